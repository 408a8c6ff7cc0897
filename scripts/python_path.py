"""Makes the repository's python/ folder (the sd_export package) importable for the
commands in scripts/ (models/demo/train_demo.py, outside scripts/, does the same itself)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
