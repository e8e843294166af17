"""How the lowering tests compile a function: as a user would, on the default target, at static shapes.

Each call resets Dynamo so that every check compiles afresh (a cached graph from an earlier test would hide the
lowering under test).
"""

import torch

from neuron_dynamo import counters


def compile_static(fn):
    """fn compiled with backend="neuron" at static shapes, after a Dynamo reset."""
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", dynamic=False)


def run_compiled(fn, *args):
    """fn's compiled result, and the reason of each op that ran eagerly ({op: reason})."""
    with counters.collect_reports() as reports:
        result = compile_static(fn)(*args)
    return result, {entry["op"]: entry["reason"] for report in reports for entry in report.fallback_ops}


def check_compiled(fn, *args, rtol: float, atol: float, lowered: bool = True) -> dict:
    """The compiled result equals eager's (NaN where eager has NaN); with lowered, nothing ran eagerly."""
    result, fallbacks = run_compiled(fn, *args)
    torch.testing.assert_close(result, fn(*args), equal_nan=True, rtol=rtol, atol=atol)
    if lowered:
        assert not fallbacks, fallbacks
    return fallbacks
