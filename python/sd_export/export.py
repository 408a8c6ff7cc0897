"""The export: what to build (family, sizes, schedule, tokenizer) from the arguments, the
configs and the checkpoint; the modules built, filled and checked; the model folder written."""

import os
import time

from . import diffusers_layout, stages
from .checkpoints import VaeOverride, open_checkpoint
from .configs import (FAMILY_DEFAULTS, SD1_SCHEDULE, SD1_VAE, assumed_parameterization, check_consistency,
                      detect_family, detect_unet_shapes, load_ldm_config, load_text_config, open_clip_text_layers,
                      text_cfg_from_open_clip)
from .keymaps import checkpoint_key_maps
from .lora import bake_loras, parse_lora_arg
from .report import PROG, ExportError, say
from .weights import build_modules, check_keys, load_weights, random_init


def resolve(args):
    """Family, sizes, schedule and tokenizer of the model to export, and the opened checkpoint."""
    folder = None
    if args.checkpoint and diffusers_layout.is_diffusers_folder(args.checkpoint):
        if args.config:
            raise ExportError("--config is for single-file checkpoints; a diffusers folder has its own configs")
        try:
            folder = diffusers_layout.read_folder(args.checkpoint)
        except diffusers_layout.LayoutError as e:
            raise ExportError(str(e))
    ldm = load_ldm_config(args.config) if args.config else None
    ckpt = None if args.random_init else open_checkpoint(args.checkpoint, folder)
    if getattr(args, "vae", None):
        if folder:
            raise ExportError("--vae is for single-file checkpoints; replace a diffusers folder's vae/ folder instead")
        ckpt = VaeOverride(ckpt, args.vae)
    r = {"ckpt": ckpt, "folder": folder, "tokenizer_dir": args.tokenizer}

    if folder:
        text_cfg = load_text_config(args.text_config or folder["text_config"])
        family = "sd1" if text_cfg["quick_gelu"] else "sd2"  # OpenCLIP's text tower uses GELU
        unet_cfg, vae_cfg, schedule = folder["unet"], folder["vae"], dict(folder["schedule"])
        p_source = "diffusers scheduler/scheduler_config.json (prediction_type)"
        r["tokenizer_dir"] = args.tokenizer or folder["tokenizer_dir"]
    else:
        family = detect_family(ckpt) if ckpt else (ldm["family"] if ldm else "sd1")
        if ldm and ldm["family"] != family:
            raise ExportError(f"{args.checkpoint} is an {family.upper().replace('SD', 'SD ')}.x checkpoint but "
                              f"config {args.config} describes an {ldm['family'].upper().replace('SD', 'SD ')}.x model")
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


def export(args):
    import torch
    start = time.time()
    out = os.path.abspath(args.out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"output {out} exists and is not a directory")
    r = resolve(args)
    ckpt, family = r["ckpt"], r["family"]
    unet_cfg, vae_cfg, text_cfg, schedule = r["unet"], r["vae"], r["text"], r["schedule"]
    if ckpt is None:
        check_consistency(unet_cfg, vae_cfg, text_cfg)

    modules = build_modules(unet_cfg, vae_cfg, text_cfg)
    if ckpt is not None:
        maps = checkpoint_key_maps(ckpt, modules, family, unet_cfg, vae_cfg, diffusers=r["folder"] is not None)
        if r["folder"] or args.config or args.text_config:
            hint = "of the given configs"
        else:
            hint = f"(SD {family[2]}.x defaults; give --config/--text-config for other sizes)"
        check_keys(ckpt, modules, maps, hint)  # names the file: before the config-only checks below
        check_consistency(unet_cfg, vae_cfg, text_cfg)
        load_weights(ckpt, modules, maps)
        ckpt.close()
        source = os.path.basename(os.path.normpath(args.checkpoint))
    else:
        random_init(modules, args.seed)
        source = f"random-init (seed {args.seed})"

    loras = bake_loras(modules, [parse_lora_arg(a) for a in args.lora]) if args.lora else []

    dtype = torch.float16 if args.dtype == "float16" else torch.float32
    info = stages.model_info(schedule, unet_cfg, vae_cfg, text_cfg, args.dtype, source, family,
                             r["parameterization_source"], r["latent_size"])
    if args.guidance_scale is not None:
        info["guidance_scale"] = args.guidance_scale
    # The sampler recipe the model is meant for (docs/model-format.md).
    for key in ("default_sampler", "default_steps", "default_schedule"):
        if getattr(args, key, None) is not None:
            info[key] = getattr(args, key)
    if loras:
        info["loras"] = loras  # what was baked in: name, weight, A1111 short hash
    stages.write_model_folder(out, modules, dtype, r["tokenizer"], family, info)
    if getattr(args, "vae", None):
        source_text = f"{source} with VAE {os.path.basename(args.vae)}"
    else:
        source_text = source
    say(f"{PROG}: exported {source_text} -> {out} ({family}, {schedule['parameterization']}, {args.dtype}, "
        f"size multiple {info['size_multiple']}) in {time.time() - start:.1f} s")

