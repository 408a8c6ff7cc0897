"""The inputs tests/fuzz/fuzz_gguf.py found (issue 37): each refused by the GGUF reader in
one line naming the file, where it raised numpy's ValueError before."""

import os
import tempfile
import unittest

import gguf_writer as gw
from sd_export.gguf_io import GgufFile
from sd_export.report import ExportError


class FuzzFindings(unittest.TestCase):
    def refused(self, data, *words):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "x.gguf")
            with open(path, "wb") as f:
                f.write(data)
            with self.assertRaises(ExportError) as cm:
                with GgufFile(path) as g:
                    for key in g.keys():
                        g.load(key)
            message = str(cm.exception)
            self.assertTrue(message.startswith(path), message)
            self.assertNotIn("\n", message)
            for w in words:
                self.assertIn(w, message)

    def test_zero_sized_dimension_beside_a_huge_one(self):
        # [2^63, 0]: no bytes, so within the file; numpy cannot make the array.
        t = gw.f32_tensor("a", [[1.0]])
        t.shape, t.raw = [2 ** 63, 0], b""
        self.refused(gw.build([t]), "'a'", "dimension of 0")

    def test_block_type_without_dimensions(self):
        # A q8_0 scalar: no whole block (it read as 0 bytes, then failed to reshape).
        t = gw.Tensor("q", [], "q8_0", b"")
        self.refused(gw.build([t]), "'q'", "not whole blocks of 32")


if __name__ == "__main__":
    unittest.main()
