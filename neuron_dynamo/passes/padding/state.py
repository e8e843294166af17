"""The padding proof's vocabulary: what a pad region holds, per dim and per tensor; the rule registry."""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Callable

import sympy
import torch
import torch.fx as fx
from torch.utils._sympy.functions import FloorDiv

from neuron_dynamo.errors import NeuronDynamoError

aten = torch.ops.aten
prims = torch.ops.prims


class Pad(enum.Enum):
    """What the pad region of a dim holds."""

    ZERO = "zero"
    NEG_INF = "-inf"
    FINITE = "finite"
    UNKNOWN = "unknown"


SAFE_IN_PRODUCTS = (Pad.ZERO, Pad.FINITE)
_EXACT = {Pad.ZERO: 0.0, Pad.NEG_INF: -math.inf}


@dataclasses.dataclass(frozen=True)
class DimPad:
    """One padded dim: its size expression and what its pad region holds."""

    expr: sympy.Expr
    kind: Pad
    parts: tuple[sympy.Expr, ...] | None = None  # a merge of several dims, outermost first, one or more padded

    @property
    def factors(self) -> tuple[sympy.Expr, ...]:
        return self.parts if self.parts is not None else (self.expr,)

    @property
    def is_tail(self) -> bool:
        """The pad region is one contiguous tail `[e(real), e(bucket))`."""
        return self.parts is None


@dataclasses.dataclass(frozen=True)
class TensorPad:
    """Per-dim padding of one tensor (None for an unpadded dim), and an index bound for integer tensors."""

    dims: tuple[DimPad | None, ...]
    bound: sympy.Expr | None = None

    @property
    def padded(self) -> bool:
        return any(d is not None for d in self.dims)


@dataclasses.dataclass(frozen=True)
class SymValue:
    """A SymInt/SymFloat value computed in the graph; `bucketed` when it depends on a bucketed size."""

    expr: sympy.Expr
    bucketed: bool


class PaddingRefused(NeuronDynamoError):
    """Raised inside the analysis when a node cannot be proven safe under padding (caught; the graph runs exact)."""


@dataclasses.dataclass
class PaddingProof:
    """The verdict for one graph.

    When `safe`, `graph` is the transformed graph: it takes the original inputs padded with zeros, followed by one
    0-d int64 tensor per symbol of `symbols` holding the real size, and its real outputs equal the unpadded ones.
    """

    safe: bool
    graph: fx.GraphModule | None
    symbols: tuple[sympy.Symbol, ...]
    reason: str | None = None
    masks: list[str] = dataclasses.field(default_factory=list)
    # Per graph output: per dim, the factors of a merged padded dim (None for a plain dim); None for non-tensors.
    output_factors: list[list[tuple[sympy.Expr, ...] | None] | None] = dataclasses.field(default_factory=list)
    # The same per graph input (placeholder): how the caller pads it (a merged dim is padded factor by factor).
    input_factors: list[list[tuple[sympy.Expr, ...] | None] | None] = dataclasses.field(default_factory=list)
    # The largest bucket per symbol (`buffer[:, :s]` of a 600-long buffer: a 640 bucket would be cut to 600).
    limits: dict[sympy.Symbol, int] = dataclasses.field(default_factory=dict)


Rule = Callable[..., object]  # rule(analysis, node) -> the output state
_RULES: dict[object, Rule] = {}
# Rules that follow a merged padded dim (padding interleaved with real data) through their outputs; every other
# rule refuses one, because its slicing/indexing reasoning assumes the pad region is a tail.
_MERGE_AWARE: set[Rule] = set()


def rule(*packets, merge_aware: bool = False) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for packet in packets:
            _RULES[packet] = fn
        if merge_aware:
            _MERGE_AWARE.add(fn)
        return fn

    return register


def graph_outputs(output: fx.Node) -> list:
    """The values an output node returns, in order (None entries kept: AOTAutograd returns them)."""
    values = output.args[0]
    return list(values) if isinstance(values, (tuple, list)) else [values]


def _exprs(node: fx.Node) -> list[sympy.Expr] | None:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return shape_exprs(value) if isinstance(value, torch.Tensor) else None


def shape_exprs(value: torch.Tensor) -> list[sympy.Expr]:
    """The sizes of a (fake) tensor as sympy expressions."""
    return [exact_quotients(sympy.sympify(s.node.expr if isinstance(s, torch.SymInt) else int(s)))
            for s in value.shape]


def exact_quotients(expr: sympy.Expr) -> sympy.Expr:
    """`expr` with each floor division that divides exactly written as the quotient, innermost first: `(s**2) // s`
    is `s` (a square pair map viewed back from its rows)."""
    if not expr.has(FloorDiv):
        return expr
    expr = expr.func(*(exact_quotients(arg) for arg in expr.args))
    if not isinstance(expr, FloorDiv):
        return expr
    quotient = sympy.cancel(expr.args[0] / expr.args[1])
    if quotient.has(FloorDiv) or not quotient.is_polynomial() or sympy.fraction(quotient)[1] != 1:
        return expr
    integral = all(c.is_Integer for c in sympy.Poly(quotient, *quotient.free_symbols).coeffs()) if \
        quotient.free_symbols else quotient.is_Integer
    return quotient if integral else expr


def _dtype(node: fx.Node) -> torch.dtype | None:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return value.dtype if isinstance(value, torch.Tensor) else None


def _op_name(target) -> str:
    return str(getattr(target, "overloadpacket", target))


def _classify(value: torch.Tensor) -> Pad:
    """The kind of a 0-d tensor computed from exact pad values. A complex kind is the value `kind + 0j` (ZERO is
    `0+0j`, NEG_INF `-inf+0j`), FINITE has both parts finite: casts between real and complex keep the kind."""
    if value.dtype.is_complex:
        if float(value.imag) == 0:
            return _classify(value.real)
        return Pad.FINITE if bool(torch.isfinite(value)) else Pad.UNKNOWN
    if value.dtype == torch.bool or not value.dtype.is_floating_point:
        return Pad.ZERO if int(value) == 0 else Pad.FINITE
    number = float(value)
    if number == 0:
        return Pad.ZERO
    if number == -math.inf:
        return Pad.NEG_INF
    return Pad.FINITE if math.isfinite(number) else Pad.UNKNOWN


def _classify_scalar(value) -> Pad:
    return _classify(torch.tensor(value))


def _fill_for(dtype: torch.dtype, value: float):
    """`value` representable in `dtype` (+-inf become the integer extremes, booleans their identity)."""
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point or dtype.is_complex:
        return value
    info = torch.iinfo(dtype)
    if value == -math.inf:
        return info.min
    if value == math.inf:
        return info.max
    return int(value)


# Element-wise ops that map finite inputs to finite outputs (no overflow, no pole, no scalar that could be inf).
_BOUNDED = {
    "aten.neg", "aten.abs", "aten.relu", "aten.sigmoid", "aten.tanh", "aten.sin", "aten.cos", "aten.clamp",
    "aten.silu", "aten.gelu", "aten.sign", "aten.floor", "aten.ceil", "aten.round", "aten.trunc", "aten.clone",
    "aten.hardtanh", "aten.leaky_relu", "aten.maximum", "aten.minimum", "aten.alias", "aten.detach",
    "aten.lift_fresh_copy", "aten.contiguous",
}  # fmt: skip
# The bounded ops that stay bounded on complex numbers (tanh, sigmoid have poles there, sin and cos grow like sinh).
_BOUNDED_COMPLEX = {
    "aten.neg", "aten.clone", "aten.alias", "aten.detach", "aten.lift_fresh_copy", "aten.contiguous", "aten._conj",
    "aten.conj_physical", "aten.resolve_conj", "aten.resolve_neg", "aten._neg_view", "aten.real", "aten.imag",
}  # fmt: skip
_CASTS = {"aten._to_copy", "prims.convert_element_type", "aten.to"}
_IDENTITY_BOUND = {"aten.clone", "aten.alias", "aten.detach", "aten._to_copy", "prims.convert_element_type",
                   "aten.lift_fresh_copy", "aten.contiguous", "aten.to"}  # fmt: skip
_INT_TYPE = re.compile(r"^(Optional\[)?(List\[)?(int|SymInt)")
_SYM_ASSERTS = {"aten._assert_scalar", "aten.sym_constrain_range", "aten.sym_constrain_range_for_size",
                "aten._assert_async", "aten._assert_tensor_metadata", "aten.sym_size", "aten.sym_numel",
                "aten.sym_stride", "aten.sym_storage_offset"}  # fmt: skip


def _tensor_overload(target: torch._ops.OpOverload, argument_type: str) -> torch._ops.OpOverload | None:
    """The overload of a pointwise op taking this Scalar/Tensor argument as a tensor (div.Scalar -> div.Tensor)."""
    if torch.Tag.pointwise not in target.tags or argument_type not in ("Tensor", "number"):
        return None
    if argument_type == "Tensor":
        return target
    candidate = getattr(target.overloadpacket, "Tensor", None)
    if candidate is None:
        return None
    names = lambda op: [a.name for a in op._schema.arguments]
    return candidate if names(candidate) == names(target) else None

def _set_arg(node: fx.Node, index: int, name: str, value) -> None:
    if len(node.args) > index:
        args = list(node.args)
        args[index] = value
        node.args = tuple(args)
    else:
        node.kwargs = {**node.kwargs, name: value}
