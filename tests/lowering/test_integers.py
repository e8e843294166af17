"""Integers are integers: torch's integer semantics on the NKI target, or an eager fallback with a reason.

The NKI engines compute arithmetic in fp32 (exact for integers up to 2**24) and saturate when they convert to a
narrow type, and int64 lives as int32 on the device; torch computes integers exactly and wraps on overflow. Each
case here was once silently wrong. Now integer arithmetic whose result can reach 2**24 runs eagerly with a reason
(counted in `explain`), narrow arithmetic that is provably exact stays lowered and wraps like torch, and
comparisons, min/max, selects, casts and bit ops stay lowered and are exact at any int32 value.
"""

import logging

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import neuron_dynamo
from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.codegen import Code, CodegenError, Emitter, Tile

INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
NARROW = (torch.int8, torch.uint8, torch.int16)
WIDE = (torch.int32, torch.int64)


def _compiled(fn, **kwargs):
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", **kwargs)  # the defaults a user gets, unless a test says otherwise


def _explain(fn, *inputs, options=None):
    neuron_dynamo.reset_stats()
    report = neuron_dynamo.explain(_compiled(fn), *inputs, options=options)
    return report, [entry["reason"] for graph in report.graphs for entry in graph.fallback_ops]


def _extremes(dtype: torch.dtype, size: int = 16) -> torch.Tensor:
    """The dtype's extremes, the values around 2**24 that fp32 cannot tell apart, and small numbers."""
    info = torch.iinfo(torch.int32 if dtype is torch.int64 else dtype)  # int64 reaches the device as int32
    candidates = [info.min, info.min + 1, info.max, info.max - 1, 0, 1, -1, 2**24 - 1, 2**24, 2**24 + 1, 2**24 + 3,
                  -(2**24) - 1, 100, 200, -100, 127]
    values = [v for v in candidates if info.min <= v <= info.max]
    values += [7] * (size - len(values))
    return torch.tensor(values[:size], dtype=dtype)


def _values(dtype: torch.dtype, size: int = 16):
    # int64 tensors hold int32 values here: larger ones cannot even reach the device (they fail loudly, not wrongly)
    info = torch.iinfo(torch.int32 if dtype is torch.int64 else dtype)
    return st.lists(st.integers(info.min, info.max), min_size=size, max_size=size)


# ------------------------------------------------------------------------------------------------ the cases
@pytest.mark.parametrize(("fn", "x"), [
    (lambda t: t + 1, torch.tensor([16777217, -16777219, 2**31 - 1])),  # int64: fp32 gave 16777216
    (lambda t: t * 3, torch.tensor([10000001, -10000001, 2**31 - 1])),  # int64: fp32 gave 30000004
    (lambda t: t + 1, torch.tensor([2**31 - 1, -(2**31)], dtype=torch.int32)),  # wraps, did saturate
    (lambda t: t * 2 - 1, torch.tensor([2**30 + 7, -(2**30) - 9], dtype=torch.int32)),
    (lambda t: t + 200, torch.tensor([100, 55, 56, 255, 0], dtype=torch.uint8)),  # 44, did give 255
    (lambda t: t * 3, torch.tensor([100, -100, 43, 42, -128, 127], dtype=torch.int8)),  # 44, did give 127
    (lambda t: -t, torch.tensor([-128, 127, 0], dtype=torch.int8)),
    (lambda t: t.abs(), torch.tensor([-128, 127, -5], dtype=torch.int8)),
    (lambda t: t - 30000, torch.tensor([-32768, -2769, 32767, 0], dtype=torch.int16)),
], ids=["int64_add", "int64_mul", "int32_overflow", "int32_mul_sub", "uint8_add", "int8_mul", "int8_neg", "int8_abs",
        "int16_sub"])
def test_integer_arithmetic_matches_eager(fn, x):
    torch.testing.assert_close(_compiled(fn)(x), fn(x), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", WIDE)
def test_wide_integer_arithmetic_runs_eagerly_with_a_reason(dtype):
    x = torch.tensor([16777217, -5, 2**31 - 1], dtype=dtype)
    fn = lambda t: (t + 1) * 3  # noqa: E731
    report, reasons = _explain(fn, x)
    torch.testing.assert_close(report.output, fn(x), rtol=0, atol=0)
    assert len(reasons) == 2 and all("2**24" in r and "fp32" in r for r in reasons), reasons
    assert report.totals()["fallback_ops"] == 2
    assert neuron_dynamo.stats().get("graphs_failed", 0) == 0


@pytest.mark.parametrize("dtype", NARROW)
def test_exact_narrow_arithmetic_stays_lowered_and_wraps(dtype):
    x = _extremes(dtype)
    y = x.flip(0)
    fn = lambda a, b: ((a + b) * 3 - a).abs() - b  # noqa: E731 - every intermediate is far below 2**24
    report, reasons = _explain(fn, x, y)
    torch.testing.assert_close(report.output, fn(x, y), rtol=0, atol=0)
    assert reasons == [] and report.totals()["ops_lowered"] == report.totals()["ops_total"]


def test_narrow_arithmetic_that_can_reach_2_24_runs_eagerly():
    x = torch.tensor([32767, -32768, 181, 3], dtype=torch.int16)
    fn = lambda t: t * t  # noqa: E731 - up to 2**30: fp32 cannot hold it exactly
    report, reasons = _explain(fn, x)
    torch.testing.assert_close(report.output, fn(x), rtol=0, atol=0)
    assert len(reasons) == 1 and "int16 arithmetic" in reasons[0]


@settings(max_examples=10, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_arithmetic_property(dtype, data):
    compiled = _COMPILED_ARITH.setdefault(dtype, _compiled(_arith))
    x = torch.tensor(data.draw(_values(dtype)), dtype=dtype)
    y = torch.tensor(data.draw(_values(dtype)), dtype=dtype)
    torch.testing.assert_close(compiled(x, y), _arith(x, y), rtol=0, atol=0)


def _arith(a, b):
    return a + b, a - b, a * b, -a, (a * 2 + 1), a.abs()


_COMPILED_ARITH: dict = {}


# ------------------------------------------------------------------------------------------------ division
@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("fn", [lambda a, b: a // b, lambda a, b: a % b, lambda a, b: a // 0,
                                lambda a, b: torch.div(a, b, rounding_mode="trunc")],
                         ids=["floordiv", "remainder", "floordiv_by_constant_zero", "truncdiv"])
def test_integer_division_by_zero_raises_like_eager(dtype, fn):
    x = torch.tensor([5, -7, 0, 9], dtype=dtype) if dtype is not torch.uint8 else torch.tensor([5, 7, 0, 9],
                                                                                              dtype=dtype)
    zero = torch.zeros(4, dtype=dtype)
    with pytest.raises(RuntimeError, match="ZeroDivisionError") as eager:
        fn(x, zero)
    with pytest.raises(type(eager.value), match="ZeroDivisionError"):
        _compiled(fn)(x, zero)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_division_runs_eagerly_with_a_reason(dtype):
    x = torch.tensor([16777217, -7, 0, 9], dtype=torch.int64).to(dtype)
    y = torch.tensor([3, 2, 5, -4], dtype=torch.int64).to(dtype)
    fn = lambda a, b: (a // b, torch.div(a, b, rounding_mode="trunc"), a // 3)  # noqa: E731
    report, reasons = _explain(fn, x, y, options={"bucketing": False})  # see the bucketing test below
    for ours, eager in zip(report.output, fn(x, y), strict=True):
        torch.testing.assert_close(ours, eager, rtol=0, atol=0)
    assert reasons and all("division" in r and "by zero" in r for r in reasons), reasons
    assert report.totals()["fallback_ops"] == 3 and neuron_dynamo.stats().get("graphs_failed", 0) == 0


@pytest.mark.parametrize("fn", [
    lambda a, b: a // b, lambda a, b: a % b, lambda a, b: torch.fmod(a, b),
    lambda a, b: torch.div(a, b, rounding_mode="trunc"), lambda a, b: torch.div(a, b, rounding_mode="floor"),
], ids=["floordiv", "remainder", "fmod", "trunc", "floor"])
def test_integer_division_by_a_bucketed_divisor_does_not_fail_the_graph(fn):
    """Bucketing pads the divisor with zeros: the padding proof sets its pad to 1 first (eager raises on 0)."""
    neuron_dynamo.reset_stats()
    compiled = _compiled(fn)
    for n in (5, 7, 37):
        x, y = torch.arange(n) - 10, torch.arange(n) + 1
        torch.testing.assert_close(compiled(x, y), fn(x, y), rtol=0, atol=0)
    stats = neuron_dynamo.stats()
    assert stats.get("graphs_failed", 0) == 0 and stats.get("calls_eager", 0) == 0, stats


def test_a_division_by_zero_in_the_inputs_raises_as_in_eager_and_the_graph_stays_compiled(caplog):
    fn = lambda a, b: a // b  # noqa: E731
    compiled = _compiled(fn)
    x = torch.arange(5)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(x, torch.zeros(5, dtype=torch.int64))
    neuron_dynamo.reset_stats()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(x, torch.zeros(5, dtype=torch.int64))
    torch.testing.assert_close(compiled(x, x + 1), fn(x, x + 1), rtol=0, atol=0)
    assert neuron_dynamo.stats().get("graphs_failed", 0) == 0 and "backend failed" not in caplog.text


def test_integer_true_division_is_float_and_lowered():
    x, y = torch.tensor([5, -7, 0, 9]), torch.tensor([2, 2, 3, -4])
    report, reasons = _explain(lambda a, b: a / b, x, y)
    torch.testing.assert_close(report.output, x / y)
    assert reasons == []


# ---------------------------------------------------------------------------------------- exact ops stay lowered
def _exact_ops(a, b):
    wide = a.dtype in WIDE
    big = 16777217 if wide else 100  # constants beyond a narrow type are not what a narrow type is compared with
    ops = [a == b, a != b, a < b, a <= b, a > b, a >= b, a == big - 1, a > big - 1, a <= (-big if wide else 5),
           torch.maximum(a, b), torch.minimum(a, b), torch.where(a > b, a, b), a.masked_fill(a < b, big),
           (a > b) & (a != 0), a.relu()]
    if wide:
        ops += [a.clamp(-big, big), a.clamp(min=big - 1), a.clamp_max(b)]
    return tuple(ops)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_comparisons_selects_and_clamps_are_exact_and_lowered(dtype):
    x = _extremes(dtype)
    y = x.flip(0).clone()
    y[1::4] = x[1::4]  # equal
    y[3::4] = x[3::4] ^ 1  # neighbours, which fp32 cannot tell apart above 2**24
    report, reasons = _explain(_exact_ops, x, y)
    for ours, eager in zip(report.output, _exact_ops(x, y), strict=True):
        torch.testing.assert_close(ours, eager, rtol=0, atol=0)
    assert reasons == [], reasons


@pytest.mark.parametrize("dtype", (torch.int8, torch.uint8))
def test_comparison_with_a_constant_beyond_a_narrow_type_runs_eagerly(dtype):
    x = torch.tensor([0, 1, 100, 127], dtype=dtype)
    fn = lambda t: (t <= -100, t == 356, t > -1)  # noqa: E731 - torch wraps the constant into the tensor's type
    report, reasons = _explain(fn, x)
    for ours, eager in zip(report.output, fn(x), strict=True):
        torch.testing.assert_close(ours, eager, rtol=0, atol=0)
    assert reasons and all("beyond its range" in r for r in reasons), reasons


@settings(max_examples=10, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("dtype", WIDE)
def test_wide_comparisons_property(dtype, data):
    compiled = _COMPILED_CMP.setdefault(dtype, _compiled(_cmp))
    x = torch.tensor(data.draw(_values(dtype)), dtype=dtype)
    y = x + torch.tensor(data.draw(st.lists(st.integers(-2, 2), min_size=16, max_size=16)), dtype=dtype)
    y = y.clamp(-(2**31), 2**31 - 1)
    for ours, eager in zip(compiled(x, y), _cmp(x, y), strict=True):
        torch.testing.assert_close(ours, eager, rtol=0, atol=0)


def _cmp(a, b):
    return a == b, a < b, a >= b, torch.maximum(a, b), torch.minimum(a, b)


_COMPILED_CMP: dict = {}


@pytest.mark.parametrize("dtype", (torch.int8, torch.uint8, torch.int16, torch.bool))
def test_int32_to_narrow_casts_wrap_above_2_24(dtype):
    x = torch.tensor([16777217, 16777343, 2**31 - 1, -(2**31), -16777345, 70000, -129, 255], dtype=torch.int32)
    fn = lambda t: t.to(dtype)  # noqa: E731
    report, reasons = _explain(lambda t: (t ^ 0).to(dtype), x)
    torch.testing.assert_close(report.output, fn(x), rtol=0, atol=0)
    assert reasons == []


# ------------------------------------------------------------------------------------------------ reductions
def test_integer_sums_that_can_reach_2_24_run_eagerly():
    x = torch.tensor([16777217, 1, -3], dtype=torch.int32)
    fn = lambda t: (t.sum(), t.cumsum(0), t.amax())  # noqa: E731
    report, reasons = _explain(fn, x)
    for ours, eager in zip(report.output, fn(x), strict=True):
        torch.testing.assert_close(ours, eager, rtol=0, atol=0)
    assert len(reasons) == 3 and all("2**24" in r for r in reasons), reasons


def test_small_integer_sums_stay_lowered():
    mask = torch.tensor([[True, False, True], [True, True, True]])
    small = torch.tensor([[-128, 127, 5], [1, 2, 3]], dtype=torch.int8)
    fn = lambda m, s: (m.sum(-1), m.cumsum(-1), s.sum(), s.amax(-1))  # noqa: E731
    report, reasons = _explain(fn, mask, small)
    for ours, eager in zip(report.output, fn(mask, small), strict=True):
        torch.testing.assert_close(ours, eager, rtol=0, atol=0)
    assert reasons == []


# ------------------------------------------------------------------------------------------------ NaN constants
def test_nan_constants_are_written_as_nan():
    x = torch.tensor([1.0, -2.0, 3.0])
    fn = lambda t: (t + float("nan"), t.masked_fill(t > 0, float("nan")), t * float("inf"))  # noqa: E731
    report, reasons = _explain(fn, x)
    for ours, eager in zip(report.output, fn(x), strict=True):
        torch.testing.assert_close(ours, eager, equal_nan=True)
    assert reasons == []


# ------------------------------------------------------------------------------------------------ empty tensors
@pytest.mark.parametrize("make", [
    lambda: (torch.nn.Linear(4, 3), torch.randn(0, 4)),
    lambda: (torch.nn.Linear(4, 3), torch.randn(2, 0, 4)),
    lambda: (torch.nn.Linear(4, 3), torch.randn(0, 4, requires_grad=True)),
], ids=["linear", "linear_3d", "linear_backward"])
def test_empty_batch_matches_eager_without_a_warning(make, caplog):
    torch.manual_seed(0)
    module, x = make()
    with caplog.at_level(logging.WARNING):
        report, reasons = _explain(module, x)
        if x.requires_grad:
            report.output.sum().backward()
    torch.testing.assert_close(report.output, module(x))
    assert report.output.shape == module(x).shape
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
    assert neuron_dynamo.stats().get("graphs_failed", 0) == 0


@pytest.mark.parametrize(("fn", "inputs"), [
    (lambda a, b: torch.cat([a, b], 1) * 2, (torch.randn(2, 0, 4), torch.randn(2, 3, 4))),  # an empty KV cache
    (lambda w, i: torch.nn.functional.embedding(i, w) * 2, (torch.randn(10, 4), torch.zeros(2, 0, dtype=torch.long))),
    (lambda x, i: x.gather(1, i) * 2, (torch.randn(5, 4), torch.zeros(5, 0, dtype=torch.long))),
    (lambda x, i: x[i] * 2, (torch.randn(5, 4), torch.zeros(0, dtype=torch.long))),
    (lambda x: torch.nn.functional.pad(x, (1, 1)) * 2, (torch.randn(0, 4),)),
    (lambda x: (x.sum(0), x.sum(1), x.amax(0), x.softmax(-1)), (torch.randn(3, 0),)),
], ids=["cat", "embedding", "gather", "index", "pad", "reductions"])
def test_empty_tensors_never_fail_a_graph(fn, inputs, caplog):
    with caplog.at_level(logging.WARNING):
        report, reasons = _explain(fn, *inputs)
    expected = fn(*inputs)
    for ours, eager in zip(*((report.output, expected) if isinstance(expected, tuple) else ((report.output,),
                                                                                          (expected,))), strict=True):
        torch.testing.assert_close(ours, eager, equal_nan=True)
    assert all("empty tensor" in r for r in reasons), reasons
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert neuron_dynamo.stats().get("graphs_failed", 0) == 0


def test_empty_mm_and_zero_dim_tensors(caplog):
    a, b = torch.randn(0, 4), torch.randn(4, 3)
    with caplog.at_level(logging.WARNING):
        report, _ = _explain(lambda x, y: x @ y, a, b)
        assert report.output.shape == (0, 3)
        report, _ = _explain(lambda x, y: x @ y, torch.randn(3, 0), torch.randn(0, 2))  # an empty contraction
        torch.testing.assert_close(report.output, torch.zeros(3, 2), rtol=0, atol=0)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    scalar = torch.tensor(2.5)
    report, reasons = _explain(lambda s: (s * 2 + 1).exp(), scalar)  # a 0-dim tensor has one element
    torch.testing.assert_close(report.output, (scalar * 2 + 1).exp())
    assert reasons == []


# ------------------------------------------------------------------------------------------------ code generation
def test_literal_never_pastes_a_string():
    for text in ("anything", "(pr, cc)", "__import__('os').system('true')", "nan"):
        with pytest.raises(CodegenError):
            codegen._literal(text)
    assert codegen._literal(Code("(pr, cc)")) == "(pr, cc)"
    assert codegen._literal(Tile("v3", "int32")) == "v3"
    assert codegen._literal(float("nan")) == 'float("nan")' and codegen._literal(float("-inf")) == 'float("-inf")'
    assert codegen._literal(True) == "1.0" and codegen._literal(-7) == "-7"
    with pytest.raises(CodegenError):
        codegen.typed_constant("1; import os", "float32")


def test_emitter_only_writes_nki_calls_and_dtypes():
    e = Emitter()
    with pytest.raises(CodegenError):
        e.call("print", Tile("v0", "float32"), dtype="float32")
    with pytest.raises(CodegenError):
        e.call("nl.add", Tile("v0", "float32"), 1.0, dtype="float32, evil")
    with pytest.raises(CodegenError):
        e.raw("x = {}", "os.system('true')")
    e.raw("nisa.iota({}, [[{}, cc]])", Tile("v0", "int32"), 2)
    assert e.lines == ["nisa.iota(v0, [[2, cc]])"]


def test_a_string_constant_in_a_fused_group_spec_is_refused():
    """A spec read back from a cache entry could carry any string: it must never reach the generated source."""
    spec = codegen.GroupSpec(
        (torch.float32,),
        (codegen.Step(torch.ops.aten.add.Tensor, (codegen.Ref("in", 0), "__import__('os')"), (), torch.float32),),
        (0,))
    with pytest.raises(CodegenError):
        codegen.elementwise_source(spec, "kernel")


def test_an_int64_input_beyond_int32_runs_the_graph_eagerly_never_wrong():
    """int64 lives as int32 on device: a value beyond it cannot be stored, so the graph runs eagerly (a warning)."""
    fn = lambda x, y: torch.where(x > 5, y, y * 2)  # noqa: E731
    neuron_dynamo.reset_stats()
    x, y = torch.tensor([2**40, 3, 7]), torch.randn(3)
    torch.testing.assert_close(_compiled(fn)(x, y), fn(x, y))
    assert neuron_dynamo.stats()["graphs_failed"] == 1


# ------------------------------------------------------------------------------------------------ float → int64
def test_a_float_to_int64_cast_of_bounded_values_is_lowered_and_one_of_input_values_is_not():
    """F.interpolate's source indices are `floor((arange(n) + 0.5) · scale)` cast to int64: bounded by the analysis,
    so they fit the device's int32. A cast of an input's values could hold anything: it runs eagerly."""
    x = torch.randn(1, 2, 5, 7)
    for mode in ("nearest", "bilinear"):
        fn = lambda t, mode=mode: torch.nn.functional.interpolate(t, scale_factor=1.7, mode=mode)  # noqa: E731
        report, reasons = _explain(fn, x)
        torch.testing.assert_close(report.output, fn(x), rtol=1e-5, atol=1e-5)
        assert reasons == []
    big = torch.tensor([3e9, -2.5, 7.9])
    report, reasons = _explain(lambda t: t.long() + 1, big)
    torch.testing.assert_close(report.output, big.long() + 1, rtol=0, atol=0)
    assert any("float → int64 cast" in reason for reason in reasons), reasons
