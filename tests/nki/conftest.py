"""Lets the interpreter tests import their shared helpers (`nki_helpers.py`, next to this file) by name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
