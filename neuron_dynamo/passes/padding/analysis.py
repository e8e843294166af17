"""The padding proof's engine: the dataflow walk over the graph, the masks it inserts, element-wise ops."""

from __future__ import annotations

import copy
import dataclasses
import logging
import operator
from collections.abc import Sequence

import sympy
import torch
import torch.fx as fx
from torch.fx.operator_schemas import normalize_function

from neuron_dynamo.passes.padding.state import (
    _BOUNDED,
    _BOUNDED_COMPLEX,
    _CASTS,
    _EXACT,
    _IDENTITY_BOUND,
    _INT_TYPE,
    _MERGE_AWARE,
    _RULES,
    _SYM_ASSERTS,
    SAFE_IN_PRODUCTS,
    DimPad,
    Pad,
    PaddingProof,
    PaddingRefused,
    SymValue,
    TensorPad,
    _classify,
    _classify_scalar,
    _dtype,
    _exprs,
    _fill_for,
    _op_name,
    _set_arg,
    _tensor_overload,
    graph_outputs,
    rule,
    shape_exprs,
)

log = logging.getLogger("neuron_dynamo.passes.padding")
aten = torch.ops.aten


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
    analysis = Analysis(fx.GraphModule(gm, copy.deepcopy(gm.graph)), symbols, merged_inputs)
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
        input_factors=analysis.input_factors, limits=analysis.limits,
    )


def merged_factors(expr: sympy.Expr, symbols: Sequence[sympy.Symbol]) -> tuple[sympy.Expr, ...] | None:
    """The factors of a product size `2*s` or `s**2` (constants outermost, then symbols in `symbols` order), or
    None."""
    expr = sympy.sympify(expr)
    if not isinstance(expr, (sympy.Mul, sympy.Pow)) or not expr.free_symbols & set(symbols):
        return None
    args = []
    for arg in expr.args if isinstance(expr, sympy.Mul) else (expr,):  # s**2: the factors s, s
        args += [arg.base] * int(arg.exp) if arg.is_Pow and arg.exp.is_Integer and arg.exp > 0 else [arg]
    if not all(arg.is_Integer or arg.is_Symbol for arg in args):
        return None
    order = {symbol: i for i, symbol in enumerate(symbols)}
    return tuple(sorted(args, key=lambda arg: (not arg.is_Integer, order.get(arg, len(order)), str(arg))))


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


# Creation ops whose fill value may be a size (`full((n,), x.shape[1])`): the argument that carries it.
_FILLS = {"aten.full": ("fill_value",), "aten.full_like": ("fill_value",), "aten.new_full": ("fill_value",),
          "aten.scalar_tensor": ("s",), "aten.fill": ("value",)}


class Analysis:
    def __init__(self, gm: fx.GraphModule, symbols: tuple[sympy.Symbol, ...], merged_inputs: bool = False) -> None:
        self.gm = gm
        # merged input layouts (`2*s` padded as [2, s]): the symbols' nesting order, walked over the inputs once
        self.merged_order = _outer_first(gm, symbols) if merged_inputs else None
        self.input_factors: list = []
        self.limits: dict[sympy.Symbol, int] = {}  # the largest bucket of a symbol (a buffer sliced by it)
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
            filled = self._check_size_as_data(node)
            self.state[node] = self._call(node)
            if filled is not None:  # the creation now fills 0 and `filled` adds the real size: finite, everywhere
                state = self.tensor(node)
                self.state[filled] = TensorPad(tuple(
                    dataclasses.replace(d, kind=Pad.FINITE) if d is not None else None for d in state.dims
                ), None) if state is not None else None
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
        if self.merged_order is not None:
            state = TensorPad(tuple(dataclasses.replace(d, parts=merged_factors(d.expr, self.merged_order))
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
        exprs = shape_exprs(value)
        return self.shaped(exprs, mapped if len(exprs) == len(mapped) else (), kind)

    def _unpadded_outputs(self, node: fx.Node):
        value = node.meta.get("val")
        if isinstance(value, (tuple, list)):
            return tuple(self._fresh_from_value(v, Pad.UNKNOWN) for v in value)
        return self._fresh_from_value(value, Pad.UNKNOWN)

    def _fresh_from_value(self, value, kind: Pad):
        if not isinstance(value, torch.Tensor):
            return None
        exprs = shape_exprs(value)
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

    def limit_size(self, node: fx.Node, expr: sympy.Expr, limit: int) -> None:
        """`expr` (a bucketed size) must not exceed `limit` at the bucket: a slice of a `limit`-long buffer would be
        cut short. Recorded per symbol when `expr` is `symbol + constant` (other forms: a bucket too large for the
        buffer fails to trace, and that bucket runs exact)."""
        symbols = expr.free_symbols & self.symbol_set
        offset = expr - next(iter(symbols)) if len(symbols) == 1 else None
        if offset is None or not sympy.sympify(offset).is_Integer:
            return
        symbol = next(iter(symbols))
        self.limits[symbol] = min(self.limits.get(symbol, limit - int(offset)), limit - int(offset))

    def refuse(self, node: fx.Node, why: str):
        raise PaddingRefused(f"{_op_name(node.target)} ({node.name}): {why}")

    def _check_size_as_data(self, node: fx.Node) -> fx.Node | None:
        """A bucketed size flowing into a non-size argument would see the bucket value: a pointwise op gets the real
        size as a 0-d tensor instead, a creation op fills 0 and the real size is added after it (the node doing so
        is returned); anywhere else the graph is refused."""
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or _op_name(target) in _SYM_ASSERTS:
            return None
        if target.overloadpacket is aten.arange:
            return None  # its own rule checks that only `end` depends on a bucketed size
        filled = None
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
                is_number = isinstance(item.meta.get("val"), (torch.SymInt, torch.SymFloat))
                if tensor_overload is not None and is_number:
                    # Redirect: the op gets the real size as a 0-d tensor, exactly what eager computes with.
                    node.target = tensor_overload
                    _set_arg(node, position, argument.name, self.real(state.expr))
                    self.masks.append(f"{node.name}: the size {state.expr} used as data reads the real size")
                    continue
                if is_number and filled is None and _op_name(target) in _FILLS and argument.name in _FILLS[
                        _op_name(target)] and _dtype(node) not in (None, torch.bool):
                    _set_arg(node, position, argument.name, 0)
                    filled = self._add_after(node, self.real(state.expr))
                    self.masks.append(f"{node.name}: filled with the real size {state.expr}")
                    continue
                self.refuse(node, f"the dynamic size {state.expr} is used as data (argument {argument.name!r}); "
                                  "a bucketed program would see the bucket size, not the real one")
        return filled

    def _add_after(self, node: fx.Node, value: fx.Node) -> fx.Node:
        """`node + value` in place of `node` for every user of `node`."""
        users = list(node.users)
        with self.graph.inserting_after(node):
            added = self.graph.call_function(aten.add.Tensor, (node, value))
        added.meta["val"] = node.meta.get("val")
        for user in users:
            user.replace_input_with(node, added)
        return added

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
            elif expr.is_Symbol and expr not in self.symbol_set:  # a size not padded: its value is the real one
                node = self.graph.call_function(aten.scalar_tensor.default, (self.sym(expr),), {"dtype": torch.int64})
            elif expr.is_Number:  # a float or rational constant of a float size expression
                node = self.graph.call_function(aten.scalar_tensor.default, (float(expr),), {"dtype": torch.float64})
            elif type(expr).__name__ in ("ToFloat", "TruncToFloat") or (
                    type(expr).__name__ == "Identity" and len(expr.args) == 1):
                node = self._as_double(self.real(expr.args[0]))
            elif type(expr).__name__ in ("IntTrueDiv", "FloatTrueDiv"):
                operands = tuple(self._as_double(self.real(a)) for a in expr.args)
                node = self.graph.call_function(aten.div.Tensor, operands)
            elif type(expr).__name__ in ("FloatPow", "PowByNatural") or isinstance(expr, sympy.Pow):
                node = self.graph.call_function(aten.pow.Tensor_Tensor,
                                                tuple(self._as_double(self.real(a)) for a in expr.args))
            else:
                raise PaddingRefused(f"cannot compute the real value of size expression {expr}")
        self._real_nodes[expr] = node
        return node

    def _as_double(self, node: fx.Node) -> fx.Node:
        """A real-size node as float64 (Python's float, what eager computes size arithmetic in)."""
        return self.graph.call_function(aten._to_copy.default, (node,), {"dtype": torch.float64})

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
        if dtype is not None and (dtype == torch.bool or not (dtype.is_floating_point or dtype.is_complex)):
            return Pad.FINITE
        values = list(kinds.values())
        if name == "aten.mul" and Pad.ZERO in values and all(k in SAFE_IN_PRODUCTS for k in values):
            return Pad.ZERO
        if name in _CASTS and dtype in _KIND_KEEPING_CASTS:
            return values[0] if values and values[0] is not None else Pad.UNKNOWN
        complex_involved = any(_dtype(a) is not None and _dtype(a).is_complex for a in (node, *kinds))
        bounded = _BOUNDED_COMPLEX if complex_involved else _BOUNDED
        if name in bounded and values and all(k in SAFE_IN_PRODUCTS for k in values):
            return Pad.FINITE
        return Pad.UNKNOWN

    def independent(self, node: fx.Node, source, mixing_dims: Sequence[int], what: str):
        """Ops that act independently along every dim but `mixing_dims` of `source`: refuse if one is padded."""
        dims = self.dims(source)
        for d in mixing_dims:
            if dims and dims[d % len(dims)] is not None:
                self.refuse(node, f"{what} mixes positions along padded dim {d}")
        return self._unpadded_outputs(node)


# Casts to these keep the pad kind (a complex kind is `kind + 0j`: real <-> complex casts keep it too).
_KIND_KEEPING_CASTS = (torch.float32, torch.float64, torch.bfloat16, torch.complex64, torch.complex128)
_INTEGER_DIVISIONS = ("aten.div", "aten.floor_divide", "aten.remainder", "aten.fmod")


def _is_float(node: fx.Node) -> bool:
    dtype = _dtype(node)
    return dtype is not None and (dtype.is_floating_point or dtype.is_complex)


@rule(aten._to_copy, aten.clone, aten.alias, aten.detach, aten.lift_fresh_copy, aten.contiguous, aten.to,
       aten.copy, merge_aware=True)  # fmt: skip
def _elementwise_untagged(self: Analysis, node: fx.Node):
    """Casts and copies: element-wise, though not tagged pointwise."""
    return self._elementwise(node)
