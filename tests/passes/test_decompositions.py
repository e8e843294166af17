import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_dynamo.lowering import lowering_for
from neuron_dynamo.passes.decompositions import decomposition_table

aten = torch.ops.aten


def test_ops_with_a_lowering_are_never_decomposed():
    table = decomposition_table()
    for op in (aten.silu.default, aten.t.default, aten._fused_rms_norm.default, aten.gelu_backward.default,
               aten._softmax_backward_data.default, aten.native_layer_norm_backward.default,
               aten.embedding_dense_backward.default):
        assert op not in table
    assert all(lowering_for(op) is None for op in table if isinstance(op, torch._ops.OpOverload))


def test_ops_without_a_lowering_decompose_to_core_aten():
    table = decomposition_table()
    assert aten.index_add.default in table
    assert aten.addcmul.default in table


# ---- slice_backward with static bounds is a zero pad -------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_slice_backward_decomposition_equals_aten(data):
    """Against ATen's own slice_backward: any dim, bounds negative or past the end, step 1 (a pad) or more."""
    sizes = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    dim = data.draw(st.integers(-len(sizes), len(sizes) - 1))
    start = data.draw(st.integers(-8, 8))
    end = data.draw(st.sampled_from([2**63 - 1, *range(-8, 9)]))
    step = data.draw(st.sampled_from([1, 1, 2]))
    sliced = torch.empty(sizes)[(slice(None),) * (dim % len(sizes)) + (slice(start, end, step),)]
    grad = torch.randn(sliced.shape)
    expected = aten.slice_backward.default(grad, sizes, dim, start, end, step)
    got = decomposition_table()[aten.slice_backward.default](grad, sizes, dim, start, end, step)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert torch.equal(got, expected)


def _rotate_half_grad(x, w):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    (grad,) = torch.autograd.grad((rotated * w).sum(), x)
    return grad


def test_static_slice_backward_traces_to_a_pad():
    x, w = torch.randn(2, 3, 8, requires_grad=True), torch.randn(2, 3, 8)
    gm = make_fx(_rotate_half_grad, decomposition_table=decomposition_table())(x, w)
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert aten.constant_pad_nd.default in ops and aten.slice_scatter.default not in ops
    torch.testing.assert_close(gm(x, w), _rotate_half_grad(x, w), rtol=0, atol=0)


def test_symbolic_slice_backward_keeps_core_aten():
    def grad_of_shift(x):
        (grad,) = torch.autograd.grad((x[:, 1:] * 2).sum(), x)
        return grad

    x = torch.randn(2, 5, requires_grad=True)
    gm = make_fx(grad_of_shift, decomposition_table=decomposition_table(), tracing_mode="symbolic")(x)
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert aten.slice_scatter.default in ops
    torch.testing.assert_close(gm(x), grad_of_shift(x))


def test_rotary_backward_compiled_matches_eager():
    """The neuron backend, as a user calls it: gradients equal eager's."""
    x, w = torch.randn(2, 3, 8, requires_grad=True), torch.randn(2, 3, 8)

    def loss(x, w):
        half = x.shape[-1] // 2
        return (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * w).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, backend="neuron")
    compiled(x, w).backward()
    got, x.grad = x.grad, None
    loss(x, w).backward()
    torch.testing.assert_close(got, x.grad)
