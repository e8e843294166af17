import sys
from pathlib import Path

# The test modules (and benchmarks/opinfo_coverage.py) import opinfo_harness by name.
sys.path.insert(0, str(Path(__file__).parent))
