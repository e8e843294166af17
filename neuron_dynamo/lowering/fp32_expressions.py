"""fp32 expressions for the special-function emitters: a `Value` whose Python arithmetic writes NKI ALU calls, so
Cephes' formulas read as written, plus the series evaluators (polevl, chbevl) and an exact-enough sine and cosine
for any fp32 argument (the activation's own `sin` is valid only on [-π, π], reference/nki.md §1.9).
"""

from __future__ import annotations

import math

from neuron_dynamo.lowering.codegen import TILE_SHAPE, Emitter, Tile
from neuron_dynamo.lowering.elementwise import log_of
from neuron_dynamo.lowering.math_functions import activation
from neuron_dynamo.lowering.math_functions import sign_bit as tile_sign_bit
from neuron_dynamo.lowering.math_functions import sqrt as tile_sqrt

F32 = "float32"


# ------------------------------------------------------------------------------------------------ fp32 expressions
class Value:
    """An fp32 tile being computed: Python arithmetic on it writes NKI ALU calls, so Cephes' formulas read as
    written. Division multiplies by the VectorE reciprocal (the engines have no divide)."""

    def __init__(self, e: Emitter, tile: Tile) -> None:
        self.e = e
        self.tile = tile

    def _call(self, fn: str, *args) -> Value:
        return Value(self.e, self.e.call(fn, *(a.tile if isinstance(a, Value) else float(a) for a in args),
                                         dtype=F32))

    def __add__(self, other) -> Value:
        return self._call("nl.add", self, other)

    __radd__ = __add__

    def __sub__(self, other) -> Value:
        return self._call("nl.subtract", self, other)

    def __rsub__(self, other) -> Value:
        return self._call("nl.subtract", other, self)

    def __mul__(self, other) -> Value:
        return self._call("nl.multiply", self, other)

    __rmul__ = __mul__

    def __truediv__(self, other) -> Value:
        if isinstance(other, Value):
            return self * other.reciprocal()
        return self * (1.0 / other)

    def __rtruediv__(self, other) -> Value:
        return self.reciprocal() * other

    def __neg__(self) -> Value:
        return self * -1.0

    def reciprocal(self) -> Value:
        return self._call("nl.reciprocal", self)

    def apply(self, fn: str) -> Value:
        """A unary NKI function valid on all reals (abs, exp, floor, trunc, erf)."""
        return self._call(fn, self)

    def _mask(self, fn: str, other) -> Tile:
        return self.e.call(fn, self.tile, other.tile if isinstance(other, Value) else float(other), dtype="uint8")

    def __lt__(self, other) -> Tile:
        return self._mask("nl.less", other)

    def __le__(self, other) -> Tile:
        return self._mask("nl.less_equal", other)

    def __gt__(self, other) -> Tile:
        return self._mask("nl.greater", other)

    def __ge__(self, other) -> Tile:
        return self._mask("nl.greater_equal", other)

    def eq(self, other) -> Tile:
        return self._mask("nl.equal", other)

    def ne(self, other) -> Tile:
        return self._mask("nl.not_equal", other)

    def isnan(self) -> Tile:
        return self.ne(self)


def where(condition: Tile, a, b, e: Emitter | None = None) -> Value:
    """`a` where the 0/1 `condition` is set, else `b` (Values or numbers; `e` needed when both are numbers)."""
    e = e or next(v.e for v in (a, b) if isinstance(v, Value))
    unwrap = [v.tile if isinstance(v, Value) else float(v) for v in (a, b)]
    return Value(e, e.call("nl.where", condition, *unwrap, dtype=F32))


def either(e: Emitter, *masks: Tile) -> Tile:
    result = masks[0]
    for mask in masks[1:]:
        result = e.call("nl.logical_or", result, mask, dtype="uint8")
    return result


def both(e: Emitter, *masks: Tile) -> Tile:
    result = masks[0]
    for mask in masks[1:]:
        result = e.call("nl.logical_and", result, mask, dtype="uint8")
    return result


def as_value(e: Emitter, operand) -> Value:
    """An operand (a tile of any dtype, or a constant) as an fp32 Value."""
    if isinstance(operand, Tile):
        return Value(e, operand if operand.dtype == F32 else e.call("nl.copy", operand, dtype=F32))
    return Value(e, e.call("nl.full", TILE_SHAPE, float(operand), dtype=F32))


def exp(x: Value) -> Value:
    return x.apply("nl.exp")


def log(x: Value) -> Value:
    """The natural log on all of fp32 (`log_of` keeps the activation inside its valid range)."""
    return Value(x.e, log_of(x.e, x.tile))


def sqrt(x: Value) -> Value:
    return Value(x.e, tile_sqrt(x.e, x.tile))


def polevl(x: Value, coefficients) -> Value:
    """Cephes' polevl: c[0]·x^n + ... + c[n], by Horner's rule."""
    result = coefficients[0]
    for c in coefficients[1:]:
        result = result * x + c if isinstance(result, Value) else x * result + c
    return result


def chbevl(x: Value, coefficients) -> Value:
    """Cephes' chbevl: the Chebyshev series Σ c[i]·T_i(x/2), by Clenshaw's recurrence."""
    b0, b1, b2 = coefficients[0], 0.0, 0.0
    for c in coefficients[1:]:
        b2, b1 = b1, b0
        b0 = x * b1 - b2 + c
    return (b0 - b2) * 0.5


def rounded(x: Value) -> Value:
    """x rounded to the nearest integer (ties to even) for |x| < 2**23; larger floats are integers already."""
    nearest = Value(x.e, x.e.call("nl.copy", x.e.call("nl.copy", x.tile, dtype="int32"), dtype=F32))
    return where(x.apply("nl.abs") < 2.0**23, nearest, x)


def sign_bit(x: Value) -> Tile:
    return tile_sign_bit(x.e, x.tile)


# ------------------------------------------------------------------------------------------------ sine and cosine
# π/2 in four 12-bit parts and a remainder: k·part is exact in fp32 for the 12-bit halves of any fp32 integer k
_HALF_PI_PARTS = (1.57080078125, -4.453584551811218e-06, -8.706138032721356e-10, 6.222800053024002e-14,
                  5.721188726109832e-18)
_REDUCIBLE = 2.0**30  # beyond, k no longer fits int32: Bessel amplitudes are below 3e-5 there (see `sin_cos`)


def _split(k: Value) -> tuple[Value, Value]:
    """k = high + low with each part at most 12 significant bits (Veltkamp), so part·(12-bit constant) is exact."""
    c = k * 4097.0
    high = c - (c - k)
    return high, k - high


def _reduce(a: Value) -> tuple[Value, Tile]:
    """a - k·π/2 for the k nearest a·2/π, and k modulo 4 (an int32 in [-1, 4]): the k·part products are exact,
    so the reduced argument keeps about 40 bits of π/2 for |a| up to 2**30 (a second pass cleans up a k that fp32
    rounded)."""
    e = a.e
    quadrant = e.call("nl.copy", (a * (2.0 / math.pi)).tile, dtype="int32")
    k = Value(e, e.call("nl.copy", quadrant, dtype=F32))
    quadrant = e.call("nl.copy", k.tile, dtype="int32")  # the integer k really is, once fp32 rounded it
    high, low = _split(k)
    r = a
    for part in _HALF_PI_PARTS[:4]:
        r = r - high * part - low * part
    r = r - k * _HALF_PI_PARTS[4]
    extra = e.call("nl.copy", (r * (2.0 / math.pi)).tile, dtype="int32")
    r = r - Value(e, e.call("nl.copy", extra, dtype=F32)) * _HALF_PI_PARTS[0]
    for part in _HALF_PI_PARTS[1:3]:
        r = r - Value(e, e.call("nl.copy", extra, dtype=F32)) * part
    return r, e.call("nl.add", e.call("nl.bitwise_and", quadrant, 3, dtype="int32"), extra, dtype="int32")


def sin_cos(a: Value) -> tuple[Value, Value]:
    """sin(a) and cos(a) of an fp32 argument, to a few ulps for |a| ≤ 2**30 (torch's float sin and cos are exact
    for every float). Beyond, both are replaced by 0 and 1: the only callers there scale them by Bessel
    amplitudes √(2/(πa)) below 3e-5, inside the tolerance; infinities and NaN give NaN."""
    e = a.e
    finite = a.apply("nl.abs") <= _REDUCIBLE
    r, quadrant = _reduce(where(finite, a, 0.0))
    sin_r = Value(e, activation(e, "nl.sin", r.tile))
    cos_r = Value(e, activation(e, "nl.sin", (r.apply("nl.abs") * -1.0 + math.pi / 2).tile))
    q = e.call("nl.bitwise_and", quadrant, 3, dtype="int32")
    odd = e.call("nl.bitwise_and", q, 1, dtype="uint8")
    flip_sin = e.call("nl.greater", q, 1, dtype="uint8")
    flip_cos = e.call("nl.logical_xor", flip_sin, odd, dtype="uint8")
    sine = where(odd, cos_r, sin_r)
    cosine = where(odd, sin_r, cos_r)
    sine = where(flip_sin, -sine, sine)
    cosine = where(flip_cos, -cosine, cosine)
    nan = a.isnan()
    infinite = a.apply("nl.abs").eq(math.inf)
    bad = either(e, nan, infinite)
    sine = where(bad, math.nan, where(finite, sine, 0.0))
    cosine = where(bad, math.nan, where(finite, cosine, 1.0))
    return sine, cosine


def sin_pi(r: Value) -> Value:
    """sin(π·r) for |r| ≤ 1/2 (inside the activation's range)."""
    return Value(r.e, activation(r.e, "nl.sin", (r * math.pi).tile))


def cos_pi(r: Value) -> Value:
    """cos(π·r) for |r| ≤ 1/2, as sin(π/2 - π|r|)."""
    return Value(r.e, activation(r.e, "nl.sin", (r.apply("nl.abs") * -math.pi + math.pi / 2).tile))
