"""The checkpoint readers, each handing out tensors by key (keys, shape, is_float,
dtype_name, load, close): .safetensors files (safetensors_io), torch.save files (.ckpt,
.bin: zip archives checked record by record before torch.load, so that a TorchScript
archive is refused before any of its code can run, or legacy pickles; both loaded with
weights_only=True), and a diffusers folder's weight files read as one checkpoint."""

import os

from .gguf_io import MAGIC as GGUF_MAGIC
from .gguf_io import GgufFile
from .report import ExportError, one_line
from .safetensors_io import SafetensorsFile

# Key prefixes of a diffusers folder's three weight files, once read as one checkpoint.
DIFFUSERS_PARTS = {"unet": "unet/", "vae": "vae/", "text_encoder": "text_encoder/",
                   "text_encoder_2": "text_encoder_2/"}


# The records torch.save writes into a zip checkpoint of plain tensors (names inside the
# archive's one folder): the pickle, its tensors' storages, and format markers (byteorder
# since torch 2.1, .data/serialization_id since 2.2).
PLAIN_RECORDS = {"data.pkl", "version", "byteorder", ".data/serialization_id"}
# Records that only a TorchScript archive (torch.jit.save) has.
TORCHSCRIPT_RECORDS = ("code/", "constants.pkl", ".data/version", "extra/", "bytecode.pkl")


def unexpected_record(records):
    """The first record of a zip checkpoint that is not part of a plain tensor pickle
    (record names without the archive's folder), or None."""
    if "data.pkl" not in records:
        return "(no data.pkl)"
    for name in records:
        storage = name.startswith("data/") and len(name) > 5 and "/" not in name[5:]
        if name not in PLAIN_RECORDS and not storage:
            return name
    return None


def refuse_record(path, name):
    if any(name.startswith(r) if r.endswith("/") else name == r for r in TORCHSCRIPT_RECORDS):
        return ExportError(f"{path} is a TorchScript program (it has {name}), not a checkpoint of plain tensors; "
                           f"refusing to load it, since loading would run its code (see README \"Security\")")
    return ExportError(f"{path} is not a plain tensor checkpoint (unexpected archive entry {name}); refusing "
                       f"to load it (see README \"Security\")")


def check_zip_checkpoint(path):
    """torch.load(weights_only=True) hands a zip with TorchScript records to torch.jit.load,
    which runs the archive's code (a scripted __setstate__) before any check: so a zip
    checkpoint must hold exactly what torch.save writes for plain tensors. Read with
    zipfile, without torch."""
    import zipfile
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise ExportError(f"cannot load {path} as a PyTorch checkpoint (corrupt or truncated zip archive: "
                          f"{one_line(e)})")
    folder = names[0].split("/", 1)[0] + "/" if names else ""
    records = []
    for name in names:
        if not name.startswith(folder) or name == folder:
            raise refuse_record(path, name)
        records.append(name[len(folder):])
    if len(set(records)) != len(records):
        raise refuse_record(path, next(r for r in records if records.count(r) > 1) + " (twice)")
    bad = unexpected_record(records)
    if bad:
        raise refuse_record(path, bad)


class TorchCheckpoint:
    """A .ckpt (torch.save) file, loaded with weights_only=True; tensors handed out once each.
    A zip archive is first checked to be a plain tensor pickle (check_zip_checkpoint)."""

    def __init__(self, path):
        try:
            with open(path, "rb") as f:
                is_zip = f.read(2) == b"PK"
        except OSError as e:
            raise ExportError(f"cannot read {path}: {e.strerror or one_line(e)}")
        if is_zip:
            check_zip_checkpoint(path)
        import torch
        self.path = path
        try:
            if is_zip:
                # The same check on the records as torch's own zip reader lists them: the one
                # torch.load asks whether the archive is TorchScript.
                bad = unexpected_record(torch._C.PyTorchFileReader(path).get_all_records())
                if bad:
                    raise refuse_record(path, bad)
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except OSError as e:
            raise ExportError(f"cannot read {path}: {e.strerror or one_line(e)}")
        except ExportError:
            raise
        except Exception as e:  # torch raises many types for corrupt or unsafe pickles
            raise ExportError(f"cannot load {path} as a PyTorch checkpoint (corrupt, truncated, or not loadable "
                              f"with weights_only=True): {one_line(e)}")
        if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
            obj = obj["state_dict"]
        if not isinstance(obj, dict):
            raise ExportError(f"{path} does not contain a state dict")
        self.sd = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}

    def keys(self):
        return self.sd.keys()

    def shape(self, key):
        return tuple(self.sd[key].shape)

    def is_float(self, key):
        return self.sd[key].is_floating_point()

    def dtype_name(self, key):
        return str(self.sd[key].dtype).replace("torch.", "")

    def load(self, key):
        # pop: the checkpoint's copy goes away as soon as the model owns the weights.
        return self.sd.pop(key)

    def close(self):
        self.sd.clear()


class DiffusersCheckpoint:
    """A diffusers folder's unet, vae and text_encoder (SDXL: and text_encoder_2) weight files
    read as one checkpoint, their keys prefixed with the part's name ("unet/", "vae/", ...)."""

    def __init__(self, path, files):
        self.path = path
        self.parts = {DIFFUSERS_PARTS[part]: open_weight_file(f) for part, f in files.items()}

    def _split(self, key):
        prefix, _, rest = key.partition("/")
        return self.parts[prefix + "/"], rest

    def keys(self):
        return [prefix + k for prefix, f in self.parts.items() for k in f.keys()]

    def shape(self, key):
        f, k = self._split(key)
        return f.shape(k)

    def is_float(self, key):
        f, k = self._split(key)
        return f.is_float(k)

    def dtype_name(self, key):
        f, k = self._split(key)
        return f.dtype_name(k)

    def load(self, key):
        f, k = self._split(key)
        return f.load(k)

    def close(self):
        for f in self.parts.values():
            f.close()


def file_sha256(path):
    """The file's SHA-256 in hex: model.json's source_sha256, whose first 10 digits are
    AUTOMATIC1111's "Model hash" of a checkpoint."""
    import hashlib
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        raise ExportError(f"cannot read {path}: {e.strerror or e}")
    return h.hexdigest()


def open_weight_file(path):
    if not os.path.exists(path):
        raise ExportError(f"checkpoint {path} does not exist")
    if path.lower().endswith(".gguf"):
        return GgufFile(path)
    if path.lower().endswith(".safetensors"):
        return SafetensorsFile(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ExportError(f"cannot open {path}: {e.strerror or e}")
    if magic == GGUF_MAGIC:
        return GgufFile(path)
    # zip (torch.save) or a legacy pickle; anything else is tried as safetensors.
    if magic.startswith(b"PK") or magic[:1] == b"\x80" or not magic:
        return TorchCheckpoint(path)
    return SafetensorsFile(path)


def open_checkpoint(path, folder=None):
    """A single-file checkpoint, or the weights of a diffusers folder (folder = its read_folder())."""
    if folder is not None:
        return DiffusersCheckpoint(path, folder["files"])
    if os.path.isdir(path):
        raise ExportError(f"{path} is a directory but not a diffusers folder (no model_index.json)")
    return open_weight_file(path)



VAE_DECODER_PARTS = ("decoder.", "post_quant_conv.")


class TensorOverlay:
    """A checkpoint some of whose tensors are read from another file: `names` maps a
    checkpoint key to its key in `overlay`; every other key is the base's."""

    def _part(self, key):
        return (self.overlay, self.names[key]) if key in self.names else (self.base, key)

    def keys(self):
        return self.base.keys()

    def shape(self, key):
        f, k = self._part(key)
        return tuple(f.shape(k))

    def is_float(self, key):
        f, k = self._part(key)
        return f.is_float(k)

    def dtype_name(self, key):
        f, k = self._part(key)
        return f.dtype_name(k)

    def load(self, key):
        f, k = self._part(key)
        return f.load(k)

    def close(self):
        self.base.close()
        self.overlay.close()


class VaeOverride(TensorOverlay):
    """A single-file checkpoint whose VAE decoder weights come from a standalone VAE file
    (--vae, e.g. vae-ft-mse-840000-ema-pruned): its decoder.* and post_quant_conv.* tensors,
    bare or under first_stage_model., replace the checkpoint's. The encoder stays the checkpoint's
    (as the run-time --vae, which replaces the decoder alone; the released fine-tuned VAEs
    changed only the decoder)."""

    def __init__(self, base, vae_path):
        self.base, self.path = base, base.path
        if not os.path.isfile(vae_path):
            raise ExportError(f"--vae {vae_path} does not exist")
        self.overlay = open_weight_file(vae_path)
        self.names = {}  # checkpoint key -> key in the VAE file
        for k in self.overlay.keys():
            bare = k[len("first_stage_model."):] if k.startswith("first_stage_model.") else k
            if bare.startswith(VAE_DECODER_PARTS):
                self.names["first_stage_model." + bare] = k
        if not self.names:
            raise ExportError(f"--vae {vae_path} holds no VAE decoder tensors (decoder.* and post_quant_conv.*, "
                              f"bare or under first_stage_model.)")
        prefixes = tuple("first_stage_model." + p for p in VAE_DECODER_PARTS)
        wanted = [k for k in base.keys() if k.startswith(prefixes)]
        for k in wanted:
            bare = k[len("first_stage_model."):]
            if k not in self.names:
                raise ExportError(f"--vae {vae_path} lacks the tensor {bare} of {base.path}'s VAE decoder")
            if tuple(self.overlay.shape(self.names[k])) != tuple(base.shape(k)):
                raise ExportError(f"--vae {vae_path}: {bare} is {list(self.overlay.shape(self.names[k]))}, "
                                  f"{base.path}'s VAE has {list(base.shape(k))} (a VAE for another model family?)")
        extra = sorted(set(self.names) - set(wanted))
        if extra:
            raise ExportError(f"--vae {vae_path}: {extra[0][len('first_stage_model.'):]} is not a tensor of "
                              f"{base.path}'s VAE decoder")


def file_of(ckpt, key):
    """(the reader of the one file that holds `key`, its key there), through the --vae and
    --unet-gguf overlays and a diffusers folder's parts."""
    while True:
        if isinstance(ckpt, TensorOverlay):
            ckpt, key = ckpt._part(key)
        elif isinstance(ckpt, DiffusersCheckpoint):
            ckpt, key = ckpt._split(key)
        else:
            return ckpt, key


def load_finite(ckpt, key):
    """ckpt.load(key), refused in one line naming the file and the tensor when it holds NaN or an
    infinity: such a weight makes a NaN or black picture with no other sign. The sum is the cheap
    test (NaN and infinities carry through a sum; 0.4 s for SD 1.5's 3.2 GiB UNet on one core,
    where torch.isfinite(t).all() takes 7 s); only a sum that is not finite, which large finite
    values can also make, is looked at value by value."""
    import math

    import torch
    t = ckpt.load(key)
    if not t.is_floating_point():
        return t
    acc = torch.float64 if t.dtype == torch.float64 else torch.float32
    if not math.isfinite(float(t.sum(dtype=acc))) and not bool(torch.isfinite(t).all()):
        f, k = file_of(ckpt, key)
        raise ExportError(f"{f.path}: its tensor {k!r} holds NaN or infinite values; refusing to export it, since "
                          f"it would make NaN or black pictures")
    return t
