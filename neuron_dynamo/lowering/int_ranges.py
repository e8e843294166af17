"""Integer value ranges: when integer arithmetic in the engines' fp32 is exact.

The NKI engines compute integer arithmetic in fp32, exact for magnitudes below 2**24, and saturate where torch
wraps. `magnitude` is a small value-range analysis over the FX graph (position ids, fills, sums of bools are
bounded); `integer_refusal` says why a node's integer arithmetic must run eagerly (None when it is exact).
"""

import functools
import math

import torch
import torch.fx as fx

from neuron_dynamo.lowering.creation import CREATION_OPS, fill_value

aten = torch.ops.aten
prims = torch.ops.prims

# The largest magnitude a value of each integer dtype can have (int64: the device's int32 cannot hold it all).
INT_MAGNITUDE = {torch.bool: 1, torch.uint8: 255, torch.int8: 2**7, torch.int16: 2**15, torch.int32: 2**31,
                  torch.int64: 2**63}
_WRAPPED_BY_TORCH = (torch.int8, torch.uint8, torch.int16)  # (wider constants are refused as beyond int32)
FP32_EXACT = 2**24  # every integer of magnitude up to 2**24 is an fp32 value: integer arithmetic below is exact
_INT_ARITHMETIC = (aten.add, aten.sub, aten.rsub, aten.mul, aten.neg, aten.abs)
_INEXACT = ("the NKI engines compute in fp32, so it would round above 2**24 and saturate where torch wraps")


def magnitude(arg, depth: int = 0) -> float:
    """An upper bound on the magnitude of `arg` (a node or a constant): what the graph proves, else its dtype's.

    A small value-range analysis: graph inputs can hold anything their dtype holds, but `arange(12) + 0` (position
    ids), a `full` value, a sum of bools, a select between bounded values are bounded, and arithmetic on them is
    exact in fp32 while the bound stays below 2**24. Float values derived from bounded ones are bounded too (the
    source indices of an interpolation, `floor((arange(n) + 0.5) * scale)`): cast to int64 they fit int32."""
    if not isinstance(arg, fx.Node):
        return abs(arg) if isinstance(arg, (int, float)) else math.inf
    value = arg.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dtype.is_complex:
        return math.inf  # (float values are bounded too when derived from bounded ones: `floor(arange(n) * 0.5)`)
    limit = INT_MAGNITUDE.get(value.dtype, math.inf)
    if depth > _MAX_DEPTH or arg.op != "call_function" or not hasattr(arg.target, "overloadpacket"):
        return limit
    return min(limit, _derived_magnitude(arg, arg.target.overloadpacket, depth + 1))


_MAX_DEPTH = 24
_SAME_VALUES = (  # ops whose result holds (some of) the values of their first argument
    aten.view, aten._unsafe_view, aten.reshape, aten.expand, aten.slice, aten.select, aten.narrow, aten.unsqueeze,
    aten.squeeze, aten.transpose, aten.t, aten.permute, aten.alias, aten.detach, aten.clone, aten.lift_fresh_copy,
    aten._to_copy, prims.convert_element_type, aten.repeat, aten.flatten, aten.contiguous,
)


def _derived_magnitude(node: fx.Node, packet, depth: int) -> float:
    args = node.args
    bound = functools.partial(magnitude, depth=depth)
    if packet in CREATION_OPS:
        values = fill_value(node.target, args, node.kwargs)
        return max((abs(v) if isinstance(v, (int, float)) else math.inf for v in values), default=math.inf) if (
            packet is not aten.arange) else max((abs(a) for a in args if isinstance(a, (int, float))), default=math.inf)
    if packet in _SAME_VALUES:
        return bound(args[0])
    if packet in (aten.neg, aten.abs):
        return bound(args[0])
    if packet in (aten.floor, aten.ceil, aten.trunc, aten.round):
        return bound(args[0]) + 1
    if packet is aten.div and not isinstance(args[1], fx.Node) and args[1] != 0:
        return bound(args[0]) / abs(args[1])
    if packet is aten.mul:
        return bound(args[0]) * bound(args[1])
    if packet in (aten.add, aten.sub, aten.rsub):
        alpha = node.kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        return bound(args[0]) + bound(args[1]) * abs(alpha)
    if packet in (aten.maximum, aten.minimum, aten.clamp_min, aten.clamp_max):
        return max(bound(args[0]), bound(args[1]))
    if packet is aten.clamp:
        low = args[1] if len(args) > 1 else node.kwargs.get("min")
        high = args[2] if len(args) > 2 else node.kwargs.get("max")
        if low is not None and high is not None:
            return max(bound(low), bound(high))
        return max(bound(args[0]), *(bound(v) for v in (low, high) if v is not None))
    if packet is aten.where:
        return max(bound(args[1]), bound(args[2]))
    if packet is aten.masked_fill:
        return max(bound(args[0]), bound(args[2]))
    if packet in (aten.fmod, aten.remainder) and not isinstance(args[1], fx.Node):
        return abs(args[1]) if packet is aten.remainder else min(bound(args[0]), abs(args[1]))
    if packet in (aten.sum, aten.cumsum):
        source = args[0].meta["val"]
        count = source.numel() if packet is aten.sum else (source.shape[args[1]] if source.dim() else 1)
        try:
            return int(count) * bound(args[0])
        except (TypeError, ValueError, RuntimeError):  # a symbolic size
            return math.inf
    return math.inf


_MODULO_EXACT = 2**22  # dividend and divisor below it: the fp32 quotient is off by at most one, which is corrected
WIDE_MODULO_DIVISOR = 2**10  # below it an int32 dividend of any size is reduced exactly, a 16-bit half at a time


def _modulo_refusal(node: fx.Node, dtype: torch.dtype) -> str | None:
    """An integer fmod / remainder is lowered for a non-zero constant divisor and bounded operands only: torch
    raises on an integer division by zero, which a kernel cannot do."""
    dividend, divisor = node.args[0], node.args[1]
    name = str(dtype).removeprefix("torch.")
    if isinstance(divisor, fx.Node) or not isinstance(dividend, fx.Node):
        return f"an {name} {node.target.overloadpacket.__name__} by a tensor: torch raises where it holds a 0"
    if divisor == 0:
        return f"an {name} {node.target.overloadpacket.__name__} by 0: torch raises"
    if not torch.iinfo(dtype).min <= divisor <= torch.iinfo(dtype).max:
        return f"an {name} modulo by {divisor}, beyond {name}: torch converts the divisor first (it wraps)"
    if abs(divisor) < WIDE_MODULO_DIVISOR and dtype in (torch.int32, torch.int64):
        return None  # any int32 dividend: its 16-bit halves are reduced apart (math_functions._wide_modulo)
    if abs(divisor) >= _MODULO_EXACT or magnitude(dividend) >= _MODULO_EXACT:
        return f"an {name} {node.target.overloadpacket.__name__} whose operands can reach 2**22: {_INEXACT}"
    return None


_COMPARISONS = (aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge)


def integer_refusal(node: fx.Node, packet, dtype: torch.dtype) -> str | None:
    """Integer-valued arithmetic runs eagerly unless its result is provably below 2**24 (then fp32 is exact and
    `_wrap` gives torch's wrap-around); comparisons, selects, bit ops and casts are exact at any value."""
    if packet in _COMPARISONS and isinstance(node.args[0], fx.Node) and len(node.args) > 1:
        source, constant = node.args[0].meta["val"].dtype, node.args[1]
        if isinstance(constant, int) and not isinstance(constant, bool) and source in _WRAPPED_BY_TORCH and not (
                torch.iinfo(source).min <= constant <= torch.iinfo(source).max):
            return (f"a comparison of {source} with {constant}, beyond its range: torch converts the constant to "
                    f"{source} first (it wraps)")
    if dtype.is_floating_point or dtype is torch.bool:
        return None
    name = str(dtype).removeprefix("torch.")
    if packet is aten.div:
        return (f"{name} division ({node.kwargs.get('rounding_mode')} rounding): {_INEXACT}, and torch raises on "
                "an integer division by zero")
    if packet is aten.pow:
        return f"an {name} power: {_INEXACT}"
    if packet in (aten.fmod, aten.remainder):
        return _modulo_refusal(node, dtype)
    if packet not in _INT_ARITHMETIC:
        return None
    args = list(node.args)
    if packet in (aten.neg, aten.abs):
        bound = magnitude(args[0])
    elif packet is aten.mul:
        bound = magnitude(args[0]) * magnitude(args[1])
    else:
        alpha = node.kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        bound = magnitude(args[0]) + magnitude(args[1]) * abs(alpha)
        if bound >= FP32_EXACT and _index_sum_exact(node, min(magnitude(args[0]), magnitude(args[1]) * abs(alpha))):
            return None
    if bound >= FP32_EXACT:
        return f"{name} arithmetic ({packet.__name__}) whose result can reach 2**24: {_INEXACT}"
    return None


# ------------------------------------------------------------------------------------------------ index-only sums
_RESHAPES = (aten.view, aten._unsafe_view, aten.reshape, aten.expand, aten.unsqueeze, aten.squeeze, aten.flatten,
             aten.clone, aten.alias, aten.permute, aten.t, aten.transpose, aten.contiguous)
_INDEX_ARGUMENT = {aten.gather: 2, aten.scatter: 2, aten.scatter_add: 2, aten.scatter_reduce: 2,
                   aten.index_select: 2}


def _indexed_size(user: fx.Node, value: fx.Node) -> float:
    """The size of the dim `user` indexes with `value`, or inf when `value` is not (only) an index of `user`."""
    packet = getattr(user.target, "overloadpacket", None)
    source = user.args[0].meta.get("val") if user.args and isinstance(user.args[0], fx.Node) else None
    if not isinstance(source, torch.Tensor) or value is user.args[0]:
        return math.inf
    shape = list(source.shape) or [1]
    if packet in (aten.index, aten.index_put) and value not in user.args[2:]:
        return max((shape[d] for d, index in enumerate(user.args[1]) if index is value), default=math.inf)
    if packet in _INDEX_ARGUMENT and user.args[_INDEX_ARGUMENT[packet]] is value and value not in user.args[3:]:
        return shape[user.args[1] % len(shape)]
    return math.inf


def index_use_size(node: fx.Node, depth: int = 0) -> float:
    """The largest dim size `node`'s value indexes, when every use of it (through reshapes) is as an index; else
    inf. Such an index is in [-size, size) or torch raises, which the index kernels do too (they check bounds)."""
    if depth > _MAX_DEPTH or not node.users:
        return math.inf
    largest = 0.0
    for user in node.users:
        packet = getattr(user.target, "overloadpacket", None)
        if packet in _RESHAPES and user.args[0] is node:
            largest = max(largest, index_use_size(user, depth + 1))
        else:
            largest = max(largest, _indexed_size(user, node))
    return largest


def _index_sum_exact(node: fx.Node, smaller: float) -> bool:
    """Whether a sum with one operand bounded by `smaller` and used only as an index is exact in fp32: a result
    outside [-size, size) makes torch (and the kernels) raise, so the other operand is below size + smaller, and
    a far-off operand stays far off when rounded; `size + 2·smaller` below 2**24 keeps every step exact."""
    return index_use_size(node) + 2 * smaller < FP32_EXACT
