"""Ops without a kernel run as PyTorch's decomposition when every op of it lowers, else whole and eagerly."""

import pytest
import torch
import torch.nn.functional as F

from neuron_dynamo.counters import collect_reports


def _run(fn, *args, **options):
    compiled = torch.compile(fn, backend="neuron", dynamic=False, options=options or None)
    with collect_reports() as reports:
        out = compiled(*args)
    fallbacks = [entry["op"] for report in reports for entry in report.fallback_ops]
    return out, fallbacks


def test_dist_runs_as_its_decomposition():
    """`dist` has no kernel; PyTorch decomposes it into a subtraction and `linalg_vector_norm`, which have."""
    x, y = torch.randn(4, 37), torch.randn(4, 37)
    for p in (2, 3, float("inf")):
        fn = lambda x, y, p=p: torch.dist(x, y, p)  # noqa: E731
        torch._dynamo.reset()
        out, fallbacks = _run(fn, x, y)
        torch.testing.assert_close(out, fn(x, y), rtol=1e-5, atol=1e-5)
        assert fallbacks == []


@pytest.mark.parametrize("eager", ["aten.linalg_vector_norm", "aten.dist"])
def test_dist_stays_whole_when_it_or_an_op_of_its_decomposition_is_forced_eager(eager):
    """With the vector norm forced eager, dist's decomposition cannot run in full: it is not applied half."""
    x, y = torch.randn(4, 37), torch.randn(4, 37)
    fn = lambda x, y: torch.dist(x, y, 3)  # noqa: E731
    out, fallbacks = _run(fn, x, y, eager_ops=[eager])
    torch.testing.assert_close(out, fn(x, y))
    assert fallbacks == ["aten.dist.default"]


def test_a_tuple_result_is_spliced_by_its_parts():
    """Eval-mode batch norm is `_native_batch_norm_legit_no_training` (output, mean, rstd): its users read parts."""
    x, mean, var = torch.randn(2, 3, 5), torch.randn(3), torch.rand(3) + 0.5
    weight, bias = torch.randn(3), torch.randn(3)
    fn = lambda x: F.batch_norm(x, mean, var, weight, bias, training=False)  # noqa: E731
    out, _ = _run(fn, x)
    torch.testing.assert_close(out, fn(x), rtol=1e-5, atol=1e-5)


def test_addmv_matches_eager_on_both_targets():
    a, m, v = torch.randn(5), torch.randn(5, 7), torch.randn(7)
    fn = lambda a, m, v: torch.addmv(a, m, v, beta=0.5, alpha=2.0)  # noqa: E731
    for target in ("simulator", "reference"):
        torch._dynamo.reset()
        out, fallbacks = _run(fn, a, m, v, target=target)
        torch.testing.assert_close(out, fn(a, m, v), rtol=1e-5, atol=1e-5)
        assert fallbacks == []
