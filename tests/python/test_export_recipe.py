"""The export's sampler recipe flags (--default-sampler, --default-steps, --default-schedule,
--default-scale): what model.json will hold, and the combinations the C++ tool would refuse."""

import contextlib
import io
import unittest

from sd_export.cli import parse_args


def parse(*extra):
    return parse_args(["model.safetensors", "--out", "out", *extra])


class ExportRecipeFlags(unittest.TestCase):
    def test_lcm_and_turbo_recipes(self):
        a = parse("--default-sampler", "lcm", "--default-steps", "4", "--default-scale", "1")
        self.assertEqual((a.default_sampler, a.default_steps, a.guidance_scale), ("lcm", 4, 1.0))
        a = parse("--default-sampler", "euler_a", "--default-schedule", "trailing", "--default-steps", "1")
        self.assertEqual((a.default_sampler, a.default_schedule, a.default_steps), ("euler_a", "trailing", 1))
        a = parse()
        self.assertIsNone(a.default_sampler)

    def test_refused_recipes(self):
        bad = [
            ("--default-sampler", "heun"),
            ("--default-steps", "4"),  # no sampler
            ("--default-schedule", "trailing"),  # no sampler
            ("--default-sampler", "lcm", "--default-steps", "51"),
            ("--default-sampler", "lcm", "--default-schedule", "trailing"),
            ("--default-sampler", "dpmpp_2m", "--default-schedule", "trailing"),
            ("--default-sampler", "euler", "--default-steps", "0"),
            ("--default-scale", "0"),
        ]
        for extra in bad:
            with self.subTest(extra), contextlib.redirect_stderr(io.StringIO()) as err:
                with self.assertRaises(SystemExit) as e:
                    parse(*extra)
                self.assertEqual(e.exception.code, 2)
                self.assertIn("error:", err.getvalue())


if __name__ == "__main__":
    unittest.main()
