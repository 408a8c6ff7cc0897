"""The export: what to build (family, sizes, schedule, tokenizer) from the arguments, the
configs and the checkpoint; the modules built, filled and checked; the model folder written."""

import os
import time

from . import diffusers_layout, q8, stages
from .checkpoints import VaeOverride, file_sha256, open_checkpoint
from .configs import (FAMILY_DEFAULTS, SD1_SCHEDULE, SD1_VAE, SDXL_SCHEDULE, SDXL_TEXT, SDXL_TEXT_2, SDXL_UNET,
                      SIZE_EMBEDDING_DIM, assumed_parameterization, check_consistency,
                      detect_family, detect_unet_shapes, load_ldm_config, load_text_config, open_clip_text_layers,
                      text_cfg_from_open_clip, unet_input_channels, unet_input_kinds)
from .keymaps import SDXL_TEXT_2_PREFIX, checkpoint_key_maps, has_vae_encoder
from .lora import bake_loras, parse_lora_arg
from .report import PROG, ExportError, say
from .unet_override import UnetOverride
from .weights import build_modules, check_keys, load_weights, random_init


FAMILY_NAMES = {"sd1": "an SD 1.x", "sd2": "an SD 2.x", "sdxl": "an SDXL"}


def match_unet_input(args, ckpt, unet_cfg, ldm):
    """A single file's UNet input channels (4, or 9 for inpainting) go into unet_cfg; with a
    config they must be the config's (an inpainting file needs its inpainting yaml)."""
    channels = unet_input_channels(ckpt)
    if channels is None:
        return  # reported as a missing weight by check_keys
    if not ldm:
        unet_cfg["in_channels"] = channels
    elif channels != unet_cfg["in_channels"]:
        kinds = unet_input_kinds(unet_cfg["out_channels"])
        kind = f" ({kinds[channels]})" if channels in kinds else ""
        raise ExportError(f"{args.checkpoint}'s UNet takes {channels} input channels{kind} but config {args.config} "
                          f"says in_channels {unet_cfg['in_channels']} (an inpainting checkpoint needs its "
                          f"inpainting config, e.g. v1-inpainting-inference.yaml)")


def resolve(args):
    """Family, sizes, schedule and tokenizer of the model to export, and the opened checkpoint."""
    folder = None
    if args.checkpoint and diffusers_layout.is_diffusers_folder(args.checkpoint):
        if args.config:
            raise ExportError("--config is for single-file checkpoints; a diffusers folder has its own configs")
        folder = diffusers_layout.read_folder(args.checkpoint)  # LayoutError is an ExportError
    ldm = load_ldm_config(args.config) if args.config else None
    ckpt = None if args.random_init else open_checkpoint(args.checkpoint, folder)
    if getattr(args, "vae", None):
        if folder:
            raise ExportError("--vae is for single-file checkpoints; replace a diffusers folder's vae/ folder instead")
        ckpt = VaeOverride(ckpt, args.vae)
    if getattr(args, "unet_gguf", None):
        if folder:
            raise ExportError("--unet-gguf is for single-file checkpoints (the text encoder and VAE come from it)")
        ckpt = UnetOverride(ckpt, args.unet_gguf)
    r = {"ckpt": ckpt, "folder": folder, "tokenizer_dir": args.tokenizer, "text_2": None}
    detected = detect_family(ckpt) if ckpt and not folder else None
    if ldm and detected and ldm["family"] != detected:
        raise ExportError(f"{args.checkpoint} is {FAMILY_NAMES[detected]} checkpoint but config {args.config} "
                          f"describes {FAMILY_NAMES[ldm['family']]} model")
    if (folder and "text_config_2" in folder) or "sdxl" in (detected, ldm and ldm["family"]):
        return resolve_sdxl(args, r, ldm)
    if getattr(args, "text_config_2", None):
        raise ExportError("--text-config-2 is for SDXL's second text encoder; this is not an SDXL model")

    if folder:
        text_cfg = load_text_config(args.text_config or folder["text_config"])
        family = "sd1" if text_cfg["quick_gelu"] else "sd2"  # OpenCLIP's text tower uses GELU
        unet_cfg, vae_cfg, schedule = folder["unet"], folder["vae"], dict(folder["schedule"])
        p_source = "diffusers scheduler/scheduler_config.json (prediction_type)"
        r["tokenizer_dir"] = args.tokenizer or folder["tokenizer_dir"]
    else:
        family = detected or (ldm["family"] if ldm else "sd1")
        unet_default, text_default = FAMILY_DEFAULTS[family]
        if ldm:
            unet_cfg, vae_cfg, schedule = ldm["unet"], ldm["vae"], ldm["schedule"]
            p_source = f"config {os.path.basename(args.config)}"
        else:
            unet_cfg, vae_cfg, schedule = dict(unet_default), dict(SD1_VAE), dict(SD1_SCHEDULE)
            if ckpt:
                unet_cfg.update(detect_unet_shapes(ckpt))
                schedule["parameterization"], p_source = assumed_parameterization(family, args.checkpoint)
            else:
                p_source = "default for --random-init"
        if ckpt:
            match_unet_input(args, ckpt, unet_cfg, ldm)
        if args.text_config:
            text_cfg = load_text_config(args.text_config)
        elif family == "sd2" and ckpt:
            text_cfg = text_cfg_from_open_clip(ckpt)
        else:
            text_cfg = dict(text_default)
        if ldm:  # the config says which layer's output SD uses
            text_cfg["layers"] = text_cfg["layers_total"] - (1 if ldm["text_layer"] == "penultimate" else 0)
        if family == "sd2" and ckpt and open_clip_text_layers(ckpt) != text_cfg["layers_total"]:
            raise ExportError(f"{args.checkpoint} has {open_clip_text_layers(ckpt)} OpenCLIP text layers but the text "
                              f"config says {text_cfg['layers_total']} (give a matching --text-config)")
    text_cfg.pop("projection", None)  # SD 1.x/2.x use no text projection
    if args.parameterization:
        schedule["parameterization"], p_source = args.parameterization, "--parameterization"
    elif not folder and not ldm and ckpt and family == "sd2":
        say(f"{PROG}: note: no --config given: parameterization '{schedule['parameterization']}' "
            f"{p_source.split(':', 1)[0]}; override with --parameterization eps|v")

    tokenizer = stages.find_tokenizer(r["tokenizer_dir"], "diffusers tokenizer/ folder" if folder and not args.tokenizer
                               else "--tokenizer directory")
    if folder:
        # The text encoder config's token ids are unreliable (SD 1.x's says bos 0, eos 2); the tokenizer's are not.
        vocab = stages.read_vocab(tokenizer["vocab.json"])
        text_cfg["bos_id"] = vocab.get("<|startoftext|>", text_cfg["bos_id"])
        text_cfg["eos_id"] = vocab.get("<|endoftext|>", text_cfg["eos_id"])
        pad = folder["pad_token"]
        text_cfg["pad_id"] = vocab[pad] if pad in vocab else FAMILY_DEFAULTS[family][1]["pad_id"]
    latent_size = folder["latent_size"] if folder else (ldm["latent_size"] if ldm else None)
    r.update(family=family, unet=unet_cfg, vae=vae_cfg, text=text_cfg, schedule=schedule,
             parameterization_source=p_source, tokenizer=tokenizer, ldm=ldm, latent_size=latent_size)
    return r


def resolve_sdxl(args, r, ldm):
    """resolve() for SDXL base: CLIP ViT-L (its penultimate state, no final LayerNorm) and
    OpenCLIP bigG (penultimate state and pooled vector), the UNet's vector input."""
    ckpt, folder = r["ckpt"], r["folder"]
    if folder:
        text_cfg = load_text_config(args.text_config or folder["text_config"])
        text_cfg_2 = load_text_config(args.text_config_2 or folder["text_config_2"])
        text_cfg["layers"] = text_cfg["layers_total"] - 1  # hidden_states[-2], as diffusers' SDXL pipeline
        unet_cfg, vae_cfg, schedule = folder["unet"], folder["vae"], dict(folder["schedule"])
        size_dim = folder["size_embedding_dim"]
        p_source = "diffusers scheduler/scheduler_config.json (prediction_type)"
        r["tokenizer_dir"] = args.tokenizer or folder["tokenizer_dir"]
    else:
        if ldm:
            unet_cfg, vae_cfg, schedule = ldm["unet"], ldm["vae"], ldm["schedule"]
            size_dim = ldm["size_embedding_dim"]
            p_source = f"config {os.path.basename(args.config)}"
        else:
            unet_cfg, vae_cfg, schedule = dict(SDXL_UNET), dict(SD1_VAE), dict(SDXL_SCHEDULE)
            size_dim = SIZE_EMBEDDING_DIM
            p_source = "assumed: SDXL base predicts eps" if ckpt else "default for --random-init"
        if ckpt:
            match_unet_input(args, ckpt, unet_cfg, ldm)
        text_cfg = load_text_config(args.text_config) if args.text_config else dict(SDXL_TEXT)
        # sgm's layer_idx: hidden_states[idx], the output of that many layers
        text_cfg["layers"] = ldm["text_layer_idx"] if ldm else text_cfg["layers_total"] - 1
        if args.text_config_2:
            text_cfg_2 = load_text_config(args.text_config_2)
        elif ckpt:
            text_cfg_2 = text_cfg_from_open_clip(ckpt, SDXL_TEXT_2_PREFIX)
        else:
            text_cfg_2 = dict(SDXL_TEXT_2)
        if ckpt and open_clip_text_layers(ckpt, SDXL_TEXT_2_PREFIX) != text_cfg_2["layers_total"]:
            raise ExportError(f"{args.checkpoint} has {open_clip_text_layers(ckpt, SDXL_TEXT_2_PREFIX)} OpenCLIP "
                              f"text layers but the second text config says {text_cfg_2['layers_total']} "
                              f"(give a matching --text-config-2)")
    if not 1 <= text_cfg["layers"] <= text_cfg["layers_total"]:
        raise ExportError(f"the first text encoder's output layer {text_cfg['layers']} is not one of its "
                          f"{text_cfg['layers_total']} layers")
    text_cfg.pop("projection", None)  # CLIP-L's projection is not used
    text_cfg["final_norm"] = False
    text_cfg_2["layers"] = text_cfg_2["layers_total"]  # all run: the pooled vector needs the last
    text_cfg_2.setdefault("projection", text_cfg_2["width"])
    if args.parameterization:
        schedule["parameterization"], p_source = args.parameterization, "--parameterization"
    tokenizer = stages.find_tokenizer(r["tokenizer_dir"], "diffusers tokenizer/ folder" if folder and not args.tokenizer
                                      else "--tokenizer directory")
    # The HF configs' token ids are unreliable (bos 0, eos 2); the tokenizer's are not.
    # CLIP-L pads with the end token, bigG with 0 ("!", open_clip's padding).
    vocab = stages.read_vocab(tokenizer["vocab.json"])
    text_cfg["bos_id"] = text_cfg_2["bos_id"] = vocab.get("<|startoftext|>", 49406)
    text_cfg["eos_id"] = text_cfg_2["eos_id"] = vocab.get("<|endoftext|>", 49407)
    text_cfg["pad_id"] = text_cfg["eos_id"]
    text_cfg_2["pad_id"] = 0
    if folder:  # the folder's tokenizers say what they pad with
        for cfg, pad in ((text_cfg, folder["pad_token"]), (text_cfg_2, folder["pad_token_2"])):
            if pad in vocab:
                cfg["pad_id"] = vocab[pad]
    latent_size = folder["latent_size"] if folder else 128  # SDXL base: 1024x1024 pictures
    r.update(family="sdxl", unet=unet_cfg, vae=vae_cfg, text=text_cfg, text_2=text_cfg_2, schedule=schedule,
             parameterization_source=p_source, tokenizer=tokenizer, ldm=ldm, latent_size=latent_size,
             size_embedding_dim=size_dim)
    return r


# What an SDXL export records as the CLI's defaults (each overridden by its export flag):
# base at 1024x1024 with Euler and scale 5; SDXL-Turbo as it is run: Euler a on
# "trailing" timesteps, 1 step, no guidance, 512x512.
SDXL_BASE_RECIPE = {"image_size": 1024, "default_sampler": "euler", "guidance_scale": 5.0}
SDXL_TURBO_RECIPE = {"image_size": 512, "default_sampler": "euler_a", "default_schedule": "trailing",
                     "default_steps": 1, "guidance_scale": 1.0}


def record_sdxl_recipe(info, args, source):
    turbo = "turbo" in source.lower()
    recipe = SDXL_TURBO_RECIPE if turbo else SDXL_BASE_RECIPE
    if turbo:
        say(f"{PROG}: note: 'turbo' in the name: recording SDXL-Turbo's recipe (euler_a, trailing, 1 step, "
            f"scale 1, 512x512); override with --default-sampler/--default-steps/--guidance-scale/--image-size")
    for key, value in recipe.items():
        if key.startswith("default_") and args.default_sampler is not None:
            continue  # a sampler's steps and schedule belong to it: the user's sampler alone
        if key == "guidance_scale" and args.guidance_scale is not None:
            continue
        if key == "image_size" and (args.image_size or info.get("image_size")) and not turbo:
            continue  # a diffusers folder's sample_size
        info[key] = value


def export(args):
    import torch
    start = time.time()
    out = os.path.abspath(args.out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"output {out} exists and is not a directory")
    r = resolve(args)
    ckpt, family = r["ckpt"], r["family"]
    unet_cfg, vae_cfg, text_cfg, schedule = r["unet"], r["vae"], r["text"], r["schedule"]
    text_cfg_2, size_dim = r["text_2"], r.get("size_embedding_dim", SIZE_EMBEDDING_DIM)
    if ckpt is None:
        check_consistency(unet_cfg, vae_cfg, text_cfg, text_cfg_2, size_dim)

    # The VAE encoder (pictures to latents) is a stage of its own; a checkpoint stripped of it
    # still exports, for text to image only.
    with_encoder = ckpt is None or has_vae_encoder(ckpt, diffusers=r["folder"] is not None)
    if not with_encoder:
        say(f"{PROG}: note: {args.checkpoint} has no VAE encoder weights: exporting without vae_encoder.pt "
            f"(text to image only; img2img and inpainting need the encoder)")
    modules = build_modules(unet_cfg, vae_cfg, text_cfg, text_cfg_2, vae_encoder=with_encoder)
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(args.dtype, torch.float32)
    gguf_blocks = None
    if ckpt is not None:
        maps = checkpoint_key_maps(ckpt, modules, family, unet_cfg, vae_cfg, diffusers=r["folder"] is not None)
        if r["folder"] or args.config or args.text_config:
            hint = "of the given configs"
        elif family == "sdxl":
            hint = "(SDXL base defaults; give --config/--text-config/--text-config-2 for other sizes)"
        else:
            hint = f"(SD {family[2]}.x defaults; give --config/--text-config for other sizes)"
        check_keys(ckpt, modules, maps, hint)  # names the file: before the config-only checks below
        check_consistency(unet_cfg, vae_cfg, text_cfg, text_cfg_2, size_dim)
        # Straight to the stored dtype, unless LoRAs are merged first (in fp32).
        if args.dtype == "auto":
            args.dtype = "q8_0" if q8.quantized_source(ckpt, modules["unet"], maps["unet"]) else "float32"
        load_weights(ckpt, modules, maps, None if args.lora else dtype)
        if args.dtype == "q8_0" and not args.lora:  # a q8_0 GGUF's blocks kept as they are
            gguf_blocks = q8.source_blocks(ckpt, modules["unet"], maps["unet"])
        ckpt.close()
        source = os.path.basename(os.path.normpath(args.checkpoint))
    else:
        args.dtype = "float32" if args.dtype == "auto" else args.dtype
        random_init(modules, args.seed, None if args.lora else dtype)
        source = f"random-init (seed {args.seed})"

    loras = bake_loras(modules, [parse_lora_arg(a) for a in args.lora], dtype) if args.lora else []
    # --dtype q8_0: the UNet's layers in 8-bit blocks, every other weight float32 (as --weights q8 holds them).
    scales = {"unet": q8.narrow_module(modules["unet"], gguf_blocks)} if args.dtype == "q8_0" else None

    info = stages.model_info(schedule, unet_cfg, vae_cfg, text_cfg, args.dtype, source, family,
                             r["parameterization_source"], r["latent_size"], text_cfg_2, size_dim,
                             vae_encoder=with_encoder)
    if family == "sdxl":
        record_sdxl_recipe(info, args, source)
    if getattr(args, "image_size", None):
        info["image_size"] = args.image_size
    if args.guidance_scale is not None:
        info["guidance_scale"] = args.guidance_scale
    # The sampler recipe the model is meant for (docs/model-format.md).
    for key in ("default_sampler", "default_steps", "default_schedule"):
        if getattr(args, key, None) is not None:
            info[key] = getattr(args, key)
    if loras:
        info["loras"] = loras  # what was baked in: name, weight, A1111 short hash
    if ckpt is not None and r["folder"] is None:
        # The checkpoint file's own hash: the PNG's "Model hash", and what the CLI's model
        # cache checks an entry against (a diffusers folder has no one file to hash).
        info["source_sha256"] = file_sha256(args.checkpoint)
    stages.write_model_folder(out, modules, dtype, r["tokenizer"], family, info, scales)
    source_text = source
    if getattr(args, "unet_gguf", None):
        source_text += f" with UNet {os.path.basename(args.unet_gguf)}"
    if getattr(args, "vae", None):
        source_text += f" with VAE {os.path.basename(args.vae)}"
    kind = unet_input_kinds(unet_cfg["out_channels"])[unet_cfg["in_channels"]]
    say(f"{PROG}: exported {source_text} -> {out} ({family}, {kind}, {schedule['parameterization']}, {args.dtype}, "
        f"size multiple {info['size_multiple']}) in {time.time() - start:.1f} s")

