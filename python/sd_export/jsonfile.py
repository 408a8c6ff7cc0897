"""The one reader of the JSON files an export is given: text encoder configs, a diffusers
folder's configs and tokenizer settings, the tokenizer's vocabulary. Each is a user file:
it is read only if it is a regular file of sane size, and any problem is one line that
names the file."""

import json
import os
import stat

from .report import ExportError, one_line

# The largest JSON file an export reads: CLIP's vocab.json is 1.6 MB, a config a few KB.
MAX_JSON_BYTES = 64 * 2**20


def read_json_object(path, what="file"):
    """The JSON object in `path`, or ExportError "WHAT PATH: problem" in one line."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ExportError(f"{what} {path} is not a regular file")
        if st.st_size > MAX_JSON_BYTES:
            raise ExportError(f"{what} {path} is {st.st_size} bytes, more than a JSON file here can be "
                              f"({MAX_JSON_BYTES} bytes)")
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except OSError as e:
        raise ExportError(f"cannot read {what} {path}: {e.strerror or e}")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # ValueError covers UnicodeDecodeError
        reason = "nested too deeply" if isinstance(e, RecursionError) else one_line(e)
        raise ExportError(f"{what} {path} is not valid JSON ({reason})")
    if not isinstance(data, dict):
        raise ExportError(f"{what} {path} is not a JSON object")
    return data
