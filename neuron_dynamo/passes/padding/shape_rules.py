"""Padding rules of the shape family: views, permutes, expands, slices, cat/stack/split, constant padding."""

from __future__ import annotations

import sympy
import torch
import torch.fx as fx

from neuron_dynamo.passes.padding.analysis import Analysis
from neuron_dynamo.passes.padding.state import (
    DimPad,
    Pad,
    SymValue,
    TensorPad,
    _classify_scalar,
    _exprs,
    rule,
    shape_exprs,
)

aten = torch.ops.aten




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


def _split_tail(self: Analysis, padded: DimPad) -> tuple[sympy.Expr, ...]:
    """A tail-padded product `2*s` (a merge of [s, 2] whose only padded factor is outermost) as its factors, the padded
    one first: its real region `[0, 2*s(real))` is that of [s, 2], so it may be viewed back as [..., s, 2, ...]
    (`x @ w` of a [b, s, 2, 8] input). With more than one padded factor it stays whole."""
    if not padded.is_tail or not isinstance(padded.expr, sympy.Mul):
        return padded.factors
    inner = [f for f in padded.expr.args if not self.is_padded(f)]
    outer = [f for f in padded.expr.args if self.is_padded(f)]
    return tuple(outer + inner) if len(outer) == 1 else padded.factors


@rule(aten.view, aten._unsafe_view, aten.reshape, aten.view_copy, aten.squeeze, aten.unsqueeze, aten.flatten,
       aten.unflatten, aten._reshape_alias, aten.squeeze_copy, aten.unsqueeze_copy, merge_aware=True)  # fmt: skip
def _view(self: Analysis, node: fx.Node):
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
            factors.extend(_split_tail(self, padded) if padded is not None else (src[i],))
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


@rule(aten.permute, aten.transpose, aten.t, aten.permute_copy, aten.transpose_copy, aten.t_copy, merge_aware=True)
def _permute(self: Analysis, node: fx.Node):
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


@rule(aten.expand, aten.expand_copy, merge_aware=True)
def _expand(self: Analysis, node: fx.Node):
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


@rule(aten.repeat)
def _repeat(self: Analysis, node: fx.Node):
    """Tiling. A padded dim repeated once keeps its padding; an unpadded dim tiled a dynamic number of times
    (`mask.view(b, 1, 1, n).repeat(1, 1, n, 1)`) fills the pad with copies of real data, as expand does. A padded
    dim tiled more than once would interleave padding with real data: refused."""
    state = self.tensor(node.args[0])
    src, dst = _exprs(node.args[0]), _exprs(node)
    src_dims = state.dims if state else tuple(None for _ in src)
    offset = len(dst) - len(src)
    out = []
    for d, expr in enumerate(dst):
        padded = src_dims[d - offset] if d >= offset else None
        if padded is not None and sympy.expand(expr - src[d - offset]) != 0:
            self.refuse(node, "tiling a padded dim would interleave padding with real data")
        out.append(padded if padded is not None else DimPad(expr, Pad.UNKNOWN) if self.is_padded(expr) else None)
    return TensorPad(tuple(out), state.bound if state else None)


def _const_int(self: Analysis, node: fx.Node, value, what: str) -> int | None:
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


@rule(aten.slice, aten.narrow, aten.slice_copy)
def _slice(self: Analysis, node: fx.Node):
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
    begin = _sized_start(self, start, src[dim], dst[dim]) if not padded_src or out[dim].is_tail else None
    if begin is not None and _const_int(self, node, step, "the slice step") == 1:
        if not begin.is_Integer:
            return _read_at_real(self, node, state, dim, begin)
        start = int(begin)  # `x[-n:]` of n + c elements starts at c, at any sizes
    start = _const_int(self, node, start, "the slice start")  # a position computed from a size: refused
    if padded_src or self.is_padded(dst[dim]):
        start = _const_int(self, node, start, "the slice start") or 0
        step = _const_int(self, node, step, "the slice step")
        if start < 0 and padded_src and step == 1 and out[dim].is_tail and dst[dim] == -start:
            return _read_at_real(self, node, state, dim, src[dim] + start)
        if start < 0:
            self.refuse(node, "a slice counted from the end of a padded dim would read padding")
        if step != 1 and start != 0:
            self.refuse(node, "a strided slice with an offset along a padded dim")
    if self.is_padded(dst[dim]):
        exact_tail = padded_src and sympy.expand(src[dim] - start - dst[dim]) == 0
        kind = out[dim].kind if exact_tail and step == 1 else Pad.UNKNOWN
        out[dim] = DimPad(dst[dim], kind)
        if not self.is_padded(src[dim]) and src[dim].is_Integer and step == 1:
            self.limit_size(node, dst[dim], int(src[dim]) - start)  # `buffer[:, :s]`: s may not pass the buffer
    else:
        out[dim] = None
    return TensorPad(tuple(out), state.bound if state else None)


def _sized_start(self: Analysis, start, size: sympy.Expr, length: sympy.Expr) -> sympy.Expr | None:
    """Where a slice to the end of a dim of `size` elements begins when its start is computed from the dynamic
    sizes: `x[n:]` at n, `x[-n:]` at `size - n` (`length`, the sliced size, says which way the traced slice went)."""
    state = self.state.get(start) if isinstance(start, fx.Node) else None
    if not isinstance(state, SymValue) or not state.bucketed:
        return None
    if self.is_padded(length) and not _grows(length):  # `buffer[n:]`: a bucket's n would read fewer elements
        return None
    if sympy.expand(length - size + state.expr) == 0:
        return state.expr
    if sympy.expand(length + state.expr) == 0:
        return sympy.expand(size + state.expr)
    return None


def _grows(expr: sympy.Expr) -> bool:
    """Whether a size expression never decreases as its symbols grow, by its form: symbols and non-negative
    integers under sums, products, powers and floor divisions by a positive integer (`n // 2` grows; `100 - n` and
    `n - n // 2`, which does, are not recognised)."""
    if expr.is_Symbol or (expr.is_Integer and expr >= 0):
        return True
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        return all(_grows(arg) for arg in expr.args)
    if isinstance(expr, sympy.Pow):
        return _grows(expr.base) and expr.exp.is_Integer and expr.exp > 0
    if type(expr).__name__ == "FloorDiv":
        return _grows(expr.args[0]) and expr.args[1].is_Integer and expr.args[1] > 0
    return False


def _read_at_real(self: Analysis, node: fx.Node, state: TensorPad | None, dim: int, begin: sympy.Expr) -> TensorPad:
    """A slice to the end of a tail-padded (or unpadded) dim, read where it begins at the real sizes: the last
    position's logits `x[:, -1:]`, the text after n image tokens `x[:, n:]`, the last n rows of a table `t[-n:]`.
    A gather at `real(begin) + arange(count)`; a dynamic count is clamped into the dim (its pad then holds real
    data), and the result is padded along `dim` as the count is."""
    size, count = _exprs(node.args[0])[dim], _exprs(node)[dim]
    sized = self.is_padded(count)
    users = list(node.users)
    with self.graph.inserting_before(node.next):
        positions = self.graph.call_function(aten.arange.default, (self.sym(count),),
                                             {"device": node.meta["val"].device})
        index = self.graph.call_function(aten.add.Tensor, (positions, self.real(begin)))
        if sized:
            index = self.graph.call_function(aten.clamp.default, (index, None, self.sym(size - 1)))
        read = self.graph.call_function(aten.index_select.default, (node.args[0], dim, index))
    read.meta["val"] = node.meta["val"]
    for user in users:
        user.replace_input_with(node, read)
    dims = state.dims if state else tuple(None for _ in _exprs(node))
    result = TensorPad(dims[:dim] + (DimPad(count, Pad.UNKNOWN) if sized else None,) + dims[dim + 1:],
                       state.bound if state else None)
    self.state[read] = result
    self.masks.append(f"{node.name}: {count} position(s) from {begin} read at the real sizes")
    return result


@rule(aten.select, aten.select_copy)
def _select(self: Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    index = _const_int(self, node, node.args[2], "the selected index")  # `table[x.shape[1] - 1]`: refused
    if state is None:
        return self.out(node)
    dim = node.args[1] % len(state.dims)
    if state.dims[dim] is not None:
        if index is None or index < 0:
            self.refuse(node, "selecting a position counted from the end of a padded dim would read padding")
    return TensorPad(state.dims[:dim] + state.dims[dim + 1:], state.bound)


@rule(aten.cat)
def _cat(self: Analysis, node: fx.Node):
    tensors = [t for t in node.args[0] if _exprs(t) is not None and len(_exprs(t)) == len(_exprs(node))]
    dst = _exprs(node)
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % len(dst)
    out = []
    compact = False
    for d, expr in enumerate(dst):
        if d == dim:
            if not self.is_padded(expr):
                out.append(None)
                continue
            padded = [t for t in tensors if self.is_padded(_exprs(t)[d])]
            if padded == tensors[-1:]:
                out.append(DimPad(expr, self.dims(tensors[-1])[d].kind))
                continue
            if len(padded) != 1 or self.dims(padded[0])[d] is None or not self.dims(padded[0])[d].is_tail:
                self.refuse(node, "concatenation along a padded dim leaves padding between real data")
            out.append(DimPad(expr, Pad.UNKNOWN))
            compact = True
        elif self.is_padded(expr):
            kinds = {self.dims(t)[d].kind if self.dims(t)[d] else Pad.UNKNOWN for t in tensors}
            out.append(DimPad(expr, kinds.pop() if len(kinds) == 1 else Pad.UNKNOWN))
        else:
            out.append(None)
    bounds = {self.tensor(t).bound if self.tensor(t) else None for t in tensors}
    state = TensorPad(tuple(out), bounds.pop() if len(bounds) == 1 and dim != len(dst) else None)
    if compact:
        self.state[_compact_cat(self, node, tensors, dim)] = state
    return state


def _compact_cat(self: Analysis, node: fx.Node, tensors: list[fx.Node], dim: int) -> fx.Node:
    """A padded operand followed by unpadded ones (a KV cache and the new token's keys): the later operands are
    moved up to the padded operand's real end, so the result's padding is its tail again. Its users read the gather
    `cat[index]`, index = i below the real end, i + (bucket - real) from there (clamped: the pad holds real data)."""
    position = next(k for k, t in enumerate(tensors) if self.is_padded(_exprs(t)[dim]))
    before = sum((_exprs(t)[dim] for t in tensors[:position]), sympy.Integer(0))
    return _move_up(self, node, dim, before + _exprs(tensors[position])[dim], _exprs(tensors[position])[dim],
                    "the operands after the padded one moved up to its real end")


def _move_up(self: Analysis, node: fx.Node, dim: int, end: sympy.Expr, padded: sympy.Expr, why: str) -> fx.Node:
    """`node`'s positions from `end` on moved up by `padded`'s padding (its bucket minus real size): the gather
    `node[index]` that its users read instead (clamped: the pad then holds real data)."""
    size = _exprs(node)[dim]
    users = list(node.users)
    with self.graph.inserting_before(node.next):
        positions = self.graph.call_function(aten.arange.default, (self.sym(size),),
                                             {"device": node.meta["val"].device})
        beyond = self.graph.call_function(aten.ge.Tensor, (positions, self.real(end)))
        gap = self.graph.call_function(aten.rsub.Scalar, (self.real(padded), self.sym(padded)))
        shift = self.graph.call_function(aten.mul.Tensor, (beyond, gap))
        index = self.graph.call_function(aten.add.Tensor, (positions, shift))
        index = self.graph.call_function(aten.clamp.default, (index, None, self.sym(size - 1)))
        compacted = self.graph.call_function(aten.index_select.default, (node, dim, index))
    compacted.meta["val"] = node.meta["val"]
    for user in users:
        user.replace_input_with(node, compacted)
    self.masks.append(f"{node.name}: {why}")
    return compacted


@rule(aten.stack)
def _stack(self: Analysis, node: fx.Node):
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


@rule(aten.split, aten.split_with_sizes, aten.unbind, aten.chunk, aten.tensor_split)
def _split(self: Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    if state is None:
        return self._unpadded_outputs(node)
    args = self.kwargs(node)
    dim = args.get("dim", 0) % len(state.dims)
    if state.dims[dim] is not None:
        return _split_padded_tail(self, node, state, dim)
    if node.target.overloadpacket is aten.unbind:
        kept = state.dims[:dim] + state.dims[dim + 1:]
        return tuple(TensorPad(kept, state.bound) for _ in node.meta["val"])
    return tuple(TensorPad(state.dims, state.bound) for _ in node.meta["val"])


def _split_padded_tail(self: Analysis, node: fx.Node, state: TensorPad, dim: int):
    """split_with_sizes along a padded dim whose pad is its tail: safe when only the last piece's size is padded
    (`cat([text, image]).split([text_len, image_len])`): the other pieces are real data, the last keeps the tail."""
    pieces = [shape_exprs(value) for value in node.meta["val"]]
    if (node.target.overloadpacket is not aten.split_with_sizes or not state.dims[dim].is_tail
            or any(self.is_padded(shape[dim]) for shape in pieces[:-1])):
        self.refuse(node, "splitting along a padded dim would put padding inside the first pieces")
    head = state.dims[:dim] + (None,) + state.dims[dim + 1:]
    tail = state.dims[:dim] + (DimPad(pieces[-1][dim], state.dims[dim].kind),) + state.dims[dim + 1:]
    return tuple([TensorPad(head, state.bound)] * (len(pieces) - 1) + [TensorPad(tail, state.bound)])


@rule(aten.constant_pad_nd)
def _constant_pad(self: Analysis, node: fx.Node):
    source = node.args[0]
    state = self.tensor(source)
    pads = list(node.args[1])
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
    src = _exprs(source)
    rank = len(src)
    out = list(state.dims) if state else [None] * rank
    dst = _exprs(node)
    needs_fill, sized = [], []
    for k in range(len(pads) // 2):
        d = rank - 1 - k
        width = self.state.get(pads[2 * k]) if isinstance(pads[2 * k], fx.Node) else None
        if out[d] is None and isinstance(width, SymValue) and width.bucketed and _grows(width.expr):
            sized.append((d, width.expr))  # `F.pad(mask, (n, 0))` in front of an unpadded dim: see below
            left = 0
        else:
            left = _const_int(self, node, pads[2 * k], "the pad width")
        right = _const_int(self, node, pads[2 * k + 1], "the pad width")
        if out[d] is None:
            continue
        if right < 0 or (left < 0 and not out[d].is_tail):  # a crop at the start keeps the pad at the tail
            self.refuse(node, "negative padding crops the end of a padded dim")
        out[d] = DimPad(dst[d], out[d].kind)
        if right > 0:
            needs_fill.append((d, src[d] + left))
    if sized:
        return _sized_left_pad(self, node, out, sized, needs_fill)
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


def _sized_left_pad(self: Analysis, node: fx.Node, out: list, sized: list, needs_fill: list) -> TensorPad:
    """A left pad as wide as a dynamic size `n` in front of an unpadded dim (HunyuanVideo 1.5 pads the text mask
    in front by the image length): `cat([full(n, value), x])`, a padded operand followed by an unpadded one. As in
    `cat`, x is moved up to the fill's real end, so the padding is the dim's tail (holding real data)."""
    if len(sized) > 1 or needs_fill:
        self.refuse(node, "a pad as wide as a dynamic size, with other padding in the same op")
    dim, width = sized[0]
    out[dim] = DimPad(_exprs(node)[dim], Pad.UNKNOWN)
    state = TensorPad(tuple(out), None)
    self.state[_move_up(self, node, dim, width, width, "the padded data moved up to the real end of the pad")] = state
    return state
