#!/usr/bin/python3
"""Train the built-in demo model from scratch on the demo world (demo_world.py beside it).

    nice -n 19 /usr/bin/python3 models/demo/train_demo.py --seed 0 --out models/demo

A tiny model of the SD 1.x family, trained the SD way, on a CPU:

1. AutoencoderKL (f = 8, 4 latent channels; CompVis Encoder/Decoder layout): pixel L1 + MSE
   and a small KL term (no GAN or LPIPS: the world is flat colours).
2. The latents of the training pictures, scaled by 1 / their std (LDM's scale_by_std idea,
   written into the YAML as scale_factor).
3. A CLIP text transformer (the real CLIP tokenizer's ids, 77 tokens, causal mask) and a UNet
   with cross-attention, trained together on the SD objective: eps prediction, the SD 1.x
   schedule (scaled_linear 0.00085..0.012, 1000 steps), 10% of captions replaced by "" so that
   classifier-free guidance works; each sample's eps error weighted by min(1 / alpha_bar_t, 20)
   (--weight-cap).  The weights saved are an EMA.

It writes OUT/demo.safetensors (fp16, CompVis key layout: model.diffusion_model.*,
first_stage_model.{encoder,decoder,quant_conv,post_quant_conv}.*,
cond_stage_model.transformer.text_model.*), OUT/v1-demo.yaml (LDM config), OUT/text_encoder.json
and OUT/train_log.json, so the model goes through scripts/export_model.py like any checkpoint.
A checkpoint is written at every evaluation, so an interrupted run still leaves one.

Deterministic from --seed for a given thread count (--threads, default 1: on the shared
2-core machine a second OpenMP thread made every step several times slower whenever another
job held a core): the pictures, the order, every noise draw come from seeded generators.
"""

import argparse
import json
import math
import os
import re
import sys
import time

# OpenBLAS (Debian's torch does its matmuls there) starts its own worker thread, which
# spins in sched_yield between calls whatever torch.set_num_threads says: on a shared
# 2-core machine it burnt a core and slowed training several times.  Set before numpy loads it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The sd_export package, as scripts/python_path.py puts it on the path for the commands in scripts/.
sys.path.insert(0, os.path.join(REPO, "python"))

import demo_world  # noqa: E402  (beside this file)
from sd_export.modules import DecoderMid, ResnetBlock, TextEncoder, UNetModel, VAEDecoder, swish, vae_norm  # noqa: E402
from sd_export.safetensors_io import write_safetensors  # noqa: E402

# Sizes.  GroupNorm(32) in the UNet and VAE needs channel counts that are multiples of 32.
# 32 channels means one channel per group: every GroupNorm is then an instance norm, which
# removes each channel's mean over the picture -- where a flat background's colour lives.
# The UNet is therefore 64 channels wide (two per group; its out norm is in series with the
# prediction).  The autoencoder keeps 32 at full resolution: 64 there costs 4x per step and
# did not learn faster per step in short trials (see models/demo/README.md).
VAE = dict(embed_dim=4, ch=32, out_ch=3, ch_mult=[1, 1, 2, 2], num_res_blocks=1, attn_resolutions=[],
           resolution=64, z_channels=4)
TEXT = dict(vocab=49408, ctx=77, width=32, layers=2, heads=2, hidden=128)
UNET = dict(in_channels=4, out_channels=4, model_channels=64, attention_resolutions=[1, 2], num_res_blocks=1,
            channel_mult=[1, 1], num_heads=2, num_head_channels=-1, transformer_depth=1, context_dim=32,
            use_linear_in_transformer=False)
LINEAR_START, LINEAR_END, TIMESTEPS = 0.00085, 0.012, 1000
BOS, EOS = 49406, 49407


# --------------------------------------------------------------------------- CLIP tokenizer

class ClipTokenizer:
    """CLIP's BPE on the tokenizer files of models/clip, enough for the demo world's plain
    lowercase ASCII captions (the C++ tokenizer does the full job at run time; train_demo
    compares the two with --check-tokenizer)."""

    WORD = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d|[a-z]+|[0-9]|[^\sa-z0-9]+")

    def __init__(self, folder):
        with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
            self.vocab = json.load(f)
        with open(os.path.join(folder, "merges.txt"), encoding="utf-8") as f:
            lines = f.read().split("\n")[1:]
        self.ranks = {tuple(line.split()): i for i, line in enumerate(lines) if line}
        self.cache = {}

    def bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        parts = list(word[:-1]) + [word[-1] + "</w>"]
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b), math.inf), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            rank, a = min(pairs)  # the best-ranked pair, leftmost on ties
            if rank == math.inf:
                break
            first, second = parts[a], parts[a + 1]
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == first and parts[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        self.cache[word] = parts
        return parts

    def encode(self, text):
        text = " ".join(text.lower().split())
        if not text.isascii():
            raise ValueError(f"demo tokenizer takes ASCII captions only: {text!r}")
        return [self.vocab[t] for w in self.WORD.findall(text) for t in self.bpe(w)]

    def ids(self, text, length=77):
        body = self.encode(text)[:length - 2]
        ids = [BOS] + body + [EOS]
        return ids + [EOS] * (length - len(ids))


# --------------------------------------------------------------------------- VAE encoder

class EncoderDownsample(nn.Module):
    """CompVis Downsample(with_conv): pad right and bottom by one, 3x3 stride-2 conv."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class EncoderLevel(nn.Module):
    def __init__(self, cin, cout, num_blocks, downsample):
        super().__init__()
        self.block = nn.ModuleList()
        for _ in range(num_blocks):
            self.block.append(ResnetBlock(cin, cout))
            cin = cout
        self.attn = nn.ModuleList()  # attn_resolutions is empty: no attention here
        if downsample:
            self.downsample = EncoderDownsample(cout)

    def forward(self, x):
        for b in self.block:
            x = b(x)
        return self.downsample(x) if hasattr(self, "downsample") else x


class Encoder(nn.Module):
    """CompVis ldm.modules.diffusionmodules.model.Encoder (double_z), same parameter names."""

    def __init__(self, ch, ch_mult, num_res_blocks, z_channels, in_channels=3):
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, ch, 3, padding=1)
        levels, cin = [], ch
        for i, m in enumerate(ch_mult):
            levels.append(EncoderLevel(cin, ch * m, num_res_blocks, i != len(ch_mult) - 1))
            cin = ch * m
        self.down = nn.ModuleList(levels)
        self.mid = DecoderMid(cin)  # block_1, attn_1, block_2: the same names as the Encoder's mid
        self.norm_out = vae_norm(cin)
        self.conv_out = nn.Conv2d(cin, 2 * z_channels, 3, padding=1)

    def forward(self, x):
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
        return self.conv_out(swish(self.norm_out(self.mid(h))))


class AutoencoderKL(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.encoder = Encoder(cfg["ch"], cfg["ch_mult"], cfg["num_res_blocks"], cfg["z_channels"])
        self.quant_conv = nn.Conv2d(2 * cfg["z_channels"], 2 * cfg["embed_dim"], 1)
        # post_quant_conv + decoder: the very module the export scripts
        self.dec = VAEDecoder(**cfg)

    def encode(self, x):
        mean, logvar = self.quant_conv(self.encoder(x)).chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)

    def decode(self, z):
        return self.dec(z)


# --------------------------------------------------------------------------- helpers

def to_pixels(images_uint8):
    return torch.from_numpy(images_uint8).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def from_pixels(x):
    return ((x.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()


def alphas_cumprod():
    betas = torch.linspace(LINEAR_START ** 0.5, LINEAR_END ** 0.5, TIMESTEPS, dtype=torch.float64) ** 2
    return torch.cumprod(1.0 - betas, 0).float()


def cosine_lr(step, total, base, warmup):
    if step < warmup:
        return base * (step + 1) / warmup
    p = (step - warmup) / max(total - warmup, 1)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


class EMA:
    def __init__(self, modules, decay):
        self.decay = decay
        self.params = [p for m in modules for p in m.parameters()]
        self.shadow = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self, step):
        d = min(self.decay, (1 + step) / (10 + step))  # follow closely at first
        for s, p in zip(self.shadow, self.params):
            s.mul_(d).add_(p.detach(), alpha=1 - d)

    @torch.no_grad()
    def swap(self):
        """Exchange live and EMA weights (call twice to undo)."""
        for s, p in zip(self.shadow, self.params):
            tmp = p.detach().clone()
            p.copy_(s)
            s.copy_(tmp)


def save_checkpoint(path, tensors, metadata):
    """demo.safetensors, tensors in name order; written beside and moved into place, so an
    interrupted run keeps the previous checkpoint."""
    tmp = path + ".tmp"
    write_safetensors(tmp, [(name, tensors[name]) for name in sorted(tensors)], metadata)
    os.replace(tmp, path)


def ldm_yaml(scale_factor):
    u, v = UNET, VAE
    return f"""# The demo model (models/demo/train_demo.py): SD 1.x architecture family, tiny sizes.
# Same schema as CompVis configs/stable-diffusion/v1-inference.yaml; text encoder sizes
# (FrozenCLIPEmbedder takes none) are in text_encoder.json.
model:
  base_learning_rate: 1.0e-04
  target: ldm.models.diffusion.ddpm.LatentDiffusion
  params:
    linear_start: {LINEAR_START}
    linear_end: {LINEAR_END}
    num_timesteps_cond: 1
    log_every_t: 200
    timesteps: {TIMESTEPS}
    first_stage_key: "jpg"
    cond_stage_key: "txt"
    image_size: 8               # latent size: 64x64 pictures (SD 1.x: 64 -> 512x512)
    channels: 4
    cond_stage_trainable: true
    conditioning_key: crossattn
    monitor: val/loss_simple_ema
    scale_factor: {scale_factor}         # 1 / std of the training latents (SD 1.x: 0.18215)
    use_ema: False

    unet_config:
      target: ldm.modules.diffusionmodules.openaimodel.UNetModel
      params:
        image_size: 8
        in_channels: {u['in_channels']}
        out_channels: {u['out_channels']}
        model_channels: {u['model_channels']}
        attention_resolutions: {u['attention_resolutions']}
        num_res_blocks: {u['num_res_blocks']}
        channel_mult: {u['channel_mult']}
        num_heads: {u['num_heads']}
        use_spatial_transformer: True
        transformer_depth: {u['transformer_depth']}
        context_dim: {u['context_dim']}
        use_checkpoint: False
        legacy: False

    first_stage_config:
      target: ldm.models.autoencoder.AutoencoderKL
      params:
        embed_dim: {v['embed_dim']}
        monitor: val/rec_loss
        ddconfig:
          double_z: true
          z_channels: {v['z_channels']}
          resolution: {v['resolution']}
          in_channels: 3
          out_ch: {v['out_ch']}
          ch: {v['ch']}
          ch_mult: {v['ch_mult']}
          num_res_blocks: {v['num_res_blocks']}
          attn_resolutions: []
          dropout: 0.0
        lossconfig:
          target: torch.nn.Identity

    cond_stage_config:
      target: ldm.modules.encoders.modules.FrozenCLIPEmbedder
"""


def text_config():
    t = TEXT
    return {
        "comment": "CLIP text transformer sizes of the demo model (models/demo/train_demo.py). Keys: "
                   "cond_stage_model.transformer.text_model.* (HF CLIPTextModel names).",
        "vocab": t["vocab"], "ctx": t["ctx"], "width": t["width"], "layers": t["layers"], "heads": t["heads"],
        "hf_config": {"vocab_size": t["vocab"], "hidden_size": t["width"], "intermediate_size": t["hidden"],
                      "num_hidden_layers": t["layers"], "num_attention_heads": t["heads"],
                      "max_position_embeddings": t["ctx"], "hidden_act": "quick_gelu", "layer_norm_eps": 1e-05,
                      "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": EOS},
    }


# --------------------------------------------------------------------------- training

def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_dataset(seed, count):
    captions, images = [], np.empty((count, demo_world.SIZE, demo_world.SIZE, 3), dtype=np.uint8)
    for i in range(count):
        text, images[i] = demo_world.training_item(seed, i)
        captions.append(text)
    held = set(demo_world.held_out_captions())
    assert not held & set(captions), "a held-out caption was drawn for training"
    return captions, images


def train_vae(vae, images, steps, batch, gen, lr=2e-3, kl_weight=1e-5, full_steps=0, shape_weight=0.0):
    """`steps` on 32x32 crops (a quarter of the cost: the autoencoder is convolutional), then
    `full_steps` on whole pictures at half the batch, so the mid-block attention also sees
    the 8x8 latent grid it decodes at run time.  Pixels of the shape weigh 1 + shape_weight
    in the loss: the shape is a small part of the picture, and without the extra weight its colour
    was what the autoencoder got wrong (green and purple decoded as grey, black or blue)."""
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    n, start, total = len(images), time.time(), steps + full_steps
    for step in range(total):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, total, lr, 100)
        full = step >= steps
        idx = torch.randint(0, n, (batch // 2 if full else batch,), generator=gen)
        x = to_pixels(images[idx.numpy()])
        # The top-left pixel is always background in this world (no shape reaches a corner).
        w = 1.0 + shape_weight * ((x - x[:, :, :1, :1]).abs().sum(1, keepdim=True) > 0.1).float()
        if not full:  # crop on the latent grid (multiples of 8), as the whole picture is cut
            ox, oy = (8 * torch.randint(0, 5, (2,), generator=gen)).tolist()
            x = x[:, :, oy:oy + 32, ox:ox + 32]
            w = w[:, :, oy:oy + 32, ox:ox + 32]
        mean, logvar = vae.encode(x)
        z = mean + torch.exp(0.5 * logvar) * torch.randn(mean.shape, generator=gen)
        rec = vae.decode(z)
        err = rec - x
        rec_loss = (w * (err.abs() + err * err)).mean() / w.mean()
        kl = 0.5 * (mean ** 2 + logvar.exp() - 1.0 - logvar).mean()
        loss = rec_loss + kl_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == total - 1:
            log(f"vae {step}/{total} rec {rec_loss.item():.4f} kl {kl.item():.2f} ({time.time() - start:.0f} s)")
    return rec_loss.item()


@torch.no_grad()
def encode_all(vae, images, batch=256):
    means, stds = [], []
    for i in range(0, len(images), batch):
        mean, logvar = vae.encode(to_pixels(images[i:i + batch]))
        means.append(mean)
        stds.append(torch.exp(0.5 * logvar))
    return torch.cat(means), torch.cat(stds)


@torch.no_grad()
def sample(unet, text, vae, tok, captions, scale_factor, scale=7.5, steps=25, seed=1234):
    """DDIM (eta 0) with classifier-free guidance, for the evaluation during training only
    (the CLI's own samplers judge the exported model)."""
    ac = alphas_cumprod()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((len(captions), 4, 8, 8), generator=g)
    cond = text(torch.tensor([tok.ids(c) for c in captions]))
    uncond = text(torch.tensor([tok.ids("")] * len(captions)))
    ts = list(range(0, TIMESTEPS, TIMESTEPS // steps))[::-1]
    for i, t in enumerate(ts):
        tt = torch.full((len(captions),), t, dtype=torch.long)
        e = unet(torch.cat([x, x]), torch.cat([tt, tt]), torch.cat([uncond, cond]))
        e_u, e_c = e.chunk(2)
        eps = e_u + scale * (e_c - e_u)
        a = ac[t]
        a_prev = ac[ts[i + 1]] if i + 1 < len(ts) else ac.new_tensor(1.0)
        x0 = (x - (1 - a).sqrt() * eps) / a.sqrt()
        x = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps
    return from_pixels(vae.decode(x / scale_factor))


def evaluate(unet, text, vae, tok, scale_factor, train_captions=()):
    """Held-out pass rates (16 captions x 2 seeds) at guidance 7.5 and 1, and at 7.5 on 16
    training captions (tells underfitting from failing to generalise)."""
    held = demo_world.held_out_captions()
    out = {}
    for name, captions, scale in (("7.5", held * 2, 7.5), ("1.0", held * 2, 1.0),
                                  ("train 7.5", list(train_captions), 7.5)):
        if not captions:
            continue
        images = sample(unet, text, vae, tok, captions, scale_factor, scale=scale)
        out[name] = sum(demo_world.check(im, c)[0] for im, c in zip(images, captions)) / len(captions)
    return out


def checkpoint_tensors(unet, text, vae):
    sd = {}
    for k, v in unet.state_dict().items():
        sd["model.diffusion_model." + k] = v
    for k, v in text.state_dict().items():
        sd["cond_stage_model.transformer." + k] = v
    for k, v in vae.encoder.state_dict().items():
        sd["first_stage_model.encoder." + k] = v
    for k, v in vae.quant_conv.state_dict().items():
        sd["first_stage_model.quant_conv." + k] = v
    for k, v in vae.dec.state_dict().items():  # post_quant_conv.*, decoder.*
        sd["first_stage_model." + k] = v
    # fp16 halves the file; the export reads it back as float32.
    return {k: v.half() for k, v in sd.items()}


def save(out, unet, text, vae, scale_factor, meta):
    os.makedirs(out, exist_ok=True)
    save_checkpoint(os.path.join(out, "demo.safetensors"), checkpoint_tensors(unet, text, vae),
                    {k: str(v) for k, v in meta.items()})
    with open(os.path.join(out, "v1-demo.yaml"), "w", encoding="utf-8") as f:
        f.write(ldm_yaml(scale_factor))
    with open(os.path.join(out, "text_encoder.json"), "w", encoding="utf-8") as f:
        json.dump(text_config(), f, indent=1)
        f.write("\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(REPO, "models", "demo"))
    p.add_argument("--seed", type=int, default=0)
    # One thread: on a shared 2-core machine two OpenMP threads wait on each other at every op
    # (measured 5x slower per step than one thread while another job held a core).
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--images", type=int, default=4000, help="training pictures drawn from the world")
    p.add_argument("--vae-steps", type=int, default=3000, help="autoencoder steps on 32x32 crops")
    p.add_argument("--vae-full-steps", type=int, default=600, help="then on whole 64x64 pictures (half the batch)")
    p.add_argument("--vae-batch", type=int, default=16)
    p.add_argument("--vae-lr", type=float, default=2e-3)
    p.add_argument("--vae-shape-weight", type=float, default=3.0,
                   help="extra loss weight of the shape's pixels in the autoencoder (0: every pixel alike)")
    p.add_argument("--steps", type=int, default=6000, help="UNet + text encoder steps")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=200, help="UNet learning-rate warmup steps")
    p.add_argument("--t-tilt", type=float, default=0.0,
                   help="timestep t is drawn with probability proportional to 1 + tilt * t / 999: more of the "
                        "high-noise steps, where colours and position are decided (0: uniform)")
    p.add_argument("--weight-cap", type=float, default=20.0,
                   help="each sample's eps error is weighted by min(1 / alpha_bar_t, cap), normalised "
                        "(1: the plain SD loss)")
    p.add_argument("--unet-channels", type=int, default=UNET["model_channels"], help="UNet model_channels")
    p.add_argument("--evals", type=int, default=4, help="evaluations (and checkpoints) during UNet training")
    p.add_argument("--keep", help="also keep a copy of every evaluated checkpoint under this folder")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    UNET["model_channels"] = args.unet_channels
    torch.manual_seed(args.seed)
    t0 = time.time()
    tok = ClipTokenizer(os.path.join(REPO, "models", "clip"))

    n_images = args.images
    captions, images = make_dataset(args.seed, n_images)
    log(f"{n_images} pictures drawn in {time.time() - t0:.0f} s")

    gen = torch.Generator().manual_seed(args.seed)
    vae = AutoencoderKL(VAE)
    unet = UNetModel(**UNET)
    text = TextEncoder(TEXT["vocab"], TEXT["ctx"], TEXT["width"], TEXT["layers"], TEXT["heads"], TEXT["hidden"])
    for m in unet.modules():  # all heads in one matmul: much faster backward than the per-head loop
        if hasattr(m, "attention_mode"):
            m.attention_mode = 0
    # Only the world's words get embeddings; every other row stays exactly zero (Adam leaves a
    # never-used row alone), which keeps unseen words neutral and the file compressible.
    used = sorted({i for c in set(captions) | {""} for i in tok.ids(c)})
    gen_init = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():
        emb = text.text_model.embeddings.token_embedding.weight
        keep = torch.zeros(emb.shape[0], dtype=torch.bool)
        keep[used] = True
        emb.mul_(0.02 * keep[:, None].float())
        # CLIP's own init scale for the positions (0.01; nn.Embedding's default is std 1): with
        # std-1 positions next to std-0.02 tokens every caption looked alike to the UNet and the
        # first ~1000 steps learned an unconditional model (pictures ignored their captions).
        text.text_model.embeddings.position_embedding.weight.normal_(0.0, 0.01, generator=gen_init)
        # Start the UNet as a zero predictor so early steps do not fight a random output.
        unet.out[2].weight.zero_()
        unet.out[2].bias.zero_()
    log(f"parameters: vae {sum(p.numel() for p in vae.parameters()) / 1e6:.2f} M, unet "
        f"{sum(p.numel() for p in unet.parameters()) / 1e6:.2f} M, text "
        f"{sum(p.numel() for p in text.parameters()) / 1e6:.2f} M ({len(used)} vocabulary rows used)")

    # 1. the autoencoder
    t = time.time()
    rec = train_vae(vae, images, args.vae_steps, args.vae_batch, gen, lr=args.vae_lr, full_steps=args.vae_full_steps,
                    shape_weight=args.vae_shape_weight)
    vae.eval().requires_grad_(False)
    vae_time = time.time() - t
    # 2. latents and their scale
    mean, std = encode_all(vae, images)
    z = mean + std * torch.randn(mean.shape, generator=gen)
    scale_factor = float(f"{1.0 / z.std().item():.5g}")
    log(f"vae done in {vae_time:.0f} s (rec {rec:.4f}); latent std {z.std().item():.4f} -> scale_factor {scale_factor}")
    # The UNet can only draw what the autoencoder gives back: judge its reconstructions
    # with the same check the end-to-end test uses.
    with torch.no_grad():
        recon = from_pixels(vae.decode(mean[:256]))
    vae_pass = sum(demo_world.check(recon[i], captions[i])[0] for i in range(len(recon))) / len(recon)
    log(f"autoencoder: {vae_pass:.0%} of {len(recon)} training pictures pass demo_world.check after decode(encode(x))")
    # 3. UNet + text encoder
    meta = {"seed": args.seed, "threads": args.threads, "images": args.images, "vae_steps": args.vae_steps,
            "vae_check_pass": vae_pass,
            "vae_full_steps": args.vae_full_steps, "vae_batch": args.vae_batch, "vae_lr": args.vae_lr,
            "vae_shape_weight": args.vae_shape_weight, "weight_cap": args.weight_cap,
            "unet_channels": args.unet_channels, "steps": args.steps, "batch": args.batch, "lr": args.lr,
            "warmup": args.warmup, "t_tilt": args.t_tilt, "scale_factor": scale_factor}
    history = []

    def on_eval(step, ema, loss):
        ema.swap()
        unet.eval(), text.eval()
        scores = evaluate(unet, text, vae, tok, scale_factor, captions[:16])
        meta_now = dict(meta, trained_steps=step, minutes=round((time.time() - t0) / 60, 1))
        save(args.out, unet, text, vae, scale_factor, meta_now)
        if args.keep:  # a copy of every evaluated checkpoint, to compare them with the CLI
            save(os.path.join(args.keep, f"step{step:05d}"), unet, text, vae, scale_factor, meta_now)
        ema.swap()
        unet.train(), text.train()
        history.append({"step": step, "loss": loss, "held_out_pass": scores, "minutes": meta_now["minutes"]})
        log(f"eval at step {step}: held-out pass rate {scores} (checkpoint saved)")

    train_unet(unet, text, tok, captions, mean, std, scale_factor, args.steps, args.batch, args.lr, gen,
               evals=args.evals, on_eval=on_eval, warmup=args.warmup, t_tilt=args.t_tilt, weight_cap=args.weight_cap)
    total = time.time() - t0
    size = os.path.getsize(os.path.join(args.out, "demo.safetensors"))
    record = dict(meta, command=" ".join(["models/demo/train_demo.py"] + (argv if argv is not None else sys.argv[1:])),
                  torch=torch.__version__, wall_seconds=round(total), vae_seconds=round(vae_time),
                  vae_rec_loss=rec, history=history, checkpoint_bytes=size)
    with open(os.path.join(args.out, "train_log.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    log(f"done in {total / 60:.1f} min; {args.out}/demo.safetensors {size / 2**20:.2f} MiB")
    return 0


def train_unet(unet, text, tok, captions, mean, std, scale_factor, steps, batch, lr, gen, evals=0, on_eval=None,
               warmup=100, t_tilt=0.0, weight_cap=1.0):
    ac = alphas_cumprod()
    ids = torch.tensor([tok.ids(c) for c in captions])
    empty = torch.tensor(tok.ids(""))
    params = list(unet.parameters()) + list(text.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    ema = EMA([unet, text], 0.995)  # a ~200-step window: the whole run is only a few thousand steps
    # Still the SD eps objective and schedule; only how often each timestep is drawn is tilted.
    t_weights = 1.0 + t_tilt * torch.arange(TIMESTEPS, dtype=torch.float64) / (TIMESTEPS - 1)
    # Each sample's eps error weighted by min(1 / alpha_bar_t, cap), normalised to mean 1 over
    # the drawn timesteps.  The plain eps loss (cap 1) weighs the picture's error at timestep t
    # by SNR(t), 0.04 at t = 800, where a flat picture's colours are decided and only the
    # caption can tell them; weighting by 1 / alpha_bar = 1 + 1 / SNR lifts that to
    # SNR + 1 (capped: 0.77 at t = 800 with cap 20).
    loss_w = (1.0 / ac).clamp(max=weight_cap)
    loss_w = (loss_w / (loss_w.double() * t_weights / t_weights.sum()).sum()).float()
    n, start, avg = len(captions), time.time(), None
    eval_at = {round(steps * (k + 1) / evals) for k in range(evals)} if evals else set()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, lr, warmup)
        idx = torch.randint(0, n, (batch,), generator=gen)
        z0 = (mean[idx] + std[idx] * torch.randn((batch, 4, 8, 8), generator=gen)) * scale_factor
        tok_ids = ids[idx].clone()
        drop = torch.rand(batch, generator=gen) < 0.1  # caption dropout: the model also learns ""
        tok_ids[drop] = empty
        t = torch.multinomial(t_weights, batch, replacement=True, generator=gen)
        noise = torch.randn(z0.shape, generator=gen)
        a = ac[t][:, None, None, None]
        x = a.sqrt() * z0 + (1 - a).sqrt() * noise
        loss = (loss_w[t] * (unet(x, t, text(tok_ids)) - noise).pow(2).mean((1, 2, 3))).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ema.update(step)
        avg = loss.item() if avg is None else 0.99 * avg + 0.01 * loss.item()
        if step % 100 == 0 or step == steps - 1:
            log(f"unet {step}/{steps} loss {avg:.4f} ({time.time() - start:.0f} s)")
        if on_eval and step + 1 in eval_at:
            on_eval(step + 1, ema, avg)
    return avg


if __name__ == "__main__":
    sys.exit(main())
