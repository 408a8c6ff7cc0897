"""The export_model.py command: its arguments, and main(), which turns every failure into
one line `export_model.py: error: ...` and exit status 1."""

import argparse
import warnings

from .export import export
from .report import PROG, ExportError, one_line, say

# The C++ tool's samplers and the --schedule values each takes (src/sampling/sampler_list.h).
SAMPLER_SCHEDULES = {
    "plms": ("default", "leading", "trailing"),
    "ddim": ("default", "leading", "trailing"),
    "euler": ("default", "karras", "trailing"),
    "euler_a": ("default", "karras", "trailing"),
    "dpmpp_2m": ("default", "karras"),
    "lcm": ("default",),
}
SAMPLERS = tuple(SAMPLER_SCHEDULES)
SCHEDULES = ("default", "karras", "leading", "trailing")
LCM_MAX_STEPS = 50  # LCMScheduler's origin grid


def check_default_recipe(p, args):
    """--default-sampler/-steps/-schedule: a recipe the C++ tool will accept (it checks model.json again)."""
    if args.default_sampler is None:
        if args.default_steps is not None or args.default_schedule is not None:
            p.error("--default-steps and --default-schedule need --default-sampler")
        return
    if args.default_steps is not None and not 1 <= args.default_steps <= 10000:
        p.error("--default-steps must be from 1 to 10000")
    if args.default_sampler == "lcm" and args.default_steps is not None and args.default_steps > LCM_MAX_STEPS:
        p.error(f"--default-steps {args.default_steps}: the lcm sampler runs 1 to {LCM_MAX_STEPS} steps")
    schedule = args.default_schedule or "default"
    if schedule not in SAMPLER_SCHEDULES[args.default_sampler]:
        p.error(f"--default-schedule {schedule} does not apply to {args.default_sampler}")


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description="Export a Stable Diffusion 1.x, 2.x or SDXL base checkpoint "
                                "(.safetensors, .ckpt or a diffusers folder) to TorchScript files for the C++ program.")
    p.add_argument("checkpoint", nargs="?", help="single-file .safetensors / .ckpt / .gguf, or a diffusers folder")
    p.add_argument("--out", required=True, help="output model directory")
    p.add_argument("--config", help="LDM config yaml (v1-inference.yaml / v2-inference-v.yaml / sgm's "
                   "sd_xl_base.yaml schema); default: SD 1.x, 2.x or SDXL base sizes, detected from the checkpoint")
    p.add_argument("--text-config", help="text encoder sizes json; default: CLIP ViT-L/14 text (SD 1.x, SDXL's "
                   "first), OpenCLIP ViT-H/14 text (SD 2.x)")
    p.add_argument("--text-config-2", help="SDXL's second text encoder sizes (open_clip model config or HF "
                   "CLIPTextConfig json); default: from the checkpoint's OpenCLIP ViT-bigG/14 weights")
    p.add_argument("--tokenizer", help="directory with vocab.json and merges.txt; default: models/clip/ "
                   "(a diffusers folder's tokenizer/)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16", "q8_0", "auto"),
                   default="float32", help="storage dtype of the weights in the .pt files (default float32); bfloat16: "
                   "half the bytes, mapped as they are by --precision bf16 (no narrowing at load; other precisions "
                   "widen them); q8_0: the UNet's "
                   "Linear and convolution weights in 8-bit blocks (GGUF q8_0; a q8_0 GGUF's kept as they are), "
                   "the rest float32; auto: q8_0 when the UNet comes from a quantized GGUF file "
                   "(q8_0, q4_*, q5_*), else float32 (what the model cache uses for a .gguf)")
    p.add_argument("--parameterization", choices=("eps", "v"),
                   help="what the UNet predicts; default: from the config or scheduler, else assumed "
                   "(SD 1.x: eps; SD 2.x: v, or eps when the file name says 512 or base)")
    p.add_argument("--guidance-scale", "--default-scale", dest="guidance_scale", type=float,
                   help="the guidance scale the model is meant for: the CLI's --scale default for it "
                   "(default: none recorded, so the CLI's 7.5); 1 is the cond alone (LCM, Turbo)")
    # The sampler recipe the model is meant for (model.json default_*), the CLI's
    # defaults for it; the names are those of src/sampling/sampler_list.h.
    p.add_argument("--default-sampler", choices=SAMPLERS,
                   help="the sampler the CLI uses for this model when --sampler is not given (e.g. lcm)")
    p.add_argument("--default-steps", type=int,
                   help="its step count when --steps is not given (needs --default-sampler)")
    p.add_argument("--default-schedule", choices=SCHEDULES,
                   help="its --schedule when not given (needs --default-sampler; e.g. trailing with euler_a)")
    p.add_argument("--image-size", type=int,
                   help="the picture size the model is meant for: the CLI's --H/--W default for it (default: from "
                   "the config; SDXL 1024; e.g. 512 for SDXL Turbo)")
    p.add_argument("--random-init", action="store_true",
                   help="random weights instead of a checkpoint (for tests and performance work)")
    p.add_argument("--seed", type=int, default=0, help="seed for --random-init (default 0)")
    p.add_argument("--vae", help="a standalone VAE (.safetensors / .ckpt, e.g. vae-ft-mse-840000-ema-pruned) whose "
                   "decoder weights replace the checkpoint's")
    p.add_argument("--unet-gguf", metavar="FILE",
                   help="a UNet-only GGUF file (stable-diffusion.cpp or ComfyUI-GGUF; f32/f16/bf16/q8_0/q4_0/q4_1/"
                   "q5_0/q5_1) whose UNet replaces CHECKPOINT's; the text encoder and VAE come from CHECKPOINT")
    p.add_argument("--lora", action="append", default=[], metavar="FILE[:WEIGHT]",
                   help="bake a LoRA .safetensors into the weights (repeatable, merged in order; weight 1 by default)")
    args = p.parse_args(argv)
    if args.image_size is not None and not (8 <= args.image_size <= 16384):
        p.error("--image-size must be from 8 to 16384")
    if args.random_init and args.checkpoint:
        p.error("give either CHECKPOINT or --random-init, not both")
    if args.guidance_scale is not None and not (0 < args.guidance_scale <= 100):
        p.error("--guidance-scale must be above 0 and at most 100")
    check_default_recipe(p, args)
    if args.vae and args.random_init:
        p.error("--vae replaces a checkpoint's VAE; it does not go with --random-init")
    if args.unet_gguf and args.random_init:
        p.error("--unet-gguf takes the text encoder and VAE from a CHECKPOINT; it does not go with --random-init")
    if not args.random_init and not args.checkpoint:
        p.error("CHECKPOINT is required (or --random-init)")
    return args


def main(argv=None):
    args = parse_args(argv)
    warnings.simplefilter("ignore")  # keep stderr to the summary or the one error line
    try:
        export(args)
    except ExportError as e:
        say(f"{PROG}: error: {e}")
        return 1
    except MemoryError:
        say(f"{PROG}: error: out of memory while exporting {args.checkpoint or 'the random model'}")
        return 1
    except KeyboardInterrupt:
        say(f"{PROG}: error: interrupted")
        return 1
    except Exception as e:  # anything unforeseen still ends in one line
        say(f"{PROG}: error: exporting {args.checkpoint or 'the random model'} failed: "
            f"{type(e).__name__}: {one_line(e)}")
        return 1
    return 0

