"""Lets the kernel tests import their shared checks (`kernel_checks.py`, next to this file) by name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
