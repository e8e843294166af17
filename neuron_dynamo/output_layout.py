"""Compiled outputs handed back laid out in memory as eager's.

Kernels return views (a row of a `[1, 1]` buffer, a bucket output narrowed to the real size), or several outputs in
one buffer; AOTAutograd passes a view on as an output of its autograd Function, where an in-place op (Trainer's
`loss *= scale`) raises. So every output is made a tensor of its own, except where eager's outputs overlap in memory
(`y` returned with `y[:, 1:]`, overlapping views of one intermediate): those share memory here too, laid out as in
eager, so that an in-place op on one shows in the others as it does in eager.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from neuron_dynamo.passes.padding.state import graph_outputs
from neuron_dynamo.passes.specialize import evaluate


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where one output lies in the storage it shares with other outputs in eager (size expressions)."""

    position: int
    size: tuple
    stride: tuple
    offset: Any
    view: bool  # made by a view op: never the one that owns the storage when another output can

    @property
    def symbolic(self) -> bool:
        """Whether a size, stride or offset depends on the call's sizes."""
        return any(isinstance(value, torch.SymInt) for value in (*self.size, *self.stride, self.offset))

    def at(self, sizes: dict) -> tuple[list[int], list[int], int]:
        """Size, stride and storage offset at this call's sizes."""
        concrete = lambda value: evaluate(value.node.expr, sizes) if isinstance(value, torch.SymInt) else int(value)  # noqa: E731
        return [concrete(n) for n in self.size], [concrete(n) for n in self.stride], concrete(self.offset)


def eager_aliases(gm: fx.GraphModule) -> list[list[_Layout]]:
    """The outputs that share memory in eager, grouped by storage: a view returned with its base, views of one
    intermediate. Outputs aliasing an input are left out: AOTAutograd regenerates those from the input itself."""
    values = [node.meta.get("val") for node in gm.graph.nodes if node.op == "placeholder"]
    inputs = {StorageWeakRef(value.untyped_storage()) for value in values if isinstance(value, torch.Tensor)}
    groups: dict[StorageWeakRef, list[_Layout]] = defaultdict(list)
    output = next(node for node in gm.graph.nodes if node.op == "output")
    for position, leaf in enumerate(graph_outputs(output)):
        value = leaf.meta.get("val") if isinstance(leaf, fx.Node) else None
        if isinstance(value, torch.Tensor) and StorageWeakRef(value.untyped_storage()) not in inputs:
            view = bool(getattr(leaf.target, "is_view", False))
            layout = _Layout(position, tuple(value.shape), tuple(value.stride()), value.storage_offset(), view)
            groups[StorageWeakRef(value.untyped_storage())].append(layout)
    return [group for group in groups.values() if len(group) > 1]


class EagerLayout:
    """Runs a compiled graph and hands its outputs back laid out in memory as eager's are (module docstring).

    Outputs of one eager storage that do not overlap (Flux's `h[:, :text], h[:, text:]`) become tensors of their
    own, contiguous: the same values and in-place behaviour, and the next block's input does not carry the parent's
    strides, which Dynamo would guard on (a recompile per block). Outputs aliasing an input are left as they are
    (AOTAutograd's to regenerate).

    Which outputs share eager's storages, and how they overlap, depends on the sizes only: it is worked out once per
    set of sizes (once for a static graph), so a call only checks the tensors the kernels handed back.
    """

    def __init__(self, compiled: Any, gm: fx.GraphModule) -> None:
        self.compiled = compiled
        self.groups = eager_aliases(gm)
        self._placeholders = [node.meta.get("val") for node in gm.graph.nodes if node.op == "placeholder"]
        self._grouped = frozenset(layout.position for group in self.groups for layout in group)
        self._symbolic = any(layout.symbolic for group in self.groups for layout in group)
        self._overlaps: dict[tuple, tuple[list[_Shared], list[int]]] = {}
        self._boxed_call = True

    def __call__(self, args: list[Any]) -> Any:
        shares, alone = self._overlaps_at(args) if self.groups else ((), ())
        inputs = {arg.untyped_storage()._cdata for arg in args if isinstance(arg, torch.Tensor)}
        results = self.compiled(args)
        if not isinstance(results, (list, tuple)):
            return results
        outputs = list(results)
        storages = [out.untyped_storage()._cdata if isinstance(out, torch.Tensor) else None for out in outputs]
        shared = Counter(storages)
        grouped = self._grouped
        for position, storage in enumerate(storages):
            if storage is None or position in grouped or storage in inputs:
                continue
            out = outputs[position]
            if out._base is not None or shared[storage] > 1:
                outputs[position] = out.clone(memory_format=torch.contiguous_format)
        for shared_set in shares:
            _share(outputs, shared_set)
        for position in alone:
            if outputs[position]._base is not None:  # a view of some buffer: a tensor of its own
                outputs[position] = outputs[position].clone(memory_format=torch.contiguous_format)
        return type(results)(outputs) if isinstance(results, tuple) else outputs

    def _overlaps_at(self, args: Sequence[Any]) -> tuple[list[_Shared], list[int]]:
        """The grouped outputs split into sets that overlap in memory at this call's sizes (owners first), and the
        positions of those that overlap no other."""
        sizes = _symbol_values(self._placeholders, args) if self._symbolic else {}
        key = tuple(sizes.items())
        overlaps = self._overlaps.get(key)
        if overlaps is None:
            sets = [overlapping for group in self.groups
                    for overlapping in _overlapping([(layout.position, *layout.at(sizes))
                                                     for layout in sorted(group, key=lambda layout: layout.view)])]
            overlaps = self._overlaps[key] = ([_shared(layouts) for layouts in sets if len(layouts) > 1],
                                              [layouts[0][0] for layouts in sets if len(layouts) == 1])
        return overlaps


def _symbol_values(placeholders: list[Any], args: Sequence[Any]) -> dict:
    """The value of each size symbol of the graph in this call, read from the inputs it appears in."""
    sizes = {}
    for value, arg in zip(placeholders, args, strict=False):
        if isinstance(value, torch.SymInt):
            sizes[value.node.expr] = int(arg)
        elif isinstance(value, torch.Tensor) and isinstance(arg, torch.Tensor):
            pairs = [*zip(value.shape, arg.shape, strict=True), *zip(value.stride(), arg.stride(), strict=True)]
            for symbolic, real in pairs:
                if isinstance(symbolic, torch.SymInt):
                    sizes[symbolic.node.expr] = real
    return sizes


def _overlapping(layouts: list[tuple[int, list[int], list[int], int]]) -> list[list[tuple]]:
    """The layouts split into groups whose storage extents overlap (in order; disjoint ones alone)."""
    groups: list[list[tuple]] = []
    extents: list[tuple[int, int]] = []
    for layout in layouts:
        _, size, stride, offset = layout
        low, high = offset, _end(size, stride, offset)
        touching = [k for k, (lo, hi) in enumerate(extents) if lo < high and low < hi]
        merged, merged_extent = [layout], (low, high)
        for k in reversed(touching):
            merged = groups.pop(k) + merged
            lo, hi = extents.pop(k)
            merged_extent = (min(lo, merged_extent[0]), max(hi, merged_extent[1]))
        groups.append(merged)
        extents.append(merged_extent)
    return groups


@dataclasses.dataclass(frozen=True)
class _Shared:
    """One set of outputs that overlap in memory in eager, at one set of sizes: their layouts (position, size,
    stride, offset; owners first), the storage extent they cover, and the first that spans it alone (a base
    returned with its views), if one does."""

    layouts: list[tuple[int, list[int], list[int], int]]
    low: int
    high: int
    spanning: tuple[int, list[int], list[int]] | None


def _shared(layouts: list[tuple[int, list[int], list[int], int]]) -> _Shared:
    low = min(offset for *_, offset in layouts)
    high = max(_end(size, stride, offset) for _, size, stride, offset in layouts)
    spanning = next(((p, size, stride) for p, size, stride, offset in layouts
                     if offset == low and _end(size, stride, offset) == high and _numel(size) == high - low), None)
    return _Shared(layouts, low, high, spanning)


def _share(outputs: list[Any], shared: _Shared) -> None:
    """Lay out one set of outputs that share a storage in eager in one storage here too: views of the output
    that spans the set, else of a buffer of their own."""
    layouts, low = shared.layouts, shared.low
    if len({outputs[p].dtype for p, *_ in layouts}) > 1:  # a view as another dtype: no shared layout to rebuild
        for position, *_ in layouts:
            outputs[position] = outputs[position].clone(memory_format=torch.contiguous_format)
        return
    first = outputs[layouts[0][0]]
    if shared.spanning is not None:
        root, size, stride = shared.spanning
        if _laid_out(outputs, layouts, root, low):
            return
        base = torch.empty_strided(size, stride, dtype=first.dtype, device=first.device).copy_(outputs[root])
        for position, size_p, stride_p, offset in layouts:
            same = (size_p, stride_p, offset) == (size, stride, low)
            outputs[position] = base if same else base.as_strided(size_p, stride_p, offset - low)
        return
    buffer = torch.empty(shared.high - low, dtype=first.dtype, device=first.device)
    for position, size, stride, offset in layouts:
        outputs[position] = buffer.as_strided(size, stride, offset - low).copy_(outputs[position])


def _laid_out(outputs: list[Any], layouts: list, root: int, low: int) -> bool:
    """Whether the compiled outputs already share one storage as eager's do, the spanning one owning it."""
    base = outputs[root]
    if base._base is not None:
        return False
    return all(
        outputs[p].untyped_storage()._cdata == base.untyped_storage()._cdata and list(outputs[p].shape) == size
        and list(outputs[p].stride()) == stride and outputs[p].storage_offset() - base.storage_offset() == offset - low
        for p, size, stride, offset in layouts)


def _end(size: Sequence[int], stride: Sequence[int], offset: int) -> int:
    """One past the last storage element a layout reaches."""
    if not all(size):
        return offset
    return offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1


def _numel(size: Sequence[int]) -> int:
    total = 1
    for n in size:
        total *= n
    return total
