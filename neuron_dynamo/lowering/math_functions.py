"""Element-wise math beyond the activation table: inverse trig and hyperbolic functions, accurate expm1/log1p,
erfc, rounding, sign-bit ops, NaN-ignoring extremes, ldexp and integer modulo, as NKI emitters.

Built from the engines' fp32 ALU ops and the activations inside their valid ranges (reference/nki.md §1.9):
arctan is valid on [-π/2, π/2] and sin on [-π, π], so the emitters reduce arguments first; each intermediate is
fp32 and the result is rounded once into the step's dtype. The ops are registered with the other element-wise ops
(`elementwise.ELEMENTWISE_OPS`), whose refusals they share.
"""

import math

import numpy as np
import torch

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.codegen import TILE_SHAPE, Emitter, GroupSpec, Ref, Step, Tile, emits
from neuron_dynamo.lowering.elementwise import INT_DTYPES, all_integer, binary, log_of, maximum, minimum
from neuron_dynamo.lowering.generated import FusedKernel, run_single
from neuron_dynamo.lowering.int_ranges import WIDE_MODULO_DIVISOR
from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten

F32 = "float32"
LN2 = math.log(2.0)


def _f(e: Emitter, fn: str, *args) -> Tile:
    return e.call(fn, *args, dtype=F32)


def _mask(e: Emitter, fn: str, a, b) -> Tile:
    """A 0/1 predicate tile for `nl.where`."""
    return e.call(fn, a, b, dtype="uint8")


def _where(e: Emitter, condition: Tile, a, b) -> Tile:
    return e.call("nl.where", condition, a, b, dtype=F32)


def _fp32_tile(e: Emitter, value) -> Tile:
    """A tile operand as fp32, a constant as an fp32 tile (for unary activations, which need a tile)."""
    if isinstance(value, Tile):
        return value if value.dtype == F32 else _f(e, "nl.copy", value)
    return _f(e, "nl.full", TILE_SHAPE, float(value))


def _horner(e: Emitter, x: Tile, coefficients) -> Tile:
    """c0 + x·(c1 + x·(c2 + ...)) for `coefficients` c0, c1, ..."""
    *rest, last = coefficients
    result = _f(e, "nl.multiply", x, float(last))
    for c in reversed(rest[1:]):
        result = _f(e, "nl.multiply", _f(e, "nl.add", result, float(c)), x)
    return _f(e, "nl.add", result, float(rest[0]))


def sign_bit(e: Emitter, a) -> Tile:
    """1 where the sign bit of `a` is set (-0.0 and negative NaNs included), else 0: int32."""
    if not isinstance(a, Tile):
        return e.call("nl.full", TILE_SHAPE, int(math.copysign(1.0, a) < 0), dtype="int32")
    if a.dtype in INT_DTYPES:
        return e.call("nl.less", a, 0, dtype="int32")
    width = 32 if a.dtype == F32 else 16
    bits = e.view(a, "int32" if width == 32 else "int16")
    return e.call("nl.right_shift", bits, width - 1, dtype="int32")


def sqrt(e: Emitter, v: Tile) -> Tile:
    """sqrt on [0, inf] and NaN below 0, as torch gives. The activation is valid on [2**-116, 2**118]: tinier
    inputs take sqrt(2**-116) = 2**-58 (an absolute error below 4e-18); inputs above 2**100 are scaled by
    2**-100 and their root by 2**50 (both exact)."""
    big = _mask(e, "nl.greater", v, 2.0**100)
    scaled = _where(e, big, _f(e, "nl.multiply", v, 2.0**-100), v)
    root = _f(e, "nl.sqrt", _f(e, "nl.maximum", scaled, 2.0**-116))
    root = _where(e, big, _f(e, "nl.multiply", root, 2.0**50), root)
    return _where(e, _mask(e, "nl.less", v, 0.0), math.nan, root)


def _log1p_of(e: Emitter, u: Tile) -> Tile:
    """log(1 + u) to fp32 precision near 0 (Kahan: log(w)·u/(w - 1) with w = 1 + u rounded)."""
    w = _f(e, "nl.add", u, 1.0)
    d = _f(e, "nl.subtract", w, 1.0)
    ratio = _where(e, _mask(e, "nl.equal", w, math.inf), 1.0, _f(e, "nl.multiply", u, _f(e, "nl.reciprocal", d)))
    return _where(e, _mask(e, "nl.equal", d, 0.0), u, _f(e, "nl.multiply", log_of(e, w), ratio))


def _expm1_of(e: Emitter, u: Tile) -> Tile:
    """exp(u) - 1 to fp32 precision near 0: a Taylor polynomial on |u| < 1/4, exp(u) - 1 beyond."""
    taylor = _f(e, "nl.multiply", _horner(e, u, [1.0 / math.factorial(k + 1) for k in range(9)]), u)
    small = _mask(e, "nl.less", _f(e, "nl.abs", u), 0.25)
    return _where(e, small, taylor, _f(e, "nl.subtract", _f(e, "nl.exp", u), 1.0))


def _atan_of(e: Emitter, x: Tile) -> Tile:
    """arctan on all reals: |x| > 1 takes π/2·sign(x) - arctan(1/x), keeping the activation's input in [-1, 1]."""
    outside = _mask(e, "nl.greater", _f(e, "nl.abs", x), 1.0)
    reduced = _f(e, "nl.arctan", _where(e, outside, _f(e, "nl.reciprocal", x), x))
    mirrored = _f(e, "nl.subtract", _f(e, "nl.multiply", _f(e, "nl.sign", x), math.pi / 2), reduced)
    return _where(e, outside, mirrored, reduced)


def activation(e: Emitter, fn: str, x: Tile) -> Tile:
    """`nisa.activation(op=fn)` on an argument already inside the function's valid range (nl.sin would add a
    range reduction through x + π that costs precision near 0)."""
    def write(name: str) -> None:
        e.raw(f"{name} = nl.ndarray((pr, cc), dtype=nl.{F32}, buffer=nl.sbuf)")
        e.raw(f"nisa.activation(dst={{}}, op={fn}, data={{}})", Tile(name, F32), x)

    return e.once(("activation", fn, x.name), write, F32)


def _fp32_emitter(compute):
    """An emitter computing `compute(e, x)` on its operand as fp32, rounded once into the step's dtype."""

    def emit(e, dt, a):
        return e.call("nl.copy", compute(e, _fp32_tile(e, a)), dtype=dt)

    return emit


@emits(aten.expm1)
@_fp32_emitter
def _expm1(e, x):
    return _expm1_of(e, x)


@emits(aten.log1p)
@_fp32_emitter
def _log1p(e, x):
    return _log1p_of(e, x)


@emits(aten.log10)
@_fp32_emitter
def _log10(e, x):
    return _f(e, "nl.multiply", log_of(e, x), 1.0 / math.log(10.0))


@emits(aten.atan)
@_fp32_emitter
def _atan(e, x):
    return _atan_of(e, x)


@emits(aten.asin)
@_fp32_emitter
def _asin(e, x):
    # 2·arctan(x / (1 + sqrt(1 - x²))): the argument stays in [-1, 1]; (1 - x)(1 + x) keeps precision near ±1
    root = sqrt(e, _f(e, "nl.multiply", _f(e, "nl.subtract", 1.0, x), _f(e, "nl.add", x, 1.0)))
    half = _f(e, "nl.arctan", _f(e, "nl.multiply", x, _f(e, "nl.reciprocal", _f(e, "nl.add", root, 1.0))))
    return _f(e, "nl.multiply", half, 2.0)


@emits(aten.acos)
@_fp32_emitter
def _acos(e, x):
    # 2·arctan(sqrt((1 - |x|) / (1 + |x|))) for |x|, mirrored to π - that for x < 0: no cancellation near ±1
    ax = _f(e, "nl.abs", x)
    ratio = _f(e, "nl.multiply", _f(e, "nl.subtract", 1.0, ax), _f(e, "nl.reciprocal", _f(e, "nl.add", ax, 1.0)))
    angle = _f(e, "nl.multiply", _f(e, "nl.arctan", sqrt(e, ratio)), 2.0)
    return _where(e, _mask(e, "nl.less", x, 0.0), _f(e, "nl.subtract", math.pi, angle), angle)


@emits(aten.atan2)
def _atan2(e, dt, y, x):
    """The angle of (x, y) by octant: arctan(min/max) of the magnitudes in [0, 1], then mirrored by the signs
    (sign bits, so atan2(0, -0) = π as in torch; infinite pairs give the multiples of π/4)."""
    y, x = _fp32_tile(e, y), _fp32_tile(e, x)
    ay, ax = _f(e, "nl.abs", y), _f(e, "nl.abs", x)
    high, low = _f(e, "nl.maximum", ay, ax), _f(e, "nl.minimum", ay, ax)
    ratio = _where(e, _mask(e, "nl.equal", high, 0.0), 0.0, _f(e, "nl.multiply", low, _f(e, "nl.reciprocal", high)))
    ratio = _where(e, _mask(e, "nl.equal", low, math.inf), 1.0, ratio)
    angle = _f(e, "nl.arctan", ratio)
    angle = _where(e, _mask(e, "nl.greater", ay, ax), _f(e, "nl.subtract", math.pi / 2, angle), angle)
    angle = _where(e, sign_bit(e, x), _f(e, "nl.subtract", math.pi, angle), angle)
    return e.call("nl.where", sign_bit(e, y), _f(e, "nl.multiply", angle, -1.0), angle, dtype=dt)


def _half_exp(e: Emitter, ax: Tile) -> Tile:
    """e^|x| / 2, infinite from where exp(|x|) overflows, as in torch's sinh and cosh."""
    return _f(e, "nl.multiply", _f(e, "nl.exp", ax), 0.5)


@emits(aten.cosh)
@_fp32_emitter
def _cosh(e, x):
    half = _half_exp(e, _f(e, "nl.abs", x))
    return _f(e, "nl.add", half, _f(e, "nl.multiply", _f(e, "nl.reciprocal", half), 0.25))


@emits(aten.sinh)
@_fp32_emitter
def _sinh(e, x):
    # (e^x - e^-x) / 2 cancels near 0: a Taylor polynomial (to x^11) there, exact to fp32 on |x| < 1
    half = _half_exp(e, _f(e, "nl.abs", x))
    large = _f(e, "nl.subtract", half, _f(e, "nl.multiply", _f(e, "nl.reciprocal", half), 0.25))
    x2 = _f(e, "nl.multiply", x, x)
    taylor = _f(e, "nl.multiply", _horner(e, x2, [1.0 / math.factorial(2 * k + 1) for k in range(6)]), x)
    small = _mask(e, "nl.less", _f(e, "nl.abs", x), 1.0)
    return _where(e, small, taylor, _f(e, "nl.multiply", large, _f(e, "nl.sign", x)))


# π/2 in three parts for Cody-Waite argument reduction: k·C1 and k·C2 are exact for |k| < 2**12 or so
_HALF_PI_PARTS = (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8)


def _reduce_half_pi(e: Emitter, x: Tile) -> tuple[Tile, Tile, Tile]:
    """x = k·π/2 + r with |r| ≤ π/4 (Cody-Waite: π/2 in three parts, the first 201/128, so k·201/128 is exact while
    k·201 < 2**24: |x| up to 1.3e5), and sin r, cos r from the activation inside its valid range.
    `nl.sin`'s own reduction (through x + π, modulo 2π) is off by 3e-4 at x = 1e4 already: rotary-embedding angles
    (position × frequency) reach 1e5 at long contexts."""
    quadrant = e.call("nl.copy", _f(e, "nl.multiply", x, 2.0 / math.pi), dtype="int32")  # the nearest integer
    k = _f(e, "nl.copy", quadrant)
    r = x
    for part in _HALF_PI_PARTS:
        r = _f(e, "nl.subtract", r, _f(e, "nl.multiply", k, part))
    return quadrant, activation(e, "nl.sin", r), activation(e, "nl.sin", _f(e, "nl.add", r, math.pi / 2))


@emits(aten.tan)
@_fp32_emitter
def _tan(e, x):
    """tan(x) = sin(r)/cos(r) for an even quadrant k, -cos(r)/sin(r) for an odd one (r keeps fp32 precision near
    the poles)."""
    quadrant, sin_r, cos_r = _reduce_half_pi(e, x)
    odd = e.call("nl.bitwise_and", quadrant, 1, dtype="uint8")
    direct = _f(e, "nl.multiply", sin_r, _f(e, "nl.reciprocal", cos_r))
    flipped = _f(e, "nl.multiply", cos_r, _f(e, "nl.reciprocal", _f(e, "nl.multiply", sin_r, -1.0)))
    return _where(e, odd, flipped, direct)


def _sine(shift: int):
    """sin(x + shift·π/2): quadrant q = k + shift (mod 4) picks sin r, cos r, -sin r or -cos r."""

    def compute(e, x):
        quadrant, sin_r, cos_r = _reduce_half_pi(e, x)
        q = e.call("nl.bitwise_and", e.call("nl.add", quadrant, shift, dtype="int32"), 3, dtype="int32")
        odd = e.call("nl.bitwise_and", q, 1, dtype="uint8")
        value = _where(e, odd, cos_r, sin_r)
        negative = e.call("nl.greater", q, 1, dtype="uint8")
        return _where(e, negative, _f(e, "nl.multiply", value, -1.0), value)

    return compute


emits(aten.sin)(_fp32_emitter(_sine(0)))
emits(aten.cos)(_fp32_emitter(_sine(1)))


_BIG = 2.0**12  # beyond it asinh and acosh are log(2|x|) to fp32 precision (and x² would overflow later)


@emits(aten.asinh)
@_fp32_emitter
def _asinh(e, x):
    # log1p(|x| + x²/(1 + sqrt(1 + x²))) with the sign of x: exact to fp32 near 0, no cancellation for x < 0
    ax = _f(e, "nl.abs", x)
    a = _f(e, "nl.minimum", ax, _BIG)
    a2 = _f(e, "nl.multiply", a, a)
    root = _f(e, "nl.sqrt", _f(e, "nl.add", a2, 1.0))
    u = _f(e, "nl.add", a, _f(e, "nl.multiply", a2, _f(e, "nl.reciprocal", _f(e, "nl.add", root, 1.0))))
    far = _f(e, "nl.add", log_of(e, ax), LN2)
    magnitude = _where(e, _mask(e, "nl.greater", ax, _BIG), far, _log1p_of(e, u))
    return _where(e, _mask(e, "nl.less", x, 0.0), _f(e, "nl.multiply", magnitude, -1.0), magnitude)


@emits(aten.acosh)
@_fp32_emitter
def _acosh(e, x):
    # log1p((x - 1) + sqrt((x - 1)(x + 1))): exact to fp32 near 1; NaN below 1 (the square root's)
    a = _f(e, "nl.minimum", x, _BIG)
    below = _f(e, "nl.subtract", a, 1.0)
    u = _f(e, "nl.add", below, sqrt(e, _f(e, "nl.multiply", below, _f(e, "nl.add", a, 1.0))))
    far = _f(e, "nl.add", log_of(e, x), LN2)
    result = _where(e, _mask(e, "nl.greater", x, _BIG), far, _log1p_of(e, u))
    return _where(e, _mask(e, "nl.less", x, 1.0), math.nan, result)


@emits(aten.atanh)
@_fp32_emitter
def _atanh(e, x):
    # log1p(2|x| / (1 - |x|)) / 2 with the sign of x: exact to fp32 near 0 and near ±1, ±inf at ±1, NaN beyond
    ax = _f(e, "nl.abs", x)
    u = _f(e, "nl.multiply", _f(e, "nl.multiply", ax, 2.0), _f(e, "nl.reciprocal", _f(e, "nl.subtract", 1.0, ax)))
    magnitude = _f(e, "nl.multiply", _log1p_of(e, u), 0.5)
    return _where(e, _mask(e, "nl.less", x, 0.0), _f(e, "nl.multiply", magnitude, -1.0), magnitude)


# erfc(z) = t·exp(-z² + P(t)), t = 1/(1 + z/2), for z ≥ 0 (Numerical Recipes' erfcc: relative error below
# 1.2e-7 everywhere, so tails keep their precision where 1 - erf(z) would round to 0); erfc(-z) = 2 - erfc(z)
ERFC_POLY = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
              1.48851587, -0.82215223, 0.17087277)


@emits(aten.erfc)
@_fp32_emitter
def _erfc(e, x):
    z = _f(e, "nl.abs", x)
    t = _f(e, "nl.reciprocal", _f(e, "nl.add", _f(e, "nl.multiply", z, 0.5), 1.0))
    exponent = _f(e, "nl.subtract", _horner(e, t, ERFC_POLY), _f(e, "nl.multiply", z, z))
    tail = _f(e, "nl.multiply", t, _f(e, "nl.exp", exponent))
    return _where(e, _mask(e, "nl.less", x, 0.0), _f(e, "nl.subtract", 2.0, tail), tail)


@emits(aten.hypot)
def _hypot(e, dt, a, b):
    """max·sqrt(1 + (min/max)²): no overflow of a² + b²; an infinite operand gives inf even beside a NaN."""
    aa, ab = _f(e, "nl.abs", _fp32_tile(e, a)), _f(e, "nl.abs", _fp32_tile(e, b))
    high, low = _f(e, "nl.maximum", aa, ab), _f(e, "nl.minimum", aa, ab)
    ratio = _where(e, _mask(e, "nl.equal", high, 0.0), 0.0, _f(e, "nl.multiply", low, _f(e, "nl.reciprocal", high)))
    length = _f(e, "nl.multiply", high, _f(e, "nl.sqrt", _f(e, "nl.add", _f(e, "nl.multiply", ratio, ratio), 1.0)))
    infinite = e.call("nl.logical_or", _mask(e, "nl.equal", aa, math.inf), _mask(e, "nl.equal", ab, math.inf),
                      dtype="uint8")
    return e.call("nl.where", infinite, math.inf, length, dtype=dt)


@emits(aten.elu)
def _elu(e, dt, a, alpha=1, scale=1, input_scale=1):
    x = _fp32_tile(e, a)
    negative = _f(e, "nl.multiply", _expm1_of(e, _f(e, "nl.multiply", x, float(input_scale))), float(alpha * scale))
    return e.call("nl.where", _mask(e, "nl.greater", x, 0.0), _f(e, "nl.multiply", x, float(scale)), negative,
                  dtype=dt)


@emits(aten.elu_backward)
def _elu_backward(e, dt, grad, alpha, scale, input_scale, is_result, self_or_result):
    """torch's formula: from the result, grad·input_scale·(y + alpha·scale), else from the input through exp."""
    y = _fp32_tile(e, self_or_result)
    if is_result:
        slope = _f(e, "nl.multiply", _f(e, "nl.add", y, float(alpha * scale)), float(input_scale))
    else:
        slope = _f(e, "nl.multiply", _f(e, "nl.exp", _f(e, "nl.multiply", y, float(input_scale))),
                   float(input_scale * alpha * scale))
    grad = _fp32_tile(e, grad)
    return e.call("nl.where", _mask(e, "nl.less_equal", y, 0.0), _f(e, "nl.multiply", grad, slope),
                  _f(e, "nl.multiply", grad, float(scale)), dtype=dt)


@emits(aten.leaky_relu)
def _leaky_relu(e, dt, a, negative_slope=0.01):
    x = _fp32_tile(e, a)
    return e.call("nl.where", _mask(e, "nl.greater", x, 0.0), x, _f(e, "nl.multiply", x, float(negative_slope)),
                  dtype=dt)


@emits(aten.leaky_relu_backward)
def _leaky_relu_backward(e, dt, grad, a, negative_slope, self_is_result):
    grad = _fp32_tile(e, grad)
    return e.call("nl.where", _mask(e, "nl.greater", a, 0.0), grad, _f(e, "nl.multiply", grad, float(negative_slope)),
                  dtype=dt)


@emits(aten.isnan)
def _isnan(e, dt, a):
    return e.call("nl.not_equal", a, a, dtype=dt)  # NaN is the one value unequal to itself


@emits(aten.isinf)
def _isinf(e, dt, a):
    return e.call("nl.equal", _f(e, "nl.abs", a), math.inf, dtype=dt)


@emits(aten.signbit)
def _signbit(e, dt, a):
    return e.call("nl.copy", sign_bit(e, a), dtype=dt)


@emits(aten.copysign)
def _copysign(e, dt, a, b):
    magnitude = _f(e, "nl.abs", _fp32_tile(e, a))
    if not isinstance(b, Tile):
        return e.call("nl.multiply", magnitude, math.copysign(1.0, b), dtype=dt)
    return e.call("nl.where", sign_bit(e, b), _f(e, "nl.multiply", magnitude, -1.0), magnitude, dtype=dt)


def _nan_ignoring(extreme):
    """fmax / fmin: the maximum / minimum of the numbers, a NaN only where both operands are NaN."""

    def emit(e, dt, a, b):
        if dt in INT_DTYPES:
            return extreme(e, dt, a, b)
        both = extreme(e, F32, a, b)  # NaN where either is
        if isinstance(a, Tile):
            both = _where(e, _mask(e, "nl.not_equal", a, a), b, both)
        if isinstance(b, Tile):
            both = _where(e, _mask(e, "nl.not_equal", b, b), a, both)
        return e.call("nl.copy", both, dtype=dt)

    return emit


emits(aten.fmax)(_nan_ignoring(maximum))
emits(aten.fmin)(_nan_ignoring(minimum))


@emits(aten.logical_xor)
def _logical_xor(e, dt, a, b):
    return binary(e, "nl.logical_xor", a, b, dt)


def _round_half_even(e: Emitter, x: Tile) -> Tile:
    """Round to nearest, ties to even, as torch: the device's fp32 → int32 conversion does exactly that for
    |x| < 2**23 (larger floats are integers already, and NaN and inf stay); a zero keeps the sign of x."""
    nearest = _f(e, "nl.copy", e.call("nl.copy", x, dtype="int32"))
    rounded = _where(e, _mask(e, "nl.less", _f(e, "nl.abs", x), 2.0**23), nearest, x)
    return _where(e, _mask(e, "nl.equal", rounded, 0.0), _f(e, "nl.multiply", x, 0.0), rounded)


@emits(aten.round)
def _round(e, dt, a, decimals=0):
    """torch's round(x · 10^d) / 10^d in fp32 (`refusal` keeps 0 ≤ d ≤ 30: a negative d divides by 10^-d
    before rounding, which the device's reciprocal multiply does not do exactly at ties)."""
    if a.dtype in INT_DTYPES:
        return e.call("nl.copy", a, dtype=dt)
    x = _fp32_tile(e, a)
    if not decimals:
        return e.call("nl.copy", _round_half_even(e, x), dtype=dt)
    scale = float(np.float32(10.0**decimals))
    scaled = _round_half_even(e, _f(e, "nl.multiply", x, scale))
    return e.call("nl.multiply", scaled, 1.0 / scale, dtype=dt)


def _power_of_two(e: Emitter, exponent: Tile) -> Tile:
    """2**n for int32 n in [-126, 127], built from its bits (exp(n·ln 2) would round)."""
    biased = e.call("nl.add", exponent, 127, dtype="int32")
    return e.view(e.call("nl.left_shift", biased, 23, dtype="int32"), F32)


@emits(aten.ldexp)
def _ldexp(e, dt, a, exponent):
    """x · 2**n exactly, as torch (0 · 2**300 is 0, not 0 · inf): three exact power-of-two factors of at most
    2**±127 each (`refusal` keeps n integer), so x only rounds when it leaves the normal range."""
    remaining = _f(e, "nl.minimum", _f(e, "nl.maximum", _fp32_tile(e, exponent), -378.0), 381.0)
    result = _fp32_tile(e, a)
    for _ in range(3):
        part = _f(e, "nl.minimum", _f(e, "nl.maximum", remaining, -126.0), 127.0)
        result = _f(e, "nl.multiply", result, _power_of_two(e, e.call("nl.copy", part, dtype="int32")))
        remaining = _f(e, "nl.subtract", remaining, part)
    return e.call("nl.copy", result, dtype=dt)


def _floored_modulo(e: Emitter, x: Tile, m: int) -> Tile:
    """x mod m in [0, m) for integer-valued fp32 x and m below 2**22: the fp32 quotient is off by at most one."""
    rest = _f(e, "nl.subtract", x, _f(e, "nl.multiply", _f(e, "nl.floor", _f(e, "nl.multiply", x, 1.0 / m)),
                                      float(m)))
    rest = _where(e, _mask(e, "nl.less", rest, 0.0), _f(e, "nl.add", rest, float(m)), rest)
    return _where(e, _mask(e, "nl.greater_equal", rest, float(m)), _f(e, "nl.subtract", rest, float(m)), rest)


def _wide_modulo(e: Emitter, a: Tile, b: int, truncated: bool) -> Tile:
    """fmod / remainder of any int32 by a constant below 2**10, exact: a + 2**31 = high·2**16 + low (bit ops),
    so a ≡ (high mod m)·(2**16 mod m) + (low mod m) - (2**31 mod m) (mod m), every term below 2**22."""
    m = abs(b)
    biased = e.call("nl.bitwise_xor", a, 2**31, dtype="int32")
    high = _f(e, "nl.copy", e.call("nl.right_shift", biased, 16, dtype="int32"))
    low = _f(e, "nl.copy", e.call("nl.bitwise_and", a, 0xFFFF, dtype="int32"))
    folded = _f(e, "nl.add", _f(e, "nl.multiply", _floored_modulo(e, high, m), float(2**16 % m)),
                _floored_modulo(e, low, m))
    rest = _floored_modulo(e, _f(e, "nl.add", folded, float(m - 2**31 % m)), m)  # in [0, m)
    signed = _where(e, _mask(e, "nl.greater", rest, 0.0), _f(e, "nl.subtract", rest, float(m)), rest)  # in (-m, 0]
    if truncated:  # the sign of the dividend
        return _where(e, _mask(e, "nl.less", a, 0), signed, rest)
    return signed if b < 0 else rest  # the sign of the divisor


def _integer_modulo(truncated: bool):
    """fmod (truncated: the sign of the dividend) or remainder (floored: the sign of the divisor) of integers by
    a non-zero constant, exact: `refusal` bounds both below 2**22, so the fp32 quotient is off by at most one,
    and one correction step each way fixes it."""

    def emit(e, dt, a, b):
        if not (isinstance(a, Tile) and all_integer(a, b) and not isinstance(b, Tile) and b):
            raise codegen.CodegenError("only an integer modulo by a non-zero constant is lowered")
        if a.dtype == "int32" and abs(b) < WIDE_MODULO_DIVISOR:
            return e.call("nl.copy", _wide_modulo(e, a, b, truncated), dtype=dt)
        quotient = _f(e, "nl.trunc" if truncated else "nl.floor", _f(e, "nl.multiply", a, 1.0 / b))
        rest = _f(e, "nl.subtract", a, _f(e, "nl.multiply", quotient, float(b)))
        # the result lies in [0, |b|) times the sign of `toward` (a for fmod, b for remainder)
        if truncated:
            toward = _f(e, "nl.sign", _fp32_tile(e, a))
            step = _f(e, "nl.multiply", toward, float(abs(b)))
        else:
            toward, step = math.copysign(1.0, b), float(b)
        below = _mask(e, "nl.less", _f(e, "nl.multiply", rest, toward), 0.0)
        rest = _where(e, below, _f(e, "nl.add", rest, step), rest)
        beyond = _mask(e, "nl.greater_equal", _f(e, "nl.multiply", rest, toward), float(abs(b)))
        rest = _where(e, beyond, _f(e, "nl.subtract", rest, step), rest)
        return e.call("nl.copy", rest, dtype=dt)

    return emit


emits(aten.fmod)(_integer_modulo(truncated=True))
emits(aten.remainder)(_integer_modulo(truncated=False))



# ------------------------------------------------------------------------------------------------ angle, frexp
@emits(aten.angle)
def _angle(e, dt, a):
    """The angle of a real number: π below 0, 0 at or above it (-0.0 included), NaN kept."""
    x = _fp32_tile(e, a)
    angle = _f(e, "nl.multiply", _f(e, "nl.less", x, 0.0), math.pi)
    return e.call("nl.where", _mask(e, "nl.not_equal", x, x), x, angle, dtype=dt)


class FrexpPart:
    """One output of frexp as an element-wise step of its own (both come from one kernel: `frexp_nki`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"frexp_{self.name}"


FREXP_MANTISSA, FREXP_EXPONENT = FrexpPart("mantissa"), FrexpPart("exponent")


def _frexp_fields(e: Emitter, a) -> tuple[Tile, Tile, Tile, Tile]:
    """(x, its bits, its unbiased exponent + 1, where frexp returns x and 0): read from the bits, exact. A
    subnormal is first scaled by 2**64 (exact) so that its leading bit lands in the exponent field."""
    x = _fp32_tile(e, a)
    magnitude = _f(e, "nl.abs", x)
    tiny = _f(e, "nl.less", magnitude, 2.0**-126)
    scaled = _where(e, _mask(e, "nl.less", magnitude, 2.0**-126), _f(e, "nl.multiply", x, 2.0**64), x)
    bits = e.view(scaled, "int32")
    biased = e.call("nl.bitwise_and", e.call("nl.right_shift", bits, 23, dtype="int32"), 0xFF, dtype="int32")
    exponent = _f(e, "nl.subtract", _f(e, "nl.subtract", biased, 126.0), _f(e, "nl.multiply", tiny, 64.0))
    special = e.call("nl.logical_or", _mask(e, "nl.equal", magnitude, 0.0),
                     _mask(e, "nl.greater_equal", biased, 255), dtype="uint8")  # 0, ±inf, NaN
    return x, bits, exponent, special


@emits(FREXP_MANTISSA)
def _frexp_mantissa(e, dt, a):
    """The bits of x with the exponent field of [0.5, 1): sign and significand kept."""
    x, bits, _, special = _frexp_fields(e, a)
    sign = e.call("nl.left_shift", e.call("nl.right_shift", bits, 31, dtype="int32"), 31, dtype="int32")
    significand = e.call("nl.bitwise_and", bits, 0x7FFFFF, dtype="int32")
    field = e.call("nl.bitwise_or", e.call("nl.bitwise_or", sign, significand, dtype="int32"), 126 << 23,
                   dtype="int32")
    return e.call("nl.where", special, x, e.view(field, F32), dtype=dt)


@emits(FREXP_EXPONENT)
def _frexp_exponent(e, dt, a):
    _, _, exponent, special = _frexp_fields(e, a)
    return e.call("nl.where", special, 0.0, exponent, dtype=dt)


def _angle_refusal(node) -> str | None:
    from neuron_dynamo.lowering.elementwise import refusal

    if node.args[0].meta["val"].dtype.is_complex:
        return "the angle of a complex tensor"
    return refusal(node)


def _frexp_refusal(node) -> str | None:
    x = node.args[0].meta["val"]
    return None if x.dtype in codegen.FLOAT_DTYPES else f"frexp of {x.dtype}"


@lowers(aten.angle, aten.frexp, family="elementwise")
def math_reference(op, *args, **kwargs):
    """Reference kernel: torch computes the op."""
    return op(*args, **kwargs)


@lowers(aten.angle, family="elementwise", target="simulator", accepts=_angle_refusal, handles_empty=True)
def angle_nki(op, x):
    """A lone angle as a generated kernel (fused with its neighbours like any element-wise op)."""
    return run_single(op, (x,), {})


# frexp returns two tensors, so it never joins a fused group (`generated._fusable` takes single tensor results)
@lowers(aten.frexp, family="elementwise", target="simulator", accepts=_frexp_refusal, handles_empty=True)
def frexp_nki(op, x):
    """Mantissa and exponent from one generated kernel (two steps reading x's bits)."""
    steps = (Step(FREXP_MANTISSA, (Ref("in", 0),), (), x.dtype), Step(FREXP_EXPONENT, (Ref("in", 0),), (), torch.int32))
    return FusedKernel(GroupSpec((x.dtype,), steps, (0, 1)), x.shape)(x)
