"""Index gathers and writes, view scatters, repeats and the matmul variants on target="simulator" against eager.

`fallback="error"` makes each test prove that the op ran inside an NKI region; data movement is compared
bit-exact, sums and products at the dtype's tolerance.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_dynamo
from neuron_dynamo.lowering import codegen, kernel_for

STRICT = {"target": "simulator", "fallback": "error", "cache": "off", "bucketing": False}
INF, NAN = math.inf, math.nan


def run(fn, *args):
    torch._dynamo.reset()
    report = neuron_dynamo.explain(fn, *args, options=STRICT)
    assert all(graph.ops_lowered == graph.ops_total for graph in report.graphs)
    return report.output


def assert_matches(fn, *args, exact=True):
    expected = fn(*args)
    ours = run(fn, *args)
    assert ours.dtype == expected.dtype and ours.shape == expected.shape
    tolerance = {"atol": 0, "rtol": 0} if exact else {}
    if not exact and expected.dtype == torch.bfloat16:
        tolerance = {"atol": 2e-2, "rtol": 2e-2}  # the opinfo harness's: fp32 inside, rounded once or twice
    torch.testing.assert_close(ours, expected, equal_nan=True, **tolerance)


def setitem(x, key, value, accumulate=False):
    return torch.index_put(x, key, value, accumulate) if accumulate else _assign(x, key, value)


def _assign(x, key, value):
    y = x.clone()
    y[key] = value
    return y


# ------------------------------------------------------------------------------------------------ gathers
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("key", [
    lambda i: (slice(None), i), lambda i: (i, slice(None), i), lambda i: (Ellipsis, i),
    lambda i: (slice(None), i, i.flip(0)),
], ids=["sliced-first", "gap", "last", "adjacent-pair"])
def test_index_with_sliced_dims_before_the_indexed_ones(key, dtype):
    x = (torch.randn(4, 5, 6) * 10).to(dtype)
    index = torch.tensor([0, 3, -1])
    assert_matches(lambda x, i: x[key(i)], x, index)


def test_index_of_a_non_contiguous_source_and_an_empty_index():
    x = torch.randn(6, 5).t()
    assert_matches(lambda x, i: x[:, i], x, torch.tensor([[1, 2], [0, 5]]))
    assert_matches(lambda x, i: x[:, i], x, torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("dims", [(0,), (1,), (0, 2), (-1,)])
def test_flip_and_index_select(dims):
    x = torch.tensor([[[1.0, INF], [NAN, -0.0]], [[3.0, 4.0], [5.0, 6.0]]]).repeat(1, 2, 2)
    assert_matches(lambda x: x.flip(dims), x)
    assert_matches(lambda x, i: x.index_select(dims[0], i), x, torch.tensor([1, 0, 1]))
    if dims in ((0,), (-1,)):
        assert_matches(lambda x: torch.flip(x, dims), torch.tensor(2.0))


def test_embedding_of_a_zero_dim_index_and_a_bf16_table():
    table = torch.randn(10, 4).to(torch.bfloat16)
    assert_matches(lambda w, i: F.embedding(i, w), table, torch.tensor(3))
    assert_matches(lambda w, i: F.embedding(i, w), table, torch.tensor([[9, 0], [3, 3]]))


def test_take_and_diagonal_and_unfold_views():
    x = torch.randn(4, 6)
    assert_matches(lambda x, i: x.take(i), x, torch.tensor([[0, 23], [-1, 5]]))
    assert_matches(lambda x: x.diagonal(1) * 2, x)
    assert_matches(lambda x: x.unfold(1, 3, 2) + 1, x)


# ------------------------------------------------------------------------------------------------ copies and views
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_stack_and_repeat(dtype):
    x = (torch.randn(3, 4) * 10).to(dtype)
    assert_matches(lambda x: torch.stack([x, x.flip(0)], 1), x)
    assert_matches(lambda x: x.repeat(2, 1, 3), x)
    assert_matches(lambda x: x.t().repeat(1, 2), x)
    assert_matches(lambda x: x.repeat(0, 2), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_view_scatters(dtype):
    x = torch.randn(4, 5, 6).to(dtype)
    assert_matches(lambda x, s: torch.slice_scatter(x, s, 2, 1, 6, 2), x, torch.randn(4, 5, 3).to(dtype))
    assert_matches(lambda x, s: torch.slice_scatter(x, s, 0, 4, 4), x, torch.randn(0, 5, 6).to(dtype))
    assert_matches(lambda x, s: torch.select_scatter(x, s, 1, -1), x, torch.randn(4, 6).to(dtype))
    diagonal = torch.randn(x.diagonal(-1, 2, 0).shape).to(dtype)
    assert_matches(lambda x, s: torch.diagonal_scatter(x, s, -1, 2, 0), x, diagonal)
    assert_matches(lambda x, s: torch.as_strided_scatter(x, s, (2, 3), (7, 2), 1), x, torch.randn(2, 3).to(dtype))


# ------------------------------------------------------------------------------------------------ index writes
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_index_put_overwrites_on_any_dims(dtype):
    x = (torch.randn(4, 5, 6) * 10).to(dtype)
    values = (torch.randn(4, 2, 6) * 10).to(dtype)
    assert_matches(lambda x, v: setitem(x, (slice(None), torch.tensor([0, -1])), v), x, values)
    assert_matches(lambda x, v: setitem(x, (torch.tensor([1, 2]), slice(None), torch.tensor([0, 5])), v), x,
                   values[0, 0, :5])
    assert_matches(lambda x, m, v: setitem(x, m, v), x, torch.rand(4, 5) > 0.5, torch.tensor(1).to(dtype))


def test_index_put_accumulates_duplicates_and_non_finite_values_exactly():
    base = torch.tensor([[1.0, -INF, 0.0], [2.0, 2.0, 2.0], [0.0, 0.0, 0.0], [NAN, 1.0, 1.0]])
    values = torch.tensor([[1.0, INF, 2.0], [3.0, 4.0, 5.0], [NAN, 1.0, -INF], [0.5, 0.5, 0.5]])
    ids = torch.tensor([0, 2, 0, 0])
    assert_matches(lambda b, i, v: torch.index_put(b, [i], v, True), base, ids, values, exact=False)
    assert_matches(lambda b, i, v: torch.index_put(b, [i], v, True), base.bfloat16(), ids, values.bfloat16(),
                   exact=False)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    x = torch.tensor([[1.0, NAN, -INF, 0.0, 2.0], [3.0, 1.0, 1.0, 1.0, -1.0]])
    index = torch.tensor([[0, 0, 4], [2, 2, 1]])
    src = torch.tensor([[5.0, -2.0, INF], [0.5, 7.0, NAN]])
    assert_matches(lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self), x, index, src,
                   exact=False)
    assert_matches(lambda x, i, s: x.index_reduce(0, i, s, reduce, include_self=include_self)
                   if reduce != "sum" else x.index_add(0, i, s), x.t(), index[0], src.t(), exact=False)


def test_scatter_overwrites_adds_and_puts():
    x = torch.randn(3, 5)
    index = torch.tensor([[0, 1], [4, 2], [3, 3]])
    assert_matches(lambda x, i, s: x.scatter(1, i, s), x, torch.tensor([[0, 1], [4, 2], [3, 0]]), x[:, :2] * 2)
    assert_matches(lambda x, i: x.scatter(0, i, 2.5), x, torch.tensor([[0, 1, 2, 0, 1]]))
    assert_matches(lambda x, i, s: x.scatter_add(1, i, s), x, index, torch.randn(3, 4), exact=False)
    assert_matches(lambda x, i, s: x.put(i, s), x, torch.tensor([0, 14, -1]), torch.randn(3))
    assert_matches(lambda x, i, s: x.put(i, s, accumulate=True), x, torch.tensor([0, 14, 0]), torch.randn(3),
                   exact=False)
    assert_matches(lambda x: x.scatter(1, torch.zeros(3, 0, dtype=torch.long), 1.0), x)


def test_masked_scatter():
    x, mask = torch.randn(4, 3), torch.rand(4, 3) > 0.5
    assert_matches(lambda x, m, s: x.masked_scatter(m, s), x, mask, torch.randn(12))
    assert_matches(lambda x, m, s: x.masked_scatter(m, s), x, mask[0], torch.randn(12))


def test_an_index_write_out_of_range_is_an_error():
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, i, s: x.scatter(1, i, s), backend="neuron", options=STRICT)
    with pytest.raises(codegen.CodegenError, match="out of range"):
        compiled(torch.randn(2, 3), torch.tensor([[3], [0]]), torch.randn(2, 1))


# ------------------------------------------------------------------------------------------------ matmul variants
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_variants_with_scales(dtype):
    def r(*shape):
        return torch.randn(*shape).to(dtype)

    assert_matches(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), r(3, 4), r(3, 2), r(2, 4), exact=False)
    assert_matches(lambda c, a, b: torch.addmv(c, a, b, beta=2), r(3), r(3, 5), r(5), exact=False)
    assert_matches(lambda c, a, b: torch.addbmm(c, a, b), r(3, 4), r(2, 3, 5), r(2, 5, 4), exact=False)
    assert_matches(lambda c, a, b: torch.baddbmm(c, a, b, alpha=0.5), r(2, 3, 4), r(2, 3, 5), r(2, 5, 4),
                   exact=False)


def test_matmul_with_empty_operands_and_an_ignored_nan_bias():
    assert_matches(lambda a, b: a @ b, torch.randn(3, 0), torch.randn(0, 4))
    assert_matches(lambda a, b: a @ b, torch.randn(0, 2), torch.randn(2, 4))
    assert_matches(lambda a, b: torch.bmm(a, b), torch.randn(2, 3, 0), torch.randn(2, 0, 4))
    assert_matches(lambda c, a, b: torch.addmm(c, a, b, beta=0), torch.full((3, 4), NAN), torch.randn(3, 2),
                   torch.randn(2, 4), exact=False)
    assert_matches(lambda c, a, b: torch.addmm(c, a, b), torch.randn(4), torch.randn(3, 0), torch.randn(0, 4))


# ------------------------------------------------------------------------------------------------ refusals
def _reasons(fn, *args):
    graph = make_fx(fn)(*args)
    return [kernel_for(n.target, "simulator").refusal(n) for n in graph.graph.nodes
            if n.op == "call_function" and kernel_for(n.target, "simulator") is not None]


def test_refusals_say_why():
    x = torch.randn(4, 3)
    reasons = _reasons(lambda x, m, i, s: (x[m], x.scatter_reduce(0, i, s, "prod"),
                                           torch.index_put(x.long(), [i[0]], s.long()[0], True)),
                       x, torch.rand(4) > 0.5, torch.tensor([[0, 1, 0]]), torch.randn(1, 3))
    assert "indexing with a boolean mask" in reasons
    assert "a multiplying index write (no product reduction on the NKI targets)" in reasons
    assert any(r and r.startswith("an accumulating index write into torch.int64") for r in reasons)
    big = torch.randn(5000)
    assert "a masked_scatter over more than 4096 elements (its positions are numbered by one cumsum)" in _reasons(
        lambda x, m: x.masked_scatter(m, x), big, big > 0)
