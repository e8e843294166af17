"""Special functions as NKI emitters: the gamma family (lgamma, digamma, polygamma, Hurwitz zeta), the
error-function inverses and erfcx, nextafter, and the Bessel functions of `bessel.py`.

Each is computed in fp32 inside the kernel with the algorithm PyTorch itself uses (aten/src/ATen/native/Math.h:
Cephes rational and Chebyshev expansions, asymptotic series, reflection formulas) with Cephes' published
coefficients, so the two agree to a few fp32 ulps on the whole domain, poles, NaN and infinities included. Where
PyTorch branches on a value, the kernel computes every branch and selects (`nl.where`); where it loops until a value
crosses a bound, the loop is unrolled to the bound. Activations stay inside their valid input ranges (reference/nki.md
§1.9): logs go through `log_of`, and sines of any argument through an exact-enough reduction to [-π/4, π/4].
Derived from the Cephes Math Library (3-Clause BSD, Copyright (c) 2018, Steven Moshier), as PyTorch's Math.h is.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from neuron_dynamo.lowering.bessel import BESSEL_FUNCTIONS
from neuron_dynamo.lowering.codegen import Tile, emits
from neuron_dynamo.lowering.elementwise import refusal as elementwise_refusal
from neuron_dynamo.lowering.fp32_expressions import (
    F32,
    Value,
    as_value,
    both,
    cos_pi,
    either,
    exp,
    log,
    polevl,
    rounded,
    sign_bit,
    sin_cos,
    sin_pi,
    sqrt,
    where,
)
from neuron_dynamo.lowering.generated import run_single
from neuron_dynamo.lowering.math_functions import ERFC_POLY
from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten

# Cephes' ndtri coefficients (torch's float tables)
_NDTRI_P0 = (-59.96335010141079, 98.00107541859997, -56.67628574690703, 13.931260938727968, -1.2391658386738125)
_NDTRI_Q0 = (1.0, 1.9544885833814176, 4.676279128988815, 86.36024213908905, -225.46268785411937, 200.26021238006066,
    -82.03722561683334, 15.90562251262117, -1.1833162112133)
_NDTRI_P1 = (4.0554489230596245, 31.525109459989388, 57.16281922464213, 44.08050738932008, 14.684956192885803,
    2.1866330685079025, -0.1402560791713545, -0.03504246268278482, -0.0008574567851546854)
_NDTRI_Q1 = (1.0, 15.779988325646675, 45.39076351288792, 41.3172038254672, 15.04253856929075, 2.504649462083094,
    -0.14218292285478779, -0.03808064076915783, -0.0009332594808954574)
_NDTRI_P2 = (3.2377489177694603, 6.915228890689842, 3.9388102529247444, 1.3330346081580755, 0.20148538954917908,
    0.012371663481782003, 0.00030158155350823543, 2.6580697468673755e-06, 6.239745391849833e-09)
_NDTRI_Q2 = (1.0, 6.02427039364742, 3.6798356385616087, 1.3770209948908132, 0.21623699359449663, 0.013420400608854318,
    0.00032801446468212774, 2.8924786474538068e-06, 6.790194080099813e-09)


# ------------------------------------------------------------------------------------------------ the gamma family
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LGAMMA_SHIFT = 8  # Stirling's series is exact to fp32 from 8 on


def _lgamma_positive(z: Value) -> Value:
    """log Γ(z) for z ≥ 0: Stirling's series from 8 on, below that log Γ(z + 8) - log(z (z+1) ... (z+7))."""
    small = z < float(_LGAMMA_SHIFT)
    product = z
    for k in range(1, _LGAMMA_SHIFT):
        product = product * (z + float(k))
    w = where(small, z + float(_LGAMMA_SHIFT), z)
    log_w = log(w)
    inv = w.reciprocal()
    inv2 = inv * inv
    series = inv * ((inv2 * (1.0 / 1260.0) - 1.0 / 360.0) * inv2 + 1.0 / 12.0)
    stirling = w * (log_w - 1.0) - log_w * 0.5 + _HALF_LOG_2PI + series  # z·(log z - 1) first: no early overflow
    result = where(small, stirling - log(where(small, product, 1.0)), stirling)
    return where(z.eq(math.inf), math.inf, result)


def lgamma(x: Value) -> Value:
    """log|Γ(x)|: the reflection log π - log|sin(πx)| - log Γ(1 - x) below 0, with sin(πx) from x minus its
    nearest integer (exact); +inf at 0, at the negative integers and at ±inf, as C's lgammaf."""
    negative = x < 0.0
    r = x - rounded(x)
    sine = sin_pi(r.apply("nl.abs"))
    reflected = math.log(math.pi) - log(sine) - _lgamma_positive(where(negative, 1.0 - x, 1.0))
    pole = both(x.e, negative, r.eq(0.0))
    result = where(negative, where(pole, math.inf, reflected), _lgamma_positive(where(negative, 1.0, x)))
    return where(x.eq(-math.inf), math.inf, result)


_PSI_10 = 2.25175258906672110764
_DIGAMMA_ASYMPTOTIC = (8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
                       -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
                       8.33333333333333333333e-2)


def _digamma_positive(z: Value) -> Value:
    """ψ(z) for z > 0 as torch's float digamma: z pushed to 10 or beyond by ψ(z) = ψ(z+1) - 1/z, then the
    asymptotic series (exactly ψ(10) at 10)."""
    result = 0.0
    for _ in range(10):
        below = z < 10.0
        result = where(below, result - z.reciprocal(), result) if isinstance(result, Value) else where(
            below, -z.reciprocal(), 0.0)
        z = where(below, z + 1.0, z)
    inv2 = (z * z).reciprocal()
    tail = where(z < 1.0e17, inv2 * polevl(inv2, _DIGAMMA_ASYMPTOTIC), 0.0)
    asymptotic = result + log(z) - z.reciprocal() * 0.5 - tail
    return where(z.eq(10.0), result + _PSI_10, asymptotic)


def digamma(x: Value) -> Value:
    """ψ(x): the reflection ψ(1 - x) - π/tan(πx) below 0 (tan from x's distance to the nearest integer), NaN at
    the negative integers and -inf, ∓inf at ±0, as torch."""
    e = x.e
    negative = x < 0.0
    fraction = x - rounded(x)
    cot = cos_pi(fraction) / sin_pi(fraction)
    reflected = _digamma_positive(where(negative, 1.0 - x, 1.0)) - cot * math.pi
    integer = x.eq(x.apply("nl.trunc"))
    result = where(negative, where(integer, math.nan, reflected), _digamma_positive(where(negative, 1.0, x)))
    zero = where(sign_bit(x), math.inf, -math.inf, e)
    return where(x.eq(0.0), zero, where(either(e, x.isnan(), x.eq(math.inf)), x, result))


def trigamma(x: Value) -> Value:
    """ψ'(x) exactly as torch's float trigamma: below 1/2 the reflection with sin(fl(π·x)), then six steps of
    ψ'(x) = ψ'(x+1) + 1/x² and the asymptotic series."""
    pi = float(torch.tensor(math.pi, dtype=torch.float32))
    reflect = x < 0.5
    sine, _ = sin_cos(x * pi)
    result = where(reflect, -(float(torch.tensor(pi * pi, dtype=torch.float32)) / (sine * sine)), 0.0)
    z = where(reflect, 1.0 - x, x)
    for _ in range(6):
        result = result + (z * z).reciprocal()
        z = z + 1.0
    ixx = (z * z).reciprocal()
    inner = ((ixx * (-1.0 / 42.0) + 1.0 / 30.0) * ixx * -1.0 + 1.0 / 6.0) * ixx
    result = result + (inner + (z * 2.0).reciprocal() + 1.0) / z
    return where(reflect, -result, result)


# Euler-Maclaurin: (2k)!/B_2k, as Cephes' zeta
_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
           -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15, 1.8152105401943546773e17,
           -7.1661652561756670113e18)
_ZETA_TERMS = 10  # summed directly before the Euler-Maclaurin tail, so the tail starts at q + 10 ≥ 10


def _zeta_positive(s: Value, q: Value) -> Value:
    """ζ(s, q) = Σ (q+k)^-s for q > 0, s > 1 (Cephes): ten terms, then the Euler-Maclaurin tail at w = q + 10
    (powers as exp(-s·log a): the relative error stays below 1e-5 wherever the result is a normal float)."""
    total = 0.0
    a = q
    for _ in range(_ZETA_TERMS):
        total = exp(log(a) * -s) + total
        a = a + 1.0
    w = a
    b = exp(log(w) * -s)
    total = total + b * w / (s - 1.0) + b * 0.5
    factor, inv_w = 1.0, w.reciprocal()
    b = b * inv_w
    for k, divisor in enumerate(_ZETA_A):
        factor = (s + float(2 * k)) * factor
        total = total + factor * b * (1.0 / divisor)
        factor = factor * (s + float(2 * k + 1))
        b = b * inv_w * inv_w
    return total


def zeta(s: Value, q: Value) -> Value:
    """The Hurwitz zeta function ζ(s, q) as torch's: inf at s = 1 and at the non-positive integers q, NaN for
    s < 1 or a non-integer s with q ≤ 0. For q < 0 (s an integer) the sum splits into terms at positive
    arguments: ζ(s, q) = ζ(s, f) + (-1)^s (ζ(s, 1 - f) - ζ(s, 1 - q)), f = q - floor(q)."""
    e = s.e
    negative = q <= 0.0
    f = q - q.apply("nl.floor")
    positive = _zeta_positive(s, where(negative, 1.0, q))
    parity = e.call("nl.bitwise_and", e.call("nl.copy", s.apply("nl.abs").tile, dtype="int32"), 1, dtype="uint8")
    huge_s = s.apply("nl.abs") >= 2.0**24  # every such float is even
    sign = where(both(e, parity, e.call("nl.logical_not", huge_s, dtype="uint8")), -1.0, 1.0, e)
    f_safe = where(negative, f, 0.5)
    one_minus_f = where(negative, q.apply("nl.ceil") - q, 0.5)  # exact where small, unlike 1 - f
    mirrored = _zeta_positive(s, one_minus_f) - _zeta_positive(s, where(negative, 1.0 - q, 1.0))
    reflected = _zeta_positive(s, f_safe) + sign * mirrored
    integer_s = s.eq(s.apply("nl.floor"))
    pole = either(e, f.eq(0.0), q.eq(-math.inf))
    reflected = where(pole, math.inf, where(integer_s, reflected, math.nan))
    result = where(negative, reflected, positive)
    # s = inf: torch's terms (q+k)^-s are 0, 1 or inf: 1 at q = 1, inf below, and NaN above (its tail's 0·inf)
    infinite_s = where(q.eq(1.0), 1.0, where(q < 1.0, math.inf, math.nan, e))
    result = where(s.eq(math.inf), infinite_s, result)
    return where(s.eq(1.0), math.inf, where(s < 1.0, math.nan, result))


def polygamma(n: int, x: Value) -> Value:
    """ψ^(n)(x): ψ and ψ' as torch's float digamma and trigamma, higher orders (-1)^(n+1)·n!·ζ(n+1, x)."""
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    return zeta(as_value(x.e, float(n + 1)), x) * (sign * math.factorial(n))


# ------------------------------------------------------------------------------------------------ error functions
_ERFINV_A = (-0.140543331, 0.914624893, -1.645349621, 0.886226899)
_ERFINV_B = (0.012229801, -0.329097515, 1.442710462, -2.118377725, 1.0)
_ERFINV_C = (1.641345311, 3.429567803, -1.624906493, -1.970840454)
_ERFINV_D = (1.637067800, 3.543889200, 1.0)


def erfinv(y: Value) -> Value:
    """erf⁻¹ as torch: a rational first guess (central or tail) and two Newton steps on erf; ±inf at ±1, NaN
    beyond."""
    e = y.e
    ay = y.apply("nl.abs")
    z = y * y
    central = y * polevl(z, _ERFINV_A) / polevl(z, _ERFINV_B)
    t = sqrt(-log(where(ay < 1.0, (1.0 - ay) * 0.5, 0.5)))
    tail = polevl(t, _ERFINV_C) / polevl(t, _ERFINV_D)
    tail = where(sign_bit(y), -tail, tail)
    x = where(ay <= 0.7, central, tail)
    for _ in range(2):
        x = x - (x.apply("nl.erf") - y) / (exp(-(x * x)) * (2.0 / math.sqrt(math.pi)))
    x = where(ay.eq(1.0), where(sign_bit(y), -math.inf, math.inf, e), x)
    return where(either(e, ay > 1.0, y.isnan()), math.nan, x)


_EXP_MINUS_2 = 0.13533528323661269189
_SQRT_2PI = 2.50662827463100050242


def ndtri(y0: Value) -> Value:
    """The inverse of the standard normal CDF (Cephes ndtri): a rational function of y - 1/2 in the middle,
    of 1/sqrt(-2 log y) in the tails."""
    upper = y0 > 1.0 - _EXP_MINUS_2
    y = where(upper, 1.0 - y0, y0)
    middle_y = y - 0.5
    y2 = middle_y * middle_y
    middle = (middle_y + middle_y * (y2 * polevl(y2, _NDTRI_P0) / polevl(y2, _NDTRI_Q0))) * _SQRT_2PI
    x = sqrt(log(where(y > 0.0, y, 0.5)) * -2.0)
    x0 = x - log(x) / x
    z = x.reciprocal()
    x1 = where(x < 8.0, z * polevl(z, _NDTRI_P1) / polevl(z, _NDTRI_Q1), z * polevl(z, _NDTRI_P2) / polevl(
        z, _NDTRI_Q2))
    tail = x0 - x1
    tail = where(upper, tail, -tail)
    result = where(y > _EXP_MINUS_2, middle, tail)
    result = where(y0.eq(0.0), -math.inf, where(y0.eq(1.0), math.inf, result))
    return where(either(y0.e, y0 < 0.0, y0 > 1.0, y0.isnan()), math.nan, result)


def erfcx(x: Value) -> Value:
    """exp(x²)·erfc(x): for x ≥ 0 Numerical Recipes' erfc without its exp(-x²) factor, t·exp(P(t)) with
    t = 1/(1 + x/2) (relative error below 1.2e-7, no overflow); 2·exp(x²) - erfcx(-x) below 0."""
    ax = x.apply("nl.abs")
    t = (ax * 0.5 + 1.0).reciprocal()
    positive = t * exp(polevl(t, ERFC_POLY[::-1]))
    negative = exp(x * x) * 2.0 - positive
    return where(x < 0.0, negative, positive)


# ------------------------------------------------------------------------------------------------ nextafter
def nextafter(x: Value, y: Value) -> Tile:
    """The float after x toward y, from x's bits: the magnitude steps by one unit in the last place (as two exact
    16-bit halves with a carry: the engines add integers in fp32), ±0 steps to the smallest subnormal."""
    e = x.e
    bits = e.view(x.tile, "int32")
    high = e.call("nl.right_shift", bits, 16, dtype="int32")
    low = e.call("nl.bitwise_and", bits, 0xFFFF, dtype="int32")
    away = e.call("nl.logical_xor", x < y, x < 0.0, dtype="uint8")
    low = e.call("nl.add", low, e.call("nl.where", away, 1, -1, dtype="int32"), dtype="int32")
    carry = e.call("nl.where", e.call("nl.greater", low, 0xFFFF, dtype="uint8"), 1,
                   e.call("nl.where", e.call("nl.less", low, 0, dtype="uint8"), -1, 0, dtype="int32"), dtype="int32")
    high = e.call("nl.add", high, carry, dtype="int32")
    stepped = e.call("nl.bitwise_or", e.call("nl.left_shift", high, 16, dtype="int32"),
                     e.call("nl.bitwise_and", low, 0xFFFF, dtype="int32"), dtype="int32")
    toward_negative = e.call("nl.copy", y < 0.0, dtype="int32")
    smallest = e.call("nl.bitwise_or", e.call("nl.left_shift", toward_negative, 31, dtype="int32"), 1, dtype="int32")
    result = Value(e, e.view(e.call("nl.where", x.eq(0.0), smallest, stepped, dtype="int32"), F32))
    result = where(x.eq(y), y, result)
    return where(either(e, x.isnan(), y.isnan()), math.nan, result).tile


# ------------------------------------------------------------------------------------------------ registration
def _unary(compute):
    """The emitter of a one-operand function: computed in fp32, rounded once into the step's dtype."""

    def emit(e, dt, a):
        return e.call("nl.copy", compute(as_value(e, a)).tile, dtype=dt)

    return emit


for _op, _compute in ((aten.lgamma, lgamma), (aten.digamma, digamma), (aten.erfinv, erfinv),
                      (aten.special_ndtri, ndtri), (aten.special_erfcx, erfcx), *BESSEL_FUNCTIONS.items()):
    emits(_op)(_unary(_compute))


@emits(aten.polygamma)
def _polygamma(e, dt, n, a):
    return e.call("nl.copy", polygamma(int(n), as_value(e, a)).tile, dtype=dt)


@emits(aten.special_zeta)
def _zeta(e, dt, s, q):
    return e.call("nl.copy", zeta(as_value(e, s), as_value(e, q)).tile, dtype=dt)


@emits(aten.nextafter)
def _nextafter(e, dt, a, b):
    return nextafter(as_value(e, a), as_value(e, b))


SPECIAL_OPS = (aten.lgamma, aten.digamma, aten.polygamma, aten.special_zeta, aten.erfinv, aten.special_ndtri,
               aten.special_erfcx, *BESSEL_FUNCTIONS, aten.nextafter)
MAX_POLYGAMMA_ORDER = 12  # beyond, n! and the powers (x+k)^-(n+1) leave the accuracy exp(-s·log a) keeps


def _refuse(node: fx.Node) -> str | None:
    """Why a special-function node runs eagerly (None when the generated kernel computes it)."""
    reason = elementwise_refusal(node)
    if reason is not None:
        return reason
    dtype = node.meta["val"].dtype
    packet = node.target.overloadpacket
    if packet is aten.nextafter and dtype != torch.float32:
        return f"nextafter in {dtype}: the kernel steps fp32 bit patterns only"
    if not dtype.is_floating_point:
        return f"an integer result ({dtype})"
    if packet is aten.polygamma and not 0 <= node.args[0] <= MAX_POLYGAMMA_ORDER:
        return (f"polygamma of order {node.args[0]}: the kernel's Hurwitz zeta keeps 1e-4 accuracy up to order "
                f"{MAX_POLYGAMMA_ORDER}")
    return None


@lowers(*SPECIAL_OPS, family="elementwise")
def special(op, *args, **kwargs):
    """Reference kernel: torch computes the special function."""
    return op(*args, **kwargs)


@lowers(*SPECIAL_OPS, family="elementwise", target="simulator", accepts=_refuse, handles_empty=True)
def special_nki(op, *args, **kwargs):
    """One special function as a generated NKI kernel (fused with its neighbours in a region)."""
    return run_single(op, args, kwargs)
