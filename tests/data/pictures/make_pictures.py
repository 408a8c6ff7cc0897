#!/usr/bin/python3
"""Writes the crafted pictures of tests/unit/test_image_reader.cpp and what
PIL (the references' reader) makes of them: for each NAME.EXT, NAME.EXT.rgb =
Image.open(f).convert("RGB").tobytes() and NAME.EXT.l = convert("L").tobytes(),
listed in expected.txt as "file width height". Also the seed corpus of the
image_reader fuzz harness (tests/fuzz/corpus/image_reader/: a first byte whose
low bit picks the mask reader, then the file).

Run with Debian's /usr/bin/python3 (PIL 9.4, numpy); the files are committed,
so this is only needed to remake them. PNGs are assembled by hand (struct +
zlib) where PIL cannot write the kind (16-bit RGB, grey+alpha 16-bit, low bit
depths, tRNS)."""
import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent.parent / "fuzz" / "corpus" / "image_reader"
rng = np.random.default_rng(33)


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(w, h, depth, ctype, rows, extra=b""):
    raw = b"".join(b"\x00" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0)) + extra
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def u8(shape):
    return rng.integers(0, 256, shape, dtype=np.uint8)


def u16(shape):
    # every range: below 256 (where clamping and the high byte differ), mid, top
    v = rng.integers(0, 65536, shape, dtype=np.uint32)
    v.flat[::3] = rng.integers(0, 300, v.flat[::3].shape)
    return v


def rows16(a):
    return [b"".join(struct.pack(">H", int(x)) for x in r.reshape(-1)) for r in a]


def pil_bytes(img, **kw):
    f = io.BytesIO()
    img.save(f, **kw)
    return f.getvalue()


files = {}
files["rgb8.png"] = pil_bytes(Image.fromarray(u8((5, 7, 3))), format="PNG")
rgba = u8((5, 7, 4))
rgba[0, :, 3] = 0  # fully transparent pixels keep their colour
files["rgba8.png"] = pil_bytes(Image.fromarray(rgba), format="PNG")
files["la8.png"] = pil_bytes(Image.fromarray(u8((4, 6, 2)), "LA"), format="PNG")
files["grey8.png"] = pil_bytes(Image.fromarray(u8((6, 5))), format="PNG")
files["grey2.png"] = png(8, 2, 2, 0, [bytes([0b00011011, 0b11100100]), bytes([0b01010101, 0b10101010])])
files["grey1.png"] = png(9, 2, 1, 0, [bytes([0b10110010, 0b10000000]), bytes([0b01001101, 0])])
files["pal_trns.png"] = png(4, 2, 8, 3, [bytes([0, 1, 2, 3]), bytes([3, 2, 1, 0])],
                            chunk(b"PLTE", bytes([255, 0, 0, 0, 255, 0, 0, 0, 255, 90, 80, 70]))
                            + chunk(b"tRNS", bytes([0, 128])))
# Indices past a short PLTE: PIL gives index i the grey (i, i, i).
files["pal_short.png"] = png(4, 1, 8, 3, [bytes([0, 1, 5, 200])], chunk(b"PLTE", bytes([10, 20, 30, 40, 50, 60])))
files["pal_short2.png"] = png(4, 1, 2, 3, [bytes([0b00011011])], chunk(b"PLTE", bytes([10, 20, 30, 40, 50, 60])))
files["rgb_trns.png"] = png(3, 1, 8, 2, [bytes([1, 2, 3, 9, 9, 9, 200, 100, 0])], chunk(b"tRNS", struct.pack(">HHH", 9, 9, 9)))
files["rgb16.png"] = png(5, 3, 16, 2, rows16(u16((3, 5 * 3))))
files["rgba16.png"] = png(5, 3, 16, 6, rows16(u16((3, 5 * 4))))
files["la16.png"] = png(5, 3, 16, 4, rows16(u16((3, 5 * 2))))
files["grey16.png"] = png(6, 3, 16, 0, rows16(u16((3, 6))))
files["grey16_trns.png"] = png(6, 2, 16, 0, rows16(u16((2, 6))), chunk(b"tRNS", struct.pack(">H", 300)))
files["rgb24.bmp"] = pil_bytes(Image.fromarray(u8((5, 7, 3))), format="BMP")
files["pal8.bmp"] = pil_bytes(Image.fromarray(u8((4, 5, 3))).quantize(6), format="BMP")
files["bw1.bmp"] = pil_bytes(Image.fromarray(u8((3, 10)) > 127), format="BMP")
files["rgba32.bmp"] = pil_bytes(Image.fromarray(rgba), format="BMP")
files["grey8.bmp"] = pil_bytes(Image.fromarray(u8((4, 6))), format="BMP")
smooth = np.stack(np.meshgrid(np.linspace(0, 255, 24), np.linspace(40, 200, 16)), -1)
smooth = np.concatenate([smooth, smooth[..., :1] * 0 + 128], -1).astype(np.uint8)
files["rgb.jpg"] = pil_bytes(Image.fromarray(smooth), format="JPEG", quality=95)
files["grey.jpg"] = pil_bytes(Image.fromarray(smooth[..., 0]), format="JPEG", quality=95)
# EXIF orientation (a phone's portrait photo is stored sideways with tag 6): PIL's
# Image.open, as the references call it, decodes the pixels as stored.
exif = Image.Exif()
exif[0x0112] = 6
files["exif6.jpg"] = pil_bytes(Image.fromarray(smooth), format="JPEG", quality=95, exif=exif.tobytes())
exif[0x0112] = 8
files["exif8.png"] = pil_bytes(Image.fromarray(u8((4, 6, 3))), format="PNG", exif=exif.tobytes())

listing = []
for name, data in sorted(files.items()):
    (HERE / name).write_bytes(data)
    img = Image.open(io.BytesIO(data))
    rgb, grey = img.convert("RGB"), img.convert("L")
    (HERE / (name + ".rgb")).write_bytes(rgb.tobytes())
    (HERE / (name + ".l")).write_bytes(grey.tobytes())
    listing.append(f"{name} {img.width} {img.height}  # PIL mode {img.mode}")
(HERE / "expected.txt").write_text("\n".join(listing) + "\n")

# Not a picture to compare: a 64x64 PNG whose zlib stream inflates to 64 MiB
# (stb_image would grow its buffer to hold it all; PIL reads what it needs).
big = zlib.compressobj(9)
stream = big.compress(b"\x00" * (64 << 20)) + big.flush()
(HERE / "inflates_64mib.png").write_bytes(
    b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0)) + chunk(b"IDAT", stream)
    + chunk(b"IEND", b""))

CORPUS.mkdir(parents=True, exist_ok=True)
for i, name in enumerate(["rgb8.png", "la8.png", "rgb16.png", "grey16.png", "pal_trns.png", "rgb24.bmp", "bw1.bmp",
                          "rgb.jpg", "grey.jpg", "exif6.jpg", "exif8.png"]):
    (CORPUS / name).write_bytes(bytes([i & 1]) + files[name])
