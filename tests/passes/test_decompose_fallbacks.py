"""Ops without a kernel run as PyTorch's decomposition when every op of it lowers, else whole and eagerly."""

import torch
import torch.nn.functional as F

from neuron_dynamo.counters import collect_reports


def _run(fn, *args, **options):
    compiled = torch.compile(fn, backend="neuron", dynamic=False, options=options or None)
    with collect_reports() as reports:
        out = compiled(*args)
    fallbacks = [entry["op"] for report in reports for entry in report.fallback_ops]
    return out, fallbacks


def test_vector_norm_runs_as_its_decomposition():
    x = torch.randn(4, 37)
    for fn in (lambda x: torch.linalg.vector_norm(x, 2, dim=1), lambda x: F.normalize(x, dim=-1),
               lambda x: torch.linalg.vector_norm(x, float("inf"))):
        out, fallbacks = _run(fn, x)
        torch.testing.assert_close(out, fn(x), rtol=1e-5, atol=1e-5)
        assert fallbacks == []


def test_a_decomposition_that_would_run_partly_eagerly_is_not_applied():
    """With pow forced eager, the 2-norm's decomposition cannot run in full: the op stays whole, and says so."""
    x = torch.randn(4, 37)
    fn = lambda x: torch.linalg.vector_norm(x, 2, dim=1)  # noqa: E731
    out, fallbacks = _run(fn, x, eager_ops=["aten.pow"])
    torch.testing.assert_close(out, fn(x))
    assert fallbacks == ["aten.linalg_vector_norm.default"]


def test_an_op_named_in_eager_ops_stays_whole():
    x = torch.randn(4, 37)
    fn = lambda x: torch.linalg.vector_norm(x, 2, dim=1)  # noqa: E731
    out, fallbacks = _run(fn, x, eager_ops=["aten.linalg_vector_norm"])
    torch.testing.assert_close(out, fn(x))
    assert fallbacks == ["aten.linalg_vector_norm.default"]


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
