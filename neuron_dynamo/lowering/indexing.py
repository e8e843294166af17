"""Index gathers, index writes and constant padding on the NKI targets.

A gather is an indirect DMA (`kernels.embedding`: rows fetched by an SBUF vector of offsets). `x[..., i, ...]`
with tensor indices gathers rows of `x` permuted so the indexed dims lead (a view), viewed as [indexed positions,
rest]; `gather(x, d, index)` and `flip` gather rows or single elements the same way. The offsets are integer
element-wise arithmetic on the indices (negative indices wrapped, times the dims' strides, plus an iota for the
dims an index does not cover): a generated kernel. The engines compute that arithmetic in fp32, exact below 2²⁴,
so larger sources are refused; an index out of range raises (as torch does) rather than reading another row.

An index write (`index_put`, `scatter*`, `index_reduce`, `put`) combines rows of values into rows of a base
[R, C]: the one-hot comparison of the destination rows against an iota of R says which values land where.
Overwriting takes the last value of each row by a max over the one-hot (then an indirect-DMA gather of it);
a sum or mean is one launch of the library's `kernels.scatter` (a one-hot matmul on TensorE in fp32, with the
non-finite values counted apart: a one-hot *product* would turn every 0 · inf into NaN); amax/amin reduce a
[R, J, C] `where`. Duplicate indices overwrite in an order torch leaves undefined; they add exactly (up to the
fp32 order of additions). A single index tensor is its own row number: the writes wrap its negative entries.
The embedding backward (`embedding_dense_backward`, kept whole) is one launch of `kernels.scatter`'s
`embedding_backward_kernel`, the same one-hot matmul from zeros.

A constant pad is a memset of the border and one DMA of the source into the middle, one padded dim at a time;
a negative pad (a crop) is a view of the source.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.registry import lowers
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten
EXACT_OFFSETS = 2**24  # element offsets are formed in fp32 arithmetic: exact below this
INDEX_DTYPES = (torch.int64, torch.int32)
ONE_HOT_LIMIT = 2**24  # elements of the one-hot comparison an index write materializes
SCAN_LIMIT = 4096  # the longest cumsum the reduction family lowers (masked_scatter numbers its positions with one)
REDUCTIONS = {"sum": "sum", "add": "sum", "mean": "mean", "amax": "amax", "amin": "amin"}


def _gather_rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """table[rows] for a 2-D table: the library's indirect-DMA gather, in the device's storage dtypes."""
    from neuron_dynamo.kernels.embedding import embedding_kernel

    out = launch(embedding_kernel, codegen.to_device(rows.contiguous()), codegen.to_device(table.contiguous()))
    return codegen.from_device(out, table.dtype)


def _check_bounds(index: torch.Tensor, size: int, what: str, negative: bool = True) -> None:
    low = -size if negative else 0
    if index.numel():
        least, most = torch.aminmax(index)
        codegen.check_within(least, most, low, size - 1,
                             codegen.CodegenError(f"{what}: an index is out of range for a dim of size {size}"))


def _source_refusal(value: torch.Tensor) -> str | None:
    if value.dtype not in codegen.NKI_DTYPES:
        return f"an index gather of {value.dtype}"
    if value.numel() >= EXACT_OFFSETS:
        return "an index gather over 2**24 elements or more (offsets would not be exact)"
    return None


def _row_offsets(indices: Sequence[torch.Tensor], sizes: Sequence[int]) -> torch.Tensor:
    """The row of [prod(sizes), ...] each broadcast combination of `indices` (one per leading dim) addresses."""
    from neuron_dynamo.lowering.generated import run_traced

    sizes = [int(s) for s in sizes]
    strides = [math.prod(sizes[j + 1:]) for j in range(len(sizes))]

    def row_offsets(*indices: torch.Tensor) -> torch.Tensor:
        total = None
        for index_tensor, size, stride in zip(indices, sizes, strides, strict=True):
            term = torch.where(index_tensor < 0, index_tensor + size, index_tensor) * stride
            total = term if total is None else total + term
        return total

    return run_traced(f"index_rows:{sizes}", row_offsets, list(indices))


def _element_offsets(index: torch.Tensor, shape: Sequence[int], dim: int) -> torch.Tensor:
    """The element of a contiguous `shape` tensor that each entry of `index` addresses along `dim` (gather and
    scatter): the index times the dim's stride, plus the entry's own position along every other dim."""
    from neuron_dynamo.lowering.generated import run_traced

    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    positions, size = tuple(index.shape), shape[dim]

    def element_offsets(index: torch.Tensor) -> torch.Tensor:
        total = torch.where(index < 0, index + size, index) * strides[dim]
        for d, extent in enumerate(positions):
            if d != dim and extent > 1:
                position = torch.arange(extent).reshape([extent if e == d else 1 for e in range(len(positions))])
                total = total + position * strides[d]
        return total

    return run_traced(f"element_offsets:{dim}:{size}:{strides}", element_offsets, [index])


# ------------------------------------------------------------------------------------------------ x[..., i, ...]
def _indexed_dims(indices: Sequence) -> list[int]:
    return [d for d, index in enumerate(indices) if index is not None]


def _leading(ndim: int, dims: list[int]) -> list[int]:
    """The permutation that brings the indexed dims to the front, the others after them in order."""
    return dims + [d for d in range(ndim) if d not in dims]


def _batch_position(dims: list[int]) -> int:
    """Where torch puts the broadcast index dims: in place of the indexed dims when those are adjacent, else first."""
    return dims[0] if dims == list(range(dims[0], dims[-1] + 1)) else 0


def _batch_from_front(x: torch.Tensor, count: int, position: int) -> torch.Tensor:
    """x [batch (count dims), rest...] with the batch dims moved to `position` among the rest (a view)."""
    order = [count + i for i in range(position)] + list(range(count)) + list(range(count + position, x.dim()))
    return x.permute(order)


def _batch_to_front(x: torch.Tensor, count: int, position: int) -> torch.Tensor:
    order = list(range(position, position + count)) + list(range(position)) + list(range(position + count, x.dim()))
    return x.permute(order)


def _index_refusal(node: fx.Node) -> str | None:
    tensors = [index for index in node.args[1] if index is not None]
    if not tensors:
        return "indexing with no index tensor"
    if any(index.meta["val"].dtype not in INDEX_DTYPES for index in tensors):
        return "indexing with a boolean mask"
    return _source_refusal(node.args[0].meta["val"])


def gather_index(x: torch.Tensor, indices: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """x[indices] with integer tensors on any dims: rows of x permuted so those dims lead, gathered by DMA."""
    dims = _indexed_dims(indices)
    tensors = [indices[d] for d in dims]
    lead = x.permute(_leading(x.dim(), dims))
    sizes, rest = list(lead.shape[:len(dims)]), list(lead.shape[len(dims):])
    for index_tensor, size in zip(tensors, sizes, strict=True):
        _check_bounds(index_tensor, size, "index.Tensor")
    batch = list(tensors[0].shape if len(tensors) == 1 else torch.broadcast_shapes(*(t.shape for t in tensors)))
    if math.prod(batch) * math.prod(rest) == 0:
        out = torch.empty(*batch, *rest, dtype=x.dtype)  # nothing to move
    else:
        rows = _row_offsets(tensors, sizes).reshape(-1)
        table = lead.reshape(math.prod(sizes), math.prod(rest))
        out = _gather_rows(table, rows).reshape(*batch, *rest)
    return _batch_from_front(out, len(batch), _batch_position(dims))


@lowers(aten.index, family="views", target="simulator", accepts=_index_refusal, handles_empty=True)
def index(op, x, indices):
    return gather_index(x, indices)


def _index_select_refusal(node: fx.Node) -> str | None:
    if node.args[2].meta["val"].dtype not in INDEX_DTYPES:
        return "an index_select by a non-integer index"
    return _source_refusal(node.args[0].meta["val"])


@lowers(aten.index_select, family="views", target="simulator", accepts=_index_select_refusal, handles_empty=True)
def index_select(op, x, dim, index):
    """x.index_select(dim, i) is x[:, ..., i] with a 1-D i (a 0-dim x as one element)."""
    if x.dim() == 0:
        return gather_index(x.reshape(1), [index.reshape(-1)]).reshape(())
    return gather_index(x, [None] * (dim % x.dim()) + [index.reshape(-1)])


def _embedding_refusal(node: fx.Node) -> str | None:
    table = node.args[0].meta["val"]
    if table.dim() != 2:
        return "an embedding table that is not 2-D"
    return _source_refusal(table)


@lowers(aten.embedding, family="views", target="simulator", accepts=_embedding_refusal, handles_empty=False)
def embedding(op, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """The library's indirect-DMA gather (`kernels.embedding`); indices narrow to int32 on the way in."""
    _check_bounds(indices, weight.shape[0], "embedding", negative=False)
    return _gather_rows(weight, indices.reshape(-1)).reshape(*indices.shape, weight.shape[1])


def _embedding_backward_refusal(node: fx.Node) -> str | None:
    grad, ids, num_weights = node.args[0].meta["val"], node.args[1].meta["val"], node.args[2]
    if grad.dtype not in codegen.FLOAT_DTYPES or ids.dtype not in INDEX_DTYPES:
        return f"an embedding backward of {grad.dtype} gradients or {ids.dtype} ids"
    if num_weights * ids.numel() > ONE_HOT_LIMIT:
        return "an embedding backward whose one-hot comparison would exceed 2**24 elements"
    return None


@lowers(aten.embedding_dense_backward, family="views", target="simulator", accepts=_embedding_backward_refusal)
def embedding_dense_backward(op, grad, ids, num_weights, padding_idx, scale_grad_by_freq):
    """The library's `embedding_backward_kernel`: one launch, where torch's decomposition takes masks, a fill, a
    clamp and an index_put (and for scale_grad_by_freq an integer index write of the counts)."""
    from neuron_dynamo.kernels.scatter import embedding_backward_kernel

    rows = codegen.to_device(ids.reshape(-1).contiguous())  # a 0-dim id as one row
    out = launch(embedding_backward_kernel, grad.contiguous().reshape(rows.numel(), grad.shape[-1]), rows,
                 num_weights, padding_idx, scale_grad_by_freq)
    return codegen.from_device(out, grad.dtype)


def _flip_refusal(node: fx.Node) -> str | None:
    return _source_refusal(node.args[0].meta["val"])


@lowers(aten.flip, family="views", target="simulator", accepts=_flip_refusal, handles_empty=True)
def flip(op, x, dims):
    """Rows of x up to the last flipped dim, gathered in reversed order along the flipped dims."""
    from neuron_dynamo.lowering.generated import run_traced

    dims = sorted({d % max(x.dim(), 1) for d in dims})
    if not dims or x.numel() == 0 or x.dim() == 0:
        return x.clone()
    sizes = list(x.shape[:dims[-1] + 1])
    strides = [math.prod(sizes[j + 1:]) for j in range(len(sizes))]

    def reversed_rows() -> torch.Tensor:
        total = torch.zeros(sizes, dtype=torch.int64)
        for d, (size, stride) in enumerate(zip(sizes, strides, strict=True)):
            position = torch.arange(size)
            if d in dims:
                position = (size - 1) - position
            total = total + (position * stride).reshape([size if e == d else 1 for e in range(len(sizes))])
        return total

    rows = run_traced(f"flip_rows:{sizes}:{dims}", reversed_rows, [])
    return _gather_rows(x.reshape(math.prod(sizes), -1), rows.reshape(-1)).reshape(x.shape)


# ------------------------------------------------------------------------------------------------ gather(x, d, index)
def _gather_refusal(node: fx.Node) -> str | None:
    if node.args[2].meta["val"].dtype not in INDEX_DTYPES:
        return "a gather by an index that is not an integer tensor"
    return _source_refusal(node.args[0].meta["val"])


@lowers(aten.gather, family="views", target="simulator", accepts=_gather_refusal, handles_empty=True)
def gather(op, x, dim, index, sparse_grad=False):
    """out[..., j, ...] = x[..., index[..., j, ...], ...] along `dim`: one element per output, by indirect DMA."""
    shape = list(x.shape) or [1]  # a 0-dim x as one element
    dim = dim % len(shape)
    _check_bounds(index, shape[dim], "gather")
    if index.numel() == 0:
        return torch.empty(index.shape, dtype=x.dtype)  # nothing to move
    offsets = _element_offsets(index.reshape(index.shape or (1,)), shape, dim)
    return _gather_rows(x.reshape(-1, 1), offsets.reshape(-1)).reshape(index.shape)


# ------------------------------------------------------------------------------------------------ index writes
def _wrapped(rows: torch.Tensor, rows_count: int) -> torch.Tensor:
    return torch.where(rows < 0, rows + rows_count, rows)


def _write_rows(tensors: Sequence[torch.Tensor], sizes: Sequence[int]) -> torch.Tensor:
    """The row of [prod(sizes), ...] each broadcast combination of `tensors` writes, for `scatter_rows`: one index
    tensor is its row number as it is (no launch; the writes wrap it), several are combined by `_row_offsets`."""
    if len(tensors) == 1:
        return tensors[0].reshape(-1)
    return _row_offsets(tensors, sizes).reshape(-1)


def _put_rows(rows_count: int, count: int):
    """base[rows[j]] = values[j]: the last j hitting each row (a max over the one-hot), gathered by DMA."""

    def put(base: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        hits = _wrapped(rows, rows_count).reshape(1, count) == torch.arange(rows_count).reshape(rows_count, 1)
        last = torch.where(hits, torch.arange(count, dtype=torch.float32), -1.0).amax(1)
        picked = torch.ops.aten.embedding(values, last.clamp_min(0).to(torch.int32))
        return torch.where((last >= 0).reshape(rows_count, 1), picked, base)

    return put


def _extreme_rows(rows_count: int, count: int, cols: int, largest: bool, include_self: bool):
    """base[rows[j]] = max(base[rows[j]], values[j]) (or min) as a reduction over a [R, J, C] `where`."""
    fill = -math.inf if largest else math.inf

    def extreme(base: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        hits = _wrapped(rows, rows_count).reshape(1, count, 1) == torch.arange(rows_count).reshape(rows_count, 1, 1)
        candidates = torch.where(hits, values.reshape(1, count, cols), fill)
        reduced = candidates.amax(1) if largest else candidates.amin(1)
        if include_self:
            return torch.maximum(base, reduced) if largest else torch.minimum(base, reduced)
        landed = hits.to(torch.float32).amax(1)
        return torch.where(landed > 0, reduced, base)

    return extreme


def scatter_rows(base: torch.Tensor, rows: torch.Tensor, values: torch.Tensor, reduce: str = "set",
                 include_self: bool = True) -> torch.Tensor:
    """base [R, C] with values [J, C] written to (or combined into) rows `rows` [J] (in [-R, R), checked by the
    callers; negative ones count from the end). A sum or mean is the library kernel, whose contract covers every
    write `_write_refusal` lets through (a float base of < 2**24 elements, values of its dtype)."""
    from neuron_dynamo.kernels.scatter import scatter_add_kernel
    from neuron_dynamo.lowering.generated import run_traced

    (rows_count, cols), count = base.shape, rows.numel()
    if base.numel() == 0 or count == 0:
        return base.clone()
    if reduce in ("sum", "mean"):
        out = launch(scatter_add_kernel, base.contiguous(), codegen.to_device(rows.reshape(-1).contiguous()),
                     values.contiguous().reshape(count, cols), include_self, reduce == "mean")
        return codegen.from_device(out, base.dtype)
    if reduce == "set":
        fn = _put_rows(rows_count, count)
    else:
        fn = _extreme_rows(rows_count, count, cols, reduce == "amax", include_self)
    key = f"scatter_rows:{reduce}:{include_self}"
    return run_traced(key, fn, [base.contiguous(), rows.reshape(-1), values.contiguous().reshape(count, cols)])


def _write_refusal(base: torch.Tensor, rows: int, count: int, reduce: str | None) -> str | None:
    """Why an index write of `count` values into `rows` rows of `base` cannot be exact, or None."""
    if reduce is None:
        return "a multiplying index write (no product reduction on the NKI targets)"
    if base.dtype not in codegen.NKI_DTYPES or base.numel() >= EXACT_OFFSETS:
        return f"an index write into {base.dtype} or into 2**24 elements or more"
    if reduce != "set" and base.dtype not in codegen.FLOAT_DTYPES:
        return f"an accumulating index write into {base.dtype} (the sums and comparisons run in fp32)"
    cols = base.numel() // max(rows, 1) if reduce in ("amax", "amin") else 1
    if rows * count * cols > ONE_HOT_LIMIT:
        return "an index write whose one-hot comparison would exceed 2**24 elements"
    return None


def _values_refusal(node: fx.Node, values: fx.Node | object) -> str | None:
    if isinstance(values, fx.Node) and values.meta["val"].dtype != node.meta["val"].dtype:
        return "an index write of values of another dtype"
    return None


# index_put(x, indices, values, accumulate)
def _is_mask(indices: Sequence) -> bool:
    return len(indices) == 1 and indices[0] is not None and indices[0].dtype == torch.bool


def _index_put_refusal(node: fx.Node) -> str | None:
    x, values = node.args[0].meta["val"], node.args[2]
    indices = [index.meta["val"] if index is not None else None for index in node.args[1]]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    if _is_mask(indices):
        if _mask_rows(x, indices[0], values.meta["val"]) > 1 and indices[0].numel() > SCAN_LIMIT:
            return f"an index_put through a boolean mask over more than {SCAN_LIMIT} positions (they are numbered " \
                   "by one cumsum)"
        return _values_refusal(node, values) or _write_refusal(x, 1, 1, "sum" if accumulate else "set")
    tensors = [index for index in indices if index is not None]
    if not tensors or any(index.dtype not in INDEX_DTYPES for index in tensors):
        return "an index_put with a boolean mask among other indices"
    dims = _indexed_dims(indices)
    rows = math.prod(x.shape[d] for d in dims)
    count = math.prod(torch.broadcast_shapes(*(t.shape for t in tensors)))
    return _values_refusal(node, values) or _write_refusal(x, rows, count, "sum" if accumulate else "set")


def _mask_rows(x: torch.Tensor, mask: torch.Tensor, values: torch.Tensor) -> int:
    """How many rows of values x[mask] = values takes one by one (1: one row broadcast to every True)."""
    lead = values.dim() - (x.dim() - mask.dim())
    return math.prod(values.shape[:max(lead, 0)])


def _masked_put(x: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, accumulate: bool) -> torch.Tensor:
    """x[mask] = values (or +=) with the mask on x's leading dims: the k-th True takes values' k-th row (the
    count of Trues before it, a cumsum, then a DMA gather), or the one row for all; a `where` writes them."""
    from neuron_dynamo.lowering.generated import run_traced

    rest = list(x.shape[mask.dim():])
    positions, cols = mask.numel(), math.prod(rest)
    count = _mask_rows(x, mask, values)
    if count > 1 and int(mask.sum()) != count:
        raise codegen.CodegenError(f"index_put: {count} values for a mask with {int(mask.sum())} True positions")
    if count > 1:
        rows = values.expand(count, *rest).reshape(count, cols)
    else:
        rows = values.reshape(values.shape[max(values.dim() - len(rest), 0):]).expand(rest).reshape(1, cols)
    shape = x.shape

    def put(x: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        mask, x = mask.reshape(positions, 1), x.reshape(positions, cols)
        if count > 1:
            order = mask.reshape(-1).to(torch.float32).cumsum(0) - 1
            rows = torch.ops.aten.embedding(rows, torch.where(mask.reshape(-1), order, 0.0).to(torch.int32))
        return torch.where(mask, x + rows if accumulate else rows, x).reshape(shape)

    return run_traced(f"masked_put:{accumulate}:{count > 1}", put, [x, mask, rows])


@lowers(aten.index_put, family="views", target="simulator", accepts=_index_put_refusal, handles_empty=True)
def index_put(op, x, indices, values, accumulate=False):
    """x[indices] = values (or +=): x permuted so the indexed dims lead, as [indexed positions, rest] rows."""
    if _is_mask(indices):
        return x.clone() if x.numel() == 0 else _masked_put(x, indices[0], values, accumulate)
    dims = _indexed_dims(indices)
    tensors = [indices[d] for d in dims]
    order = _leading(x.dim(), dims)
    lead = x.permute(order)
    sizes, rest = list(lead.shape[:len(dims)]), list(lead.shape[len(dims):])
    for index_tensor, size in zip(tensors, sizes, strict=True):
        _check_bounds(index_tensor, size, "index_put")
    batch = list(tensors[0].shape if len(tensors) == 1 else torch.broadcast_shapes(*(t.shape for t in tensors)))
    if math.prod(batch) * math.prod(rest) == 0:
        return x.clone()
    position = _batch_position(dims)
    values = values.expand(rest[:position] + batch + rest[position:])  # the shape of x[indices]
    values = _batch_to_front(values, len(batch), position)
    rows = _write_rows(tensors, sizes)
    out = scatter_rows(lead.reshape(math.prod(sizes), math.prod(rest)), rows, values,
                       "sum" if accumulate else "set")
    return out.reshape(lead.shape).permute([order.index(d) for d in range(x.dim())])


# scatter(x, dim, index, src | value [, reduce]), scatter_add, scatter_reduce.two: one element per index entry
def _scatter_reduce(node: fx.Node) -> tuple[str | None, bool]:
    """The combine mode of a scatter node ("set", "sum", "mean", "amax", "amin"; None: unsupported) and
    whether the base takes part in it."""
    packet = node.target.overloadpacket
    if packet is aten.scatter_add:
        return "sum", True
    if packet is aten.scatter_reduce:
        include_self = node.args[5] if len(node.args) > 5 else node.kwargs.get("include_self", True)
        return REDUCTIONS.get(node.args[4]), include_self
    reduce = node.args[4] if len(node.args) > 4 else node.kwargs.get("reduce")
    return ("set" if reduce is None else REDUCTIONS.get(reduce)), True


def _scatter_refusal(node: fx.Node) -> str | None:
    x, index = node.args[0].meta["val"], node.args[2].meta["val"]
    if index.dtype not in INDEX_DTYPES:
        return "a scatter by an index that is not an integer tensor"
    reduce, _ = _scatter_reduce(node)
    refusal = _write_refusal(x, x.numel(), index.numel(), reduce)
    return refusal or _values_refusal(node, node.args[3])


def element_scatter(x, dim, index, src, reduce="set", include_self=True) -> torch.Tensor:
    """x with src (a tensor at least index's size, or a number) written to / combined into x along `dim` at
    `index`: x as [numel, 1] rows, the destinations the elements `gather` would read."""
    from neuron_dynamo.lowering.generated import run_single

    shape = list(x.shape) or [1]
    dim = dim % len(shape)
    _check_bounds(index, shape[dim], "scatter", negative=False)
    if index.numel() == 0 or x.numel() == 0:
        return x.clone()
    offsets = _element_offsets(index.reshape(index.shape or (1,)), shape, dim)
    if isinstance(src, torch.Tensor):
        values = src.reshape(src.shape or (1,))[tuple(slice(0, n) for n in (index.shape or (1,)))]
    else:
        values = run_single(aten.full.default, ((index.numel(), 1), src), {"dtype": x.dtype})
    out = scatter_rows(x.reshape(-1, 1), offsets.reshape(-1), values.reshape(-1, 1), reduce, include_self)
    return out.reshape(x.shape)


@lowers(aten.scatter, family="views", target="simulator", accepts=_scatter_refusal, handles_empty=True)
def scatter(op, x, dim, index, src, reduce=None):
    return element_scatter(x, dim, index, src, "set" if reduce is None else REDUCTIONS[reduce])


@lowers(aten.scatter_add, family="views", target="simulator", accepts=_scatter_refusal, handles_empty=True)
def scatter_add(op, x, dim, index, src):
    return element_scatter(x, dim, index, src, "sum")


@lowers(aten.scatter_reduce, family="views", target="simulator", accepts=_scatter_refusal, handles_empty=True)
def scatter_reduce(op, x, dim, index, src, reduce, include_self=True):
    return element_scatter(x, dim, index, src, REDUCTIONS[reduce], include_self)


# index_reduce(x, dim, index, source, reduce, include_self): whole slices along dim
def _index_reduce_refusal(node: fx.Node) -> str | None:
    x, index = node.args[0].meta["val"], node.args[2].meta["val"]
    if index.dtype not in INDEX_DTYPES:
        return "an index_reduce by a non-integer index"
    rows = x.shape[node.args[1] % x.dim()] if x.dim() else 1
    return _values_refusal(node, node.args[3]) or _write_refusal(x, rows, index.numel(),
                                                                 REDUCTIONS.get(node.args[4]))


@lowers(aten.index_reduce, family="views", target="simulator", accepts=_index_reduce_refusal, handles_empty=True)
def index_reduce(op, x, dim, index, source, reduce, include_self=True):
    """Slices of x along `dim` as rows: x.movedim(dim, 0) viewed as [x.shape[dim], rest]."""
    if x.dim() == 0:
        return index_reduce(op, x.reshape(1), 0, index, source.reshape(-1), reduce, include_self).reshape(())
    dim = dim % x.dim()
    _check_bounds(index, x.shape[dim], "index_reduce")
    lead = x.movedim(dim, 0)
    if index.numel() == 0 or x.numel() == 0:
        return x.clone()
    values = source.movedim(dim, 0).reshape(index.numel(), -1)
    out = scatter_rows(lead.reshape(x.shape[dim], -1), index.reshape(-1), values, REDUCTIONS[reduce], include_self)
    return out.reshape(lead.shape).movedim(0, dim)


# put(x, index, source, accumulate): x as one flat row of elements
def _put_refusal(node: fx.Node) -> str | None:
    x, index = node.args[0].meta["val"], node.args[1].meta["val"]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    if index.dtype not in INDEX_DTYPES:
        return "a put by an index that is not an integer tensor"
    return _values_refusal(node, node.args[2]) or _write_refusal(x, x.numel(), index.numel(),
                                                                 "sum" if accumulate else "set")


@lowers(aten.put, family="views", target="simulator", accepts=_put_refusal, handles_empty=True)
def put(op, x, index, source, accumulate=False):
    _check_bounds(index, x.numel(), "put")
    if index.numel() == 0 or x.numel() == 0:
        return x.clone()
    out = scatter_rows(x.reshape(-1, 1), index.reshape(-1), source.reshape(-1, 1), "sum" if accumulate else "set")
    return out.reshape(x.shape)


# masked_scatter(x, mask, source): the k-th True position takes source's k-th element
def _masked_scatter_refusal(node: fx.Node) -> str | None:
    value = node.meta["val"]
    if value.dtype not in codegen.NKI_DTYPES or node.args[2].meta["val"].dtype != value.dtype:
        return f"a masked_scatter of {value.dtype} or of a source of another dtype"
    if node.args[2].meta["val"].numel() == 0:
        return "a masked_scatter from an empty source"
    if value.numel() > SCAN_LIMIT:
        return f"a masked_scatter over more than {SCAN_LIMIT} elements (its positions are numbered by one cumsum)"
    return None


@lowers(aten.masked_scatter, family="views", target="simulator", accepts=_masked_scatter_refusal,
        handles_empty=True)
def masked_scatter(op, x, mask, source):
    """Each True position's source element is the count of Trues before it (a cumsum), gathered by DMA."""
    from neuron_dynamo.lowering.generated import run_traced

    shape = tuple(torch.broadcast_shapes(x.shape, mask.shape))
    if math.prod(shape) == 0:
        return x.expand(shape).clone()

    def fill(x: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        mask = mask.expand(shape).reshape(-1)
        order = mask.to(torch.float32).cumsum(0) - 1
        picked = torch.ops.aten.embedding(source.reshape(-1, 1), torch.where(mask, order, 0.0).to(torch.int32))
        return torch.where(mask.reshape(shape), picked.reshape(shape), x.expand(shape))

    return run_traced("masked_scatter", fill, [x, mask, source])


# ------------------------------------------------------------------------------------------------ constant_pad_nd
def _pad_source(name: str) -> str:
    """`kernel(src, shape, outer, width, start, stop, fill) -> result of shape`: over the [outer, stop - start] view
    of src and the [outer, width] view of the result, a memset of the border columns, then one DMA of the source
    into the middle (the two never overlap)."""
    return (
        f"{codegen.HEADER}@nki.jit\ndef {name}(src, shape, outer, width, start, stop, fill):\n"
        "    src = src.reshape((outer, stop - start))\n"
        "    result = nl.ndarray(shape, dtype=src.dtype, buffer=nl.shared_hbm)\n"
        "    out = result.reshape((outer, width))\n"
        f"    for r0 in range(0, outer, {codegen.PMAX}):\n"
        f"        pr = min({codegen.PMAX}, outer - r0)\n"
        "        for lo, hi in ((0, start), (stop, width)):\n"
        f"            for c0 in range(lo, hi, {codegen.COLS}):\n"
        f"                cc = min({codegen.COLS}, hi - c0)\n"
        "                nl.store(out[r0:r0 + pr, c0:c0 + cc], value=nl.full((pr, cc), fill, dtype=src.dtype))\n"
        "    if stop > start:\n"
        "        nisa.dma_copy(dst=out[0:outer, start:stop], src=src)\n"
        "    return result\n"
    )


@functools.cache
def _pad_kernel():
    name = codegen.source_name("constant_pad", "v1")
    return codegen.compile_source(_pad_source(name), name)


def _pad_refusal(node: fx.Node) -> str | None:
    x = node.args[0].meta["val"]
    if x.dtype not in codegen.NKI_DTYPES:
        return f"a constant pad of {x.dtype}"
    if len(node.args[1]) > 2 * x.dim():
        return "a pad of more dims than the tensor has"
    return None


@lowers(aten.constant_pad_nd, family="views", target="simulator", accepts=_pad_refusal)
def constant_pad_nd(op, x, pad, value=0):
    """torch's F.pad(mode="constant"): `pad` holds (before, after) pairs from the last dim backwards."""
    pairs = [(pad[i], pad[i + 1]) for i in range(0, len(pad), 2)]
    for back, (before, after) in enumerate(pairs):  # crops first: a view of the source
        if before < 0 or after < 0:
            dim = x.dim() - 1 - back
            x = x.narrow(dim, max(-before, 0), x.shape[dim] - max(-before, 0) - max(-after, 0))
    kernel = _pad_kernel()
    dtype = codegen.nki_dtype(x.dtype)
    fill = codegen.typed_constant(value, dtype)  # a bool tensor is stored as 0/1 bytes
    for back, (before, after) in enumerate(pairs):
        before, after = max(before, 0), max(after, 0)
        if before == after == 0:
            continue
        dim = x.dim() - 1 - back
        outer, inner = math.prod(x.shape[:dim]), math.prod(x.shape[dim + 1:])
        shape = list(x.shape)
        shape[dim] += before + after
        if math.prod(shape) == 0:
            x = torch.full(shape, value, dtype=x.dtype)
            continue
        width, start = shape[dim] * inner, before * inner
        out = launch(kernel, codegen.to_device(x), tuple(shape), outer, width, start, start + x.shape[dim] * inner,
                     fill)
        x = codegen.from_device(out, x.dtype)
    return x if any(p > 0 for p in pad) else x.clone()  # a crop alone is a copy of the view
