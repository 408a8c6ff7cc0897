"""The export side of sd-txt2img: a Stable Diffusion 1.x, 2.x or SDXL base checkpoint
(.safetensors, .ckpt, .gguf, or a diffusers folder) to the model folder the C++ program reads
(docs/model-format.md).  scripts/export_model.py is its command.

    report          one-line errors and progress
    jsonfile        the one reader of the JSON files an export is given
    configs         family, sizes and schedule (LDM yaml, text config, checkpoint shapes)
    safetensors_io  the one .safetensors reader and writer
    gguf_io         the GGUF reader (memory-mapped, checked; quantized blocks expanded as ggml does)
    checkpoints     the checkpoint readers (.safetensors, checked .ckpt/.bin, .gguf, diffusers folder)
    unet_override   --unet-gguf: the UNet from a GGUF file, the rest from the checkpoint
    diffusers_layout  a diffusers folder's configs and weight names
    keymaps         checkpoint key names -> our modules' weights
    ops             the sd::attention and sd::linear operators the modules call (plain
                    references; the C++ kernels replace them)
    modules         the TorchScript modules (text encoders, UNet, VAE decoder), a package:
                    layers, text, unet, vae
    weights         the modules built and filled (checkpoint or random)
    stages          the model folder: STAGE.pt + STAGE.weights, tokenizer, model.json
    export          the export from arguments to folder
    cli             the command line (main)
"""
