"""Element-wise ops, casts and tensor creation: the chains the NKI code generator fuses into one kernel.

On the NKI targets each op here has an *emitter* (`codegen.emits`) that writes its NKI lines for one SBUF tile;
`lower_region` fuses neighbouring element-wise nodes into one generated kernel. The registered simulator kernel is
the same generator applied to a single op (what a lone call of the op runs).
"""

import math

import numpy as np
import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.codegen import TILE_SHAPE, Emitter, Tile, emits
from neuron_dynamo.lowering.creation import CREATION_OPS
from neuron_dynamo.lowering.generated import run_single
from neuron_dynamo.lowering.int_ranges import FP32_EXACT, integer_refusal
from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten
prims = torch.ops.prims

ELEMENTWISE_OPS = (
    # arithmetic and comparisons
    aten.abs, aten.add, aten.sub, aten.rsub, aten.mul, aten.div, aten.neg, aten.reciprocal, aten.pow,
    aten.maximum, aten.minimum, aten.clamp, aten.clamp_min, aten.clamp_max, aten.sign, aten.floor, aten.ceil,
    aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge, aten.where, aten.masked_fill,
    aten.logical_not, aten.logical_and, aten.logical_or, aten.bitwise_not, aten.bitwise_and, aten.bitwise_or,
    aten.bitwise_xor,
    # transcendental functions and activations
    aten.exp, aten.exp2, aten.expm1, aten.log, aten.log1p, aten.log2, aten.sqrt, aten.rsqrt, aten.sin, aten.cos,
    aten.tanh, aten.erf, aten.sigmoid, aten.relu, aten.gelu, aten.silu, aten.hardtanh, aten.softplus, aten.mish,
    aten.log10, aten.erfc, aten.tan, aten.atan, aten.asin, aten.acos, aten.atan2, aten.sinh, aten.cosh,
    aten.asinh, aten.acosh, aten.atanh, aten.hypot, aten.elu, aten.leaky_relu,
    # classification, rounding, sign and exponent manipulation
    aten.isnan, aten.isinf, aten.signbit, aten.trunc, aten.round, aten.copysign, aten.fmax, aten.fmin,
    aten.logical_xor, aten.fmod, aten.remainder, aten.ldexp,
    # their derivatives (backward graphs)
    aten.threshold_backward, aten.gelu_backward, aten.silu_backward, aten.sigmoid_backward, aten.tanh_backward,
    aten.elu_backward, aten.leaky_relu_backward,
    # casts and copies
    aten._to_copy, prims.convert_element_type, aten.clone, aten.copy, aten.copy_, aten.lift_fresh_copy,
)


@lowers(*ELEMENTWISE_OPS, family="elementwise")
def elementwise(op, *args, **kwargs):
    """Reference kernel: torch computes the op; the NKI code generator fuses such chains into one kernel."""
    return op(*args, **kwargs)


@lowers(*CREATION_OPS, family="creation")
def creation(op, *args, **kwargs):
    """Reference kernel: torch creates the tensor; on device these are memsets and iota patterns in SBUF."""
    return op(*args, **kwargs)


# ------------------------------------------------------------------------------------------------ NKI emitters
# Integers: the engines compute arithmetic in fp32 (exact for integers up to 2**24) and saturate when they convert
# to a narrow type, while torch computes integers exactly and wraps. So an integer-valued step is only lowered when
# it is exact: `_refuse` runs integer arithmetic whose result can reach 2**24 eagerly; the rest computes in fp32,
# lands in an int32 tile (exact), and is wrapped into the result type with bit-vector ops (`_wrap`).
# Comparisons, minimum/maximum and clamps of int32 tiles (int64 lives as int32 on device) would round above 2**24
# in fp32: they compare exact 16-bit halves instead (`_order_key`).
INT_DTYPES = ("int8", "uint8", "int16", "int32")


def _tiles(*values):
    return [v for v in values if isinstance(v, Tile)]


def _binary(e: Emitter, fn: str, a, b, dt: str):
    if not _tiles(a, b):
        raise codegen.CodegenError(f"{fn} of two constants")
    return e.call(fn, a, b, dtype=dt)


def _wrap(e: Emitter, a: Tile, dt: str) -> Tile:
    """An integer-valued tile (int32, or narrower) as integer type `dt`, wrapped modulo 2**bits as torch does."""
    if dt not in _WRAP:
        return a if a.dtype == dt else e.call("nl.copy", a, dtype=dt)
    mask, sign = _WRAP[dt]
    low = e.call("nl.bitwise_and", a, mask, dtype="int32")  # the low bits, as an unsigned number (exact)
    if sign:  # two's complement: (u ^ sign) - sign maps [0, 2·sign) onto [-sign, sign), exact in fp32
        low = e.call("nl.subtract", e.call("nl.bitwise_xor", low, sign, dtype="int32"), sign, dtype="int32")
    return e.call("nl.copy", low, dtype=dt)


def _integer(e: Emitter, dt: str, fn: str, *operands):
    """`fn(*operands)` with an integer result: in fp32 (exact: `_refuse` bounds it below 2**24), then wrapped."""
    if dt not in INT_DTYPES:
        return e.call(fn, *operands, dtype=dt) if len(operands) == 1 else _binary(e, fn, *operands, dt)
    result = e.call(fn, *operands, dtype="int32") if len(operands) == 1 else _binary(e, fn, *operands, "int32")
    return _wrap(e, result, dt)


def _scaled(e: Emitter, b, alpha, dt: str):
    if alpha == 1:
        return b
    work = "int32" if dt in INT_DTYPES else dt  # an integer b·alpha must not saturate in a narrow type
    return e.call("nl.multiply", b, alpha, dtype=work) if isinstance(b, Tile) else b * alpha


@emits(aten.add)
def _add(e, dt, a, b, alpha=1):
    return _integer(e, dt, "nl.add", a, _scaled(e, b, alpha, dt))


@emits(aten.sub)
def _sub(e, dt, a, b, alpha=1):
    return _integer(e, dt, "nl.subtract", a, _scaled(e, b, alpha, dt))


@emits(aten.rsub)
def _rsub(e, dt, a, b, alpha=1):
    return _integer(e, dt, "nl.subtract", b, _scaled(e, a, alpha, dt))


@emits(aten.mul)
def _mul(e, dt, a, b):
    return _integer(e, dt, "nl.multiply", a, b)


@emits(aten.div)
def _div(e, dt, a, b, rounding_mode=None):
    # Trainium has no divide: multiply by the reciprocal (VectorE computes it in fp32). Integer results (floor or
    # trunc division of integers) are refused: not exact in fp32, and torch raises on an integer division by 0.
    if isinstance(b, Tile):
        quotient = _binary(e, "nl.multiply", a, e.call("nl.reciprocal", b, dtype="float32"), "float32")
    else:
        quotient = e.call("nl.multiply", a, 1.0 / b, dtype="float32")
    if rounding_mode == "floor":
        quotient = e.call("nl.floor", quotient, dtype="float32")
    elif rounding_mode == "trunc":
        quotient = e.call("nl.trunc", quotient, dtype="float32")
    return e.call("nl.copy", quotient, dtype=dt)


@emits(aten.neg)
def _neg(e, dt, a):
    return _integer(e, dt, "nl.multiply", a, -1.0)


@emits(aten.abs)
def _abs(e, dt, a):
    return _integer(e, dt, "nl.abs", a)  # wrapped: torch's abs(-128) of int8 is -128


def _unary(nl_name):
    def emit(e, dt, a):
        return e.call(f"nl.{nl_name}", a, dtype=dt)

    return emit


def _rounding(nl_name):
    def emit(e, dt, a):
        if a.dtype in INT_DTYPES:  # an integer is its own floor: a copy, bit-exact (fp32 would round above 2**24)
            return e.call("nl.copy", a, dtype=dt)
        return e.call(f"nl.{nl_name}", a, dtype=dt)

    return emit


for _op, _name in (
    (aten.reciprocal, "reciprocal"), (aten.exp, "exp"), (aten.log, "log"),
    (aten.sqrt, "sqrt"), (aten.rsqrt, "rsqrt"), (aten.sin, "sin"), (aten.cos, "cos"), (aten.tanh, "tanh"),
    (aten.erf, "erf"), (aten.sigmoid, "sigmoid"), (aten.silu, "silu"), (aten.mish, "mish"),
):
    emits(_op)(_unary(_name))
emits(aten.floor)(_rounding("floor"))
emits(aten.ceil)(_rounding("ceil"))
emits(aten.trunc)(_rounding("trunc"))


@emits(aten.sign)
def _sign(e, dt, a):
    if a.dtype in INT_DTYPES:
        return e.call("nl.sign", a, dtype=dt)
    return e.call("nl.where", _mask(e, "nl.not_equal", a, a), 0.0, _f(e, "nl.sign", a), dtype=dt)  # sign(NaN) = 0


@emits(aten.relu)
def _relu(e, dt, a):
    if dt == "int32":
        return _extreme(e, dt, a, 0, "nl.greater")
    if dt in INT_DTYPES:
        return e.call("nl.relu", a, dtype=dt)
    return e.call("nl.where", _mask(e, "nl.less", a, 0.0), 0.0, a, dtype=dt)  # as torch: relu(-0.0) is -0.0


@emits(aten.exp2)
def _exp2(e, dt, a):
    return e.call("nl.exp", e.call("nl.multiply", a, math.log(2.0), dtype="float32"), dtype=dt)


@emits(aten.log2)
def _log2(e, dt, a):
    return e.call("nl.multiply", e.call("nl.log", a, dtype="float32"), 1.0 / math.log(2.0), dtype=dt)


@emits(aten.gelu)
def _gelu(e, dt, a, approximate="none"):
    return e.call("nl.gelu_apprx_tanh" if approximate == "tanh" else "nl.gelu", a, dtype=dt)


@emits(aten.pow)
def _pow(e, dt, a, b):
    if isinstance(a, Tile) and isinstance(b, Tile):
        return e.call("nl.power", a, b, dtype=dt)
    if isinstance(b, Tile):  # constant base: exp(b · ln a)
        return e.call("nl.exp", e.call("nl.multiply", b, math.log(a), dtype="float32"), dtype=dt)
    special = {2: "nl.square", 0.5: "nl.sqrt", -0.5: "nl.rsqrt", -1: "nl.reciprocal", 1: "nl.copy"}
    if b in special:
        return e.call(special[b], a, dtype=dt)
    if float(b).is_integer() and 0 < b <= 8:
        result = a
        for _ in range(int(b) - 1):
            result = e.call("nl.multiply", result, a, dtype="float32")
        return e.call("nl.copy", result, dtype=dt)
    # |a|^b via exp(b · ln|a|): what torch gives for the non-negative bases that a fractional power admits
    logged = e.call("nl.log", e.call("nl.abs", a, dtype="float32"), dtype="float32")
    return e.call("nl.exp", e.call("nl.multiply", logged, float(b), dtype="float32"), dtype=dt)


def _wide_int(value) -> bool:
    return isinstance(value, Tile) and value.dtype == "int32"


def _all_integer(*values) -> bool:
    return all(v.dtype in INT_DTYPES if isinstance(v, Tile) else isinstance(v, int) for v in values)


def _halves(e: Emitter, value):
    """An integer as (high, low) 16-bit halves, high with the sign bit flipped so that unsigned order is signed
    order; both below 2**16, so fp32 holds them exactly (bit-vector ops on the int32 pattern)."""
    if not isinstance(value, Tile):
        biased = int(value) + 2**31
        return biased >> 16, biased & 0xFFFF
    if value.dtype != "int32":
        value = e.call("nl.copy", value, dtype="int32")  # narrow integers convert exactly
    high = e.call("nl.right_shift", e.call("nl.bitwise_xor", value, 2**31, dtype="int32"), 16, dtype="int32")
    return high, e.call("nl.bitwise_and", value, 0xFFFF, dtype="int32")


def _order_key(e: Emitter, a, b) -> Tile:
    """A float32 tile with the sign of a - b (zero exactly when a == b) for int32 values, computed exactly.

    (high_a - high_b)·2**16 + (low_a - low_b): both differences are below 2**16 and exact, the product is exact,
    and when the high halves differ the low difference cannot outweigh or cancel it, so fp32 rounding keeps the
    sign and the zero."""
    (a_high, a_low), (b_high, b_low) = _halves(e, a), _halves(e, b)
    high = _binary(e, "nl.subtract", a_high, b_high, "float32")
    low = _binary(e, "nl.subtract", a_low, b_low, "float32")
    return e.call("nl.add", e.call("nl.multiply", high, 65536.0, dtype="float32"), low, dtype="float32")


def _compare(fn: str):
    def emit(e, dt, a, b):
        if (_wide_int(a) or _wide_int(b)) and _all_integer(a, b):
            return e.call(fn, _order_key(e, a, b), 0.0, dtype=dt)
        return _binary(e, fn, a, b, dt)

    return emit


def _extreme(e: Emitter, dt: str, a, b, keep_a_when: str):
    """maximum (keep_a_when="nl.greater") or minimum ("nl.less") of int32 values: an exact comparison, then a
    select, which copies bits."""
    if isinstance(a, Tile):
        condition = e.call(keep_a_when, _order_key(e, a, b), 0.0, dtype="uint8")
        return e.call("nl.where", condition, a, b, dtype=dt)
    condition = e.call(keep_a_when, _order_key(e, b, a), 0.0, dtype="uint8")
    return e.call("nl.where", condition, b, a, dtype=dt)


def _min_max(e, dt, a, b, fn, keep_a_when):
    if dt == "int32" and _all_integer(a, b):
        if not _tiles(a, b):
            raise codegen.CodegenError(f"{fn} of two constants")
        return _extreme(e, dt, a, b, keep_a_when)
    return _binary(e, fn, a, b, dt)


@emits(aten.maximum, aten.clamp_min)
def _maximum(e, dt, a, b):
    return _min_max(e, dt, a, b, "nl.maximum", "nl.greater")


@emits(aten.minimum, aten.clamp_max)
def _minimum(e, dt, a, b):
    return _min_max(e, dt, a, b, "nl.minimum", "nl.less")


@emits(aten.clamp, aten.hardtanh)
def _clamp(e, dt, a, min=None, max=None):  # noqa: A002 - aten's argument names
    result = a
    if min is not None:
        result = _maximum(e, dt, result, min)
    if max is not None:
        result = _minimum(e, dt, result, max)
    return result if result is not a else e.call("nl.copy", a, dtype=dt)


for _op, _name in ((aten.eq, "equal"), (aten.ne, "not_equal"), (aten.lt, "less"), (aten.le, "less_equal"),
                   (aten.gt, "greater"), (aten.ge, "greater_equal")):
    emits(_op)(_compare(f"nl.{_name}"))
for _op, _name in ((aten.logical_and, "logical_and"), (aten.logical_or, "logical_or")):
    emits(_op)(lambda e, dt, a, b, _fn=f"nl.{_name}": _binary(e, _fn, a, b, dt))


@emits(aten.bitwise_and)
def _bitwise_and(e, dt, a, b):
    return _binary(e, "nl.bitwise_and", a, b, dt)


@emits(aten.bitwise_or)
def _bitwise_or(e, dt, a, b):
    return _binary(e, "nl.bitwise_or", a, b, dt)


@emits(aten.bitwise_xor)
def _bitwise_xor(e, dt, a, b):
    return _binary(e, "nl.bitwise_xor", a, b, dt)


@emits(aten.logical_not)
def _logical_not(e, dt, a):
    return e.call("nl.equal", a, 0, dtype=dt)


@emits(aten.bitwise_not)
def _bitwise_not(e, dt, a):
    if a.dtype == "uint8" and dt == "uint8":  # bool: the device stores it as a 0/1 byte
        return e.call("nl.equal", a, 0, dtype=dt)
    return e.call("nl.invert", a, dtype=dt)


@emits(aten.where)
def _where(e, dt, condition, a, b):
    return e.call("nl.where", condition, a, b, dtype=dt)


@emits(aten.masked_fill)
def _masked_fill(e, dt, a, mask, value):
    return e.call("nl.where", mask, value, a, dtype=dt)


@emits(aten._to_copy, prims.convert_element_type, aten.clone, aten.lift_fresh_copy)
def _copy(e, dt, a, *args, **kwargs):
    """A cast with torch's semantics, which the device's conversion (round to nearest even) does not have."""
    if kwargs.get("dtype", args[0] if args else None) is torch.bool:
        return e.call("nl.not_equal", a, 0, dtype=dt)  # any non-zero value (NaN included) is True
    if a.dtype.startswith(("float", "bfloat")) and not dt.startswith(("float", "bfloat")):
        a = e.call("nl.trunc", a, dtype="float32")  # torch truncates toward zero
        if dt in _WRAP:
            a = e.call("nl.copy", a, dtype="int32")  # an integer-valued float: exact in int32, then wrapped
    if dt in _WRAP and a.dtype != dt:  # torch wraps into a narrow integer type; the device would saturate
        return _wrap(e, a, dt)
    return e.call("nl.copy", a, dtype=dt)


# narrow integer type → (mask of its bits, its sign bit or 0 when unsigned), for `_wrap`
_WRAP = {"uint8": (0xFF, 0), "int8": (0xFF, 2**7), "int16": (0xFFFF, 2**15)}


@emits(aten.copy, aten.copy_)
def _copy_into(e, dt, dst, src, non_blocking=False):
    if isinstance(src, Tile):
        return e.call("nl.copy", src, dtype=dt)
    return e.call("nl.full", TILE_SHAPE, codegen.typed_constant(src, dt), dtype=dt)


@emits(aten.threshold_backward)
def _threshold_backward(e, dt, grad, a, threshold):
    return e.call("nl.where", e.call("nl.less_equal", a, threshold, dtype="uint8"), 0.0, grad, dtype=dt)


@emits(aten.gelu_backward)
def _gelu_backward(e, dt, grad, a, approximate="none"):
    if approximate != "tanh":
        return e.call("nl.multiply", grad, e.call("nl.gelu_dx", a, dtype="float32"), dtype=dt)
    # d/dx 0.5·x·(1 + tanh(c·(x + k·x³))) = 0.5·(1 + t) + 0.5·x·(1 - t²)·c·(1 + 3k·x²)
    c, k = math.sqrt(2.0 / math.pi), 0.044715
    f32 = "float32"
    x2 = e.call("nl.multiply", a, a, dtype=f32)
    inner = e.call("nl.multiply", e.call("nl.add", e.call("nl.multiply", x2, k, dtype=f32), 1.0, dtype=f32), a,
                   dtype=f32)
    t = e.call("nl.tanh", e.call("nl.multiply", inner, c, dtype=f32), dtype=f32)
    left = e.call("nl.multiply", e.call("nl.add", t, 1.0, dtype=f32), 0.5, dtype=f32)
    one_minus_t2 = e.call("nl.subtract", 1.0, e.call("nl.multiply", t, t, dtype=f32), dtype=f32)
    slope = e.call("nl.add", e.call("nl.multiply", x2, 3 * k * c, dtype=f32), c, dtype=f32)
    right = e.call("nl.multiply", e.call("nl.multiply", one_minus_t2, slope, dtype=f32),
                   e.call("nl.multiply", a, 0.5, dtype=f32), dtype=f32)
    return e.call("nl.multiply", grad, e.call("nl.add", left, right, dtype=f32), dtype=dt)


@emits(aten.silu_backward)
def _silu_backward(e, dt, grad, a):
    return e.call("nl.multiply", grad, e.call("nl.silu_dx", a, dtype="float32"), dtype=dt)


@emits(aten.sigmoid_backward)
def _sigmoid_backward(e, dt, grad, y):
    slope = e.call("nl.multiply", y, e.call("nl.subtract", 1.0, y, dtype="float32"), dtype="float32")
    return e.call("nl.multiply", grad, slope, dtype=dt)


@emits(aten.tanh_backward)
def _tanh_backward(e, dt, grad, y):
    slope = e.call("nl.subtract", 1.0, e.call("nl.multiply", y, y, dtype="float32"), dtype="float32")
    return e.call("nl.multiply", grad, slope, dtype=dt)


@emits(aten.softplus)
def _softplus(e, dt, a, beta=1, threshold=20):
    scaled = e.call("nl.multiply", a, float(beta), dtype="float32")
    soft = e.call("nl.multiply", e.call("nl.softplus", scaled, dtype="float32"), 1.0 / beta, dtype="float32")
    return e.call("nl.where", e.call("nl.greater", scaled, float(threshold), dtype="uint8"), a, soft, dtype=dt)


# ------------------------------------------------------------------------------------------------ more math
# Built from the engines' fp32 ALU ops and the activations inside their valid ranges (reference/nki.md §1.9):
# arctan is valid on [-π/2, π/2] and sin on [-π, π], so the emitters reduce arguments first; each intermediate
# is fp32 and the result is rounded once into the step's dtype.
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


def _sign_bit(e: Emitter, a) -> Tile:
    """1 where the sign bit of `a` is set (-0.0 and negative NaNs included), else 0: int32."""
    if not isinstance(a, Tile):
        return e.call("nl.full", TILE_SHAPE, int(math.copysign(1.0, a) < 0), dtype="int32")
    if a.dtype in INT_DTYPES:
        return e.call("nl.less", a, 0, dtype="int32")
    width = 32 if a.dtype == F32 else 16
    bits = e.view(a, "int32" if width == 32 else "int16")
    return e.call("nl.right_shift", bits, width - 1, dtype="int32")


def _sqrt(e: Emitter, v: Tile) -> Tile:
    """sqrt on [0, inf] and NaN below 0, as torch gives: the activation is valid from 2**-116 only, so tinier
    inputs take sqrt(2**-116) = 2**-58 (an absolute error below 4e-18)."""
    root = _f(e, "nl.sqrt", _f(e, "nl.maximum", v, 2.0**-116))
    return _where(e, _mask(e, "nl.less", v, 0.0), math.nan, root)


def _log1p_of(e: Emitter, u: Tile) -> Tile:
    """log(1 + u) to fp32 precision near 0 (Kahan: log(w)·u/(w - 1) with w = 1 + u rounded)."""
    w = _f(e, "nl.add", u, 1.0)
    d = _f(e, "nl.subtract", w, 1.0)
    ratio = _where(e, _mask(e, "nl.equal", w, math.inf), 1.0, _f(e, "nl.multiply", u, _f(e, "nl.reciprocal", d)))
    return _where(e, _mask(e, "nl.equal", d, 0.0), u, _f(e, "nl.multiply", _f(e, "nl.log", w), ratio))


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


def _activation(e: Emitter, fn: str, x: Tile) -> Tile:
    """`nisa.activation(op=fn)` on an argument already inside the function's valid range (nl.sin would add a
    range reduction through x + π that costs precision near 0)."""
    out = e.alloc(F32)
    e.raw(f"nisa.activation(dst={{}}, op={fn}, data={{}})", out, x)
    return out


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
    return _f(e, "nl.multiply", _f(e, "nl.log", x), 1.0 / math.log(10.0))


@emits(aten.atan)
@_fp32_emitter
def _atan(e, x):
    return _atan_of(e, x)


@emits(aten.asin)
@_fp32_emitter
def _asin(e, x):
    # 2·arctan(x / (1 + sqrt(1 - x²))): the argument stays in [-1, 1]; (1 - x)(1 + x) keeps precision near ±1
    root = _sqrt(e, _f(e, "nl.multiply", _f(e, "nl.subtract", 1.0, x), _f(e, "nl.add", x, 1.0)))
    half = _f(e, "nl.arctan", _f(e, "nl.multiply", x, _f(e, "nl.reciprocal", _f(e, "nl.add", root, 1.0))))
    return _f(e, "nl.multiply", half, 2.0)


@emits(aten.acos)
@_fp32_emitter
def _acos(e, x):
    # 2·arctan(sqrt((1 - |x|) / (1 + |x|))) for |x|, mirrored to π - that for x < 0: no cancellation near ±1
    ax = _f(e, "nl.abs", x)
    ratio = _f(e, "nl.multiply", _f(e, "nl.subtract", 1.0, ax), _f(e, "nl.reciprocal", _f(e, "nl.add", ax, 1.0)))
    angle = _f(e, "nl.multiply", _f(e, "nl.arctan", _sqrt(e, ratio)), 2.0)
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
    angle = _where(e, _sign_bit(e, x), _f(e, "nl.subtract", math.pi, angle), angle)
    return e.call("nl.where", _sign_bit(e, y), _f(e, "nl.multiply", angle, -1.0), angle, dtype=dt)


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


@emits(aten.tan)
@_fp32_emitter
def _tan(e, x):
    """tan(x) = ±sin(r)/cos(r) or -cos(r)/sin(r) with x = k·π/2 + r, |r| ≤ π/4 (Cody-Waite, so r keeps fp32
    precision near the poles), the sines taken inside the activation's valid range."""
    quadrant = e.call("nl.copy", _f(e, "nl.multiply", x, 2.0 / math.pi), dtype="int32")  # the nearest integer
    k = _f(e, "nl.copy", quadrant)
    r = x
    for part in _HALF_PI_PARTS:
        r = _f(e, "nl.subtract", r, _f(e, "nl.multiply", k, part))
    sin_r = _activation(e, "nl.sin", r)
    cos_r = _activation(e, "nl.sin", _f(e, "nl.add", r, math.pi / 2))
    odd = e.call("nl.bitwise_and", quadrant, 1, dtype="uint8")
    direct = _f(e, "nl.multiply", sin_r, _f(e, "nl.reciprocal", cos_r))
    flipped = _f(e, "nl.multiply", cos_r, _f(e, "nl.reciprocal", _f(e, "nl.multiply", sin_r, -1.0)))
    return _where(e, odd, flipped, direct)


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
    far = _f(e, "nl.add", _f(e, "nl.log", ax), LN2)
    magnitude = _where(e, _mask(e, "nl.greater", ax, _BIG), far, _log1p_of(e, u))
    return _where(e, _mask(e, "nl.less", x, 0.0), _f(e, "nl.multiply", magnitude, -1.0), magnitude)


@emits(aten.acosh)
@_fp32_emitter
def _acosh(e, x):
    # log1p((x - 1) + sqrt((x - 1)(x + 1))): exact to fp32 near 1; NaN below 1 (the square root's)
    a = _f(e, "nl.minimum", x, _BIG)
    below = _f(e, "nl.subtract", a, 1.0)
    u = _f(e, "nl.add", below, _sqrt(e, _f(e, "nl.multiply", below, _f(e, "nl.add", a, 1.0))))
    far = _f(e, "nl.add", _f(e, "nl.log", x), LN2)
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
_ERFC_POLY = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
              1.48851587, -0.82215223, 0.17087277)


@emits(aten.erfc)
@_fp32_emitter
def _erfc(e, x):
    z = _f(e, "nl.abs", x)
    t = _f(e, "nl.reciprocal", _f(e, "nl.add", _f(e, "nl.multiply", z, 0.5), 1.0))
    exponent = _f(e, "nl.subtract", _horner(e, t, _ERFC_POLY), _f(e, "nl.multiply", z, z))
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
    return e.call("nl.copy", _sign_bit(e, a), dtype=dt)


@emits(aten.copysign)
def _copysign(e, dt, a, b):
    magnitude = _f(e, "nl.abs", _fp32_tile(e, a))
    if not isinstance(b, Tile):
        return e.call("nl.multiply", magnitude, math.copysign(1.0, b), dtype=dt)
    return e.call("nl.where", _sign_bit(e, b), _f(e, "nl.multiply", magnitude, -1.0), magnitude, dtype=dt)


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


emits(aten.fmax)(_nan_ignoring(_maximum))
emits(aten.fmin)(_nan_ignoring(_minimum))


@emits(aten.logical_xor)
def _logical_xor(e, dt, a, b):
    return _binary(e, "nl.logical_xor", a, b, dt)


def _round_half_even(e: Emitter, x: Tile) -> Tile:
    """Round to nearest, ties to even, as torch: the device's fp32 → int32 conversion does exactly that for
    |x| < 2**23 (larger floats are integers already, and NaN and inf stay); a zero keeps the sign of x."""
    nearest = _f(e, "nl.copy", e.call("nl.copy", x, dtype="int32"))
    rounded = _where(e, _mask(e, "nl.less", _f(e, "nl.abs", x), 2.0**23), nearest, x)
    return _where(e, _mask(e, "nl.equal", rounded, 0.0), _f(e, "nl.multiply", x, 0.0), rounded)


@emits(aten.round)
def _round(e, dt, a, decimals=0):
    """torch's round(x · 10^d) / 10^d in fp32 (`_refuse` keeps 0 ≤ d ≤ 30: a negative d divides by 10^-d
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
    2**±127 each (`_refuse` keeps n integer), so x only rounds when it leaves the normal range."""
    remaining = _f(e, "nl.minimum", _f(e, "nl.maximum", _fp32_tile(e, exponent), -378.0), 381.0)
    result = _fp32_tile(e, a)
    for _ in range(3):
        part = _f(e, "nl.minimum", _f(e, "nl.maximum", remaining, -126.0), 127.0)
        result = _f(e, "nl.multiply", result, _power_of_two(e, e.call("nl.copy", part, dtype="int32")))
        remaining = _f(e, "nl.subtract", remaining, part)
    return e.call("nl.copy", result, dtype=dt)


def _integer_modulo(truncated: bool):
    """fmod (truncated: the sign of the dividend) or remainder (floored: the sign of the divisor) of integers by
    a non-zero constant, exact: `_refuse` bounds both below 2**22, so the fp32 quotient is off by at most one,
    and one correction step each way fixes it."""

    def emit(e, dt, a, b):
        if not (isinstance(a, Tile) and _all_integer(a, b) and not isinstance(b, Tile) and b):
            raise codegen.CodegenError("only an integer modulo by a non-zero constant is lowered")
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


def _refuse(node: fx.Node) -> str | None:
    """Why the code generator cannot take this node (None when it can)."""
    for arg in [*node.args, *node.kwargs.values()]:
        for leaf in arg if isinstance(arg, (list, tuple)) else [arg]:
            if isinstance(leaf, fx.Node) and not isinstance(leaf.meta.get("val"), torch.Tensor):
                return "a non-constant scalar operand"
            if isinstance(leaf, complex):
                return "a complex constant"
            if isinstance(leaf, int) and not isinstance(leaf, bool) and not (
                    codegen.INT32_RANGE[0] <= leaf <= codegen.INT32_RANGE[1]):
                return f"an integer constant beyond int32 ({leaf}): the device keeps integers in 32 bits"
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return "no tensor result"
    if value.dtype not in codegen.NKI_DTYPES:
        return f"result dtype {value.dtype}"
    packet = node.target.overloadpacket
    reason = _ARGUMENT_REFUSALS.get(packet, lambda node, value: None)(node, value)
    if reason is not None:
        return reason
    if packet in (aten.copy, aten.copy_) and node.args[0].meta["val"].shape != value.shape:
        return "a broadcasting copy"
    if packet in (aten._to_copy, prims.convert_element_type) and value.dtype == torch.int64 and _is_float(node.args[0]):
        return "a float → int64 cast (int64 lives as int32 on the device: values beyond it would saturate)"
    return integer_refusal(node, packet, value.dtype)


def _arange_refusal(node: fx.Node, value: torch.Tensor) -> str | None:
    numbers = [a for a in node.args if not isinstance(a, fx.Node)]
    if len(numbers) != len(node.args) or not all(isinstance(a, (int, float)) for a in numbers):
        return "an arange with non-constant bounds"
    if any(isinstance(a, float) for a in numbers) and not value.dtype.is_floating_point:
        return "a fractional arange into an integer dtype (torch rounds each double value)"
    if value.dtype.is_floating_point and value.numel() >= FP32_EXACT:
        return "a floating-point arange of 2**24 elements or more (its index is exact in fp32 only below)"
    return None


def _round_refusal(node: fx.Node, value: torch.Tensor) -> str | None:
    decimals = node.kwargs.get("decimals", node.args[1] if len(node.args) > 1 else 0)
    if value.dtype.is_floating_point and not 0 <= decimals <= 30:
        return (f"round to {decimals} decimals: torch divides by 10^{-decimals} before rounding, and the device's "
                "reciprocal multiply can land on the other side of a tie" if decimals < 0 else
                f"round to {decimals} decimals: 10^{decimals} overflows fp32")
    return None


def _modulo_refusal(node: fx.Node, value: torch.Tensor) -> str | None:
    if value.dtype.is_floating_point:
        return (f"a floating-point {node.target.overloadpacket.__name__}: exact only with an exact division, and the "
                "engines multiply by an fp32 reciprocal (the quotient can be off by one)")
    return None  # integers: int_ranges.integer_refusal


def _ldexp_refusal(node: fx.Node, value: torch.Tensor) -> str | None:
    if _is_float(node.args[1]):
        return "ldexp with a floating-point exponent (torch computes pow(2, n), not exact through exp)"
    return None


_ARGUMENT_REFUSALS = {aten.arange: _arange_refusal, aten.round: _round_refusal, aten.fmod: _modulo_refusal,
                      aten.remainder: _modulo_refusal, aten.ldexp: _ldexp_refusal}


def _is_float(arg) -> bool:
    value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point


# A fused kernel of an empty shape returns empty tensors without running (`FusedKernel.__call__`).
@lowers(*ELEMENTWISE_OPS, family="elementwise", target="simulator", accepts=_refuse, handles_empty=True)
def elementwise_nki(op, *args, **kwargs):
    """One element-wise op as a generated NKI kernel (`lower_region` fuses chains of them into one)."""
    return run_single(op, args, kwargs)


@lowers(*CREATION_OPS, family="creation", target="simulator", accepts=_refuse, handles_empty=True)
def creation_nki(op, *args, **kwargs):
    """A creation op as a generated NKI kernel: memset (or iota) tiles stored to HBM."""
    return run_single(op, args, kwargs)
