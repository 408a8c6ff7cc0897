"""How the export reports: progress lines on stderr, and every failure as one
ExportError line (`export_model.py: error: ...`, no traceback)."""

import sys

PROG = "export_model.py"


class ExportError(Exception):
    """A failure to report as one line, without a traceback."""


def say(msg):
    print(msg, file=sys.stderr, flush=True)


def one_line(e):
    text = str(e).strip() or type(e).__name__
    # torch's weights_only failures put the useful part after a long preamble
    marker = "WeightsUnpickler error: "
    if marker in text:
        text = text[text.index(marker) + len(marker):]
    return text.splitlines()[0].strip()
