"""Views, reshapes and data movement: free on device when they only change the access pattern, DMA otherwise.

On the NKI targets a pure view (reshape of contiguous data, transpose, permute, slice, expand, ...) is not a
kernel: it changes the access pattern the next kernel's DMA reads with, so the simulator kernel is the strided
torch view itself and no data moves. `cat` is a generated DMA kernel (HBM → HBM copies into the slices of the
result), `embedding` the library's indirect-DMA gather.
"""

import math

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.registry import lowers
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten


@lowers(
    aten.view, aten._unsafe_view, aten.reshape, aten.expand, aten.slice, aten.select, aten.narrow, aten.unsqueeze,
    aten.squeeze, aten.transpose, aten.split, aten.split_with_sizes, aten.unbind, aten.as_strided, aten.cat,
    aten.stack, aten.repeat, aten.constant_pad_nd, aten.slice_scatter, aten.select_scatter,
    aten.alias, aten.detach, aten.embedding, aten.index_select, aten.gather, aten.index,
    family="views",
)
def views(op, *args, **kwargs):
    """Reference kernel: torch moves the data; on device these become access patterns or (indirect) DMA."""
    return op(*args, **kwargs)


ACCESS_PATTERNS = (
    aten.view, aten._unsafe_view, aten.reshape, aten.expand, aten.slice, aten.select, aten.narrow, aten.unsqueeze,
    aten.squeeze, aten.transpose, aten.split, aten.split_with_sizes, aten.unbind, aten.as_strided, aten.alias,
    aten.detach,
)


@lowers(*ACCESS_PATTERNS, family="views", target="simulator")
def access_pattern(op, *args, **kwargs):
    """A view on device is the access pattern of the consumer's DMA: the strided view, no data moved.

    Kernels may hand back another memory layout than eager's (a contiguous attention output where eager's is
    transposed), so a `view` the new strides cannot express becomes a reshape: one copy, the DMA the device does.
    """
    if op.overloadpacket in (aten.view, aten._unsafe_view):
        return args[0].reshape(args[1])
    return op(*args, **kwargs)


def _cat_source(count: int, name: str) -> str:
    params = ", ".join(f"x{i}" for i in range(count))
    lines = [codegen.HEADER, "@nki.jit", f"def {name}({params}, outer, total, widths):",
             "    out = nl.ndarray((outer, total), dtype=x0.dtype, buffer=nl.shared_hbm)"]
    offset = "0"
    for i in range(count):
        lines.append(f"    if widths[{i}] > 0:")
        lines.append(f"        nisa.dma_copy(dst=out[0:outer, {offset}:{offset} + widths[{i}]], src=x{i})")
        offset = f"{offset} + widths[{i}]"
    lines.append("    return out")
    return "\n".join(lines) + "\n"


def _cat_refusal(node: fx.Node) -> str | None:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dtype not in codegen.NKI_DTYPES:
        return "cat of a dtype NKI cannot store"
    if any(arg.meta["val"].dtype != value.dtype for arg in node.args[0]):
        return "cat of mixed dtypes"
    return None


@lowers(aten.cat, family="views", target="simulator", accepts=_cat_refusal)
def cat(op, tensors, dim=0):
    """torch.cat as one DMA per input into its slice of the result, each input viewed as [outer, width]."""
    tensors = [t for t in tensors if t.numel() or t.dim() > 1]
    dim = dim % tensors[0].dim()
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    outer = math.prod(shape[:dim])
    if outer * math.prod(shape[dim:]) == 0:
        return torch.cat(tensors, dim)
    widths = tuple(math.prod(t.shape[dim:]) for t in tensors)
    name = codegen.source_name("cat", str(len(tensors)))
    kernel = codegen.compile_source(_cat_source(len(tensors), name), name)
    parts = [codegen.to_device(t.contiguous()).reshape(outer, w) for t, w in zip(tensors, widths, strict=True)]
    out = launch(kernel, *parts, outer, sum(widths), widths)
    return codegen.from_device(out.reshape(shape), tensors[0].dtype)


def _embedding_refusal(node: fx.Node) -> str | None:
    table = node.args[0].meta["val"]
    if table.dim() != 2:
        return "an embedding table that is not 2-D"
    return None


@lowers(aten.embedding, family="views", target="simulator", accepts=_embedding_refusal, handles_empty=False)
def embedding(op, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """The library's indirect-DMA gather (`kernels.embedding`); indices narrow to int32 on the way in."""
    from neuron_dynamo.kernels.embedding import embedding_kernel

    return launch(embedding_kernel, codegen.to_device(indices.contiguous()), weight.contiguous())


def _scatter_source(name: str) -> str:
    return (f"{codegen.HEADER}@nki.jit\ndef {name}(base, src, outer, width, start, stop):\n"
            "    out = nl.ndarray((outer, width), dtype=base.dtype, buffer=nl.shared_hbm)\n"
            "    nisa.dma_copy(dst=out, src=base)\n"
            "    nisa.dma_copy(dst=out[0:outer, start:stop], src=src)\n"
            "    return out\n")


def _slice_scatter_refusal(node: fx.Node) -> str | None:
    base, src = (arg.meta["val"] for arg in node.args[:2])
    step = node.args[5] if len(node.args) > 5 else node.kwargs.get("step", 1)
    if step != 1 or base.dtype != src.dtype or base.dtype not in codegen.NKI_DTYPES:
        return "a strided or casting slice_scatter"
    return None


@lowers(aten.slice_scatter, family="views", target="simulator", accepts=_slice_scatter_refusal)
def slice_scatter(op, base, src, dim=0, start=None, end=None, step=1):
    """base with src written into base[..., start:end, ...]: two DMAs over [outer, dim · inner] views."""
    dim = dim % base.dim()
    size = base.shape[dim]
    start, end = slice(start, end).indices(size)[:2]
    outer, inner = math.prod(base.shape[:dim]), math.prod(base.shape[dim + 1:])
    if base.numel() == 0 or end <= start:
        return base.clone()
    name = codegen.source_name("slice_scatter", "v1")
    kernel = codegen.compile_source(_scatter_source(name), name)
    out = launch(kernel, codegen.to_device(base.contiguous()).reshape(outer, size * inner),
                 codegen.to_device(src.contiguous()).reshape(outer, (end - start) * inner), outer, size * inner,
                 start * inner, end * inner)
    return codegen.from_device(out.reshape(base.shape), base.dtype)


# ------------------------------------------------------------------------------------------------ index writes
# Written as one-hot comparisons against an iota of the indexed dim, which the code generator fuses, and (for the
# accumulating index_put of an embedding backward) a one-hot matmul on TensorE. Exact: `where`, not a product, picks
# the values, and each one-hot matmul sum adds one term per index. (The gathers are in `indexing`.)


@lowers(aten.scatter, aten.index_put, family="views")
def index_ops(op, *args, **kwargs):
    """Reference kernel: torch indexes."""
    return op(*args, **kwargs)


def _last_dim(node: fx.Node, dim: int) -> bool:
    return dim in (-1, node.args[0].meta["val"].dim() - 1)


def _scatter_refusal(node: fx.Node) -> str | None:
    if node.target is not aten.scatter.value or not _last_dim(node, node.args[1]):
        return "a scatter other than of a scalar along the last dim"
    if node.args[2].meta["val"].shape[-1] != 1 or node.meta["val"].dtype not in codegen.NKI_DTYPES:
        return "a scatter of more than one index per row"
    return None


@lowers(aten.scatter, family="views", target="simulator", accepts=_scatter_refusal)
def scatter(op, base, dim, index, value):
    from neuron_dynamo.lowering.generated import run_traced

    def put(base, index):
        return torch.where(torch.arange(base.shape[-1]) == index, torch.tensor(value, dtype=base.dtype), base)

    return run_traced(f"scatter:{value!r}", put, [base, index])


def _index_put_refusal(node: fx.Node) -> str | None:
    base, indices = node.args[0].meta["val"], node.args[1]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    if not accumulate or len(indices) != 1 or indices[0] is None or base.dim() != 2:
        return "an index_put other than accumulating rows of a 2-D tensor"
    if base.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"an index_put into {base.dtype}"
    return None


@lowers(aten.index_put, family="views", target="simulator", accepts=_index_put_refusal)
def index_put(op, base, indices, values, accumulate=False):
    """base[ids] += values (the embedding backward) as base + one_hot(ids)ᵀ @ values on TensorE."""
    from neuron_dynamo.lowering.generated import run_traced

    def accumulate_rows(base, ids, values):
        rows = values.reshape(-1, base.shape[-1])
        one_hot = (ids.reshape(-1, 1) == torch.arange(base.shape[0])).to(base.dtype)
        return base + one_hot.t() @ rows

    return run_traced("index_put", accumulate_rows, [base, indices[0], values])
