"""Where the device's arithmetic differs from torch's, the NKI lowerings keep torch's answer (eager is the oracle).

Each case here once gave a wrong answer without any error: casts rounded (the device converts to nearest even and
saturates; torch truncates toward zero, wraps narrow integers, and `bool()` means != 0), generated kernels replaced
-inf by a finite stand-in, and SDPA averaged the values of a query row whose every key is masked (torch gives 0).
"""

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from compiled import compile_static
from hypothesis import given, settings

import neuron_dynamo

INT_TARGETS = (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


def _in_range_for_torch(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float → int is undefined in C++ beyond the int32 range: keep the values whose torch answer is defined."""
    return values if dtype is torch.bool else values.clamp(-(2.0**31) + 1, 2.0**31 - 129)


@settings(max_examples=15, deadline=None)
@given(values=st.lists(st.floats(-1e5, 1e5, allow_nan=False, width=32), min_size=1, max_size=40),
       dtype=st.sampled_from(INT_TARGETS))
def test_float_to_integer_casts_match_torch(values, dtype):
    x = _in_range_for_torch(torch.tensor(values, dtype=torch.float32), dtype)
    fn = lambda t: (t * 1.5).to(dtype)  # noqa: E731 - one fused region: multiply, then the cast
    report = neuron_dynamo.explain(compile_static(fn), x)
    assert torch.equal(report.output, fn(x))
    assert report.totals()["fallback_ops"] == 0  # the cast ran on the target, not eagerly


@pytest.mark.parametrize("dtype", INT_TARGETS)
def test_integer_to_narrow_integer_casts_wrap_like_torch(dtype):
    x = torch.tensor([-70000, -300, -129, -1, 0, 1, 127, 128, 255, 256, 40000, 70000], dtype=torch.int32)
    fn = lambda t: (t + 1).to(dtype)  # noqa: E731
    assert torch.equal(compile_static(fn)(x), fn(x))


def test_float_to_int64_runs_eagerly_with_a_reason():
    """int64 lives as int32 on the device: 1e10 would saturate, so the cast is not lowered."""
    x = torch.tensor([-2.7, 2.7, 1e10])
    fn = lambda t: (t * 1.0).long()  # noqa: E731
    report = neuron_dynamo.explain(compile_static(fn), x)
    assert torch.equal(report.output, fn(x))
    reasons = [entry["reason"] for graph in report.graphs for entry in graph.fallback_ops]
    assert any("int64" in reason for reason in reasons)


def test_minus_infinity_constants_stay_infinite():
    x = torch.randn(4, 6)
    fn = lambda t: torch.where(t > 0, t, float("-inf")).exp() * 0.0 + torch.full_like(t, float("-inf")).isinf()  # noqa: E731
    torch.testing.assert_close(compile_static(fn)(x), fn(x), equal_nan=True)


def test_sdpa_query_with_no_key_to_attend_gives_zero_and_no_gradient():
    torch.manual_seed(0)
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool).tril()
    mask[..., :2] = False  # two left-padding positions: rows 0 and 1 have no key at all
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
    results = []
    neuron_dynamo.reset_stats()
    for run in (fn, compile_static(fn)):
        q, k, v = (torch.randn(1, 2, 6, 8, generator=torch.Generator().manual_seed(i), requires_grad=True)
                   for i in range(3))
        out = run(q, k, v)
        (out * torch.arange(8.0)).sum().backward()
        results.append((out.detach(), q.grad, k.grad, v.grad))
    for ours, eager in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(ours, eager, atol=1e-5, rtol=1e-4)
    assert neuron_dynamo.stats()["fallback_ops"] == 0


def test_integer_constant_beyond_int32_runs_eagerly_with_a_reason():
    """Reformer masks int64 buckets with iinfo(int64).min: the device's 32-bit integers cannot hold it."""
    x = torch.arange(6).reshape(2, 3)
    fn = lambda t: (t * 2).masked_fill(t > 2, torch.iinfo(torch.int64).min)  # noqa: E731
    report = neuron_dynamo.explain(compile_static(fn), x)
    assert torch.equal(report.output, fn(x))
    reasons = [entry["reason"] for graph in report.graphs for entry in graph.fallback_ops]
    assert any("beyond int32" in reason for reason in reasons)
    assert neuron_dynamo.stats().get("graphs_failed", 0) == 0
