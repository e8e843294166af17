"""Padding rules of data movement by index: embedding, gathers, losses over targets, scatters, creation."""

from __future__ import annotations

import sympy
import torch
import torch.fx as fx

from neuron_dynamo.passes.padding.analysis import Analysis
from neuron_dynamo.passes.padding.shape_rules import _const_int
from neuron_dynamo.passes.padding.state import DimPad, Pad, _classify_scalar, _exprs, rule

aten = torch.ops.aten


def _in_range_padding(self: Analysis, node: fx.Node, index) -> None:
    """Indices into an unpadded dim: their pad must hold a valid index. Padded ids are 0, but `arange(s)` position
    ids hold s..bucket-1 in their pad, beyond a table smaller than the bucket: set to 0."""
    if isinstance(index, fx.Node):
        self.mask_padded(node, index, 0, "padded indices into an unpadded dim set to 0 (in range)",
                         unless=(Pad.ZERO,))


@rule(aten.embedding)
def _embedding(self: Analysis, node: fx.Node):
    weight = self.tensor(node.args[0])
    if weight is not None and weight.padded:
        self.refuse(node, "embedding table with a padded dim")
    _in_range_padding(self, node, node.args[1])
    return self.out(node)


@rule(aten.embedding_dense_backward)
def _embedding_backward(self: Analysis, node: fx.Node):
    if len(node.args) > 4 and node.args[4] and self._touches_padding(node):
        self.refuse(node, "scale_grad_by_freq counts padded indices")
    self.mask_padded(node, node.args[0], 0.0, "embedding backward: padded gradient rows zeroed", unless=(Pad.ZERO,))
    return self.out(node)


def _check_index_bound(self: Analysis, node: fx.Node, source_dim: DimPad | None, index) -> None:
    if source_dim is None:
        return
    state = self.tensor(index)
    bound = state.bound if state is not None else None
    if bound is None or sympy.expand(bound - source_dim.expr) != 0:
        self.refuse(node, "indexing along a padded dim with indices that may point into the padding")


@rule(aten.index)
def _index(self: Analysis, node: fx.Node):
    source_dims = self.dims(node.args[0])
    for d, index in enumerate(node.args[1]):
        if index is not None:
            _check_index_bound(self, node, source_dims[d], index)
            if source_dims[d] is None:
                _in_range_padding(self, node, index)
    return self.out(node)


@rule(aten.index_select, aten.gather)
def _index_select(self: Analysis, node: fx.Node):
    source_dims = self.dims(node.args[0])
    dim = node.args[1] % len(source_dims) if source_dims else 0
    if source_dims:
        _check_index_bound(self, node, source_dims[dim], node.args[2])
    if not source_dims or source_dims[dim] is None:
        _in_range_padding(self, node, node.args[2])
    return self.out(node)


@rule(aten.nll_loss_forward, aten.nll_loss_backward, merge_aware=True)
def _nll_loss(self: Analysis, node: fx.Node):
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


@rule(aten.scatter, aten.scatter_add, aten.scatter_reduce, aten.slice_scatter, aten.select_scatter, aten.index_add,
       aten.index_copy, aten.index_fill, merge_aware=True)  # fmt: skip
def _scatter(self: Analysis, node: fx.Node):
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


@rule(aten.index_put, aten._unsafe_index_put, merge_aware=True)
def _index_put(self: Analysis, node: fx.Node):
    """Accumulating writes (embedding backward): padded positions add zero once their values are masked."""
    args = self.kwargs(node)
    if not self._touches_padding(node):
        return self.like(node, node.args[0])
    destination = self.tensor(node.args[0])
    if destination is not None and destination.padded:
        return _write_into_padded_buffer(self, node, args, destination)
    if not args.get("accumulate", False):
        self.refuse(node, "writes at padded positions would overwrite real entries of the buffer (e.g. a KV cache); "
                          "redirecting such writes is not supported")
    _check_write_layouts(self, node, list(args["indices"]), args["values"], len(_exprs(node.args[0])))
    for index in args["indices"]:
        _in_range_padding(self, node, index)
    self.mask_padded(node, args["values"], 0.0, "accumulating write: padded values zeroed", unless=(Pad.ZERO,))
    return self.like(node, node.args[0])


def _write_into_padded_buffer(self: Analysis, node: fx.Node, args: dict, destination):
    """An overwrite of unpadded values at unpadded indices into a padded buffer (a static KV cache at
    `cache_position`): an index in range of the real size lands in the real region at any bucket; a negative one
    counts from the real end, so it is made non-negative first. The buffer's pad keeps what it held."""
    indices = list(args["indices"])
    values = args["values"]
    if args.get("accumulate", False) or any(self.tensor(i) is not None and self.tensor(i).padded for i in indices) \
            or (self.tensor(values) is not None and self.tensor(values).padded):
        self.refuse(node, "writes into a padded buffer at data-dependent positions")
    for dim, index in enumerate(indices):
        if index is None or destination.dims[dim] is None:
            continue
        with self.graph.inserting_before(node):
            negative = self.graph.call_function(aten.lt.Scalar, (index, 0))
            wrapped = self.graph.call_function(aten.add.Tensor, (index, self.real(destination.dims[dim].expr)))
            counted = self.graph.call_function(aten.where.self, (negative, wrapped, index))
        counted.meta["val"] = index.meta.get("val")
        node.replace_input_with(index, counted)
        self.masks.append(f"{node.name}: negative write positions counted from the real end")
    return self.like(node, node.args[0])


def _check_write_layouts(self: Analysis, node: fx.Node, indices: list, values, dest_rank: int) -> None:
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


def _slice_scatter_padded(self: Analysis, node: fx.Node, args: dict, dim: int):
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


@rule(aten.full, aten.zeros, aten.ones, aten.new_full, aten.new_zeros, aten.new_ones, aten.full_like, aten.zeros_like,
       aten.ones_like, aten.scalar_tensor, aten.empty, aten.new_empty, aten.empty_like, aten.empty_strided,
       aten.new_empty_strided, aten.fill)  # fmt: skip
def _creation(self: Analysis, node: fx.Node):
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


@rule(aten.arange)
def _arange(self: Analysis, node: fx.Node):
    args = self.kwargs(node)
    start = _const_int(self, node, args.get("start", 0), "the arange start")
    step = _const_int(self, node, args.get("step", 1), "the arange step")
    dst = _exprs(node)
    bound = dst[0] if start == 0 and step == 1 and self.is_padded(dst[0]) else None
    return self.out(node, Pad.FINITE, bound)
