"""sd_export.jsonfile: the one JSON reader of the export (text configs, a diffusers folder's
configs, the tokenizer's vocabulary). Every bad file is one ExportError line naming it."""

import json
import os
import tempfile
import unittest

from sd_export import diffusers_layout, jsonfile
from sd_export.configs import load_text_config
from sd_export.report import ExportError
from sd_export.stages import read_vocab


class JsonReader(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="sd-jsonfile-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, data):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def error_of(self, read, path):
        with self.assertRaises(ExportError) as ctx:
            read(path)
        line = str(ctx.exception)
        self.assertEqual(len(line.splitlines()), 1, line)
        self.assertIn(path, line)
        return line

    def test_reads_an_object(self):
        path = self.write("ok.json", json.dumps({"a": [1, 2], "b": "é"}).encode())
        self.assertEqual(jsonfile.read_json_object(path), {"a": [1, 2], "b": "é"})

    def test_bad_files_are_one_line_naming_the_file(self):
        cases = {
            "missing": (os.path.join(self.dir, "nope.json"), "cannot read"),
            "a folder": (self.dir, "not a regular file"),
            "invalid": (self.write("bad.json", b'{"a": '), "not valid JSON"),
            "not utf-8": (self.write("latin.json", b'{"a": "\xe9"}'), "not valid JSON"),
            "deep": (self.write("deep.json", b"[" * 100000 + b"]" * 100000), "nested too deeply"),
            "a list": (self.write("list.json", b"[1, 2]"), "not a JSON object"),
        }
        for what, (path, expect) in cases.items():
            with self.subTest(what):
                self.assertIn(expect, self.error_of(jsonfile.read_json_object, path))

    def test_oversized_file_is_refused_before_reading(self):
        path = self.write("big.json", b"{}")
        saved = jsonfile.MAX_JSON_BYTES
        jsonfile.MAX_JSON_BYTES = 1
        try:
            self.assertIn("more than a JSON file here can be", self.error_of(jsonfile.read_json_object, path))
        finally:
            jsonfile.MAX_JSON_BYTES = saved

    def test_every_json_input_goes_through_it(self):
        path = self.write("bad.json", b"{oops")
        self.assertTrue(self.error_of(load_text_config, path).startswith(f"text config {path} is not valid JSON"))
        self.assertTrue(self.error_of(diffusers_layout.read_json, path).startswith(f"diffusers config {path}"))
        self.assertTrue(self.error_of(read_vocab, path).startswith(f"tokenizer vocabulary {path}"))
        # A diffusers folder's errors are export errors too: one line, no traceback.
        self.assertTrue(issubclass(diffusers_layout.LayoutError, ExportError))


if __name__ == "__main__":
    unittest.main()
