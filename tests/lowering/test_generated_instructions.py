"""A generated element-wise kernel writes each instruction once and skips those that return their operand.

The oracle is eager torch for the values; the sources are read back from the fused element-wise kernels the backend
generated (kept in linecache under `<nki-generated fused_...>`; one loop body each), and no two lines of one kernel
may compute the same expression.
"""

import linecache
import re

import torch
from compiled import check_compiled

from neuron_dynamo.lowering.codegen import Emitter, Tile


def _generated_sources() -> dict[str, list[str]]:
    return {name: entry[2] for name, entry in list(linecache.cache.items()) if name.startswith("<nki-generated fused_")}


def test_rotary_cos_and_sin_share_their_range_reduction_and_equal_eager():
    def rotary(t, inv_freq):
        freqs = t[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * 1.0, emb.sin() * 1.0

    t = torch.arange(300, dtype=torch.float32)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    check_compiled(rotary, t, inv_freq, rtol=2e-6, atol=2e-6)
    sources = _generated_sources()  # every fused kernel this process generated, this test's among them
    assert any("op=nl.sin" in "".join(lines) for lines in sources.values()), "no rotary kernel was generated"
    for name, lines in sources.items():
        expressions = [line.split(" = ", 1)[1].strip() for line in lines  # the emitter's `vN = nl.fn(...)` lines
                       if re.match(r"\s*v\d+ = nl\.", line) and " = nl.ndarray(" not in line]  # allocations alike
        assert len(expressions) == len(set(expressions)), f"{name} computes an expression twice"


def test_emitter_keeps_conversions_and_the_sign_of_zero():
    """Only exact identities are dropped: a cast to another dtype stays, and x + 0.0 stays (-0.0 + 0.0 is +0.0)."""
    e = Emitter()
    x = Tile("t0", "float32")
    assert e.call("nl.copy", x, dtype="float32") is x
    assert e.call("nl.multiply", x, 1.0, dtype="float32") is x
    cast = e.call("nl.copy", x, dtype="bfloat16")
    assert cast is not x and e.call("nl.copy", x, dtype="bfloat16") is cast
    assert e.call("nl.add", x, 0.0, dtype="float32") is not x
    assert e.call("nl.multiply", Tile("t1", "int32"), 1.0, dtype="float32").dtype == "float32"
    assert len(e.lines) == 3
