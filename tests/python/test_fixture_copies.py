"""The fixture copies in tests/fixtures must stay byte-identical to the shared
conformance set they were copied from, when that set is next to the checkout
(it is not in a plain clone; then these tests are skipped)."""
import os
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "fixtures"))
SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "conformance"))


class FixtureCopies(unittest.TestCase):
    @unittest.skipUnless(os.path.isdir(SHARED), "no ../shared/conformance next to the checkout")
    def test_every_copied_file_matches_the_shared_original(self):
        compared = 0
        for root, _, files in os.walk(FIXTURES):
            for name in files:
                copy = os.path.join(root, name)
                original = os.path.join(SHARED, os.path.relpath(copy, FIXTURES))
                if not os.path.exists(original):
                    continue  # made here (e.g. a README extract), not a copy
                with open(copy, "rb") as a, open(original, "rb") as b:
                    self.assertEqual(a.read(), b.read(), f"{copy} differs from {original}")
                compared += 1
        # tiny/ alone holds the checkpoint, configs and 4 cases of 18 files each.
        self.assertGreater(compared, 70)

    @unittest.skipUnless(os.path.isdir(SHARED), "no ../shared/conformance next to the checkout")
    def test_copied_sets_are_complete(self):
        # Whole sets copied for the k-sampler and SD 2.x tests; tiny2.ckpt is
        # not copied (the tests make it from tiny2.safetensors).
        not_copied = {os.path.join("tiny2", "tiny2.ckpt")}
        for sub in ("tiny/cases_k", "tiny2"):
            mine, shared = os.path.join(FIXTURES, sub), os.path.join(SHARED, sub)
            expected = {f for f in files_under(shared) if os.path.join(sub, f) not in not_copied}
            self.assertEqual(files_under(mine), expected, sub)


def files_under(root):
    found = set()
    for d, _, names in os.walk(root):
        for n in names:
            found.add(os.path.relpath(os.path.join(d, n), root))
    return found


if __name__ == "__main__":
    unittest.main()
