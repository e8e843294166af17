"""benchmarks/kernel_library.py keeps working: its --quick --json run covers every kernel with estimated figures."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_library.py"


def test_quick_benchmark_reports_every_kernel():
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json"], capture_output=True, text=True,
                         check=True, timeout=600)
    doc = json.loads(run.stdout)
    assert doc["estimated"] is True and doc["target"] == "trn2"
    names = {r["kernel"] for r in doc["results"]}
    assert {"matmul", "attention_causal", "attention_backward_causal", "softmax", "rmsnorm", "rope", "embedding",
            "cross_entropy", "transpose", "silu_mul"} <= names
    for row in doc["results"]:
        assert row["estimated_us"] > 0 and 0 < row["value"] <= 1.0, row
