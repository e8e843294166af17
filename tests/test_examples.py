"""The examples run as users run them (a fresh process, offline) and succeed: each checks itself against eager."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[1] / "examples"


@pytest.mark.parametrize("script", ["sft_trl.py", "diffusers_regional.py"])
def test_example_runs(script):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(EXAMPLES / script)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ops run eagerly (fallback)" in done.stdout or "no fallback ops" in done.stdout


def test_generate_static_cache_example_runs():
    """The generation example: every prompt's tokens equal eager's, and the third prompt length compiles nothing."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(EXAMPLES / "generate_static_cache.py")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ops run eagerly (fallback)" in done.stdout or "no fallback ops" in done.stdout
    assert "prompt of 40 tokens" in done.stdout and "(eager: same), 0 program(s) compiled" in done.stdout
