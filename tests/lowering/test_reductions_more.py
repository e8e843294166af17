"""Reductions, scans, norms and losses on the NKI simulator, compared with eager.

Every case is compiled as a user would with `fallback="error"`, so a case that passes ran lowered (nothing eagerly);
the refusals at the end check that what cannot be exact runs eagerly with a reason.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from neuron_dynamo.kernels.scans import cummax_kernel, cummin_kernel, cumprod_kernel, linear_recurrence_kernel

import neuron_dynamo
from neuron_dynamo.toolchain.simulator import launch

NAN, INF = math.nan, math.inf
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def _lowered(fn, *inputs, dtype=torch.float32):
    """fn compiled (nothing may run eagerly) equals fn in eager, NaN for NaN, in dtype and shape."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron", options={"fallback": "error", "target": "simulator"})
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(compiled(*inputs), fn(*inputs), equal_nan=True, rtol=tol, atol=tol)


def _reasons(fn, *inputs):
    torch._dynamo.reset()
    neuron_dynamo.reset_stats()
    report = neuron_dynamo.explain(torch.compile(fn, backend="neuron"), *inputs)
    return [entry["reason"] for graph in report.graphs for entry in graph.fallback_ops]


def _special() -> torch.Tensor:
    return torch.tensor([[1.0, NAN, 3.0, NAN, 3.0], [2.0, 2.0, -INF, 1.0, 2.0], [0.0, -0.0, INF, INF, -1.0]])


X = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(0))
ODD = X.transpose(0, 2)  # non-contiguous


@pytest.mark.parametrize("x", [X, ODD, X.bfloat16()], ids=["contiguous", "transposed", "bf16"])
@pytest.mark.parametrize("reduce", [
    lambda t: torch.var(t, dim=1),
    lambda t: torch.std(t, dim=(0, 2), keepdim=True, correction=0),
    lambda t: torch.var_mean(t, dim=-1, correction=2),
    lambda t: torch.std_mean(t),
], ids=["var", "std", "var_mean", "std_mean"])
def test_variances(x, reduce):
    _lowered(reduce, x, dtype=x.dtype)


def test_variance_edges_match_eager():
    _lowered(lambda t: torch.var(t, dim=1), X[:, :1])  # one element, correction 1: 0/0 = NaN
    _lowered(lambda t: torch.var(t, dim=1, correction=3), X[:, :2])  # a negative divisor counts as 0: x/0
    _lowered(lambda t: torch.var(t), torch.tensor(2.0))
    _lowered(lambda t: torch.var_mean(t, dim=1), torch.empty(3, 0))  # NaN from no element
    _lowered(lambda t: torch.std(t, dim=0), torch.empty(0, 4))
    _lowered(lambda t: torch.var(t, dim=1), _special())


@pytest.mark.parametrize("order", [2, 1, 0, INF, -INF, 3, -1.5, 0.5])
def test_vector_norm_orders(order):
    _lowered(lambda t: torch.linalg.vector_norm(t, ord=order, dim=1, keepdim=True), X)
    _lowered(lambda t: torch.linalg.vector_norm(t, ord=order), ODD)
    _lowered(lambda t: torch.linalg.vector_norm(t, ord=order, dim=0), _special())


def test_vector_norm_dtypes_and_edges():
    _lowered(lambda t: torch.linalg.vector_norm(t, dim=(0, 2)), X.bfloat16(), dtype=torch.bfloat16)
    _lowered(lambda t: torch.linalg.vector_norm(t, dtype=torch.float32), X.bfloat16())
    _lowered(lambda t: torch.linalg.vector_norm(t), torch.tensor(-3.0))
    _lowered(lambda t: torch.linalg.vector_norm(t, dim=1), torch.empty(3, 0))
    _lowered(lambda t: F.normalize(t, dim=1), X)


@pytest.mark.parametrize("x", [_special(), X > 0, (X * 3).to(torch.int32), X.to(torch.uint8), torch.empty(2, 0)],
                         ids=["float", "bool", "int32", "uint8", "empty"])
def test_any_all(x):
    _lowered(lambda t: (t.any(), t.all()), x)
    _lowered(lambda t: (t.any(dim=1), t.all(dim=-1, keepdim=True)), x)
    _lowered(lambda t: (torch.ops.aten.any.dims(t, [], False), torch.ops.aten.all.dims(t, [0, 1], True)), x)


@pytest.mark.parametrize("x", [_special(), X, ODD, X.bfloat16(), torch.tensor([[3, 1, 3], [-2, 5, 5]],
                                                                                dtype=torch.int8)],
                         ids=["nan", "float", "transposed", "bf16", "int8"])
def test_extremes_and_their_first_index(x):
    _lowered(lambda t: (t.argmax(), t.argmin(dim=1), t.argmax(dim=0, keepdim=True)), x)
    _lowered(lambda t: (t.max(dim=1), t.min(dim=-1, keepdim=True), t.max(), t.min()), x)


def test_extremes_of_a_scalar():
    _lowered(lambda t: (t.argmax(), t.argmin(0), t.max(0), t.min(0, keepdim=True)), torch.tensor(-2.0))


@pytest.mark.parametrize("x", [_special(), X, ODD, X.bfloat16(), torch.tensor(1.5)],
                         ids=["special", "float", "transposed", "bf16", "scalar"])
def test_logsumexp_and_prod(x):
    _lowered(lambda t: (torch.logsumexp(t, dim=-1), t.prod(), t.prod(0, keepdim=True)), x, dtype=x.dtype)
    _lowered(lambda t: torch.logsumexp(t, dim=tuple(range(min(t.dim(), 2))), keepdim=True), x, dtype=x.dtype)


def test_empty_products_and_logsumexp():
    _lowered(lambda t: (t.prod(1), torch.logsumexp(t, dim=1)), torch.empty(3, 0))


def test_product_of_booleans():
    _lowered(lambda t: (t > 0).prod(1), X)


@pytest.mark.parametrize("x", [_special(), X, ODD, X.bfloat16(), torch.tensor(0.5)],
                         ids=["special", "float", "transposed", "bf16", "scalar"])
def test_scans(x):
    _lowered(lambda t: (t.cumprod(0), t.cummax(-1), t.cummin(0), t.logcumsumexp(-1), t.cumsum(0)), x,
             dtype=x.dtype)


def test_empty_scans():
    _lowered(lambda t: (t.cumsum(1), t.cumprod(0), t.cummax(1), t.cummin(0), t.logcumsumexp(1)), torch.empty(0, 3))


def test_logcumsumexp_of_infinite_prefixes():
    x = torch.tensor([[-INF, -INF, 1.0, INF, 2.0, INF], [-1e30, 0.0, 1e30, 5.0, -INF, -INF]])
    _lowered(lambda t: t.logcumsumexp(1), x)


def test_running_extreme_indices_follow_torch_ties_and_nans():
    x = torch.tensor([1.0, NAN, 3.0, NAN, 2.0, 2.0])
    _lowered(lambda t: (t.cummax(0), t.cummin(0)), x)
    _lowered(lambda t: (t.cummax(0), t.cummin(0)), torch.tensor([2, 2, 1, 3, 3, 0], dtype=torch.int16))


def test_scan_kernels_carry_across_chunks():
    x = torch.randn(130, 4500, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(launch(cummax_kernel, x), torch.cummax(x, 1).values)
    torch.testing.assert_close(launch(cummin_kernel, x), torch.cummin(x, 1).values)
    small = 1 + x / 100
    torch.testing.assert_close(launch(cumprod_kernel, small), torch.cumprod(small, 1))
    torch.testing.assert_close(launch(linear_recurrence_kernel, torch.ones_like(x), x), torch.cumsum(x, 1),
                               rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dim", [0, 1, -2])
def test_softmax_over_any_dim(dim):
    _lowered(lambda t: (t.softmax(dim), t.log_softmax(dim)), X)
    _lowered(lambda t: (t.softmax(dim), t.log_softmax(dim)), ODD.bfloat16(), dtype=torch.bfloat16)
    x = X.clone().requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: t.softmax(dim) * t.log_softmax(dim), backend="neuron",
                             options={"fallback": "error"})
    (grad,) = torch.autograd.grad(compiled(x).sum(), x)
    (expected,) = torch.autograd.grad((x.softmax(dim) * x.log_softmax(dim)).sum(), x)
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-4)


def test_softmax_of_a_scalar():
    _lowered(lambda t: (t.softmax(0), t.log_softmax(0)), torch.tensor(3.0))


def test_layer_norm_over_the_last_two_dims_with_backward():
    norm = torch.nn.LayerNorm([5, 6])
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    _lowered(lambda t: norm(t), X)
    x = X.clone().requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(norm, backend="neuron", options={"fallback": "error"})
    ours = torch.autograd.grad(compiled(x).square().sum(), [x, norm.weight, norm.bias])
    theirs = torch.autograd.grad(norm(x).square().sum(), [x, norm.weight, norm.bias])
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(training):
    x = torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(2))
    weight, bias = torch.randn(3), torch.randn(3)

    def norm(x, mean, var):
        return F.batch_norm(x, mean, var, weight, bias, training=training, momentum=0.3), mean, var

    torch._dynamo.reset()
    compiled = torch.compile(norm, backend="neuron", options={"fallback": "error"})
    ours = compiled(x, torch.zeros(3), torch.ones(3))
    theirs = norm(x, torch.zeros(3), torch.ones(3))  # the running statistics are updated in place, as eager does
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_nll_loss_with_class_weights():
    logp = torch.randn(6, 5).log_softmax(1)
    target = torch.tensor([0, 4, 2, 2, 1, 3])
    weight = torch.rand(5)
    for reduction in ("mean", "sum", "none"):
        _lowered(lambda lp, t, w, r=reduction: F.nll_loss(lp, t, weight=w, reduction=r, ignore_index=2),
                 logp, target, weight)
    _lowered(lambda lp, t, w: F.nll_loss(lp, t, weight=w), logp[0], target[0], weight)


def test_refusals_say_why():
    wide = torch.tensor([2**25 + 1, 2**25], dtype=torch.int64)
    assert any("rounds above 2**24" in r for r in _reasons(lambda t: t.argmax(), wide))
    assert any("integer product" in r for r in _reasons(lambda t: t.prod(), torch.tensor([3, 4])))
    assert any("of torch.int64" in r for r in _reasons(lambda t: t.cumprod(0), torch.tensor([3, 4])))
    assert any("can reach 2**24" in r for r in _reasons(lambda t: t.cumsum(0), torch.tensor([2**30, 1])))
