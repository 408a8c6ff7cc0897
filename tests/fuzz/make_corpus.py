#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz harnesses (tests/fuzz/corpus/<target>/):
a few small valid inputs per target, each shaped the way its harness reads
bytes (tests/fuzz/fuzz_targets.h); and the inputs of the bugs found while
fuzzing (tests/data/fuzz-inputs/<target>/, replayed by
tests/unit/test_fuzz_inputs.cpp). Run again after changing it; the files are
committed, so this is only needed to remake them. The image_reader seeds are
made with the pictures they come from, by tests/data/pictures/make_pictures.py."""
import json
import struct
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE / "corpus"
FOUND = HERE.parent / "data" / "fuzz-inputs"


def put(target, name, data, root=ROOT):
    d = root / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))


def weights(tensors, pad_to=8):
    """A weight file in the safetensors layout: (name, dtype, shape) list."""
    size = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1}
    header, offset = {}, 0
    for name, dtype, shape in tensors:
        n = size[dtype]
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % pad_to)
    return struct.pack("<Q", len(text)) + text + bytes(range(256)) * (offset // 256) + bytes(offset % 256)


put("weight_index", "two_f32", weights([("a.weight", "F32", [2, 3]), ("a.bias", "F32", [3])]))
put("weight_index", "mixed", weights([("x", "F16", [4]), ("y", "BF16", [2, 2]), ("z", "F32", [])]))
put("weight_index", "empty_tensor", weights([("e", "F32", [0, 5]), ("f", "F16", [1, 1, 1, 1])]))
put("weight_index", "header_only", struct.pack("<Q", 2) + b"{}")
# --dtype q8_0 exports: an I8 weight with its F16 scales [rows, row / 32], wider tensors first (aligned).
put("weight_index", "q8_linear", weights([("l.bias", "F32", [4]), ("l.weight_scale", "F16", [4, 2]),
                                          ("l.weight", "I8", [4, 64])]))
put("weight_index", "q8_conv", weights([("c.weight_scale", "F16", [2, 9]), ("c.weight", "I8", [2, 32, 3, 3]),
                                        ("n.weight", "I8", [1, 32]), ("n.weight_scale", "F16", [1, 1])]))

# LoRA files for the lora_file harness's small model (fuzz_targets.cpp).
put("lora_file", "kohya_linear_alpha", weights([
    ("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.alpha", "F16", []),
    ("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight", "F16", [2, 8]),
    ("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_up.weight", "F16", [8, 2])]))
put("lora_file", "kohya_locon_te", weights([
    ("lora_unet_down_blocks_0_resnets_0_conv1.lora_down.weight", "F32", [2, 4, 3, 3]),
    ("lora_unet_down_blocks_0_resnets_0_conv1.lora_up.weight", "F32", [8, 2, 1, 1]),
    ("lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight", "F32", [2, 8, 1, 1]),
    ("lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight", "F32", [8, 2, 1, 1]),
    ("lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight", "F32", [2, 8]),
    ("lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight", "F32", [8, 2])]))
put("lora_file", "diffusers", weights([
    ("unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora.down.weight", "F32", [2, 8]),
    ("unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora.up.weight", "F32", [8, 2]),
    ("text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_linear_layer.down.weight", "F32", [2, 8]),
    ("text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_linear_layer.up.weight", "F32", [8, 2])]))
# LyCORIS modules: LoHa (plain and CP), LoKr (a product w2, a whole conv w2), LoCon's CP middle.
Q = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q"
C = "lora_unet_down_blocks_0_resnets_0_conv1"
put("lora_file", "loha", weights([(Q + ".alpha", "F16", []), (Q + ".hada_w1_a", "F32", [8, 2]),
                                  (Q + ".hada_w1_b", "F32", [2, 8]), (Q + ".hada_w2_a", "F32", [8, 2]),
                                  (Q + ".hada_w2_b", "F32", [2, 8]), (C + ".hada_t1", "F32", [2, 2, 3, 3]),
                                  (C + ".hada_w1_a", "F32", [2, 8]), (C + ".hada_w1_b", "F32", [2, 4]),
                                  (C + ".hada_t2", "F32", [2, 2, 3, 3]), (C + ".hada_w2_a", "F32", [2, 8]),
                                  (C + ".hada_w2_b", "F32", [2, 4])]))
put("lora_file", "lokr", weights([(Q + ".alpha", "F16", []), (Q + ".lokr_w1", "F32", [2, 2]),
                                  (Q + ".lokr_w2_a", "F32", [4, 1]), (Q + ".lokr_w2_b", "F32", [1, 4]),
                                  (C + ".lokr_w1_a", "F32", [2, 1]), (C + ".lokr_w1_b", "F32", [1, 2]),
                                  (C + ".lokr_w2", "F32", [4, 2, 3, 3])]))
put("lora_file", "locon_mid", weights([(C + ".lora_down.weight", "F32", [2, 4, 1, 1]),
                                       (C + ".lora_mid.weight", "F32", [2, 2, 3, 3]),
                                       (C + ".lora_up.weight", "F32", [8, 2, 1, 1])]))

# DoRA magnitudes: per input column on a LoRA, per output row on a LoHa's conv.
put("lora_file", "dora", weights([(Q + ".lora_down.weight", "F32", [2, 8]), (Q + ".lora_up.weight", "F32", [8, 2]),
                                  (Q + ".dora_scale", "F32", [1, 8]), (C + ".hada_w1_a", "F32", [8, 2]),
                                  (C + ".hada_w1_b", "F32", [2, 36]), (C + ".hada_w2_a", "F32", [8, 2]),
                                  (C + ".hada_w2_b", "F32", [2, 36]), (C + ".dora_scale", "F32", [8, 1, 1, 1])]))


def model_json(**over):
    m = {
        "format": 1, "family": "sd1", "parameterization": "eps", "dtype": "float32",
        "scale_factor": 0.18215, "latent_channels": 4, "downsample_factor": 8, "size_multiple": 16,
        "image_size": 512, "context_length": 77, "context_dim": 768,
        "bos_id": 49406, "eos_id": 49407, "pad_id": 49407, "tokenizer": "clip",
        "alphas_cumprod": [0.99915, 0.9983, 0.5, 0.0047],
        "source": "tiny.safetensors",
        "architecture": {"unet": {"in_channels": 4, "model_channels": 32, "channel_mult": [1, 2],
                                  "attention_resolutions": [1], "num_heads": 2},
                         "vae": {"ch": 32, "ch_mult": [1, 2], "z_channels": 4},
                         "text": {"vocab": 49408, "ctx": 77, "width": 32, "layers": 2, "heads": 2}},
        "files": {"text_encoder": "text_encoder.pt", "unet": "unet.pt", "vae_decoder": "vae_decoder.pt",
                  "vocab": "vocab.json", "merges": "merges.txt"},
    }
    m.update(over)
    return json.dumps(m, indent=1)


put("model_config", "sd1", model_json())
put("model_config", "sd2_v", model_json(family="sd2", parameterization="v", context_dim=1024, guidance_scale=7.5,
                                         bos_id=49406, eos_id=49407, pad_id=0, dtype="float16"))
put("model_config", "minimal", json.dumps({"format": 1, "scale_factor": 1, "latent_channels": 4,
                                           "downsample_factor": 8, "size_multiple": 64, "context_length": 77,
                                           "alphas_cumprod": [1, 0.5]}))

# Nested just past the limit (io/json_depth.h: 64 levels), so that the fuzzer starts next to it.
put("model_config", "nested_65", json.dumps({"format": 1, "architecture": {"x": json.loads("[" * 64 + "]" * 64)}}))

# First byte: low bit 0 = plain text, 1 = JSON lines.
put("prompts", "plain", b"\x00" + "\ufeffa cat\r\n\n  # a comment\na dog (in the rain:1.2)\n\tlast".encode())
put("prompts", "jsonl", b"\x01" + "\n".join([
    json.dumps({"prompt": "a cat", "negative_prompt": "blur", "seed": 18446744073709551615, "steps": 20,
                "scale": 7.5, "H": 64, "W": 96, "sampler": "ddim", "n_iter": 2}),
    "",
    json.dumps({"prompt": "un caf\u00e9, \u732b"}, ensure_ascii=False),
]).encode())
put("prompts", "jsonl_bad_key", b"\x01" + b'{"prompt": "a", "steps": 0}\n{"prompt": "b", "x": 1}\n')

put("prompts", "jsonl_nested_65", b"\x01" + b'{"prompt": "a", "seed": ' + b"[" * 65 + b"]" * 65 + b"}\n")

put("prompt_weights", "nested", "a (red:1.3) cat, ((sharp)), [blurry], (a [b] c:0.5) d")
put("prompt_weights", "escapes_break", r"\(not weighted\) BREAK a BREAKfast [unclosed (open:")
put("prompt_weights", "numbers", "(a: +1.5 ) (b:-.2) (c:1.2.3) :0.7) (d:)")
put("prompt_weights", "schedules",
    "a [cat:dog:0.5] [(x:1.2):[b|c]:-.5e1] \\[a:b:1\\] [red|] [a [b:c:1]] [x:(y:1)] [[")
put("prompt_weights", "network_tags", "a <lora:x:0.5:te=1> <lyco:y> <hypernet:h <lora:z:1> c <a b:1> <:y> <x:> <<lora:n:1>>")

for name, text in [
    ("plain", "a photograph of an astronaut riding a horse"),
    ("entities", "caf&eacute; &amp; &#39;quotes&#39; &lt;tag&gt; &#x1F431; don't we'll"),
    ("mojibake", "SÃ£o Paulo cafÃ© â€œquotedâ€\x9d ﬁne ＦＵＬＬ"),
    ("weights_break", "(a red:1.2) apple BREAK [blue] sky, <|startoftext|> 12345 \u0130\u03a3\u03c3"),
]:
    put("tokenizer", name, text)


def png(chunks):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    body = b"".join(chunk(k, d) for k, d in chunks)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + body + \
        chunk(b"IDAT", zlib.compress(b"\x00\x10\x20\x30")) + chunk(b"IEND", b"")


# First byte: low bit 0 = the rest is a PNG, 1 = the rest is keyword NUL text.
put("png_text", "with_texts", b"\x00" + png([(b"tEXt", b"Comment\x00hello"),
                                             (b"iTXt", b"parameters\x00\x00\x00\x00\x00a cat\nSteps: 5")]))
put("png_text", "compressed_itxt", b"\x00" + png([(b"iTXt", b"z\x00\x01\x00en\x00zz\x00" + zlib.compress(b"x"))]))
put("png_text", "keyword_text", b"\x01" + "parameters\x00un caf\u00e9\nSteps: 20, Sampler: PLMS".encode())

# torch.save pickles: data.pkl of the fixtures' .pt/.pth files (read as zip
# members; nothing is unpickled here).
import zipfile  # noqa: E402
FIXTURES = HERE.parent / "fixtures"
for src, name in [("embeddings/embone.pt", "embone"), ("embeddings/embthree.pt", "embthree"),
                  ("taesd/taesd_decoder.pth", "taesd_decoder")]:
    with zipfile.ZipFile(FIXTURES / src) as z:
        put("torch_pickle", name + ".pkl", z.read(next(n for n in z.namelist() if n.endswith("/data.pkl"))))

# Hostile shapes (issue 32): a stride-0 view standing for 2 GiB, many views of one
# storage, a view past its storage, and runs of opcodes that only grow the
# reader's memory. Made with torch.save where torch is at hand (/usr/bin/python3).
def pickle_of(obj):
    import io
    import torch
    buf = io.BytesIO()
    torch.save(obj, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


try:
    import torch
    base = torch.zeros(1 << 8)
    put("torch_pickle", "stride0_expand.pkl", pickle_of({"string_to_param": {"*": torch.zeros(1).expand(1 << 24, 32)}}))
    put("torch_pickle", "many_views.pkl", pickle_of({"v%d" % i: base[i % 7:] for i in range(200)}))
    put("torch_pickle", "strided_view.pkl", pickle_of({"t": torch.zeros(8, 6).t()[1:, ::2]}))
except ImportError:
    pass
put("torch_pickle", "empty_tuples.pkl", b"\x80\x02" + b")0" * 512 + b"}.")
put("torch_pickle", "marks.pkl", b"\x80\x02" + b"(" * 512 + b"}.")
put("torch_pickle", "memo_dups.pkl", b"\x80\x02X\x04\x00\x00\x00abcdq\x00" + b"h\x00" * 256 + b"(" + b"h\x00" * 64 + b"t}.")

# The bugs (docs/reliability.md). Printing a value for an error message
# recursed once per level of nesting: 100000 levels (200 KB) overflowed the
# 8 MiB stack. These are 8000 levels deep: the replay test runs them on a
# 512 KiB stack, which they overflowed before the fix, so the files stay small.
DEEP = 8000
deep = "[" * DEEP + "]" * DEEP
model = {"format": 1, "scale_factor": 1, "latent_channels": 4, "downsample_factor": 8,
         "size_multiple": 64, "context_length": 77, "alphas_cumprod": [1, 0.5]}


def model_with(key, raw):
    return json.dumps(model)[:-1] + ', "%s": %s}' % (key, raw)


put("prompts", "deep_seed_value.jsonl", b"\x01" + ('{"prompt": "a", "seed": %s}\n' % deep).encode(), FOUND)
put("model_config", "deep_alphas_entry.json", json.dumps(model).replace("[1, 0.5]", "[1, %s]" % deep), FOUND)
put("model_config", "deep_source.json", model_with("source", deep), FOUND)
put("model_config", "deep_architecture.json", model_with("architecture", '{"unet": %s}' % deep), FOUND)
# 1e-50 is in (0, 1] as a double, but the float kept of it is 0 (an infinite sigma).
put("model_config", "alphas_entry_float_zero.json", json.dumps(model).replace("[1, 0.5]", "[1, 1e-50]"), FOUND)
