"""`index.Tensor`, `gather` and `constant_pad_nd` on target="simulator" (indirect DMA, memset + DMA) against eager.

`fallback="error"` makes each test prove that the op ran inside an NKI region.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_dynamo
from neuron_dynamo.lowering import codegen, kernel_for

STRICT = {"target": "simulator", "fallback": "error", "cache": "off", "bucketing": False}


def assert_matches(fn, *args):
    expected = fn(*args)
    torch._dynamo.reset()
    report = neuron_dynamo.explain(fn, *args, options=STRICT)
    outputs = report.output if isinstance(expected, tuple) else (report.output,)
    for ours, theirs in zip(outputs, expected if isinstance(expected, tuple) else (expected,), strict=True):
        assert ours.dtype == theirs.dtype
        torch.testing.assert_close(ours, theirs, atol=0, rtol=0)  # data movement: bit-exact
    assert all(graph.ops_lowered == graph.ops_total for graph in report.graphs)


@settings(max_examples=6, deadline=None)
@given(batch=st.integers(1, 3), seq=st.integers(1, 140), width=st.integers(1, 20),
       dtype=st.sampled_from([torch.float32, torch.int64, torch.bfloat16, torch.bool]))
def test_index_with_broadcast_and_negative_indices_gathers_rows(batch, seq, width, dtype):
    torch.manual_seed(seq)
    table = (torch.randn(batch, seq, width) * 100).to(dtype)
    rows = torch.arange(batch).reshape(batch, 1, 1)
    positions = torch.randint(-seq, seq, (1, 5, 1))

    def fn(table, rows, positions):
        return table[rows, positions], table[rows.reshape(batch, 1), positions.reshape(1, 5)][..., 0]

    assert_matches(fn, table, rows, positions)


def test_the_attention_mask_construction_of_a_causal_lm():
    """The index arithmetic transformers builds its masks with: positions gathered by broadcast index grids."""
    def mask(positions, cumsum):
        b = torch.arange(2).reshape(2, 1, 1, 1)
        q = torch.arange(12).reshape(1, 1, 12, 1)
        k = torch.arange(12).reshape(1, 1, 1, 12)
        return (positions[b, k] <= positions[b, q]) & (cumsum[b, q] == cumsum[b, k])

    assert_matches(mask, torch.arange(12).expand(2, 12), torch.tensor([[1] * 12, [0] * 3 + [1] * 9]).cumsum(-1))


@settings(max_examples=6, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 150), picks=st.integers(1, 7), dim=st.sampled_from([0, 1, -1]))
def test_gather_along_any_dim(rows, cols, picks, dim):
    torch.manual_seed(rows * cols)
    x = torch.randn(rows, cols)
    size = x.shape[dim]
    index_shape = (picks, cols) if dim == 0 else (rows, picks)
    index = torch.randint(0, size, index_shape)
    assert_matches(lambda x, i: torch.gather(x, dim, i), x, index)


def test_the_token_type_gather_of_bert():
    buffer = torch.zeros(1, 64, dtype=torch.int64)
    buffer[0, 5:] = 1
    positions = torch.arange(12).unsqueeze(0)
    assert_matches(lambda b, p: torch.gather(b.expand(1, -1), 1, p).expand(2, 12), buffer, positions)


@pytest.mark.parametrize(("pad", "value", "dtype"), [
    ((0, 1), -100, torch.int64),             # the shifted labels of a causal LM loss
    ((2, 3, 1, 0), 0.5, torch.float32),      # two dims
    ((-1, 2), 0.0, torch.bfloat16),          # a crop and a pad
    ((0, 0, 0, 0, 1, 1), True, torch.bool),  # a leading dim
])
def test_constant_pad(pad, value, dtype):
    x = (torch.randn(2, 5, 7) * 10).to(dtype)
    assert_matches(lambda x: F.pad(x, pad, value=value), x)


def test_an_index_out_of_range_is_an_error_not_a_read_of_other_memory():
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, i: x[i], backend="neuron", options=STRICT)
    with pytest.raises(codegen.CodegenError, match="out of range"):
        compiled(torch.randn(4, 3), torch.tensor([0, 4]))


def test_boolean_masks_are_refused_and_sliced_leading_dims_are_not():
    x = torch.randn(4, 3)
    graph = make_fx(lambda x, m, i: (x[m], x[:, i]))(x, torch.rand(4) > 0.5, torch.tensor([0, 2]))
    reasons = [kernel_for(n.target, "simulator").refusal(n) for n in graph.graph.nodes if "index" in str(n.target)]
    assert reasons == ["indexing with a boolean mask", None]
