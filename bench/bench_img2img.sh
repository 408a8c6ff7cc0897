#!/usr/bin/env bash
# img2img and inpainting at full size (issue 33), on models exported with random weights:
#   /usr/bin/python3 scripts/export_model.py --random-init --out WORK/sd15
#   /usr/bin/python3 scripts/export_model.py --random-init --config bench/v1-inpainting-inference.yaml --out WORK/sd15-inpaint
#   bench/bench_img2img.sh WORK [THREADS] [all|img2img|inpaint]
# Prints, for 512x512 and DDIM: txt2img at 20 steps against img2img at strength
# 0.5 (UNet evaluations from --verbose, wall time, peak RSS), the encoder stage's
# time and peak, and the seconds per step of the inpainting UNet (9 channels)
# against the plain one (4 channels, latent blending), from runs of 2 and 4 steps.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$1
threads=${2:-2}
part=${3:-all}
cli=build/sd-txt2img
/usr/bin/python3 - "$work" <<'PY'
import sys
from PIL import Image, ImageDraw
w = sys.argv[1]
img = Image.new("RGB", (512, 512), (40, 70, 160))
d = ImageDraw.Draw(img)
d.ellipse((128, 128, 384, 384), fill=(220, 40, 30))
img.save(w + "/init.png")
mask = Image.new("L", (512, 512), 0)
ImageDraw.Draw(mask).rectangle((160, 160, 352, 352), fill=255)
mask.save(w + "/mask.png")
PY
run() {  # label, args...
  local label=$1; shift
  local out; out=$(mktemp -d)
  /usr/bin/time -f "$label: %e s wall, peak RSS %M KiB" "$cli" --threads "$threads" --quiet --verbose --seed 1 \
    --prompt "a yellow circle on a blue background" --sampler ddim --H 512 --W 512 --outdir "$out" "$@" 2>&1 >/dev/null |
    grep -E "wall|model evaluations|vae encoder peak|unet +peak|error" | sed "s/^/  /"
  rm -rf "$out"
}
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $threads threads, load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$part" != inpaint ]; then
  run "txt2img 20 steps" --model "$work/sd15" --steps 20
  run "img2img 20 steps strength 0.5" --model "$work/sd15" --steps 20 --init-img "$work/init.png" --strength 0.5
fi
[ "$part" = img2img ] && exit 0
for m in sd15 sd15-inpaint; do
  for s in 2 4; do
    run "inpaint $m $s steps" --model "$work/$m" --steps "$s" --strength 1 --init-img "$work/init.png" --mask "$work/mask.png"
  done
done
