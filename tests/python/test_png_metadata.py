"""The PNG "parameters" text of sd-txt2img, read back by an independent reader.

Runs the CLI on the tiny model with a prompt file of 7 prompts, --n_samples 3
--n_iter 3 --json, and checks with PIL (Debian's python3-pil) and a hand-rolled
chunk walker (zlib.crc32) that every image carries an iTXt "parameters" chunk
with a valid CRC whose text equals the JSON line printed for it.

Needs SD_TXT2IMG (the binary) and SD_TEST_MODELS (the exported tiny models);
CTest sets both (test python_png_metadata). Skipped when they are missing, e.g.
when `unittest discover` runs the export tests in this folder.
"""
import json
import os
import struct
import subprocess
import tempfile
import unittest
import zlib

try:
    from PIL import Image, PngImagePlugin
except ImportError:  # pragma: no cover - PIL is a test dependency (python3-pil)
    Image = None

BINARY = os.environ.get("SD_TXT2IMG")
MODELS = os.environ.get("SD_TEST_MODELS")

# A1111's "Model hash" of the tiny model: its checkpoint's SHA-256, first 10 digits.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "tiny", "tiny.safetensors"),
          "rb") as _f:
    TINY_HASH = __import__("hashlib").sha256(_f.read()).hexdigest()[:10]

PROMPTS = ["a red fox", "a blue bird", "un café au lait, 猫 🐱", "a green frog",
           "a yellow sun", "a purple cow", "a white swan"]


def png_chunks(path):
    """(type, data) of every chunk; asserts each CRC."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        ctype = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(ctype + body) & 0xFFFFFFFF == crc, (path, ctype)
        chunks.append((ctype.decode("ascii"), body))
        pos += 12 + length
    return chunks


@unittest.skipUnless(BINARY and MODELS and Image, "needs SD_TXT2IMG, SD_TEST_MODELS and PIL")
class PngMetadata(unittest.TestCase):
    def test_parameters_text_equals_json_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            prompts = os.path.join(tmp, "prompts.txt")
            with open(prompts, "w", encoding="utf-8") as f:
                f.write("# seven prompts\n" + "\n".join(PROMPTS) + "\n")
            out = subprocess.run(
                [BINARY, "--model", os.path.join(MODELS, "tiny-st"), "--from-file", prompts,
                 "--n_samples", "3", "--n_iter", "3", "--H", "64", "--W", "64", "--steps", "4",
                 "--threads", "1", "--outdir", os.path.join(tmp, "out"), "--json", "--quiet"],
                capture_output=True, check=False)
            self.assertEqual(out.returncode, 0, out.stderr.decode())
            self.assertEqual(out.stderr, b"")
            lines = out.stdout.decode("utf-8").splitlines()
            self.assertEqual(len(lines), 21)
            for i, line in enumerate(lines):
                record = json.loads(line)
                self.assertEqual(record["index"], i)
                self.assertEqual(record["prompt"], PROMPTS[i % 7])
                path = record["path"]
                with Image.open(path) as im:
                    self.assertEqual(im.size, (64, 64))
                    im.load()
                    text = im.text["parameters"]
                    # PIL returns iTXt chunks as its iTXt type (a str subclass)
                    self.assertIsInstance(text, PngImagePlugin.iTXt)
                self.assertEqual(str(text), record["parameters"])
                # "Model hash": the checkpoint's SHA-256, first 10 digits (A1111's short hash)
                self.assertTrue(text.startswith(PROMPTS[i % 7] + "\nSteps: 4, Sampler: PLMS, CFG scale: 7.5, "
                                                "Seed: 42, Size: 64x64, Model hash: " + TINY_HASH + ", Model: tiny"),
                                text)
                types = [t for t, _ in png_chunks(path)]
                self.assertEqual(types[0], "IHDR")
                self.assertEqual(types[1], "iTXt")
                self.assertEqual(types[-1], "IEND")
            self.assertEqual(len(os.listdir(os.path.join(tmp, "out"))), 21)


if __name__ == "__main__":
    unittest.main()
