"""Writes a diffusers-layout copy of a single-file SD 1.x / 2.x checkpoint, for the round-trip
test of the export's diffusers reader.

This is the inverse direction, written independently of sd_export/diffusers_layout.py: it walks
the diffusers block structure (down_blocks / mid_block / up_blocks, the decoder's up_blocks
counted from the coarsest level) and takes each weight from its CompVis-ldm name, where the
reader maps each ldm name to a diffusers one.  Every checkpoint weight must be used once.
"""

import json
import os
import shutil

import torch

from sd_export.safetensors_io import write_safetensors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RESNET = (("norm1.", "in_layers.0."), ("conv1.", "in_layers.2."), ("time_emb_proj.", "emb_layers.1."),
          ("norm2.", "out_layers.0."), ("conv2.", "out_layers.3."), ("conv_shortcut.", "skip_connection."))
VAE_RESNET = (("conv_shortcut.", "nin_shortcut."),)
VAE_ATTN_NEW = (("group_norm.", "norm."), ("to_q.", "q."), ("to_k.", "k."), ("to_v.", "v."), ("to_out.0.", "proj_out."))
VAE_ATTN_OLD = (("group_norm.", "norm."), ("query.", "q."), ("key.", "k."), ("value.", "v."),
                ("proj_attn.", "proj_out."))


class Copier:
    """Copies tensors from an ldm-named dict to diffusers names, prefix by prefix."""

    def __init__(self, sd):
        self.sd, self.out, self.used = sd, {}, set()

    def take(self, hf_prefix, ldm_prefix, renames=(), linear=False):
        keys = [k for k in self.sd if k.startswith(ldm_prefix)]
        assert keys, f"nothing under {ldm_prefix}"
        for k in keys:
            rest = k[len(ldm_prefix):]
            for hf_part, ldm_part in renames:
                if rest.startswith(ldm_part):
                    rest = hf_part + rest[len(ldm_part):]
                    break
            t = self.sd[k]
            if linear and t.dim() == 4:  # diffusers stores 1x1 attention convs as linear weights
                t = t[:, :, 0, 0]
            self.out[hf_prefix + rest] = t
            self.used.add(k)

    def check_all_used(self, what):
        left = sorted(set(self.sd) - self.used)
        assert not left, f"{what}: {len(left)} weights not written, e.g. {left[:3]}"


def unet_weights(sd, cfg):
    c = Copier(sd)
    nrb, levels = cfg["num_res_blocks"], len(cfg["channel_mult"])
    attn = {i for i in range(levels) if 2 ** i in cfg["attention_resolutions"]}
    c.take("conv_in.", "input_blocks.0.0.")
    c.take("time_embedding.linear_1.", "time_embed.0.")
    c.take("time_embedding.linear_2.", "time_embed.2.")
    block = 1
    for i in range(levels):
        for j in range(nrb):
            c.take(f"down_blocks.{i}.resnets.{j}.", f"input_blocks.{block}.0.", RESNET)
            if i in attn:
                c.take(f"down_blocks.{i}.attentions.{j}.", f"input_blocks.{block}.1.")
            block += 1
        if i < levels - 1:
            c.take(f"down_blocks.{i}.downsamplers.0.conv.", f"input_blocks.{block}.0.op.")
            block += 1
    c.take("mid_block.resnets.0.", "middle_block.0.", RESNET)
    c.take("mid_block.attentions.0.", "middle_block.1.")
    c.take("mid_block.resnets.1.", "middle_block.2.", RESNET)
    block = 0
    for i in range(levels):  # up_blocks.0 is the deepest level
        level = levels - 1 - i
        for j in range(nrb + 1):
            c.take(f"up_blocks.{i}.resnets.{j}.", f"output_blocks.{block}.0.", RESNET)
            if level in attn:
                c.take(f"up_blocks.{i}.attentions.{j}.", f"output_blocks.{block}.1.")
            if j == nrb and level > 0:
                c.take(f"up_blocks.{i}.upsamplers.0.conv.", f"output_blocks.{block}.{2 if level in attn else 1}.conv.")
            block += 1
    c.take("conv_norm_out.", "out.0.")
    c.take("conv_out.", "out.2.")
    c.check_all_used("unet")
    return c.out


def vae_weights(sd, cfg, old_attention_names=False):
    c = Copier(sd)
    attn_names = VAE_ATTN_OLD if old_attention_names else VAE_ATTN_NEW
    levels, nrb = len(cfg["ch_mult"]), cfg["num_res_blocks"]
    for side in ("encoder", "decoder"):
        c.take(f"{side}.conv_in.", f"{side}.conv_in.")
        c.take(f"{side}.conv_out.", f"{side}.conv_out.")
        c.take(f"{side}.conv_norm_out.", f"{side}.norm_out.")
        c.take(f"{side}.mid_block.resnets.0.", f"{side}.mid.block_1.", VAE_RESNET)
        c.take(f"{side}.mid_block.resnets.1.", f"{side}.mid.block_2.", VAE_RESNET)
        c.take(f"{side}.mid_block.attentions.0.", f"{side}.mid.attn_1.", attn_names, linear=True)
    for i in range(levels):
        for j in range(nrb):
            c.take(f"encoder.down_blocks.{i}.resnets.{j}.", f"encoder.down.{i}.block.{j}.", VAE_RESNET)
        if i < levels - 1:
            c.take(f"encoder.down_blocks.{i}.downsamplers.0.conv.", f"encoder.down.{i}.downsample.conv.")
    for i in range(levels):  # decoder up_blocks.0 is the coarsest level, ldm's up.{levels-1}
        level = levels - 1 - i
        for j in range(nrb + 1):
            c.take(f"decoder.up_blocks.{i}.resnets.{j}.", f"decoder.up.{level}.block.{j}.", VAE_RESNET)
        if level > 0:
            c.take(f"decoder.up_blocks.{i}.upsamplers.0.conv.", f"decoder.up.{level}.upsample.conv.")
    c.take("quant_conv.", "quant_conv.")
    c.take("post_quant_conv.", "post_quant_conv.")
    c.check_all_used("vae")
    return c.out


def open_clip_text_weights(sd, layers_used):
    """OpenCLIP text tower -> HF CLIPTextModel names, keeping the layers SD uses (as diffusers'
    SD 2.x text encoder: 23 of ViT-H's 24 layers)."""
    out = {"text_model.embeddings.token_embedding.weight": sd["token_embedding.weight"],
           "text_model.embeddings.position_embedding.weight": sd["positional_embedding"],
           "text_model.final_layer_norm.weight": sd["ln_final.weight"],
           "text_model.final_layer_norm.bias": sd["ln_final.bias"]}
    names = (("ln_1.", "layer_norm1."), ("ln_2.", "layer_norm2."), ("mlp.c_fc.", "mlp.fc1."),
             ("mlp.c_proj.", "mlp.fc2."), ("attn.out_proj.", "self_attn.out_proj."))
    for n in range(layers_used):
        src, dst = f"transformer.resblocks.{n}.", f"text_model.encoder.layers.{n}."
        for kind in ("weight", "bias"):
            q, k, v = sd[f"{src}attn.in_proj_{kind}"].chunk(3)
            out[f"{dst}self_attn.q_proj.{kind}"] = q
            out[f"{dst}self_attn.k_proj.{kind}"] = k
            out[f"{dst}self_attn.v_proj.{kind}"] = v
            for oc, hf in names:
                out[f"{dst}{hf}{kind}"] = sd[f"{src}{oc}{kind}"]
    return out


def save_weights(tensors, folder, base, fmt):
    os.makedirs(folder, exist_ok=True)
    # Float weights only: position_ids (int64) is a buffer diffusers' own files no longer carry.
    tensors = {k: v.clone() for k, v in tensors.items() if v.is_floating_point()}
    if fmt == "bin":
        torch.save(tensors, os.path.join(folder, base[1]))
    else:
        # diffusers' own files carry this metadata
        write_safetensors(os.path.join(folder, base[0]), sorted(tensors.items()), metadata={"format": "pt"})


def write_json(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)


def write_diffusers(state_dict, ldm, text, out, fmt="safetensors", old_attention_names=False):
    """state_dict: the single file's tensors; ldm: export_model.load_ldm_config(); text:
    export_model.load_text_config() (layers = layers SD uses)."""
    family, unet, vae, sched = ldm["family"], ldm["unet"], ldm["vae"], ldm["schedule"]

    def part(prefix):
        return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}

    save_weights(unet_weights(part("model.diffusion_model."), unet), os.path.join(out, "unet"),
                 ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin"), fmt)
    save_weights(vae_weights(part("first_stage_model."), vae, old_attention_names), os.path.join(out, "vae"),
                 ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin"), fmt)
    if family == "sd2":
        text_sd = open_clip_text_weights(part("cond_stage_model.model."), text["layers"])
    else:
        text_sd = part("cond_stage_model.transformer.")
    save_weights(text_sd, os.path.join(out, "text_encoder"), ("model.safetensors", "pytorch_model.bin"), fmt)

    levels = len(unet["channel_mult"])
    attn = [2 ** i in unet["attention_resolutions"] for i in range(levels)]
    boc = [unet["model_channels"] * m for m in unet["channel_mult"]]
    heads = unet["num_heads"] if unet["num_heads"] > 0 else [c // unet["num_head_channels"] for c in boc]
    write_json(os.path.join(out, "unet", "config.json"), {
        "_class_name": "UNet2DConditionModel", "_diffusers_version": "0.21.0", "act_fn": "silu",
        "attention_head_dim": heads, "block_out_channels": boc, "center_input_sample": False,
        "cross_attention_dim": unet["context_dim"],
        "down_block_types": ["CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attn],
        "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": unet["in_channels"],
        "layers_per_block": unet["num_res_blocks"], "mid_block_scale_factor": 1, "norm_eps": 1e-05,
        "norm_num_groups": 32, "out_channels": unet["out_channels"], "sample_size": ldm["latent_size"] or 64,
        "up_block_types": ["CrossAttnUpBlock2D" if a else "UpBlock2D" for a in reversed(attn)],
        "use_linear_projection": unet["use_linear_in_transformer"], "upcast_attention": family == "sd2"})
    write_json(os.path.join(out, "vae", "config.json"), {
        "_class_name": "AutoencoderKL", "_diffusers_version": "0.21.0", "act_fn": "silu",
        "block_out_channels": [vae["ch"] * m for m in vae["ch_mult"]],
        "down_block_types": ["DownEncoderBlock2D"] * len(vae["ch_mult"]), "in_channels": 3,
        "latent_channels": vae["z_channels"], "layers_per_block": vae["num_res_blocks"], "norm_num_groups": 32,
        "out_channels": vae["out_ch"], "sample_size": vae["resolution"], "scaling_factor": sched["scale_factor"],
        "up_block_types": ["UpDecoderBlock2D"] * len(vae["ch_mult"])})
    # Token ids as in the real SD 1.x / 2.x configs (copied from OpenAI's: bos 0, eos 2, pad 1):
    # a reader must take them from the tokenizer instead.
    write_json(os.path.join(out, "text_encoder", "config.json"), {
        "architectures": ["CLIPTextModel"], "model_type": "clip_text_model", "vocab_size": text["vocab"],
        "hidden_size": text["width"], "intermediate_size": text["hidden"], "num_hidden_layers": text["layers"],
        "num_attention_heads": text["heads"], "max_position_embeddings": text["ctx"],
        "hidden_act": "quick_gelu" if text["quick_gelu"] else "gelu", "layer_norm_eps": text["eps"],
        "projection_dim": text["width"], "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1,
        "torch_dtype": "float32"})
    write_json(os.path.join(out, "scheduler", "scheduler_config.json"), {
        "_class_name": "DDIMScheduler" if family == "sd2" else "PNDMScheduler", "beta_start": sched["linear_start"],
        "beta_end": sched["linear_end"], "beta_schedule": "scaled_linear", "clip_sample": False,
        "num_train_timesteps": sched["timesteps"], "set_alpha_to_one": False, "skip_prk_steps": True,
        "steps_offset": 1, "prediction_type": "v_prediction" if sched["parameterization"] == "v" else "epsilon"})
    tok = os.path.join(out, "tokenizer")
    os.makedirs(tok, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(os.path.join(REPO, "models", "clip", name), os.path.join(tok, name))
    pad = "!" if family == "sd2" else "<|endoftext|>"
    write_json(os.path.join(tok, "special_tokens_map.json"), {
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": pad, "unk_token": "<|endoftext|>"})
    write_json(os.path.join(tok, "tokenizer_config.json"), {"model_max_length": 77, "pad_token": pad})
    write_json(os.path.join(out, "model_index.json"), {
        "_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.21.0",
        "scheduler": ["diffusers", "DDIMScheduler" if family == "sd2" else "PNDMScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
        "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"]})
