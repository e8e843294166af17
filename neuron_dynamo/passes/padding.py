"""The padding proof: may a graph run on inputs padded to a bucket and give the same real outputs?

Bucketing (`passes/bucketing.py`) serves a dynamic dimension from a static program compiled for a larger *bucket*
size: inputs are padded at the end of each dynamic dim, the program runs, outputs are sliced back. That is only
correct when no padded element can reach a real output. This pass proves it, or inserts the masks that make it true,
or refuses (the graph then runs at its exact shapes, and the reason is logged and counted).

It is a forward dataflow analysis over the aten graph *with symbolic sizes* (AOTAutograd's graph, before it is
specialised to a bucket). A tensor dim is *padded* when its size expression contains a bucketed symbol; its real
region is `[0, e(real))`, its pad region `[e(real), e(bucket))` ("right padding"). For each padded dim the analysis
tracks what the pad region holds:

    ZERO     exactly 0 (or False)                    NEG_INF  exactly -inf
    FINITE   finite values, arbitrary                 UNKNOWN  anything, inf and NaN included

and, for integer tensors, an index *bound* (values at real positions index only the real region of a dim: `arange`).
Graph inputs are padded with 0, so every padded input dim starts as ZERO (ids, attention masks and labels included:
an attention mask padded with 0 masks the padded keys). Values of unpadded tensors (weights, real data) broadcast
into a pad region are never assumed finite: they may be inf (an additive -inf mask is real data).

Rules, over a padded dim (`mask` = the analysis inserts `masked_fill(pad region, value)`; `refuse` = exact shapes):

| op family | rule |
|---|---|
| graph inputs | padded with 0 at the tail of each dynamic dim; when that is refused, a dim sized `c·s` (a flattened |
|   | `[c, s]`: a saved activation in a backward graph) is padded as `[c, s]` (merged), and the proof runs again |
| element-wise (`Tag.pointwise`), casts | safe. Pad kind computed exactly when every padded operand holds a constant |
|   | (0, -inf); else int/bool results FINITE, 0 * finite = 0, bounded ops (tanh, relu) keep FINITE, others UNKNOWN; |
|   | an integer `//`, `%`, fmod, div(rounding_mode) masks the divisor's pad to 1 (eager raises on 0) |
| view, reshape, (un)squeeze | safe while the padded dim stays a dim; a merge with other dims is followed as a |
|   | *merged* dim (padding interleaved), which only element-wise ops, matmul, reductions, softmax, norms |
|   | and scatters may consume; a split must cut at factor boundaries |
| permute, transpose, expand | dims follow; a broadcast to a padded size fills the pad with real data (UNKNOWN) |
| slice, narrow, select | constant start >= 0: safe. Start counted from the end (`x[:, -1]`): refuse. A start, |
|   | index or (unpadded) end computed from a dynamic size (`table[x.shape[1] - 1]`), of any tensor: refuse |
| cat / split, unbind | along unpadded dims safe; along a padded dim only the last operand may be padded / refuse |
| stack | safe: the new dim is unpadded, the others keep the operands' pads (mixed kinds: UNKNOWN) |
| constant_pad_nd | right padding of a padded dim: the fill is moved to the real end (mask) |
| mm, bmm, addmm, baddbmm, mv, dot | contraction safe when one operand's pad is ZERO and the other's ZERO or FINITE; |
|   | else mask operands to 0 |
| sum, any / amax, max, argmax, logsumexp | need the neutral pad 0 / -inf, else mask to it (+inf: min, 1: prod) |
| mean | mask to 0, then sum / real element count |
| var, std | refuse |
| softmax, log_softmax | mask the input to -inf (pad of the result: 0 / -inf); backward: mask operands to 0 |
| attention (SDPA fwd/bwd) | causal self-attention, both lengths padded by one symbol: safe for real queries. |
|   | Else mask the padded keys with -inf. Padded keys/values zeroed; backward zeroes padded queries' grad/out/lse |
| cumsum, cumprod, cummax | safe (right padding: a real position sees only earlier real positions); merged dim: refuse |
| sort, argsort, topk, median, mode | refuse (padding would move into real positions) |
| unique, nonzero, masked_select | refuse (the output size would count padding) |
| layer norm, batch norm (eval), conv | safe when the normalised / convolved dims are unpadded; LN backward masks to 0 |
| embedding (+ backward) | padded indices are valid rows (pad 0); backward masks padded gradient rows to 0 |
| index, index_select, gather | along a padded dim only with an index bounded by that dim (derived from `arange`) |
|   | indices into an unpadded dim (embedding too) whose pad is not 0 (`arange(s)` position ids): pad set to 0 |
| nll_loss (fwd/bwd) | padded targets are set to `ignore_index` |
| scatter, index_add, slice_scatter | along unpadded dims safe; slice_scatter along a padded dim restores the |
|   | destination behind the real end; other writes along a padded dim (a KV cache) refuse |
| index_put | accumulate: mask padded values to 0, when the values are padded like the indices (not broadcast, |
|   | not merged differently: else refuse), padded indices set in range; overwrite: refuse |
| mutations (copy_, add_, ...) | refuse when padding is involved (the caller would never see the padded copy) |
| random (dropout, rand, bernoulli) | refuse on padded shapes (the random stream would differ) |
| creation (full, zeros, arange) | pad kind from the fill value; `arange` start must not depend on a bucketed size |
| a size used as data (`x / s0`) | a pointwise op gets the real size as a 0-d tensor; anywhere else: refuse |
| anything else touching padding | refuse, naming the op |

Masks compare `arange(bucket size)` against the real size, which the transformed graph receives as extra 0-d int64
inputs (one per bucketed symbol, appended after the original inputs) so that one static program serves every real
length of its bucket.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import logging
import math
import operator
import re
from collections.abc import Callable, Sequence

import sympy
import torch
import torch.fx as fx
from torch.fx.operator_schemas import normalize_function

from neuron_dynamo.errors import NeuronDynamoError

log = logging.getLogger("neuron_dynamo.passes.padding")
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


Rule = Callable[["_Analysis", fx.Node], object]
_RULES: dict[object, Rule] = {}


def _rule(*packets) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for packet in packets:
            _RULES[packet] = fn
        return fn

    return register


def prove_padding(gm: fx.GraphModule, symbols: Sequence[sympy.Symbol]) -> PaddingProof:
    """Prove that padding the dims whose sizes involve `symbols` cannot change a real output of `gm`.

    `gm` is an aten graph whose placeholders carry `meta["val"]` (fake tensors with symbolic sizes, as AOTAutograd
    and `make_fx(tracing_mode="symbolic")` produce). `gm` itself is not modified.
    """
    symbols = tuple(symbols)
    proof = _prove(gm, symbols, merged_inputs=False)
    if not proof.safe and _has_product_input(gm, set(symbols)):
        # An input dim sized `2*s` is the merge of [2, s] (a saved activation, flattened): padded as such, it lines
        # up with the views of the graph that merge [2, s] the same way.
        merged = _prove(gm, symbols, merged_inputs=True)
        if merged.safe:
            return merged
    if proof.reason is not None:
        log.info("padding refused: %s", proof.reason)
    return proof


def _prove(gm: fx.GraphModule, symbols: tuple[sympy.Symbol, ...], merged_inputs: bool) -> PaddingProof:
    # A new graph over the same module: its constants may be fake or meta tensors, which cannot be deep-copied.
    analysis = _Analysis(fx.GraphModule(gm, copy.deepcopy(gm.graph)), symbols, merged_inputs)
    try:
        analysis.run()
    except PaddingRefused as refusal:
        return PaddingProof(safe=False, graph=None, symbols=symbols, reason=str(refusal))
    except Exception as error:  # a graph shape the rules did not foresee: refusing is always safe
        log.warning("padding analysis failed, running at exact shapes: %r", error, exc_info=True)
        reason = f"analysis error ({type(error).__name__}: {error})"
        return PaddingProof(safe=False, graph=None, symbols=symbols, reason=reason)
    return PaddingProof(
        safe=True, graph=analysis.gm, symbols=symbols, masks=analysis.masks, output_factors=analysis.output_factors,
        input_factors=analysis.input_factors,
    )


def merged_factors(expr: sympy.Expr, symbols: Sequence[sympy.Symbol]) -> tuple[sympy.Expr, ...] | None:
    """The factors of a product size `2*s` (constants outermost, then symbols in `symbols` order), or None."""
    expr = sympy.sympify(expr)
    if not isinstance(expr, sympy.Mul) or not expr.free_symbols & set(symbols):
        return None
    if not all(arg.is_Integer or arg.is_Symbol for arg in expr.args):
        return None
    order = {symbol: i for i, symbol in enumerate(symbols)}
    return tuple(sorted(expr.args, key=lambda arg: (not arg.is_Integer, order.get(arg, len(order)), str(arg))))


def _outer_first(gm: fx.GraphModule, symbols: Sequence[sympy.Symbol]) -> list[sympy.Symbol]:
    """`symbols` in the order their dims nest in the inputs: the batch symbol (a dim 0) before the length (dim 1)."""
    first_dim: dict[sympy.Symbol, int] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            for d, expr in enumerate(_exprs(node) or ()):
                if expr in symbols:
                    first_dim[expr] = min(first_dim.get(expr, d), d)
    return sorted(symbols, key=lambda symbol: (first_dim.get(symbol, len(first_dim) + 99), str(symbol)))


def _has_product_input(gm: fx.GraphModule, symbols: set) -> bool:
    return any(merged_factors(e, list(symbols)) for n in gm.graph.nodes if n.op == "placeholder"
               for e in (_exprs(n) or ()))


def graph_outputs(output: fx.Node) -> list:
    """The values an output node returns, in order (None entries kept: AOTAutograd returns them)."""
    values = output.args[0]
    return list(values) if isinstance(values, (tuple, list)) else [values]


def _exprs(node: fx.Node) -> list[sympy.Expr] | None:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(value, torch.Tensor):
        return None
    return [sympy.sympify(s.node.expr if isinstance(s, torch.SymInt) else int(s)) for s in value.shape]


def _dtype(node: fx.Node) -> torch.dtype | None:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return value.dtype if isinstance(value, torch.Tensor) else None


def _op_name(target) -> str:
    return str(getattr(target, "overloadpacket", target))


def _classify(value: torch.Tensor) -> Pad:
    """The kind of a 0-d tensor computed from exact pad values."""
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
    if dtype.is_floating_point:
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


class _Analysis:
    def __init__(self, gm: fx.GraphModule, symbols: tuple[sympy.Symbol, ...], merged_inputs: bool = False) -> None:
        self.gm = gm
        self.merged_inputs = merged_inputs
        self.input_factors: list = []
        self.graph = gm.graph
        self.symbols = symbols
        self.symbol_set = set(symbols)
        self.state: dict[fx.Node, object] = {}
        self.masks: list[str] = []
        self._real_nodes: dict[sympy.Expr, fx.Node] = {}
        self._pad_masks: dict[tuple, fx.Node] = {}
        self._sym_nodes: dict[sympy.Expr, object] = {}
        self.output_factors: list = []
        self._first_compute: fx.Node | None = None

    # ---- driving -------------------------------------------------------------------------------------------------

    def run(self) -> None:
        nodes = list(self.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        self._first_compute = next(n for n in nodes if n.op != "placeholder")
        anchor = placeholders[-1] if placeholders else None
        for symbol in self.symbols:
            if anchor is None:
                with self.graph.inserting_before(self._first_compute):
                    anchor = self.graph.placeholder(f"real_{symbol}")
            else:
                with self.graph.inserting_after(anchor):
                    anchor = self.graph.placeholder(f"real_{symbol}")
            self._real_nodes[symbol] = anchor
        for node in nodes:
            self.visit(node)
        self.graph.eliminate_dead_code()
        self.graph.lint()
        self.gm.recompile()

    def visit(self, node: fx.Node) -> None:
        if node.op == "placeholder":
            self.state[node] = self._input_state(node)
        elif node.op == "get_attr":
            self.state[node] = None
        elif node.op == "output":
            self.output_factors = [
                [d.parts if d is not None else None for d in self.tensor(out).dims] if self.tensor(out) else None
                for out in graph_outputs(node)
            ]
        elif node.op == "call_function":
            self._check_size_as_data(node)
            self.state[node] = self._call(node)
        else:
            raise PaddingRefused(f"{node.op} node {node.name}: no padding rule for module/method calls")

    def _input_state(self, node: fx.Node):
        value = node.meta.get("val")
        if isinstance(value, (torch.SymInt, torch.SymFloat)):
            self.input_factors.append(None)
            expr = value.node.expr
            return SymValue(expr, bool(expr.free_symbols & self.symbol_set))
        exprs = _exprs(node)
        if exprs is None:
            self.input_factors.append(None)
            return None
        state = self._fresh(exprs, Pad.ZERO)
        if self.merged_inputs:
            order = _outer_first(self.gm, self.symbols)
            state = TensorPad(tuple(dataclasses.replace(d, parts=merged_factors(d.expr, order))
                                    if d is not None else None for d in state.dims), state.bound)
        self.input_factors.append([d.parts if d is not None else None for d in state.dims])
        return state

    def _call(self, node: fx.Node):
        target = node.target
        if target is operator.getitem:
            parent = self.state.get(node.args[0])
            return parent[node.args[1]] if isinstance(parent, (tuple, list)) else None
        value = node.meta.get("val")
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            expr = value.node.expr
            return SymValue(expr, bool(expr.free_symbols & self.symbol_set))
        name = _op_name(target)
        if name in _SYM_ASSERTS:
            return None
        packet = getattr(target, "overloadpacket", None)
        rule = _RULES.get(packet)
        pointwise = isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags
        if rule not in _MERGE_AWARE and not pointwise and self._has_merged_input(node):
            self.refuse(node, "a merged padded dim (padding interleaved with real data) reaches an op that is not "
                              "independent along it")
        if rule is not None:
            return rule(self, node)
        if isinstance(target, torch._ops.OpOverload):
            if torch.Tag.nondeterministic_seeded in target.tags:
                return self._random(node)
            if target._schema.is_mutable:
                return self._mutation(node)
            if torch.Tag.pointwise in target.tags:
                return self._elementwise(node)
        if not self._touches_padding(node):
            return self._unpadded_outputs(node)
        raise PaddingRefused(f"{name} ({node.name}) has no padding rule and touches a padded dimension")

    # ---- helpers -------------------------------------------------------------------------------------------------

    def is_padded(self, expr: sympy.Expr) -> bool:
        return bool(sympy.sympify(expr).free_symbols & self.symbol_set)

    def _fresh(self, exprs: Sequence[sympy.Expr], kind: Pad, bound=None) -> TensorPad:
        return TensorPad(tuple(DimPad(e, kind) if self.is_padded(e) else None for e in exprs), bound)

    def tensor(self, arg) -> TensorPad | None:
        state = self.state.get(arg) if isinstance(arg, fx.Node) else None
        return state if isinstance(state, TensorPad) else None

    def dims(self, arg) -> tuple[DimPad | None, ...]:
        state = self.tensor(arg)
        if state is not None:
            return state.dims
        exprs = _exprs(arg) if isinstance(arg, fx.Node) else None
        return tuple(None for _ in exprs) if exprs is not None else ()

    def _touches_padding(self, node: fx.Node) -> bool:
        if any(self.tensor(a) is not None and self.tensor(a).padded for a in node.all_input_nodes):
            return True
        return self._outputs_padded(node)

    def _outputs_padded(self, node: fx.Node) -> bool:
        values = node.meta.get("val")
        values = values if isinstance(values, (tuple, list)) else [values]
        for value in values:
            if isinstance(value, torch.Tensor):
                shape = [s.node.expr for s in value.shape if isinstance(s, torch.SymInt)]
                if any(self.is_padded(e) for e in shape):
                    return True
        return False

    def _merged(self, expr: sympy.Expr, factors: Sequence[sympy.Expr], kind: Pad) -> DimPad | None:
        """The state of a dim of size `expr` made of `factors` (outermost first)."""
        factors = [f for f in factors if f != 1]
        padded = [i for i, f in enumerate(factors) if self.is_padded(f)]
        if not padded:
            return None
        if padded == [0]:
            return DimPad(expr, kind)  # only the outermost factor padded: the pad region is still a tail
        return DimPad(expr, kind, tuple(factors))

    def _has_merged_input(self, node: fx.Node) -> bool:
        return any(d is not None and not d.is_tail for a in node.all_input_nodes for d in self.dims(a))

    def shaped(self, exprs, mapped: Sequence[DimPad | None], kind: Pad, bound=None) -> TensorPad:
        """A state for sizes `exprs` whose dim i continues `mapped[i]` (keeping how a merged dim is laid out)."""
        dims = []
        for i, expr in enumerate(exprs):
            if not self.is_padded(expr):
                dims.append(None)
                continue
            source = mapped[i] if i < len(mapped) else None
            parts = None
            if source is not None and source.parts is not None:
                if sympy.expand(source.expr - expr) != 0:
                    raise PaddingRefused(f"cannot follow the merged padded dim {source.expr} into size {expr}")
                parts = source.parts
            dims.append(DimPad(expr, kind, parts))
        return TensorPad(tuple(dims), bound)

    def like(self, node: fx.Node, source, kind: Pad = Pad.UNKNOWN) -> TensorPad | tuple:
        """Outputs of `node` whose dims continue the dims of `source` position by position."""
        mapped = self.dims(source)
        values = node.meta.get("val")
        if isinstance(values, (tuple, list)):
            return tuple(self._like_value(v, mapped, kind) for v in values)
        return self._like_value(values, mapped, kind)

    def _like_value(self, value, mapped, kind):
        if not isinstance(value, torch.Tensor):
            return None
        exprs = [sympy.sympify(s.node.expr if isinstance(s, torch.SymInt) else int(s)) for s in value.shape]
        return self.shaped(exprs, mapped if len(exprs) == len(mapped) else (), kind)

    def _unpadded_outputs(self, node: fx.Node):
        value = node.meta.get("val")
        if isinstance(value, (tuple, list)):
            return tuple(self._fresh_from_value(v, Pad.UNKNOWN) for v in value)
        return self._fresh_from_value(value, Pad.UNKNOWN)

    def _fresh_from_value(self, value, kind: Pad):
        if not isinstance(value, torch.Tensor):
            return None
        exprs = [sympy.sympify(s.node.expr if isinstance(s, torch.SymInt) else int(s)) for s in value.shape]
        return self._fresh(exprs, kind)

    def out(self, node: fx.Node, kind: Pad = Pad.UNKNOWN, bound=None) -> TensorPad | None:
        exprs = _exprs(node)
        return self._fresh(exprs, kind, bound) if exprs is not None else None

    def kwargs(self, node: fx.Node) -> dict:
        """The node's arguments by schema name (defaults filled in)."""
        normalized = normalize_function(
            node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True
        )
        if normalized is None:
            raise PaddingRefused(f"cannot read the arguments of {_op_name(node.target)} ({node.name})")
        schema_defaults = {
            a.name: a.default_value for a in node.target._schema.arguments if a.has_default_value()
        }
        return {**schema_defaults, **normalized.kwargs}

    def refuse(self, node: fx.Node, why: str):
        raise PaddingRefused(f"{_op_name(node.target)} ({node.name}): {why}")

    def _check_size_as_data(self, node: fx.Node) -> None:
        """Refuse a bucketed size flowing into a non-size argument (it would see the bucket value)."""
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or _op_name(target) in _SYM_ASSERTS:
            return
        if target.overloadpacket is aten.arange:
            return  # its own rule checks that only `end` depends on a bucketed size
        arguments = target._schema.arguments
        positional = list(node.args) + [node.kwargs.get(a.name) for a in arguments[len(node.args):]]
        for position, (argument, value) in enumerate(zip(arguments, positional, strict=False)):
            if _INT_TYPE.match(str(argument.type)):
                continue
            for item in value if isinstance(value, (list, tuple)) else [value]:
                state = self.state.get(item) if isinstance(item, fx.Node) else None
                if not (isinstance(state, SymValue) and state.bucketed):
                    continue
                tensor_overload = _tensor_overload(target, str(argument.type))
                if tensor_overload is not None and isinstance(item.meta.get("val"), torch.SymInt):
                    # Redirect: the op gets the real size as a 0-d tensor, exactly what eager computes with.
                    node.target = tensor_overload
                    _set_arg(node, position, argument.name, self.real(state.expr))
                    self.masks.append(f"{node.name}: the size {state.expr} used as data reads the real size")
                    continue
                self.refuse(node, f"the dynamic size {state.expr} is used as data (argument {argument.name!r}); "
                                  "a bucketed program would see the bucket size, not the real one")

    # ---- graph surgery -------------------------------------------------------------------------------------------

    def real(self, expr: sympy.Expr) -> fx.Node:
        """A 0-d int64 node holding `expr` evaluated at the real sizes."""
        expr = sympy.sympify(expr)
        if expr in self._real_nodes:
            return self._real_nodes[expr]
        with self.graph.inserting_before(self._first_compute):
            if expr.is_Integer:
                node = self.graph.call_function(aten.scalar_tensor.default, (int(expr),), {"dtype": torch.int64})
            elif isinstance(expr, sympy.Add):
                first, *rest = expr.args
                node = self.real(first)
                for term in rest:
                    node = self.graph.call_function(aten.add.Tensor, (node, self.real(term)))
            elif isinstance(expr, sympy.Mul):
                first, *rest = expr.args
                node = self.real(first)
                for term in rest:
                    node = self.graph.call_function(aten.mul.Tensor, (node, self.real(term)))
            elif type(expr).__name__ == "FloorDiv":
                node = self.graph.call_function(
                    aten.div.Tensor_mode, (self.real(expr.args[0]), self.real(expr.args[1])), {"rounding_mode": "floor"}
                )
            else:
                raise PaddingRefused(f"cannot compute the real value of size expression {expr}")
        self._real_nodes[expr] = node
        return node

    def sym(self, expr: sympy.Expr):
        """A SymInt node (or int) holding `expr` at the sizes the graph runs with (the bucket sizes)."""
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        if expr in self._sym_nodes:
            return self._sym_nodes[expr]
        with self.graph.inserting_before(self._first_compute):
            if isinstance(expr, sympy.Symbol):
                node = self._symbol_source(expr)
            elif isinstance(expr, (sympy.Add, sympy.Mul)):
                combine = operator.add if isinstance(expr, sympy.Add) else operator.mul
                first, *rest = expr.args
                node = self.sym(first)
                for term in rest:
                    node = self.graph.call_function(combine, (node, self.sym(term)))
            elif type(expr).__name__ == "FloorDiv":
                node = self.graph.call_function(operator.floordiv, (self.sym(expr.args[0]), self.sym(expr.args[1])))
            else:
                raise PaddingRefused(f"cannot compute size expression {expr} in the graph")
        self._sym_nodes[expr] = node
        return node

    def _symbol_source(self, symbol: sympy.Symbol) -> fx.Node:
        for node in self.graph.nodes:
            if node.op != "placeholder":
                break
            value = node.meta.get("val")
            if isinstance(value, torch.SymInt) and value.node.expr == symbol:
                return node
            exprs = _exprs(node) or []
            for dim, expr in enumerate(exprs):
                if expr == symbol:
                    return self.graph.call_function(aten.sym_size.int, (node, dim))
        raise PaddingRefused(f"no graph input has size {symbol}")

    def pad_mask(self, node: fx.Node, dim: int, threshold: sympy.Expr | None = None) -> fx.Node:
        """A bool tensor broadcastable to `node`, True in the pad region of `dim` (or at positions >= `threshold`)."""
        rank = len(_exprs(node))
        dim = dim % rank
        padded = self.dims(node)[dim]
        factors = padded.factors if threshold is None else (_exprs(node)[dim],)
        key = (node, dim, threshold)
        if key not in self._pad_masks:
            device = node.meta["val"].device
            combined = None
            for k, factor in enumerate(factors):
                if not self.is_padded(factor):
                    continue
                positions = self.graph.call_function(aten.arange.default, (self.sym(factor),), {"device": device})
                limit = self.real(factor if threshold is None else threshold)
                mask = self.graph.call_function(aten.ge.Tensor, (positions, limit))
                shape = [1] * len(factors)
                shape[k] = -1
                mask = self.graph.call_function(aten.view.default, (mask, shape))
                combined = mask if combined is None else self.graph.call_function(aten.logical_or.default,
                                                                                  (combined, mask))
            if len(factors) > 1:
                full = [self.sym(f) for f in factors]
                combined = self.graph.call_function(aten.expand.default, (combined, full))
                combined = self.graph.call_function(aten.clone.default, (combined,))
            shape = [1] * rank
            shape[dim] = -1
            self._pad_masks[key] = self.graph.call_function(aten.view.default, (combined, shape))
        return self._pad_masks[key]

    def mask(self, consumer: fx.Node, arg: fx.Node, dims: Sequence[int], fill: float, why: str) -> fx.Node:
        """Replace `arg` in `consumer` by a copy whose pad region along `dims` holds `fill`."""
        with self.graph.inserting_before(consumer):
            combined = None
            for dim in dims:
                mask = self.pad_mask(arg, dim)
                combined = mask if combined is None else self.graph.call_function(aten.logical_or.default,
                                                                                  (combined, mask))
            masked = self.graph.call_function(aten.masked_fill.Scalar, (arg, combined, _fill_for(_dtype(arg), fill)))
        masked.meta["val"] = arg.meta.get("val")
        consumer.replace_input_with(arg, masked)
        old = self.tensor(arg)
        kind = _classify_scalar(_fill_for(_dtype(arg), fill))
        normalized = {d % len(old.dims) for d in dims}
        self.state[masked] = TensorPad(
            tuple(dataclasses.replace(d, kind=kind) if i in normalized and d is not None else d
                  for i, d in enumerate(old.dims)),
            old.bound,
        )
        self.masks.append(f"{consumer.name}: {why}")
        return masked

    def mask_padded(self, consumer: fx.Node, arg, fill: float, why: str, unless: tuple[Pad, ...] = ()) -> None:
        """Mask every padded dim of `arg` whose pad kind is not in `unless`."""
        state = self.tensor(arg)
        if state is None:
            return
        dims = [i for i, d in enumerate(state.dims) if d is not None and d.kind not in unless]
        if dims:
            self.mask(consumer, arg, dims, fill, why)

    # ---- generic rules -------------------------------------------------------------------------------------------

    def _random(self, node: fx.Node):
        if self._outputs_padded(node):
            self.refuse(node, "random numbers drawn for a padded shape would differ from the unpadded draw")
        return self._unpadded_outputs(node)

    def _mutation(self, node: fx.Node):
        if self._touches_padding(node):
            self.refuse(node, "writes into a buffer at padded positions (or into a padded input, whose padded copy "
                              "the caller never sees); redirecting such writes is not supported")
        return self._unpadded_outputs(node)

    def _elementwise(self, node: fx.Node):
        exprs = _exprs(node)
        if exprs is None:
            return self._unpadded_outputs(node)
        divisor = node.args[1] if len(node.args) > 1 else None
        if _op_name(node.target) in _INTEGER_DIVISIONS and isinstance(divisor, fx.Node) and not _is_float(node):
            self.mask_padded(node, divisor, 1, "an integer division by a padded divisor: pad set to 1 (eager raises "
                                               "on a division by 0)")
        operands = [a for a in node.all_input_nodes if isinstance(a, fx.Node) and _exprs(a) is not None]
        rank = len(exprs)
        name = _op_name(node.target)
        out_dims = []
        for d, expr in enumerate(exprs):
            if not self.is_padded(expr):
                out_dims.append(None)
                continue
            kinds, layouts = {}, set()
            for operand in operands:
                op_dims = self.dims(operand)
                aligned = d - (rank - len(op_dims))
                if aligned >= 0 and op_dims[aligned] is not None:
                    kinds[operand] = op_dims[aligned].kind
                    layouts.add(op_dims[aligned].parts)
                else:
                    kinds[operand] = None  # real data broadcast into the pad region
            if len(layouts) > 1:
                self.refuse(node, "operands lay out a merged padded dim differently")
            parts = layouts.pop() if layouts else None
            out_dims.append(DimPad(expr, self._elementwise_kind(node, name, kinds), parts))
        bound = None
        if name in _IDENTITY_BOUND and operands:
            bound = self.tensor(operands[0]).bound if self.tensor(operands[0]) else None
        elif name in ("aten.add", "aten.sub") and len(node.args) > 1 and node.args[1] == 0:
            bound = self.tensor(node.args[0]).bound if self.tensor(node.args[0]) else None
        return TensorPad(tuple(out_dims), bound)

    def _elementwise_kind(self, node: fx.Node, name: str, kinds: dict) -> Pad:
        dtype = _dtype(node)
        if kinds and all(k in _EXACT for k in kinds.values()):
            try:
                args = [torch.full((), _fill_for(_dtype(a), _EXACT[kinds[a]]), dtype=_dtype(a))
                        if isinstance(a, fx.Node) and a in kinds else a for a in node.args]
                kwargs = {k: v for k, v in node.kwargs.items() if not isinstance(v, fx.Node)}
                kwargs.pop("device", None)
                return _classify(node.target(*args, **kwargs))
            except Exception:  # an op that cannot run on 0-d values: fall back to the rules below
                pass
        if name == "aten.where" and len(node.args) == 3:
            branches = [kinds.get(a) if isinstance(a, fx.Node) else _classify_scalar(a) for a in node.args[1:]]
            if branches[0] == branches[1] and branches[0] is not None:
                return branches[0]
        if dtype is not None and (dtype == torch.bool or not dtype.is_floating_point):
            return Pad.FINITE
        values = list(kinds.values())
        if name == "aten.mul" and Pad.ZERO in values and all(k in SAFE_IN_PRODUCTS for k in values):
            return Pad.ZERO
        if name in _CASTS and dtype in (torch.float32, torch.float64, torch.bfloat16):
            return values[0] if values and values[0] is not None else Pad.UNKNOWN
        if name in _BOUNDED and values and all(k in SAFE_IN_PRODUCTS for k in values):
            return Pad.FINITE
        return Pad.UNKNOWN

    def independent(self, node: fx.Node, source, mixing_dims: Sequence[int], what: str):
        """Ops that act independently along every dim but `mixing_dims` of `source`: refuse if one is padded."""
        dims = self.dims(source)
        for d in mixing_dims:
            if dims and dims[d % len(dims)] is not None:
                self.refuse(node, f"{what} mixes positions along padded dim {d}")
        return self._unpadded_outputs(node)


_INTEGER_DIVISIONS = ("aten.div", "aten.floor_divide", "aten.remainder", "aten.fmod")


def _is_float(node: fx.Node) -> bool:
    dtype = _dtype(node)
    return dtype is not None and (dtype.is_floating_point or dtype.is_complex)


@_rule(aten._to_copy, aten.clone, aten.alias, aten.detach, aten.lift_fresh_copy, aten.contiguous, aten.to,
       aten.copy)  # fmt: skip
def _elementwise_untagged(self: _Analysis, node: fx.Node):
    """Casts and copies: element-wise, though not tagged pointwise."""
    return self._elementwise(node)


# ---- shape rules ---------------------------------------------------------------------------------------------------


def _generic_point(expr: sympy.Expr) -> float:
    return float(expr.subs({s: 1009 + 17 * i for i, s in enumerate(sorted(expr.free_symbols, key=str))}))


def _take_factors(factors: list[sympy.Expr], target: sympy.Expr) -> list[sympy.Expr] | None:
    """Consume the leading `factors` whose product is `target` (splitting a static integer factor if needed)."""
    taken, product = [], sympy.Integer(1)
    while sympy.expand(product - target) != 0:
        if not factors:
            return None
        factor = factors[0]
        if _generic_point(product * factor) <= _generic_point(target) + 0.5:
            taken.append(factors.pop(0))
            product *= factor
            continue
        need = sympy.simplify(target / product)
        if factor.is_Integer and need.is_Integer and int(factor) % int(need) == 0:
            taken.append(need)
            factors[0] = sympy.Integer(int(factor) // int(need))
            product *= need
            continue
        return None
    return taken


def _view_groups(src: list[sympy.Expr], dst: list[sympy.Expr]) -> list[tuple[list[int], list[int]]] | None:
    """Group the dims of a reshape `src -> dst` into runs with equal element counts (size-1 dims stand alone)."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1:
            groups.append(([i], []))
            i += 1
            continue
        if j < len(dst) and dst[j] == 1:
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(src) or j >= len(dst):
            return None
        gi, gj = [i], [j]
        pi, pj = src[i], dst[j]
        i, j = i + 1, j + 1
        while sympy.expand(pi - pj) != 0:
            if _generic_point(pi) < _generic_point(pj):
                if i >= len(src):
                    return None
                pi, gi = pi * src[i], gi + [i]
                i += 1
            else:
                if j >= len(dst):
                    return None
                pj, gj = pj * dst[j], gj + [j]
                j += 1
        groups.append((gi, gj))
    return groups


@_rule(aten.view, aten._unsafe_view, aten.reshape, aten.view_copy, aten.squeeze, aten.unsqueeze, aten.flatten,
       aten.unflatten, aten._reshape_alias, aten.squeeze_copy, aten.unsqueeze_copy)  # fmt: skip
def _view(self: _Analysis, node: fx.Node):
    source = node.args[0]
    src, dst = _exprs(source), _exprs(node)
    state = self.tensor(source)
    if state is None or not state.padded:
        return self.out(node, Pad.UNKNOWN, state.bound if state else None)
    groups = _view_groups(src, dst)
    if groups is None:
        self.refuse(node, f"cannot relate the view {src} -> {dst}")
    out: list[DimPad | None] = [None] * len(dst)
    for gi, gj in groups:
        factors, kinds = [], []
        for i in gi:
            padded = state.dims[i]
            factors.extend(padded.factors if padded is not None else (src[i],))
            if padded is not None:
                kinds.append(padded.kind)
        if not kinds:
            continue
        kind = kinds[0] if len(set(kinds)) == 1 else Pad.UNKNOWN
        for j in gj:
            taken = _take_factors(factors, dst[j])
            if taken is None:
                self.refuse(node, f"view {[str(src[i]) for i in gi]} -> {[str(dst[j]) for j in gj]} splits a merged "
                                  "padded dim across a padded factor")
            out[j] = self._merged(dst[j], taken, kind)
        if any(f != 1 for f in factors):
            self.refuse(node, f"cannot relate the view {src} -> {dst}")
    return TensorPad(tuple(out), state.bound)


@_rule(aten.permute, aten.transpose, aten.t, aten.permute_copy, aten.transpose_copy, aten.t_copy)
def _permute(self: _Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    if state is None:
        return self.out(node)
    rank = len(state.dims)
    order = list(range(rank))
    packet = node.target.overloadpacket
    if packet in (aten.permute, aten.permute_copy):
        order = [d % rank for d in node.args[1]]
    elif rank >= 2:
        a, b = (node.args[1] % rank, node.args[2] % rank) if len(node.args) > 2 else (0, 1)
        order[a], order[b] = order[b], order[a]
    return TensorPad(tuple(state.dims[i] for i in order), state.bound)


@_rule(aten.expand, aten.expand_copy)
def _expand(self: _Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    dst = _exprs(node)
    src_dims = state.dims if state else tuple(None for _ in _exprs(node.args[0]))
    src = _exprs(node.args[0])
    out = []
    offset = len(dst) - len(src)
    for d, expr in enumerate(dst):
        i = d - offset
        if i >= 0 and src_dims[i] is not None:
            out.append(src_dims[i])
        elif self.is_padded(expr):
            out.append(DimPad(expr, Pad.UNKNOWN))  # copies of real data fill the pad region
        else:
            out.append(None)
    return TensorPad(tuple(out), state.bound if state else None)


def _const_int(self: _Analysis, node: fx.Node, value, what: str) -> int | None:
    """`value` as a plain int, refusing when it depends on a bucketed size."""
    if value is None:
        return None
    if isinstance(value, fx.Node):
        state = self.state.get(value)
        if isinstance(state, SymValue):
            if state.bucketed:
                self.refuse(node, f"{what} depends on a dynamic size ({state.expr})")
            return int(state.expr) if state.expr.is_number else None
        self.refuse(node, f"{what} is computed at run time")
    return int(value)


@_rule(aten.slice, aten.narrow, aten.slice_copy)
def _slice(self: _Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    src, dst = _exprs(node.args[0]), _exprs(node)
    args = self.kwargs(node)
    dim = args.get("dim", 0) % len(src)
    out = list(state.dims) if state else [None] * len(src)
    padded_src = out[dim] is not None
    if node.target.overloadpacket is aten.narrow:
        start, step = args["start"], 1
    else:
        start, step = args.get("start"), args.get("step", 1)
        if not self.is_padded(dst[dim]):  # an end that depends on a size must be where a padded dim ends
            _const_int(self, node, args.get("end"), "the slice end")
    start = _const_int(self, node, start, "the slice start")  # a position computed from a size: refused
    if padded_src or self.is_padded(dst[dim]):
        start = _const_int(self, node, start, "the slice start") or 0
        step = _const_int(self, node, step, "the slice step")
        if start < 0:
            self.refuse(node, "a slice counted from the end of a padded dim would read padding")
        if step != 1 and start != 0:
            self.refuse(node, "a strided slice with an offset along a padded dim")
    if self.is_padded(dst[dim]):
        exact_tail = padded_src and sympy.expand(src[dim] - start - dst[dim]) == 0
        kind = out[dim].kind if exact_tail and step == 1 else Pad.UNKNOWN
        out[dim] = DimPad(dst[dim], kind)
    else:
        out[dim] = None
    return TensorPad(tuple(out), state.bound if state else None)


@_rule(aten.select, aten.select_copy)
def _select(self: _Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    index = _const_int(self, node, node.args[2], "the selected index")  # `table[x.shape[1] - 1]`: refused
    if state is None:
        return self.out(node)
    dim = node.args[1] % len(state.dims)
    if state.dims[dim] is not None:
        if index is None or index < 0:
            self.refuse(node, "selecting a position counted from the end of a padded dim would read padding")
    return TensorPad(state.dims[:dim] + state.dims[dim + 1:], state.bound)


@_rule(aten.cat)
def _cat(self: _Analysis, node: fx.Node):
    tensors = [t for t in node.args[0] if _exprs(t) is not None and len(_exprs(t)) == len(_exprs(node))]
    dst = _exprs(node)
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % len(dst)
    out = []
    for d, expr in enumerate(dst):
        if d == dim:
            if not self.is_padded(expr):
                out.append(None)
                continue
            padded = [t for t in tensors if self.is_padded(_exprs(t)[d])]
            if padded != tensors[-1:]:
                self.refuse(node, "concatenation along a padded dim leaves padding between real data")
            last = self.dims(tensors[-1])[d]
            out.append(DimPad(expr, last.kind))
        elif self.is_padded(expr):
            kinds = {self.dims(t)[d].kind if self.dims(t)[d] else Pad.UNKNOWN for t in tensors}
            out.append(DimPad(expr, kinds.pop() if len(kinds) == 1 else Pad.UNKNOWN))
        else:
            out.append(None)
    bounds = {self.tensor(t).bound if self.tensor(t) else None for t in tensors}
    return TensorPad(tuple(out), bounds.pop() if len(bounds) == 1 and dim != len(dst) else None)


@_rule(aten.stack)
def _stack(self: _Analysis, node: fx.Node):
    """A new, unpadded dim; every other dim is the operands' (which have one shape), pads combined like `cat`'s."""
    tensors = list(node.args[0])
    dst = _exprs(node)
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % len(dst)
    out: list[DimPad | None] = []
    for d, expr in enumerate(dst[:dim] + dst[dim + 1:]):
        if not self.is_padded(expr):
            out.append(None)
            continue
        kinds = {self.dims(t)[d].kind if self.tensor(t) and self.dims(t)[d] else Pad.UNKNOWN for t in tensors}
        out.append(DimPad(expr, kinds.pop() if len(kinds) == 1 else Pad.UNKNOWN))
    out.insert(dim, None)
    bounds = {self.tensor(t).bound if self.tensor(t) else None for t in tensors}
    return TensorPad(tuple(out), bounds.pop() if len(bounds) == 1 else None)


@_rule(aten.split, aten.split_with_sizes, aten.unbind, aten.chunk, aten.tensor_split)
def _split(self: _Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    if state is None:
        return self._unpadded_outputs(node)
    args = self.kwargs(node)
    dim = args.get("dim", 0) % len(state.dims)
    if state.dims[dim] is not None:
        self.refuse(node, "splitting along a padded dim would put padding inside the first pieces")
    if node.target.overloadpacket is aten.unbind:
        kept = state.dims[:dim] + state.dims[dim + 1:]
        return tuple(TensorPad(kept, state.bound) for _ in node.meta["val"])
    return tuple(TensorPad(state.dims, state.bound) for _ in node.meta["val"])


@_rule(aten.constant_pad_nd)
def _constant_pad(self: _Analysis, node: fx.Node):
    source = node.args[0]
    state = self.tensor(source)
    pads = list(node.args[1])
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
    src = _exprs(source)
    rank = len(src)
    out = list(state.dims) if state else [None] * rank
    dst = _exprs(node)
    needs_fill = []
    for k in range(len(pads) // 2):
        d = rank - 1 - k
        left = _const_int(self, node, pads[2 * k], "the pad width")
        right = _const_int(self, node, pads[2 * k + 1], "the pad width")
        if out[d] is None:
            continue
        if left < 0 or right < 0:
            self.refuse(node, "negative padding crops a padded dim")
        out[d] = DimPad(dst[d], out[d].kind)
        if right > 0:
            needs_fill.append((d, src[d] + left))
    result = TensorPad(tuple(out), None)
    if needs_fill:
        # The pad op writes `value` after the *bucket* end; move it to the real end.
        users = list(node.users)
        with self.graph.inserting_before(node.next):
            combined = None
            for d, threshold in needs_fill:
                mask = self.pad_mask(node, d, threshold)
                combined = mask if combined is None else self.graph.call_function(aten.logical_or.default,
                                                                                  (combined, mask))
            filled = self.graph.call_function(aten.masked_fill.Scalar, (node, combined, value))
        filled.meta["val"] = node.meta.get("val")
        for user in users:
            user.replace_input_with(node, filled)
        kind = _classify_scalar(value)
        self.state[filled] = TensorPad(
            tuple(DimPad(p.expr, kind) if p is not None and any(d == i for d, _ in needs_fill) else p
                  for i, p in enumerate(out)), None)
        self.masks.append(f"{node.name}: pad value written at the real end")
    return result


# ---- matmul ----------------------------------------------------------------------------------------------------------


@_rule(aten.mm, aten.bmm, aten.addmm, aten.baddbmm, aten.mv, aten.dot)
def _matmul(self: _Analysis, node: fx.Node):
    packet = node.target.overloadpacket
    lhs, rhs = (node.args[1], node.args[2]) if packet in (aten.addmm, aten.baddbmm) else (node.args[0], node.args[1])
    lhs_dims, rhs_dims = self.dims(lhs), self.dims(rhs)
    k_lhs = lhs_dims[-1] if lhs_dims else None
    k_rhs = rhs_dims[-2] if len(rhs_dims) >= 2 else (rhs_dims[0] if rhs_dims else None)
    if k_lhs is not None and k_rhs is not None and k_lhs.parts != k_rhs.parts:
        # one side merged (padding interleaved per outer row), the other padded at its tail: position i of the
        # contraction is not the same real element on both sides, and no mask can make it so
        self.refuse(node, "a contraction over a padded dim laid out differently by its operands")
    if k_lhs is not None or k_rhs is not None:
        ka = k_lhs.kind if k_lhs else Pad.UNKNOWN
        kb = k_rhs.kind if k_rhs else Pad.UNKNOWN
        safe = (ka == Pad.ZERO and kb in SAFE_IN_PRODUCTS) or (kb == Pad.ZERO and ka in SAFE_IN_PRODUCTS)
        if not safe:
            why = "contraction over a padded dim: padded terms zeroed"
            if ka in SAFE_IN_PRODUCTS:
                self.mask(node, rhs, [len(rhs_dims) - 2 if len(rhs_dims) >= 2 else 0], 0.0, why)
            elif kb in SAFE_IN_PRODUCTS:
                self.mask(node, lhs, [len(lhs_dims) - 1], 0.0, why)
            else:
                self.mask(node, lhs, [len(lhs_dims) - 1], 0.0, why)
                self.mask(node, rhs, [len(rhs_dims) - 2 if len(rhs_dims) >= 2 else 0], 0.0, why)
    exprs = _exprs(node)
    mapped: list[DimPad | None] = [None] * len(exprs)
    if len(exprs) >= 1 and len(rhs_dims) >= 2:
        mapped[-1] = rhs_dims[-1]
    if len(exprs) >= 2:
        mapped[-2] = lhs_dims[-2]
    elif len(exprs) == 1 and len(rhs_dims) == 1:
        mapped[0] = lhs_dims[0]
    if len(exprs) == 3:
        mapped[0] = lhs_dims[0]
    return self.shaped(exprs, mapped, Pad.UNKNOWN)


# ---- reductions ------------------------------------------------------------------------------------------------------

_NEUTRAL = {
    aten.sum: 0.0, aten.nansum: 0.0, aten.any: 0.0, aten.mean: 0.0, aten.linalg_vector_norm: 0.0,
    aten.amax: -math.inf, aten.max: -math.inf, aten.argmax: -math.inf, aten.logsumexp: -math.inf,
    aten.amin: math.inf, aten.min: math.inf, aten.argmin: math.inf,
    aten.prod: 1.0, aten.all: 1.0,
}  # fmt: skip


def _reduced_dims(args: dict, rank: int) -> list[int]:
    dim = args.get("dim")
    if dim is None or dim == [] or dim == ():
        return list(range(rank))
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return sorted({d % rank for d in dims}) if rank else []


@_rule(*_NEUTRAL)
def _reduction(self: _Analysis, node: fx.Node):
    if node.target in (aten.max.other, aten.min.other):  # binary element-wise, not reductions
        return self._elementwise(node)
    packet = node.target.overloadpacket
    source = node.args[0]
    state = self.tensor(source)
    if state is None or not state.padded:
        return self._unpadded_outputs(node)
    args = self.kwargs(node)
    rank = len(state.dims)
    reduced = _reduced_dims(args, rank)
    padded = [d for d in reduced if state.dims[d] is not None]
    if packet is aten.linalg_vector_norm and padded and not (args.get("ord", 2) > 0):
        self.refuse(node, "a norm of non-positive order over a padded dim")
    neutral = _NEUTRAL[packet]
    neutral_kind = _classify_scalar(neutral)
    to_mask = [d for d in padded if state.dims[d].kind != neutral_kind or neutral_kind == Pad.FINITE]
    if neutral_kind == Pad.UNKNOWN:  # +inf is "unknown" to the lattice: always mask
        to_mask = padded
    if to_mask:
        self.mask(node, source, to_mask, neutral, f"{packet.__name__} over a padded dim: pad set to {neutral}")
    keep = args.get("keepdim", False)
    mapped = [None if d in reduced else p for d, p in enumerate(state.dims) if keep or d not in reduced]
    values = node.meta.get("val")
    results = [self._like_value(v, mapped, Pad.UNKNOWN) for v in (values if isinstance(values, tuple) else [values])]
    result = tuple(results) if isinstance(values, tuple) else results[0]
    if packet is aten.mean and padded:
        self.state[_mean_as_sum(self, node, args, reduced)] = result
    return result


def _mean_as_sum(self: _Analysis, node: fx.Node, args: dict, reduced: list[int]) -> fx.Node:
    """mean = sum / (real element count): the masked pad contributes 0 to the sum and nothing to the count."""
    src = _exprs(node.args[0])
    count = sympy.Integer(1)
    for d in reduced:
        count *= src[d]
    keepdim = args.get("keepdim", False)
    with self.graph.inserting_after(node):
        total = self.graph.call_function(
            aten.sum.dim_IntList, (node.args[0], reduced, keepdim), {"dtype": args.get("dtype")}
        )
        with self.graph.inserting_after(total):
            quotient = self.graph.call_function(aten.div.Tensor, (total, self.real(count)))
    node.replace_all_uses_with(quotient)
    self.masks.append(f"{node.name}: mean over a padded dim divides by the real count")
    self.graph.erase_node(node)
    quotient.meta["val"] = node.meta.get("val")
    return quotient


@_rule(aten.var, aten.std, aten.var_mean, aten.std_mean)
def _variance(self: _Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    if state is not None and state.padded:
        args = self.kwargs(node)
        if any(state.dims[d] is not None for d in _reduced_dims(args, len(state.dims))):
            self.refuse(node, "variance over a padded dim")
    return self._unpadded_outputs(node)


@_rule(aten.cumsum, aten.cumprod, aten.logcumsumexp, aten.cummax, aten.cummin)
def _scan(self: _Analysis, node: fx.Node):
    dims = self.dims(node.args[0])
    if dims:
        scanned = dims[node.args[1] % len(dims)]
        if scanned is not None and not scanned.is_tail:
            self.refuse(node, "a scan along a merged padded dim would carry padding into later real positions")
    return self.like(node, node.args[0])  # right padding: prefix results at real positions see only real positions


@_rule(aten.sort, aten.argsort, aten.topk, aten.kthvalue, aten.median, aten.nanmedian, aten.mode, aten.msort)
def _sort(self: _Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    if state is not None and state.padded:
        args = self.kwargs(node)
        if node.target.overloadpacket is aten.msort:
            args["dim"] = 0
        dims = [args["dim"] % len(state.dims)] if args.get("dim") is not None else range(len(state.dims))
        if any(state.dims[d] is not None for d in dims):
            self.refuse(node, "sorting/selecting along a padded dim would move padding into real positions")
    return self.like(node, node.args[0])


@_rule(aten.unique_dim, aten._unique2, aten.unique_consecutive, aten.nonzero, aten.masked_select, aten._unique)
def _data_dependent(self: _Analysis, node: fx.Node):
    if self._touches_padding(node):
        self.refuse(node, "a data-dependent output size would count padded elements")
    return self._unpadded_outputs(node)


# ---- softmax and attention -------------------------------------------------------------------------------------------


@_rule(aten._softmax, aten.softmax, aten._log_softmax, aten.log_softmax)
def _softmax(self: _Analysis, node: fx.Node):
    source = node.args[0]
    state = self.tensor(source)
    if state is None or not state.padded:
        return self._unpadded_outputs(node)
    dim = node.args[1] % len(state.dims)
    log_space = node.target.overloadpacket in (aten._log_softmax, aten.log_softmax)
    result = self.like(node, source)
    if state.dims[dim] is not None:
        if state.dims[dim].kind != Pad.NEG_INF:
            self.mask(node, source, [dim], -math.inf, "softmax over a padded dim: pad set to -inf")
        dims = list(result.dims)
        dims[dim] = dataclasses.replace(dims[dim], kind=Pad.NEG_INF if log_space else Pad.ZERO)
        result = TensorPad(tuple(dims))
    return result


@_rule(aten._softmax_backward_data, aten._log_softmax_backward_data)
def _softmax_backward(self: _Analysis, node: fx.Node):
    grad, output = node.args[0], node.args[1]
    state = self.tensor(grad)
    if state is None or not state.padded:
        return self._unpadded_outputs(node)
    dim = node.args[2] % len(state.dims)
    if state.dims[dim] is not None:
        why = "softmax backward over a padded dim: pad set to 0"
        self.mask_padded(node, grad, 0.0, why, unless=(Pad.ZERO,))
        if node.target.overloadpacket is aten._softmax_backward_data:
            self.mask_padded(node, output, 0.0, why, unless=(Pad.ZERO,))
    return self.like(node, grad)


def _key_padding_mask(self: _Analysis, node: fx.Node, key: fx.Node, attn_mask, query_dtype) -> fx.Node:
    """attn_mask with -inf (or False) at the padded keys."""
    with self.graph.inserting_before(node):
        key_pad = self.pad_mask(key, -2)  # [.., S, 1]
        rank = len(_exprs(key))
        last = self.graph.call_function(aten.transpose.int, (key_pad, rank - 2, rank - 1))  # [.., 1, S]
        if attn_mask is None:
            neg = self.graph.call_function(aten.scalar_tensor.default, (-math.inf,), {"dtype": query_dtype})
            zero = self.graph.call_function(aten.scalar_tensor.default, (0.0,), {"dtype": query_dtype})
            return self.graph.call_function(aten.where.self, (last, neg, zero))
        if _dtype(attn_mask) == torch.bool:
            keep = self.graph.call_function(aten.logical_not.default, (last,))
            return self.graph.call_function(aten.logical_and.default, (attn_mask, keep))
        return self.graph.call_function(aten.masked_fill.Scalar, (attn_mask, last, -math.inf))


def _set_arg(node: fx.Node, index: int, name: str, value) -> None:
    if len(node.args) > index:
        args = list(node.args)
        args[index] = value
        node.args = tuple(args)
    else:
        node.kwargs = {**node.kwargs, name: value}


@_rule(aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_efficient_attention,
       aten.scaled_dot_product_attention, aten._scaled_dot_product_flash_attention)  # fmt: skip
def _attention(self: _Analysis, node: fx.Node):
    args = self.kwargs(node)
    query, key, value = args["query"], args["key"], args["value"]
    mask_name = "attn_bias" if "attn_bias" in args else "attn_mask"
    attn_mask, causal = args.get(mask_name), bool(args.get("is_causal", False))
    if args.get("dropout_p", 0.0) and self._touches_padding(node):
        self.refuse(node, "attention dropout on padded shapes")
    key_dims, query_dims = self.dims(key), self.dims(query)
    _refuse_padded_head_dim(self, node, query_dims, key_dims)
    keys_padded = key_dims[-2] is not None
    if keys_padded:
        why = "attention over padded keys: padded keys/values zeroed"
        self.mask_padded(node, key, 0.0, why, unless=SAFE_IN_PRODUCTS)
        self.mask_padded(node, value, 0.0, why, unless=SAFE_IN_PRODUCTS)
        same_length = query_dims[-2] is not None and sympy.expand(query_dims[-2].expr - key_dims[-2].expr) == 0
        if not (causal and same_length and attn_mask is None):
            if causal:
                self.refuse(node, "causal attention with padded keys of a different length than the queries")
            new_mask = _key_padding_mask(self, node, key, attn_mask, _dtype(query))
            index = [a.name for a in node.target._schema.arguments].index(mask_name)
            _set_arg(node, index, mask_name, new_mask)
            self.masks.append(f"{node.name}: padded keys masked with -inf")
    return self._unpadded_outputs(node)


def _refuse_padded_head_dim(self: _Analysis, node: fx.Node, query_dims, key_dims) -> None:
    """The default scale 1/sqrt(head dim) would be taken at the bucket's head dim, not the real one."""
    if (query_dims and query_dims[-1] is not None) or (key_dims and key_dims[-1] is not None):
        self.refuse(node, "attention over a padded head dim (its scale depends on the real size)")


@_rule(aten._scaled_dot_product_flash_attention_for_cpu_backward)
def _attention_backward(self: _Analysis, node: fx.Node):
    args = self.kwargs(node)
    if not self._touches_padding(node):
        return self._unpadded_outputs(node)
    if args.get("dropout_p", 0.0):
        self.refuse(node, "attention dropout on padded shapes")
    why = "attention backward: padded rows zeroed"
    query, key = args["query"], args["key"]
    for name in ("grad_out", "query", "out", "key", "value"):
        self.mask_padded(node, args[name], 0.0, why, unless=(Pad.ZERO,))
    self.mask_padded(node, args["logsumexp"], 0.0, why, unless=(Pad.ZERO,))
    key_dims, query_dims = self.dims(key), self.dims(query)
    _refuse_padded_head_dim(self, node, query_dims, key_dims)
    if key_dims[-2] is not None:
        same_length = query_dims[-2] is not None and sympy.expand(query_dims[-2].expr - key_dims[-2].expr) == 0
        attn_mask = args.get("attn_mask")
        if not (args["is_causal"] and same_length and attn_mask is None):
            if args["is_causal"]:
                self.refuse(node, "causal attention with padded keys of a different length than the queries")
            new_mask = _key_padding_mask(self, node, node.args[2] if len(node.args) > 2 else key, attn_mask,
                                         _dtype(query))
            _set_arg(node, 8, "attn_mask", new_mask)
            self.masks.append(f"{node.name}: padded keys masked with -inf")
    return self._unpadded_outputs(node)


# ---- normalisation, convolution, embedding, indexing, losses -------------------------------------------------------


@_rule(aten.native_layer_norm)
def _layer_norm(self: _Analysis, node: fx.Node):
    normalized = len(node.args[1])
    self.independent(node, node.args[0], list(range(-normalized, 0)), "layer norm")
    return self.like(node, node.args[0])


@_rule(aten.native_layer_norm_backward)
def _layer_norm_backward(self: _Analysis, node: fx.Node):
    normalized = len(node.args[2])
    self.independent(node, node.args[1], list(range(-normalized, 0)), "layer norm")
    why = "layer-norm backward sums over padded rows: operands zeroed"
    for index in (0, 1, 3, 4):
        self.mask_padded(node, node.args[index], 0.0, why, unless=(Pad.ZERO,))
    return self.like(node, node.args[1])


@_rule(aten._native_batch_norm_legit_no_training)
def _batch_norm_eval(self: _Analysis, node: fx.Node):
    return self.independent(node, node.args[0], [1], "batch norm")


@_rule(aten.convolution)
def _convolution(self: _Analysis, node: fx.Node):
    rank = len(_exprs(node.args[0]))
    return self.independent(node, node.args[0], list(range(1, rank)), "convolution")


def _in_range_padding(self: _Analysis, node: fx.Node, index) -> None:
    """Indices into an unpadded dim: their pad must hold a valid index. Padded ids are 0, but `arange(s)` position
    ids hold s..bucket-1 in their pad, beyond a table smaller than the bucket: set to 0."""
    if isinstance(index, fx.Node):
        self.mask_padded(node, index, 0, "padded indices into an unpadded dim set to 0 (in range)",
                         unless=(Pad.ZERO,))


@_rule(aten.embedding)
def _embedding(self: _Analysis, node: fx.Node):
    weight = self.tensor(node.args[0])
    if weight is not None and weight.padded:
        self.refuse(node, "embedding table with a padded dim")
    _in_range_padding(self, node, node.args[1])
    return self.out(node)


@_rule(aten.embedding_dense_backward)
def _embedding_backward(self: _Analysis, node: fx.Node):
    if len(node.args) > 4 and node.args[4] and self._touches_padding(node):
        self.refuse(node, "scale_grad_by_freq counts padded indices")
    self.mask_padded(node, node.args[0], 0.0, "embedding backward: padded gradient rows zeroed", unless=(Pad.ZERO,))
    return self.out(node)


def _check_index_bound(self: _Analysis, node: fx.Node, source_dim: DimPad | None, index) -> None:
    if source_dim is None:
        return
    state = self.tensor(index)
    bound = state.bound if state is not None else None
    if bound is None or sympy.expand(bound - source_dim.expr) != 0:
        self.refuse(node, "indexing along a padded dim with indices that may point into the padding")


@_rule(aten.index)
def _index(self: _Analysis, node: fx.Node):
    source_dims = self.dims(node.args[0])
    for d, index in enumerate(node.args[1]):
        if index is not None:
            _check_index_bound(self, node, source_dims[d], index)
            if source_dims[d] is None:
                _in_range_padding(self, node, index)
    return self.out(node)


@_rule(aten.index_select, aten.gather)
def _index_select(self: _Analysis, node: fx.Node):
    source_dims = self.dims(node.args[0])
    dim = node.args[1] % len(source_dims) if source_dims else 0
    if source_dims:
        _check_index_bound(self, node, source_dims[dim], node.args[2])
    if not source_dims or source_dims[dim] is None:
        _in_range_padding(self, node, node.args[2])
    return self.out(node)


@_rule(aten.nll_loss_forward, aten.nll_loss_backward)
def _nll_loss(self: _Analysis, node: fx.Node):
    backward = node.target.overloadpacket is aten.nll_loss_backward
    target = node.args[2] if backward else node.args[1]
    ignore_index = node.args[5] if backward else node.args[4]
    self.mask_padded(node, target, ignore_index, "loss: padded targets set to ignore_index")
    self_dims = self.dims(node.args[1] if backward else node.args[0])
    if self_dims and len(self_dims) > 1 and any(d is not None for d in self_dims[1:]):
        self.refuse(node, "a loss over a padded class dim")
    target_dims = self.dims(target)
    if backward:
        return self.shaped(_exprs(node), [target_dims[0] if target_dims else None, None], Pad.ZERO)
    return tuple(self._like_value(v, target_dims, Pad.ZERO) for v in node.meta["val"])


@_rule(aten.scatter, aten.scatter_add, aten.scatter_reduce, aten.slice_scatter, aten.select_scatter, aten.index_add,
       aten.index_copy, aten.index_fill)  # fmt: skip
def _scatter(self: _Analysis, node: fx.Node):
    """Writes along one dim: independent along every other dim, so only the written dim must be unpadded."""
    state = self.tensor(node.args[0])
    args = self.kwargs(node)
    dims = state.dims if state else ()
    dim = args.get("dim", 0) % len(dims) if dims else 0
    if dims and dims[dim] is not None:
        if node.target.overloadpacket is aten.slice_scatter:
            return _slice_scatter_padded(self, node, args, dim)
        self.refuse(node, "writes along a padded dim (e.g. into a KV cache); redirecting such writes is not supported")
    for name in ("src", "index", "source"):
        other = args.get(name)
        other_dims = self.dims(other) if isinstance(other, fx.Node) else ()
        if len(other_dims) == len(dims) and any(
            o is not None and (dims[d] is None or d == dim) for d, o in enumerate(other_dims)
        ):
            self.refuse(node, f"its {name} is padded along a dim the destination is not")
    return self.like(node, node.args[0])


@_rule(aten.index_put, aten._unsafe_index_put)
def _index_put(self: _Analysis, node: fx.Node):
    """Accumulating writes (embedding backward): padded positions add zero once their values are masked."""
    args = self.kwargs(node)
    if not self._touches_padding(node):
        return self.like(node, node.args[0])
    destination = self.tensor(node.args[0])
    if destination is not None and destination.padded:
        self.refuse(node, "writes into a padded buffer at data-dependent positions")
    if not args.get("accumulate", False):
        self.refuse(node, "writes at padded positions would overwrite real entries of the buffer (e.g. a KV cache); "
                          "redirecting such writes is not supported")
    _check_write_layouts(self, node, list(args["indices"]), args["values"], len(_exprs(node.args[0])))
    for index in args["indices"]:
        _in_range_padding(self, node, index)
    self.mask_padded(node, args["values"], 0.0, "accumulating write: padded values zeroed", unless=(Pad.ZERO,))
    return self.like(node, node.args[0])


def _check_write_layouts(self: _Analysis, node: fx.Node, indices: list, values, dest_rank: int) -> None:
    """Zeroing the values' pad cancels exactly the writes of padded index positions only if, along every padded dim
    of the indices, the values are padded the same way (not broadcast, not merged differently)."""
    if any(index is None for index in indices):
        self.refuse(node, "an indexed write with a skipped (None) dim touching padding")
    index_rank = max(len(_exprs(index)) for index in indices)
    value_dims = self.dims(values) if isinstance(values, fx.Node) else ()
    full_rank = index_rank + dest_rank - len(indices)
    for d in range(index_rank):
        layouts = set()
        for index in indices:
            dims = self.dims(index)
            aligned = d - (index_rank - len(dims))
            if aligned >= 0 and dims[aligned] is not None:
                layouts.add(dims[aligned].parts)
        if not layouts:
            continue
        v = d + len(value_dims) - full_rank
        if len(layouts) > 1 or v < 0 or value_dims[v] is None or value_dims[v].parts != layouts.pop():
            self.refuse(node, "an accumulating write whose values are broadcast over, or lay out differently, a "
                              "padded dim of its indices")


def _slice_scatter_padded(self: _Analysis, node: fx.Node, args: dict, dim: int):
    """slice_scatter(self, src, dim, start) along a padded dim: behind the real end of `src` the unpadded result holds
    `self`, the bucketed one holds `src`'s padding; put `self` back there."""
    start = _const_int(self, node, args.get("start"), "the slice_scatter start") or 0
    step = _const_int(self, node, args.get("step", 1), "the slice_scatter step")
    if start < 0 or step != 1:
        self.refuse(node, "a slice_scatter counted from the end, or strided, along a padded dim")
    src_dims = self.dims(args["src"])
    if src_dims[dim] is None or not src_dims[dim].is_tail:
        self.refuse(node, "slice_scatter of an unpadded source along a padded dim")
    users = list(node.users)
    with self.graph.inserting_before(node.next):
        behind = self.pad_mask(node, dim, src_dims[dim].expr + start)
        fixed = self.graph.call_function(aten.where.self, (behind, node.args[0], node))
    fixed.meta["val"] = node.meta.get("val")
    for user in users:
        user.replace_input_with(node, fixed)
    self.masks.append(f"{node.name}: slice_scatter keeps the destination behind the real end of the source")
    self.state[fixed] = self.like(node, node.args[0], Pad.UNKNOWN)
    return self.state[fixed]


# ---- creation --------------------------------------------------------------------------------------------------------


@_rule(aten.full, aten.zeros, aten.ones, aten.new_full, aten.new_zeros, aten.new_ones, aten.full_like, aten.zeros_like,
       aten.ones_like, aten.scalar_tensor, aten.empty, aten.new_empty, aten.empty_like, aten.empty_strided,
       aten.new_empty_strided, aten.fill)  # fmt: skip
def _creation(self: _Analysis, node: fx.Node):
    packet = node.target.overloadpacket
    if packet in (aten.empty, aten.new_empty, aten.empty_like, aten.empty_strided, aten.new_empty_strided):
        return self.out(node, Pad.UNKNOWN)
    if packet in (aten.zeros, aten.new_zeros, aten.zeros_like):
        return self.out(node, Pad.ZERO)
    if packet in (aten.ones, aten.new_ones, aten.ones_like):
        return self.out(node, Pad.FINITE)
    args = self.kwargs(node)
    fill = args.get("fill_value", args.get("value", args.get("s")))
    kind = _classify_scalar(fill) if isinstance(fill, (int, float, bool)) else Pad.UNKNOWN
    return self.out(node, kind)


@_rule(aten.arange)
def _arange(self: _Analysis, node: fx.Node):
    args = self.kwargs(node)
    start = _const_int(self, node, args.get("start", 0), "the arange start")
    step = _const_int(self, node, args.get("step", 1), "the arange step")
    dst = _exprs(node)
    bound = dst[0] if start == 0 and step == 1 and self.is_padded(dst[0]) else None
    return self.out(node, Pad.FINITE, bound)


# Rules that follow a merged padded dim (padding interleaved with real data) through their outputs; every other
# rule refuses one, because its slicing/indexing reasoning assumes the pad region is a tail.
_MERGE_AWARE = {
    _elementwise_untagged, _scatter, _index_put, _view, _permute, _expand, _matmul, _reduction, _scan, _sort, _softmax,
    _softmax_backward, _layer_norm, _layer_norm_backward, _nll_loss,
}  # fmt: skip
