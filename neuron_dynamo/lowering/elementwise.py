"""Element-wise ops, casts and tensor creation: the chains the NKI code generator fuses into one kernel.

On the NKI targets each op here has an *emitter* (`codegen.emits`) that writes its NKI lines for one SBUF tile;
`lower_region` fuses neighbouring element-wise nodes into one generated kernel. The registered simulator kernel is
the same generator applied to a single op (what a lone call of the op runs).
"""

import math

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen, int_ranges
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
# it is exact: `refusal` runs integer arithmetic whose result can reach 2**24 eagerly; the rest computes in fp32,
# lands in an int32 tile (exact), and is wrapped into the result type with bit-vector ops (`_wrap`).
# Comparisons, minimum/maximum and clamps of int32 tiles (int64 lives as int32 on device) would round above 2**24
# in fp32: they compare exact 16-bit halves instead (`_order_key`).
INT_DTYPES = ("int8", "uint8", "int16", "int32")


def _tiles(*values):
    return [v for v in values if isinstance(v, Tile)]


def binary(e: Emitter, fn: str, a, b, dt: str):
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
    """`fn(*operands)` with an integer result: in fp32 (exact: `refusal` bounds it below 2**24), then wrapped."""
    if dt not in INT_DTYPES:
        return e.call(fn, *operands, dtype=dt) if len(operands) == 1 else binary(e, fn, *operands, dt)
    result = e.call(fn, *operands, dtype="int32") if len(operands) == 1 else binary(e, fn, *operands, "int32")
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
        quotient = binary(e, "nl.multiply", a, e.call("nl.reciprocal", b, dtype="float32"), "float32")
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
    (aten.reciprocal, "reciprocal"), (aten.exp, "exp"), (aten.sqrt, "sqrt"), (aten.rsqrt, "rsqrt"), (aten.tanh, "tanh"),
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
    is_nan = e.call("nl.not_equal", a, a, dtype="uint8")
    return e.call("nl.where", is_nan, 0.0, e.call("nl.sign", a, dtype="float32"), dtype=dt)  # sign(NaN) = 0


@emits(aten.relu)
def _relu(e, dt, a):
    if dt == "int32":
        return _extreme(e, dt, a, 0, "nl.greater")
    if dt in INT_DTYPES:
        return e.call("nl.relu", a, dtype=dt)
    negative = e.call("nl.less", a, 0.0, dtype="uint8")
    return e.call("nl.where", negative, 0.0, a, dtype=dt)  # as torch: relu(-0.0) is -0.0


@emits(aten.exp2)
def _exp2(e, dt, a):
    return e.call("nl.exp", e.call("nl.multiply", a, math.log(2.0), dtype="float32"), dtype=dt)


_LOG_RANGE = (2.0**-64, 2.0**64)  # where ScalarE's log is valid (reference/nki.md §1.9)


def log_of(e: Emitter, a) -> Tile:
    """The natural log of a tile on all of fp32, as fp32: the activation is only valid on [2**-64, 2**64], so x is
    scaled into it by powers of 2**64 (exact) and 64·ln 2 per step added back; 0 gives -inf, a negative or NaN
    gives NaN and inf gives inf, as torch does."""
    f32 = lambda fn, *args: e.call(fn, *args, dtype="float32")  # noqa: E731
    mask = lambda fn, *args: e.call(fn, *args, dtype="uint8")  # noqa: E731
    x = a if a.dtype == "float32" else f32("nl.copy", a)
    low, high = _LOG_RANGE
    big, tiny, tinier = mask("nl.greater", x, high), mask("nl.less", x, low), mask("nl.less", x, low * low)
    scaled = f32("nl.where", big, f32("nl.multiply", x, low), f32("nl.where", tiny, f32("nl.multiply", x, high), x))
    scaled = f32("nl.where", tinier, f32("nl.multiply", scaled, high), scaled)  # subnormals take two steps
    steps = f32("nl.add", f32("nl.where", big, 1.0, f32("nl.where", tiny, -1.0, 0.0)),
                f32("nl.where", tinier, -1.0, 0.0))
    inside = f32("nl.minimum", f32("nl.maximum", scaled, low), high)  # 0, negatives and inf: fixed below
    result = f32("nl.add", f32("nl.log", inside), f32("nl.multiply", steps, 64 * math.log(2.0)))
    result = f32("nl.where", mask("nl.equal", x, 0.0), -math.inf, result)
    result = f32("nl.where", mask("nl.equal", x, math.inf), math.inf, result)
    return f32("nl.where", mask("nl.less", x, 0.0), math.nan, f32("nl.where", mask("nl.not_equal", x, x), x, result))


@emits(aten.log)
def _log(e, dt, a):
    return e.call("nl.copy", log_of(e, a), dtype=dt)


@emits(aten.log2)
def _log2(e, dt, a):
    return e.call("nl.multiply", log_of(e, a), 1.0 / math.log(2.0), dtype=dt)


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
    logged = log_of(e, e.call("nl.abs", a, dtype="float32"))
    return e.call("nl.exp", e.call("nl.multiply", logged, float(b), dtype="float32"), dtype=dt)


def _wide_int(value) -> bool:
    return isinstance(value, Tile) and value.dtype == "int32"


def all_integer(*values) -> bool:
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
    high = binary(e, "nl.subtract", a_high, b_high, "float32")
    low = binary(e, "nl.subtract", a_low, b_low, "float32")
    return e.call("nl.add", e.call("nl.multiply", high, 65536.0, dtype="float32"), low, dtype="float32")


def _compare(fn: str):
    def emit(e, dt, a, b):
        if (_wide_int(a) or _wide_int(b)) and all_integer(a, b):
            return e.call(fn, _order_key(e, a, b), 0.0, dtype=dt)
        return binary(e, fn, a, b, dt)

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
    if dt == "int32" and all_integer(a, b):
        if not _tiles(a, b):
            raise codegen.CodegenError(f"{fn} of two constants")
        return _extreme(e, dt, a, b, keep_a_when)
    return binary(e, fn, a, b, dt)


@emits(aten.maximum, aten.clamp_min)
def maximum(e, dt, a, b):
    return _min_max(e, dt, a, b, "nl.maximum", "nl.greater")


@emits(aten.minimum, aten.clamp_max)
def minimum(e, dt, a, b):
    return _min_max(e, dt, a, b, "nl.minimum", "nl.less")


@emits(aten.clamp, aten.hardtanh)
def _clamp(e, dt, a, min=None, max=None):  # noqa: A002 - aten's argument names
    result = a
    if min is not None:
        result = maximum(e, dt, result, min)
    if max is not None:
        result = minimum(e, dt, result, max)
    return result if result is not a else e.call("nl.copy", a, dtype=dt)


for _op, _name in ((aten.eq, "equal"), (aten.ne, "not_equal"), (aten.lt, "less"), (aten.le, "less_equal"),
                   (aten.gt, "greater"), (aten.ge, "greater_equal")):
    emits(_op)(_compare(f"nl.{_name}"))
for _op, _name in ((aten.logical_and, "logical_and"), (aten.logical_or, "logical_or")):
    emits(_op)(lambda e, dt, a, b, _fn=f"nl.{_name}": binary(e, _fn, a, b, dt))


@emits(aten.bitwise_and)
def _bitwise_and(e, dt, a, b):
    return binary(e, "nl.bitwise_and", a, b, dt)


@emits(aten.bitwise_or)
def _bitwise_or(e, dt, a, b):
    return binary(e, "nl.bitwise_or", a, b, dt)


@emits(aten.bitwise_xor)
def _bitwise_xor(e, dt, a, b):
    return binary(e, "nl.bitwise_xor", a, b, dt)


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


def refusal(node: fx.Node) -> str | None:
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
    if packet in (aten._to_copy, prims.convert_element_type) and value.dtype == torch.int64 and _is_float(
            node.args[0]) and not int_ranges.magnitude(node.args[0]) < 2**31:
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
@lowers(*ELEMENTWISE_OPS, family="elementwise", target="simulator", accepts=refusal, handles_empty=True)
def elementwise_nki(op, *args, **kwargs):
    """One element-wise op as a generated NKI kernel (`lower_region` fuses chains of them into one)."""
    return run_single(op, args, kwargs)


@lowers(*CREATION_OPS, family="creation", target="simulator", accepts=refusal, handles_empty=True)
def creation_nki(op, *args, **kwargs):
    """A creation op as a generated NKI kernel: memset (or iota) tiles stored to HBM."""
    return run_single(op, args, kwargs)
