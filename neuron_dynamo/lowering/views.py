"""Views, reshapes and data movement: free on device when they only change the access pattern, DMA otherwise.

On the NKI targets a pure view (reshape of contiguous data, transpose, permute, slice, expand, ...) is not a
kernel: it changes the access pattern the next kernel's DMA reads with, so the simulator kernel is the strided
torch view itself and no data moves. `cat` is a generated DMA kernel (HBM → HBM copies into the slices of the
result), `stack` the same over unsqueezed inputs. A `repeat` is one DMA whose source access pattern walks the
input again for each repetition (step 0), and the view scatters (`slice_scatter`, `select_scatter`,
`diagonal_scatter`, `as_strided_scatter`) copy the base and then DMA the source into the access pattern of the
view. The gathers and index writes are in `indexing`.
"""

import functools
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
    aten.stack, aten.repeat, aten.constant_pad_nd, aten.slice_scatter, aten.select_scatter, aten.diagonal_scatter,
    aten.as_strided_scatter, aten.alias, aten.detach, aten.embedding, aten.index_select, aten.gather, aten.index,
    aten.diagonal, aten.unfold, aten.flip,
    family="views",
)
def views(op, *args, **kwargs):
    """Reference kernel: torch moves the data; on device these become access patterns or (indirect) DMA."""
    return op(*args, **kwargs)


ACCESS_PATTERNS = (
    aten.view, aten._unsafe_view, aten.reshape, aten.expand, aten.slice, aten.select, aten.narrow, aten.unsqueeze,
    aten.squeeze, aten.transpose, aten.split, aten.split_with_sizes, aten.unbind, aten.as_strided, aten.alias,
    aten.detach, aten.diagonal, aten.unfold,
)


# The tensor methods that are these views, with the op's own arguments: their kernels call them directly (a view
# needs only torch's own per-op cost; a region takes hundreds per run). `view` is `reshape` (`access_pattern`).
METHODS = {
    aten.view.default: torch.Tensor.reshape, aten._unsafe_view.default: torch.Tensor.reshape,
    aten.reshape.default: torch.Tensor.reshape, aten.expand.default: torch.Tensor.expand,
    aten.unsqueeze.default: torch.Tensor.unsqueeze, aten.squeeze.default: torch.Tensor.squeeze,
    aten.squeeze.dim: torch.Tensor.squeeze, aten.squeeze.dims: torch.Tensor.squeeze,
    aten.transpose.int: torch.Tensor.transpose, aten.detach.default: torch.Tensor.detach,
    aten.select.int: torch.Tensor.select, aten.narrow.default: torch.Tensor.narrow,
}


@lowers(*ACCESS_PATTERNS, family="views", target="simulator", direct=METHODS)
def access_pattern(op, *args, **kwargs):
    """A view on device is the access pattern of the consumer's DMA: the strided view, no data moved.

    Kernels may hand back another memory layout than eager's (a contiguous attention output where eager's is
    transposed), so a `view` the new strides cannot express becomes a reshape: one copy, the DMA the device does.
    """
    if op.overloadpacket in (aten.view, aten._unsafe_view):
        return args[0].reshape(args[1])
    return op(*args, **kwargs)


@functools.cache
def _cat_kernel(count: int):
    """The DMA kernel of a cat of `count` inputs, generated once: a region calls it with the same count every time."""
    name = codegen.source_name("cat", str(count))
    return codegen.compile_source(_cat_source(count, name), name)


def _cat_source(count: int, name: str) -> str:
    """`kernel(x0, ..., shape, outer, total, widths) -> result of shape`: input i, viewed as [outer, widths[i]],
    copied into its columns of the [outer, total] view of the result."""
    params = ", ".join(f"x{i}" for i in range(count))
    lines = [codegen.HEADER, "@nki.jit", f"def {name}({params}, shape, outer, total, widths):",
             "    result = nl.ndarray(shape, dtype=x0.dtype, buffer=nl.shared_hbm)",
             "    out = result.reshape((outer, total))"]
    offset = "0"
    for i in range(count):
        lines.append(f"    if widths[{i}] > 0:")
        lines.append(f"        nisa.dma_copy(dst=out[0:outer, {offset}:{offset} + widths[{i}]], "
                     f"src=x{i}.reshape((outer, widths[{i}])))")
        offset = f"{offset} + widths[{i}]"
    lines.append("    return result")
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
    kept = [t for t in tensors if t.numel() or t.dim() > 1]  # torch skips 1-D empties
    if not kept:
        return torch.cat(tensors, dim)  # nothing to move
    tensors = kept
    dim = dim % tensors[0].dim()
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    outer = math.prod(shape[:dim])
    if outer * math.prod(shape[dim:]) == 0:
        return torch.cat(tensors, dim)
    widths = tuple(math.prod(t.shape[dim:]) for t in tensors)
    kernel = _cat_kernel(len(tensors))
    out = launch(kernel, *[codegen.to_device(t) for t in tensors], tuple(shape), outer, sum(widths), widths)
    return codegen.from_device(out, tensors[0].dtype)


@lowers(aten.scatter, aten.scatter_add, aten.scatter_reduce, aten.index_put, aten.index_reduce, aten.put,
        aten.masked_scatter, aten.embedding_dense_backward, family="views")
def index_writes(op, *args, **kwargs):
    """Reference kernel: torch writes; on device these are one-hot comparisons, matmuls and DMA (`indexing`)."""
    return op(*args, **kwargs)


@lowers(aten.stack, family="views", target="simulator", accepts=_cat_refusal)
def stack(op, tensors, dim=0):
    """torch.stack is the cat of the inputs with a new dim of size 1."""
    dim = dim % (tensors[0].dim() + 1)
    return cat(aten.cat.default, [t.unsqueeze(dim) for t in tensors], dim)


# ------------------------------------------------------------------------------------------------ access-pattern DMA
MAX_PATTERN_DIMS = 4  # the free dims a DMA access pattern may have


def merged_pattern(sizes, strides) -> list[list[int]]:
    """`[[step, count], ...]` (outermost first) of a strided view, dims of one element dropped and dims that
    continue each other merged."""
    merged: list[list[int]] = []
    for count, step in zip(sizes, strides, strict=True):
        if count == 1:
            continue
        if merged and merged[-1][0] == step * count:
            merged[-1] = [step, merged[-1][1] * count]
        else:
            merged.append([step, count])
    return merged or [[1, 1]]


def _as_tuples(pattern: list[list[int]]) -> tuple[tuple[int, int], ...]:
    return tuple((step, count) for step, count in pattern)


def _view_pattern(shape, view_of) -> tuple[list[list[int]], int]:
    """The access pattern and offset of `view_of(t)` over a contiguous `t` of `shape`."""
    probe = view_of(torch.empty(shape, device="meta"))
    return merged_pattern(probe.shape, probe.stride()), probe.storage_offset()


def _overlaps(pattern: list[list[int]]) -> bool:
    reach = 0
    for step, count in sorted(pattern):
        if step <= reach:
            return True
        reach += step * (count - 1)
    return False


def _write_source(name: str) -> str:
    """`kernel(base, src, pattern, offset)`: a copy of base with src (viewed as the pattern's counts) DMA'd into the
    access pattern of the copy's allocation."""
    return (f"{codegen.HEADER}@nki.jit\ndef {name}(base, src, pattern, offset):\n"
            "    out = nl.ndarray(base.shape, dtype=base.dtype, buffer=nl.shared_hbm)\n"
            "    nisa.dma_copy(dst=out, src=base)\n"
            "    nisa.dma_copy(dst=out.ap(pattern, offset=offset), src=src.reshape(tuple(n for _, n in pattern)))\n"
            "    return out\n")


def _read_source(name: str) -> str:
    return (f"{codegen.HEADER}@nki.jit\ndef {name}(src, counts, pattern):\n"
            "    out = nl.ndarray(counts, dtype=src.dtype, buffer=nl.shared_hbm)\n"
            "    nisa.dma_copy(dst=out, src=src.ap(pattern, offset=0))\n"
            "    return out\n")


@functools.cache
def _generated(make_source, prefix: str):
    """A generated kernel that depends on nothing but its source (compiled once, not per call)."""
    name = codegen.source_name(prefix, "v1")
    return codegen.compile_source(make_source(name), name)


def strided_write(base: torch.Tensor, src: torch.Tensor, pattern: tuple, offset: int) -> torch.Tensor:
    """base with the view at access pattern `pattern` (`((step, count), ...)`, outermost first) and `offset` replaced
    by src: a copy of base, then one DMA into the view's access pattern."""
    if base.numel() == 0 or src.numel() == 0:
        return base.clone()
    out = launch(_generated(_write_source, "strided_write"), codegen.to_device(base), codegen.to_device(src), pattern,
                 offset)
    out = codegen.from_device(out, base.dtype)
    return out if base.dim() else out.reshape(())  # a 0-dim argument is one element on device


def _pattern_refusal(value: torch.Tensor, pattern: list[list[int]]) -> str | None:
    if value.dtype not in codegen.NKI_DTYPES:
        return f"a strided copy of {value.dtype}"
    if len(pattern) > MAX_PATTERN_DIMS:
        return f"a strided copy needing more than {MAX_PATTERN_DIMS} access-pattern dims"
    return None


def _view_of(node: fx.Node):
    """The view a view-scatter node writes, as a function of its base."""
    args = [arg.meta["val"] if isinstance(arg, fx.Node) else arg for arg in node.args]
    return _VIEWS[node.target.overloadpacket](*args[2:])


_VIEWS = {
    aten.slice_scatter: lambda dim=0, start=None, end=None, step=1: lambda t: t[
        (slice(None),) * (dim % t.dim()) + (slice(start, end, step),)],
    aten.select_scatter: lambda dim, index: lambda t: t.select(dim, index),
    aten.diagonal_scatter: lambda offset=0, dim1=0, dim2=1: lambda t: t.diagonal(offset, dim1, dim2),
    aten.as_strided_scatter: lambda size, stride, storage_offset=None: lambda t: t.as_strided(
        size, stride, storage_offset),
}


def _view_scatter_refusal(node: fx.Node) -> str | None:
    base, src = (arg.meta["val"] for arg in node.args[:2])
    if base.dtype != src.dtype:
        return "a view scatter of a source of another dtype"
    if node.target.overloadpacket is aten.as_strided_scatter and not base.is_contiguous():
        return "an as_strided_scatter into a non-contiguous base"
    pattern, _ = _view_pattern(base.shape, _view_of(node))
    if _overlaps(pattern):
        return "an as_strided_scatter into overlapping elements"
    return _pattern_refusal(base, pattern)


@lowers(aten.slice_scatter, aten.select_scatter, aten.diagonal_scatter, aten.as_strided_scatter, family="views",
        target="simulator", accepts=_view_scatter_refusal)
def view_scatter(op, base, src, *args):
    return strided_write(base, src, *_scatter_pattern(op, tuple(base.shape), _frozen(args)))


@functools.cache
def _scatter_pattern(op, shape: tuple[int, ...], args: tuple) -> tuple[tuple[tuple[int, int], ...], int]:
    """The access pattern and offset a view scatter writes: the same for every call of a static region."""
    pattern, offset = _view_pattern(shape, _VIEWS[op.overloadpacket](*args))
    return _as_tuples(pattern), offset


def _frozen(args: tuple) -> tuple:
    """The scatter's view arguments, hashable (as_strided_scatter's size and stride come as lists)."""
    return tuple(tuple(arg) if isinstance(arg, list) else arg for arg in args)


def _repeat_pattern(shape, repeats) -> tuple[list[int], list[list[int]]]:
    """The output shape of x.repeat(repeats) and the access pattern reading x once per repetition (step 0)."""
    shape = [1] * (len(repeats) - len(shape)) + list(shape)
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    sizes, steps = [], []
    for times, size, stride in zip(repeats, shape, strides, strict=True):
        sizes += [times, size]
        steps += [0, stride]
    return [t * s for t, s in zip(repeats, shape, strict=True)], merged_pattern(sizes, steps)


def _repeat_refusal(node: fx.Node) -> str | None:
    return _pattern_refusal(node.meta["val"], _repeat_pattern(node.args[0].meta["val"].shape, node.args[1])[1])


@lowers(aten.repeat, family="views", target="simulator", accepts=_repeat_refusal)
def repeat(op, x, repeats):
    shape, pattern = _repeat_pattern(x.shape, repeats)
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=x.dtype)
    counts = tuple(count for _, count in pattern)
    out = launch(_generated(_read_source, "repeat"), codegen.to_device(x.contiguous()).reshape(-1), counts,
                 _as_tuples(pattern))
    return codegen.from_device(out.reshape(shape), x.dtype)
