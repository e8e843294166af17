"""Index gathers and constant padding as DMA: `index.Tensor`, `gather`, `constant_pad_nd` on the NKI targets.

A gather is an indirect DMA (`kernels.embedding`: rows fetched by an SBUF vector of offsets). `x[i0, i1, ...]`
with tensor indices on the leading dims gathers rows of `x` viewed as [indexed positions, rest]; `gather(x, d,
index)` gathers single elements of `x` viewed as [numel, 1]. The offsets are integer element-wise arithmetic on
the indices (negative indices wrapped, times the dims' strides, plus an iota for the dims `gather` does not index):
a generated kernel. The engines compute that arithmetic in fp32, exact below 2²⁴, so larger sources are refused;
an index out of range raises (as torch does) rather than reading another row.

A constant pad is a memset of the border and one DMA of the source into the middle, one padded dim at a time;
a negative pad (a crop) is a view of the source.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.registry import lowers
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten
EXACT_OFFSETS = 2**24  # element offsets are formed in fp32 arithmetic: exact below this
INDEX_DTYPES = (torch.int64, torch.int32)


def _gather_rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """table[rows] for a 2-D table: the library's indirect-DMA gather, in the device's storage dtypes."""
    from neuron_dynamo.kernels.embedding import embedding_kernel

    out = launch(embedding_kernel, codegen.to_device(rows.contiguous()), codegen.to_device(table.contiguous()))
    return codegen.from_device(out, table.dtype)


def _check_bounds(index: torch.Tensor, size: int, what: str) -> None:
    if index.numel() and (index.min() < -size or index.max() >= size):
        raise codegen.CodegenError(f"{what}: an index is out of range for a dim of size {size}")


def _source_refusal(value: torch.Tensor) -> str | None:
    if value.dtype not in codegen.NKI_DTYPES:
        return f"an index gather of {value.dtype}"
    if value.numel() >= EXACT_OFFSETS:
        return "an index gather over 2**24 elements or more (offsets would not be exact)"
    return None


# ------------------------------------------------------------------------------------------------ x[i0, i1, ...]
def _index_refusal(node: fx.Node) -> str | None:
    x, indices = node.args[0].meta["val"], list(node.args[1])
    while indices and indices[-1] is None:
        indices.pop()
    if not indices or any(index is None for index in indices):
        return "indexing with a None (a sliced dim) before an indexed dim"
    if any(index.meta["val"].dtype not in INDEX_DTYPES for index in indices):
        return "indexing with a boolean mask"
    return _source_refusal(x)


@lowers(aten.index, family="views", target="simulator", accepts=_index_refusal, handles_empty=False)
def index(op, x, indices):
    """x[i0, ..., ik-1] with integer tensors on the k leading dims: rows of x as [prod(dims < k), rest]."""
    from neuron_dynamo.lowering.generated import run_traced

    indices = list(indices)
    while indices and indices[-1] is None:
        indices.pop()
    k = len(indices)
    sizes = list(x.shape[:k])
    for index_tensor, size in zip(indices, sizes, strict=True):
        _check_bounds(index_tensor, size, "index.Tensor")
    strides = [math.prod(sizes[j + 1:]) for j in range(k)]

    def row_offsets(*indices: torch.Tensor) -> torch.Tensor:
        total = None
        for index_tensor, size, stride in zip(indices, sizes, strides, strict=True):
            term = torch.where(index_tensor < 0, index_tensor + size, index_tensor) * stride
            total = term if total is None else total + term
        return total

    rows = run_traced(f"index_rows:{sizes}", row_offsets, indices)
    rest = list(x.shape[k:])
    table = x.reshape(math.prod(sizes), math.prod(rest))
    return _gather_rows(table, rows).reshape(*rows.shape, *rest)


# ------------------------------------------------------------------------------------------------ gather(x, d, index)
def _gather_refusal(node: fx.Node) -> str | None:
    if node.args[2].meta["val"].dtype not in INDEX_DTYPES or node.args[0].meta["val"].dim() == 0:
        return "a gather of a scalar, or by an index that is not an integer tensor"
    return _source_refusal(node.args[0].meta["val"])


@lowers(aten.gather, family="views", target="simulator", accepts=_gather_refusal, handles_empty=False)
def gather(op, x, dim, index, sparse_grad=False):
    """out[..., j, ...] = x[..., index[..., j, ...], ...] along `dim`: one element per output, by indirect DMA."""
    from neuron_dynamo.lowering.generated import run_traced

    dim = dim % x.dim()
    _check_bounds(index, x.shape[dim], "gather")
    strides = [math.prod(x.shape[d + 1:]) for d in range(x.dim())]
    shape, size = tuple(index.shape), x.shape[dim]

    def element_offsets(index: torch.Tensor) -> torch.Tensor:
        total = torch.where(index < 0, index + size, index) * strides[dim]
        for d, extent in enumerate(shape):
            if d != dim and extent > 1:
                position = torch.arange(extent).reshape([extent if e == d else 1 for e in range(len(shape))])
                total = total + position * strides[d]
        return total

    offsets = run_traced(f"gather_offsets:{dim}:{size}:{strides}", element_offsets, [index])
    return _gather_rows(x.reshape(-1, 1), offsets.reshape(-1)).reshape(shape)


# ------------------------------------------------------------------------------------------------ constant_pad_nd
def _pad_source(name: str) -> str:
    """`kernel(src [outer, stop - start], outer, width, start, stop, fill) -> out [outer, width]`: a memset of the
    border columns, then one DMA of the source into the middle (the two never overlap)."""
    return (
        f"{codegen.HEADER}@nki.jit\ndef {name}(src, outer, width, start, stop, fill):\n"
        "    out = nl.ndarray((outer, width), dtype=src.dtype, buffer=nl.shared_hbm)\n"
        f"    for r0 in range(0, outer, {codegen.PMAX}):\n"
        f"        pr = min({codegen.PMAX}, outer - r0)\n"
        "        for lo, hi in ((0, start), (stop, width)):\n"
        f"            for c0 in range(lo, hi, {codegen.COLS}):\n"
        f"                cc = min({codegen.COLS}, hi - c0)\n"
        "                nl.store(out[r0:r0 + pr, c0:c0 + cc], value=nl.full((pr, cc), fill, dtype=src.dtype))\n"
        "    if stop > start:\n"
        "        nisa.dma_copy(dst=out[0:outer, start:stop], src=src)\n"
        "    return out\n"
    )


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
        dim = x.dim() - 1 - back
        x = x.narrow(dim, max(-before, 0), x.shape[dim] - max(-before, 0) - max(-after, 0))
    name = codegen.source_name("constant_pad", "v1")
    kernel = codegen.compile_source(_pad_source(name), name)
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
        source = codegen.to_device(x.contiguous()).reshape(outer, x.shape[dim] * inner)
        out = launch(kernel, source, outer, width, start, start + x.shape[dim] * inner, fill)
        x = codegen.from_device(out.reshape(shape), x.dtype)
    return x if any(p > 0 for p in pad) else x.clone()  # a crop alone is a copy of the view
