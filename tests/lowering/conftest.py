"""Lets the lowering tests import their shared way of compiling (`compiled.py`, next to this file) by name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
