"""The element-wise ops built from several engine instructions (inverse trigonometry, rounding, sign bits, ...)
against eager: special values (±0, ±inf, NaN, the edges of each domain), bf16, 0-dim, empty and non-contiguous
inputs, and the cases the backend refuses, with their reasons."""

import logging
import math

import pytest
import torch
import torch.nn.functional as F
from compiled import compile_static

import neuron_dynamo

SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e-6, -1e-6, 1e-30, 3.0, -7.25, 88.0, 89.0, -89.0,
            1e20, -1e20, math.inf, -math.inf, math.nan, 0.999999, -0.999999, 1.0000001, 1.5707, 4.7123, 8000.5]

UNARY = {
    "isnan": torch.isnan, "isinf": torch.isinf, "signbit": torch.signbit, "sign": torch.sign, "sgn": torch.sgn,
    "trunc": torch.trunc, "frac": torch.frac, "round": torch.round, "round_3": lambda t: torch.round(t, decimals=3),
    "log10": torch.log10, "erfc": torch.erfc, "acos": torch.acos, "asin": torch.asin, "atan": torch.atan,
    "sinh": torch.sinh, "cosh": torch.cosh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
    "expm1": torch.expm1, "log1p": torch.log1p, "elu": F.elu, "selu": F.selu, "leaky_relu": F.leaky_relu,
    "nan_to_num": torch.nan_to_num, "entr": torch.special.entr,
}
BINARY = {
    "atan2": torch.atan2, "hypot": torch.hypot, "copysign": torch.copysign, "fmax": torch.fmax, "fmin": torch.fmin,
    "logical_xor": torch.logical_xor, "xlogy": torch.xlogy, "xlog1py": torch.special.xlog1py,
    "heaviside": torch.heaviside,
}


def _check(fn, *inputs, rtol=1e-4, atol=1e-5):
    """Compiled output equals eager's, and nothing ran eagerly."""
    report = neuron_dynamo.explain(compile_static(fn), *inputs)
    torch.testing.assert_close(report.output, fn(*inputs), rtol=rtol, atol=atol, equal_nan=True)
    reasons = [entry["reason"] for graph in report.graphs for entry in graph.fallback_ops]
    assert not reasons, reasons


def _values(count: int = 300, scale: float = 3.0) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.cat([torch.tensor(SPECIALS), torch.randn(count) * scale])


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_op_matches_eager_on_special_values(name):
    _check(UNARY[name], _values())


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_op_matches_eager_on_special_values(name):
    x = _values()
    y = torch.cat([torch.tensor([0.0, -0.0, -1.0, 1.0, math.inf, -math.inf, math.nan]).repeat(4), torch.randn(300)])
    _check(BINARY[name], x, y[: x.numel()])
    _check(BINARY[name], y[: x.numel()], x)


def test_zeros_keep_their_sign():
    x = torch.tensor([-0.0, 0.0, -0.3, 0.3, -0.5, -1e-3])
    fn = lambda t: (1.0 / t.round(), torch.signbit(t), torch.atan2(t, torch.full_like(t, -0.0)))  # noqa: E731
    _check(fn, x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_compute_in_fp32_and_round_once(dtype):
    x = _values(200, 2.0).clamp(-60, 60).to(dtype)
    fn = lambda t: (t.atan(), t.asinh(), t.erfc(), t.sinh(), t.round(), t.signbit(), t.tan(), t.isinf())  # noqa: E731
    _check(fn, x, rtol=1e-2, atol=1e-2)


def test_zero_dim_and_non_contiguous_inputs():
    x = torch.randn(6, 130).t()[::2]  # transposed and strided: ragged 65 × 6
    fn = lambda t, s: (torch.atan2(t, s), torch.hypot(t, s), t.acos(), t.tan(), t.cosh())  # noqa: E731
    _check(fn, x, torch.tensor(-0.75))


def test_empty_inputs():
    fn = lambda t: (t.isnan(), t.asin(), torch.fmax(t, t))  # noqa: E731
    _check(fn, torch.empty(0, 5))


def test_integer_inputs_promote_like_torch():
    x = torch.tensor([-3, -1, 0, 1, 2, 70000], dtype=torch.int32)
    fn = lambda t: (t.atan(), t.signbit(), t.isnan(), t.round(), t.trunc(), torch.fmax(t, t.flip(0)))  # noqa: E731
    _check(fn, x)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int8, torch.uint8])
def test_integer_modulo_by_a_constant_is_exact(dtype):
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max + 1, (500,), dtype=dtype)
    for divisor in [d for d in (3, -7, 10, 1, 127) if d >= info.min]:
        _check(lambda t, d=divisor: (t.remainder(d), torch.fmod(t, d)), x)


def test_int64_modulo_of_bounded_positions_is_exact():
    """int64 graph inputs can hold anything; positions from arange are provably small (`int_ranges`)."""
    fn = lambda t: t + (torch.arange(-3000, 3000, 3) + 5).remainder(-7) + torch.arange(2000).fmod(6)  # noqa: E731
    _check(fn, torch.zeros(2000))


def test_roll_index_arithmetic_lowers():
    _check(lambda t: torch.roll(t, 3, 0) * 2, torch.randn(11, 4))


@pytest.mark.parametrize("args", [(0.5, 7.25, 0.25), (-1.0, 1.0, 0.1), (3,), (2.0, -3.0, -0.7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fractional_and_floating_arange_match_eager(args, dtype):
    fn = lambda t: t + torch.arange(*args, dtype=dtype)  # noqa: E731
    size = torch.arange(*args, dtype=dtype).numel()
    _check(fn, torch.zeros(size, dtype=dtype), rtol=1e-5 if dtype == torch.float32 else 1e-2)


def test_ldexp_is_exact_over_the_exponent_range():
    x = torch.tensor([1.0, -1.5, 3.0, 0.75, 1e-3, 2.0, math.inf, 0.0, 3e38, 1e-40, math.nan])
    n = torch.tensor([0, 10, -130, 127, 140, -200, 5, 300, -300, 200, 3], dtype=torch.int32)
    _check(torch.ldexp, x, n, rtol=0, atol=0)


def test_tan_keeps_precision_near_its_poles():
    x = torch.tensor([1.5707, -1.5707, 4.7123, 1.57079, 7.85398, 100.0, -1000.0])
    _check(torch.tan, x)


def _refusals(fn, *inputs):
    report = neuron_dynamo.explain(compile_static(fn), *inputs)
    torch.testing.assert_close(report.output, fn(*inputs), equal_nan=True)
    return [entry["reason"] for graph in report.graphs for entry in graph.fallback_ops]


@pytest.mark.parametrize(("fn", "inputs", "expected"), [
    (lambda a, b: torch.fmod(a, b), (torch.randn(8), torch.randn(8)), "floating-point fmod"),
    (lambda a: a.remainder(0.3), (torch.randn(8),), "floating-point remainder"),
    (lambda a, b: a % b, (torch.arange(8), torch.arange(1, 9)), "by a tensor"),
    (lambda a: a % 3000, (torch.randint(-2**30, 2**30, (8,)),), "2**22"),  # a % 3 is exact: 16-bit halves
    (lambda a: torch.round(a, decimals=-2), (torch.randn(8) * 1000,), "tie"),
    (lambda a, b: torch.ldexp(a, b), (torch.randn(8), torch.randn(8)), "floating-point exponent"),
])
def test_refusals_say_why(fn, inputs, expected):
    reasons = _refusals(fn, *inputs)
    assert any(expected in reason for reason in reasons), reasons


def test_fractional_arange_into_integers_is_refused():
    reasons = _refusals(lambda t: t + torch.arange(0.5, 5.5, 1.0, dtype=torch.int32), torch.zeros(5, dtype=torch.int32))
    assert any("integer dtype" in reason for reason in reasons), reasons


def test_sin_cos_tan_of_rotary_angles_at_long_contexts():
    """Rotary embeddings take sin/cos of position × frequency: at 128k positions the angles reach 1.3e5, where
    `nl.sin`'s own range reduction is off by 4e-3; the emitters reduce by π/2 in three parts (exact to about 1e5)."""
    positions = torch.arange(0, 131072, 97, dtype=torch.float32)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    fn = lambda p, f: (torch.outer(p, f).sin(), torch.outer(p, f).cos())  # noqa: E731
    _check(fn, positions, inv_freq, atol=1e-4)
    special = torch.tensor([0.0, -0.0, 1e-30, 3.14159265, 1e4, 1e5, -1e5, math.inf, -math.inf, math.nan])
    _check(lambda t: (t.sin(), t.cos(), t.tan()), special, atol=1e-4)


def test_logs_stay_inside_the_activation_range_on_all_of_fp32(caplog):
    """ScalarE's log is valid on [2**-64, 2**64] only (the interpreter warns outside, where hardware is invalid):
    subnormals, 0, huge values and inf are scaled into it, and the answers are still eager's."""
    x = torch.tensor([0.0, -0.0, 1e-45, 1e-40, 2.0**-130, 1e-30, 2.0**-64, 1e-10, 0.5, 1.0, 3.0, 1e10, 2.0**64,
                      1e25, 3e38, math.inf, -1.0, -math.inf, math.nan])
    with caplog.at_level(logging.WARNING, logger="neuron_dynamo.nki"):
        for fn in (torch.log, torch.log2, torch.log10, torch.log1p, lambda t: t.abs() ** 0.3):
            _check(fn, x, rtol=1e-5, atol=1e-6)
    assert not [r for r in caplog.records if "outside its valid ScalarE range" in r.getMessage()]
