"""The parametrisation shared by the OpInfo test modules: one test per op, the op's outcome checked and recorded."""

from __future__ import annotations

import opinfo_harness as harness
import pytest
import torch

PASSING = ("lowered", "fell back", "no graph", "no samples")


def op_params(dtype: torch.dtype, backward: bool = False) -> list:
    return [pytest.param(op, id=harness.op_name(op)) for op in harness.ops_for(dtype, backward)]


def check(op, dtype: torch.dtype, record_property, *, backward: bool = False, target: str | None = None) -> None:
    """Run the op's samples (NEURON_OPINFO_SAMPLES of them) and fail on a mismatch with eager or any error."""
    outcome = harness.run_op(op, dtype, backward=backward, target=target, limit=harness.sample_limit())
    record_property("status", outcome.status)
    record_property("fallbacks", outcome.fallbacks)
    assert outcome.status in PASSING, f"{outcome.op}: {outcome.status}: {outcome.detail}"
