"""The per-call work of a compiled program is planned once and gives the same results as doing it every call.

A static program runs with the same shapes again and again: fused kernels skip the expand and dtype conversion an
input does not need, view scatters and cats reuse their access pattern and generated kernel, and the eager layout
of the outputs is worked out once per set of sizes. Each test checks the planned path against eager.
"""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_dynamo
from neuron_dynamo.lowering import lower_region, views
from neuron_dynamo.lowering.codegen import GroupSpec, Ref, Step
from neuron_dynamo.lowering.generated import FusedKernel
from neuron_dynamo.output_layout import EagerLayout
from neuron_dynamo.toolchain.simulator import device_time

aten = torch.ops.aten
STRICT = {"target": "simulator", "fallback": "error", "cache": "off"}


def test_fused_kernel_takes_broadcast_strided_and_narrowed_inputs_as_eager():
    """Inputs of the group's shape, broadcast ones, a strided slice and int64/bool inputs (stored as int32/uint8)."""
    def chain(x, row, ids, mask):
        return torch.where(mask, x * row + ids, -x)

    x = torch.randn(6, 8, 16)[:, :, ::2]  # not contiguous
    args = x, torch.randn(1, 8), torch.arange(8, dtype=torch.int64), torch.rand(6, 8, 8) > 0.5
    lowered = lower_region(make_fx(chain)(*args), "simulator")
    assert sum(isinstance(node.target, FusedKernel) for node in lowered.graph.nodes) == 1
    for _ in range(2):  # the second call runs the kernel's recorded instruction stream
        torch.testing.assert_close(lowered(*args), chain(*args), rtol=0, atol=0)


def test_fused_kernel_hands_back_the_graph_dtypes():
    spec = GroupSpec((torch.int64,), (Step(aten.add.Tensor, (Ref("in", 0), 3), (), torch.int64),), (0,))
    kernel = FusedKernel(spec, (4, 5))
    ids = torch.arange(20, dtype=torch.int64).reshape(4, 5)
    for _ in range(2):
        (out,) = kernel(ids)
        assert out.dtype == torch.int64 and torch.equal(out, ids + 3)


def test_view_scatters_reuse_their_pattern_per_shape_and_match_eager():
    """slice/select/as_strided scatters at two shapes: one pattern each, computed at the first call."""
    views._scatter_pattern.cache_clear()
    for rows in (6, 10):
        base, src = torch.randn(rows, 8), torch.randn(rows, 3)
        for _ in range(2):
            out = views.view_scatter(aten.slice_scatter.default, base, src, 1, 2, 8, 2)
            torch.testing.assert_close(out, torch.slice_scatter(base, src, 1, 2, 8, 2), rtol=0, atol=0)
        diagonal = torch.randn(4)
        out = views.view_scatter(aten.as_strided_scatter.default, base, diagonal, [4], [9], 1)
        torch.testing.assert_close(out, torch.as_strided_scatter(base, diagonal, [4], [9], 1), rtol=0, atol=0)
    assert views._scatter_pattern.cache_info().misses == 4  # (slice, as_strided) x two shapes


def test_cat_generates_its_kernel_once_per_input_count():
    parts = [torch.randn(3, 4), torch.randn(3, 2)]
    views.cat(aten.cat.default, parts, 1)
    before = views._cat_kernel.cache_info()
    for _ in range(3):
        torch.testing.assert_close(views.cat(aten.cat.default, parts, 1), torch.cat(parts, 1), rtol=0, atol=0)
    assert views._cat_kernel.cache_info().misses == before.misses


def test_eager_layout_of_a_static_graph_is_planned_once():
    """A base returned with a view of it shares memory as in eager, call after call, from one plan."""
    def fn(x):
        y = x * 2
        return y, y[1:]

    x = torch.randn(4, 3)
    gm = make_fx(fn, tracing_mode="fake")(x)
    layout = EagerLayout(lambda args: list(fn(*args)), gm)
    for _ in range(3):
        y, tail = layout([x])
        assert tail._base is y or tail.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
        y.add_(1)
        torch.testing.assert_close(tail, y[1:], rtol=0, atol=0)
    assert len(layout._overlaps) == 1


def test_outputs_that_are_views_come_back_as_tensors_of_their_own():
    """A narrowed kernel output is cloned once (by the eager layout), and in-place ops on outputs are allowed."""
    def fn(x):
        return (x * 3)[:, :2] + 1, x.sum()

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron", options=STRICT)
    neuron_dynamo.reset_stats()
    x = torch.randn(4, 5, requires_grad=True)
    for _ in range(2):
        head, total = compiled(x)
        assert head._base is None and head.is_contiguous()
        torch.testing.assert_close(head, fn(x)[0])
        head.mul_(2)  # an autograd Function output that is a view would refuse this
        (head.sum() + total).backward()
    assert neuron_dynamo.stats().get("graphs_failed", 0) == 0


def _transposes(lowered):
    return sum(getattr(node.target, "op", None) is aten.t.default for node in lowered.graph.nodes)


def test_a_transpose_of_a_transpose_is_its_source_unless_that_would_return_it_twice():
    """AOTAutograd's weight gradients are t(t(mm)): the product itself is handed back (no view to make, none to
    copy), with eager's values and strides; an input, or a tensor returned anyway, keeps its views."""
    x, w = torch.randn(6, 4), torch.randn(4, 5)
    cases = [(lambda x, w: torch.mm(x, w).t().t(), 0), (lambda x, w: torch.mm(x, w).t().t().t().t() + 1, 0),
             (lambda x, w: x.t().t(), 2), (lambda x, w: (lambda g: (g, g.t().t()))(torch.mm(x, w)), 2)]
    for fn, kept in cases:
        lowered = lower_region(make_fx(fn)(x, w), "simulator")
        assert _transposes(lowered) == kept
        ours, theirs = lowered(x, w), fn(x, w)
        for got, expected in zip(ours if isinstance(ours, tuple) else [ours],
                                 theirs if isinstance(theirs, tuple) else [theirs], strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            assert got.stride() == expected.stride()


def test_a_group_without_inputs_runs_once_and_hands_out_copies():
    """Creation ops and arithmetic on them are constants (a compiler folds them): the kernel runs at the first call
    only, and every call gets tensors of its own (a caller writing into one changes no later result)."""

    def fn(x):
        table = torch.arange(8.0).reshape(8, 1) * torch.full((8, 8), 0.5).exp()
        return x @ table, torch.full((4,), 3.0).exp()

    x = torch.randn(3, 8)
    lowered = lower_region(make_fx(fn)(x), "simulator")
    with device_time() as first_call:
        first = lowered(x)
    first[1].add_(1.0)
    with device_time() as second_call:
        second = lowered(x)
    assert second_call.kernels == first_call.kernels - 2  # the two constant groups ran at the first call only
    for ours, theirs in zip(second, fn(x), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_cat_of_one_tensor_and_empties_moves_nothing_when_the_tensor_lies_as_the_result():
    """A KV cache's first update is cat([empty, x]): a kernel's fresh output already is the result (no cat launch),
    a strided view is copied into the result's layout by the cat kernel, and an input is never handed back as an
    output of its own."""
    x, w = torch.randn(6, 4), torch.randn(4, 6)
    cases = [  # (fn, launches: the mm or the fused group, the cat if any, the product)
        (lambda x, w: torch.cat([torch.tensor([]), torch.mm(x, w)], -2) * 2, 2),
        (lambda x, w: torch.cat([torch.tensor([]), torch.mm(x, w).t()], -2) * 2, 3),
        (lambda x, w: torch.cat([torch.tensor([]), x], -2), 1),
        (lambda x, w: torch.cat([torch.tensor([]), x * 3], -2) + x, 2),  # x * 3 is fused code still open
    ]
    for fn, launches in cases:
        lowered = lower_region(make_fx(fn)(x, w), "simulator")
        with device_time() as spent:
            ours = lowered(x, w)
        expected = fn(x, w)
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
        assert ours.stride() == expected.stride() and ours.data_ptr() != x.data_ptr()
        assert spent.kernels == launches
