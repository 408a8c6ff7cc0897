"""The fixtures copied into tests/fixtures (so that a clone runs without ../shared) must be
byte-identical to ../shared/conformance where that exists: tiny/cases_k and tiny2/ (whose
tiny2.ckpt is not copied: tests make it from tiny2.safetensors)."""

import filecmp
import os
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
SHARED = os.path.join(REPO, "..", "shared", "conformance")
COPIED = ("tiny/cases_k", "tiny2")
NOT_COPIED = {"tiny2/tiny2.ckpt"}


def files_under(root):
    found = set()
    for d, _, names in os.walk(root):
        for n in names:
            found.add(os.path.relpath(os.path.join(d, n), root))
    return found


class FixtureCopiesTest(unittest.TestCase):
    def test_copies_match_shared_conformance(self):
        if not os.path.isdir(SHARED):
            self.skipTest(f"{SHARED} is not present")
        for sub in COPIED:
            mine, shared = os.path.join(FIXTURES, sub), os.path.join(SHARED, sub)
            self.assertTrue(os.path.isdir(shared), shared)
            expected = {f for f in files_under(shared) if os.path.join(sub, f) not in NOT_COPIED}
            self.assertEqual(files_under(mine), expected, sub)
            for f in sorted(expected):
                self.assertTrue(filecmp.cmp(os.path.join(mine, f), os.path.join(shared, f), shallow=False),
                                os.path.join(sub, f))


if __name__ == "__main__":
    unittest.main()
