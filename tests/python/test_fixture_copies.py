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


if __name__ == "__main__":
    unittest.main()
