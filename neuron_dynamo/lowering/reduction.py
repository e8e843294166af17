"""Reductions and scans along one or more dims: VectorE work in NKI, fused with the element-wise ops around them.

On the NKI targets sum/mean/amax/amin are generated kernels over a [rows, cols] view with the kept dims on
partitions and the reduced dims along the free axis (`codegen.plan_reduction`). When the reduced dims lead (the
bias gradients of a backward graph: a sum over batch and sequence), the data is turned by the library's TensorE
transpose kernel first, so every partition works.

The other reductions are plain torch code of those kernels (`generated.run_traced`): norms, any/all, the extremes
and their first index, logsumexp, variances. Scans (cumsum, cumprod, cummax/cummin, logcumsumexp) and products are
VectorE `tensor_tensor_scan` library kernels (`kernels.scans`), sequential in fp32 as torch's CPU kernels are.
"""

import dataclasses
import functools
import math

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen, int_ranges
from neuron_dynamo.lowering.registry import lowers
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten


@lowers(
    aten.sum, aten.mean, aten.amax, aten.amin, aten.max, aten.min, aten.var, aten.var_mean, aten.std, aten.prod,
    aten.argmax, aten.argmin, aten.any, aten.all, aten.logsumexp, aten.cumsum, aten.cumprod, aten.logcumsumexp,
    aten.cummax, aten.cummin, aten.linalg_vector_norm,
    family="reduction",
)
def reduction(op, *args, **kwargs):
    """Reference kernel: torch reduces; the NKI code generator emits reduction chains."""
    return op(*args, **kwargs)


KINDS = {aten.sum: "sum", aten.mean: "mean", aten.amax: "amax", aten.amin: "amin"}


def _dims(x: torch.Tensor, dims) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.dim()))
    return [d % max(x.dim(), 1) for d in ([dims] if isinstance(dims, int) else dims)]


def _refusal(node: fx.Node) -> str | None:
    value, source = node.meta.get("val"), node.args[0].meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dtype not in codegen.NKI_DTYPES:
        return "a reduction result NKI cannot store"
    if source.dtype not in codegen.NKI_DTYPES or (source.dtype == torch.bool and node.target.overloadpacket
                                                  is not aten.sum):
        return f"a reduction over {source.dtype}"
    if len(node.args) > 1 and isinstance(node.args[1], fx.Node):
        return "reduction dims given by a tensor"
    return _integer_refusal(node, source)


def _static_int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, RuntimeError):  # a symbolic size: no bound is known
        return None


def _integer_refusal(node: fx.Node, source: torch.Tensor) -> str | None:
    """The kernels reduce in fp32 (VectorE): exact for integers while every partial sum stays below 2**24, and for
    a max/min of integers fp32 holds exactly (int8/uint8/int16, not int32/int64)."""
    if source.dtype.is_floating_point:
        return None
    packet = node.target.overloadpacket
    name = str(source.dtype).removeprefix("torch.")
    magnitude = int_ranges.magnitude(node.args[0])  # what the graph proves about its values, else the dtype's
    if packet in (aten.amax, aten.amin):
        if magnitude > int_ranges.FP32_EXACT:
            return f"a {packet.__name__} of {name}: the engines compare in fp32, which rounds above 2**24"
        return None
    value = node.meta["val"]
    if not value.dtype.is_floating_point:  # an integer sum: exact only while it cannot reach 2**24
        count = _static_int(source.numel()) if not source.dim() else _static_int(
            math.prod(source.shape[d] for d in _dims(source, node.args[1] if len(node.args) > 1 else None)))
        if count is None or count * magnitude >= int_ranges.FP32_EXACT:
            return (f"an integer sum of {name} that can reach 2**24: the engines add in fp32, which would round "
                    "(torch adds integers exactly)")
    return None


@lowers(aten.sum, aten.mean, aten.amax, aten.amin, family="reduction", target="simulator", accepts=_refusal,
        handles_empty=True)
def reduce(op, x, dims=None, keepdim=False, dtype=None):
    """One generated reduction kernel over [kept, reduced]; the result takes the graph's shape and dtype."""
    plan = _plan(op, x.shape, x.dtype, tuple(dims) if isinstance(dims, list) else dims, keepdim, dtype)
    if plan.kernel is None:  # nothing to move or add: the (empty or identity) result needs no kernel
        exact = {aten.sum: aten.sum.dim_IntList, aten.mean: aten.mean.dim}.get(op.overloadpacket)
        return op(x, plan.dims, keepdim) if exact is None else exact(x, plan.dims, keepdim, dtype=dtype)
    if plan.transposed:
        view = launch(_transpose_kernel(), x.contiguous().reshape(plan.cols, plan.rows))
    else:  # the kernel views the kept dims as rows itself
        view = x.permute(plan.order) if plan.order else x
    if view.dtype in codegen.STORED_AS_OTHER:
        view = codegen.to_device(view)
    out = launch(plan.kernel, view, plan.device_shape, plan.rows, plan.cols)
    if out.dtype != plan.out_dtype or plan.device_shape != plan.shape:
        out = codegen.from_device(out, plan.out_dtype).reshape(plan.shape)
    return out


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How `reduce` runs one op at one shape and set of arguments (worked out once: a region reduces the same
    shapes every run)."""

    dims: list[int]
    shape: tuple[int, ...]  # the result's
    device_shape: tuple[int, ...]  # the kernel's result (a 0-dim result is one element on device)
    out_dtype: torch.dtype
    order: list[int] | None  # a permutation bringing the reduced dims last, when they are not
    transposed: bool  # the reduced dims lead: the TensorE transpose kernel turns [reduced, kept] first
    rows: int
    cols: int
    kernel: object  # None when there is nothing to reduce


@functools.lru_cache(maxsize=1024)
def _plan(op, shape: torch.Size, x_dtype: torch.dtype, dims, keepdim: bool, dtype) -> _Plan:
    packet = op.overloadpacket
    out_dtype = dtype or (torch.int64 if packet is aten.sum and not x_dtype.is_floating_point else x_dtype)
    rank = len(shape)
    dims = list(range(rank)) if dims is None or dims == () else [
        d % max(rank, 1) for d in ([dims] if isinstance(dims, int) else dims)]
    kept = tuple(1 if d in dims else s for d, s in enumerate(shape)) if keepdim else tuple(
        s for d, s in enumerate(shape) if d not in dims)
    order, rows, cols = codegen.plan_reduction(shape, dims)
    leading = order != list(range(rank))
    transposed = leading and order == [*range(len(dims), rank), *range(len(dims))] and x_dtype.is_floating_point
    kernel = None if rows * cols == 0 else _reduction_kernel(
        KINDS[packet], codegen.nki_dtype(x_dtype), codegen.nki_dtype(out_dtype))
    return _Plan(dims, kept, kept or (1,), out_dtype, order if leading and not transposed else None, transposed,
                 rows, cols, kernel)


@functools.cache
def _transpose_kernel():
    from neuron_dynamo.kernels.transpose import transpose_kernel

    return transpose_kernel


@functools.cache
def _reduction_kernel(kind: str, in_dtype: str, out_dtype: str):
    """The generated kernel of one reduction kind and dtype pair (named and built once, not at every call)."""
    name = codegen.source_name(f"reduce_{kind}", f"{in_dtype}:{out_dtype}")
    return codegen.compile_source(codegen.reduction_source(kind, in_dtype, out_dtype, name), name)


def _arg(node: fx.Node, index: int, name: str, default=None):
    """An argument of `node` given by position or keyword."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _count(shape, dims: list[int]) -> int:
    return math.prod(shape[d] for d in dims) if len(shape) else 1


def _kept_shape(x: torch.Tensor, dims: list[int], keepdim: bool) -> list[int]:
    if keepdim:
        return [1 if d in dims else s for d, s in enumerate(x.shape)]
    return [s for d, s in enumerate(x.shape) if d not in dims]


def _exact_in_fp32(node: fx.Node, what: str) -> str | None:
    """The kernels compute in fp32: floats are exact after a widening; integers only below 2**24."""
    source = node.args[0].meta["val"]
    if source.dtype in codegen.FLOAT_DTYPES:
        return None
    if source.dtype not in codegen.NKI_DTYPES:
        return f"a {what} of {source.dtype}"
    if int_ranges.magnitude(node.args[0]) > int_ranges.FP32_EXACT:
        name = str(source.dtype).removeprefix("torch.")
        return f"a {what} of {name}: the engines compute in fp32, which rounds above 2**24"
    return None


def _variance_refusal(node: fx.Node) -> str | None:
    if node.target._overloadname != "correction":
        return f"{node.target} (only the .correction overload, which AOTAutograd produces)"
    source = node.args[0].meta["val"]
    if source.dtype not in codegen.FLOAT_DTYPES:
        return f"a variance of {source.dtype}"
    if isinstance(_arg(node, 1, "dim"), fx.Node):
        return "reduction dims given by a tensor"
    return None


@lowers(aten.var, aten.var_mean, aten.std, family="reduction", target="simulator", accepts=_variance_refusal,
        handles_empty=True)
def variance(op, x, dims=None, *, correction=None, keepdim=False):
    """Two passes in fp32 (a mean kernel, then a fused (x - mean)² and sum): exact when |mean| ≫ std, unlike
    E[x²] - E[x]². The divisor is max(0, N - correction) as in torch, so one element with correction 1 gives 0/0 =
    NaN. With no element to reduce (or none to produce) the NaN/empty result needs no kernel."""
    from neuron_dynamo.lowering.generated import run_traced

    reduced = _dims(x, dims)
    if _count(x.shape, reduced) == 0 or x.numel() == 0:
        return op(x, dims, correction=correction, keepdim=keepdim)
    divisor = max(_count(x.shape, reduced) - (1 if correction is None else correction), 0)
    scale = 1.0 / divisor if divisor else math.inf
    packet, shape = op.overloadpacket, _kept_shape(x, reduced, keepdim)

    def moments(x):
        wide = x.to(torch.float32)
        mean = wide.mean(reduced, keepdim=True)
        var = ((wide - mean) * (wide - mean)).sum(reduced, keepdim=keepdim) * scale
        if packet is aten.std:
            return var.sqrt().to(x.dtype)
        if packet is aten.var:
            return var.to(x.dtype)
        return var.to(x.dtype), mean.reshape(shape).to(x.dtype)

    return run_traced(f"{packet.__name__}:{reduced}:{scale}:{keepdim}", moments, [x])


def _cumsum_refusal(node: fx.Node) -> str | None:
    value, source = node.meta.get("val"), node.args[0].meta["val"]
    if value.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32):
        return f"a cumsum into {value.dtype}"
    if source.dtype not in codegen.NKI_DTYPES:
        return f"a cumsum of {source.dtype}"
    length = _static_int(source.shape[node.args[1]]) if source.dim() else 1
    if not value.dtype.is_floating_point:
        magnitude = int_ranges.magnitude(node.args[0])
        if length is None or length * magnitude >= int_ranges.FP32_EXACT:
            name = str(source.dtype).removeprefix("torch.")
            return (f"an integer cumsum of {name} that can reach 2**24: VectorE adds in fp32, which would round "
                    "(torch adds integers exactly)")
    return None


@lowers(aten.cumsum, family="reduction", target="simulator", accepts=_cumsum_refusal, handles_empty=True)
def cumsum(op, x, dim, dtype=None):
    """A running sum: VectorE scan, sequential in fp32 as torch's CPU kernel (so an inf or NaN reaches only the
    sums after it).

    Integer sums are exact while they stay below 2²⁴ (fp32's integer range): `_cumsum_refusal` runs the others
    eagerly, and a sum that reaches it anyway raises rather than rounds.
    """
    from neuron_dynamo.kernels.scans import cumsum_kernel
    from neuron_dynamo.lowering.generated import run_traced

    if x.numel() == 0:  # an empty scan: nothing to compute
        return op(x, dim, dtype=dtype)
    out_dtype = dtype or (torch.int64 if not x.dtype.is_floating_point else x.dtype)
    if not out_dtype.is_floating_point and x.to(torch.int64).abs().sum() >= 2**24:
        raise codegen.CodegenError("an integer cumsum beyond 2**24 is not exact in fp32")
    dim = dim % max(x.dim(), 1)
    running = launch(cumsum_kernel, _rows_along(x, [dim]))
    return _from_rows(run_traced(f"cast:{out_dtype}", lambda r: r.to(out_dtype), [running]), x, dim)


# ------------------------------------------------------------------------------------------------ norms, any/all
def _norm_refusal(node: fx.Node) -> str | None:
    source, value = node.args[0].meta["val"], node.meta["val"]
    if source.dtype not in codegen.FLOAT_DTYPES or value.dtype not in codegen.FLOAT_DTYPES:
        return f"a vector norm of {source.dtype} into {value.dtype}"
    order = _arg(node, 1, "ord", 2)
    if not isinstance(order, (int, float)) or isinstance(order, bool):
        return "a vector norm whose order is not a number"
    if isinstance(_arg(node, 2, "dim"), fx.Node):
        return "reduction dims given by a tensor"
    return None


@lowers(aten.linalg_vector_norm, family="reduction", target="simulator", accepts=_norm_refusal, handles_empty=True)
def vector_norm(op, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """(Σ|x|^p)^(1/p) in fp32 with the special orders as torch defines them: max |x| (inf), min |x| (-inf), the
    count of non-zeros (0). An empty reduction (norm 0, or torch's own error for ±inf) needs no kernel."""
    from neuron_dynamo.lowering.generated import run_traced

    reduced = _dims(x, dim)
    if _count(x.shape, reduced) == 0 or x.numel() == 0:
        return op(x, ord, dim, keepdim, dtype=dtype)
    out_dtype = dtype or x.dtype
    order = float(ord)

    def norm(x):
        size = x.to(out_dtype).to(torch.float32).abs()
        if order == math.inf:
            total = size.amax(reduced, keepdim=keepdim)
        elif order == -math.inf:
            total = size.amin(reduced, keepdim=keepdim)
        elif order == 0:
            total = (size != 0).to(torch.float32).sum(reduced, keepdim=keepdim)
        elif order == 1:
            total = size.sum(reduced, keepdim=keepdim)
        elif order == 2:
            total = (size * size).sum(reduced, keepdim=keepdim).sqrt()
        else:
            total = size.pow(order).sum(reduced, keepdim=keepdim).pow(1.0 / order)
        return total.to(out_dtype)

    return run_traced(f"vector_norm:{order}:{reduced}:{keepdim}:{out_dtype}", norm, [x])


def _truth_refusal(node: fx.Node) -> str | None:
    source = node.args[0].meta["val"]
    if source.dtype not in codegen.NKI_DTYPES:
        return f"an any/all of {source.dtype}"
    if source.dtype == torch.int64 and int_ranges.magnitude(node.args[0]) > codegen.INT32_RANGE[1]:
        return "an any/all of int64 values the device's int32 cannot hold"
    if isinstance(_arg(node, 1, "dim"), fx.Node):
        return "reduction dims given by a tensor"
    return None


@lowers(aten.any, aten.all, family="reduction", target="simulator", accepts=_truth_refusal, handles_empty=True)
def truth(op, x, dim=None, keepdim=False):
    """any: some element is non-zero (NaN is); all: no element is zero. Counted in fp32, which is exact here: a
    count of ones never rounds back to zero. `any.dims` with an empty list reduces nothing, as in torch."""
    from neuron_dynamo.lowering.generated import run_traced

    is_any = op.overloadpacket is aten.any
    out_dtype = torch.uint8 if x.dtype == torch.uint8 else torch.bool
    reduced = None if (op._overloadname == "dims" and dim is not None and len(dim) == 0) else _dims(x, dim)

    def test(x):
        hits = (x != 0) if is_any else (x == 0)
        if reduced is None:
            return (x != 0).to(out_dtype)
        count = hits.to(torch.float32).sum(reduced, keepdim=keepdim)
        return ((count > 0) if is_any else (count == 0)).to(out_dtype)

    return run_traced(f"{op.overloadpacket.__name__}:{reduced}:{keepdim}:{out_dtype}", test, [x])


# ------------------------------------------------------------------------------------------------ extremes, indices
def _extreme_refusal(node: fx.Node) -> str | None:
    if node.target._overloadname not in ("default", "dim"):
        return f"{node.target}: an element-wise max/min, not a reduction"
    if isinstance(_arg(node, 1, "dim"), fx.Node):
        return "reduction dims given by a tensor"
    return _exact_in_fp32(node, node.target.overloadpacket.__name__)


def _first_extreme_index(wide: torch.Tensor, dim: int, keepdim: bool, largest: bool) -> tuple:
    """(extreme, first index of it) along `dim` of an fp32 tensor: NaN is the extreme wherever there is one, as
    in torch. Plain torch code of lowered ops, for `run_traced`."""
    extreme = wide.amax(dim, keepdim=True) if largest else wide.amin(dim, keepdim=True)
    n = wide.shape[dim]
    positions = torch.arange(n, dtype=torch.float32).reshape([n if d == dim else 1 for d in range(wide.dim())])
    hit = (wide == extreme) | (wide != wide)
    index = torch.where(hit, positions, torch.full_like(positions, n)).amin(dim, keepdim=keepdim)
    return (extreme if keepdim else extreme.squeeze(dim)), index.to(torch.int64)


@lowers(aten.argmax, aten.argmin, family="reduction", target="simulator", accepts=_extreme_refusal)
def arg_extreme(op, x, dim=None, keepdim=False):
    """The first index of the maximum (minimum), NaN counting as both, from a max and a masked min of positions
    (exact in fp32 for rows shorter than 2**24)."""
    from neuron_dynamo.lowering.generated import run_traced

    largest = op.overloadpacket is aten.argmax

    def index(x):
        flat = x.reshape(-1) if dim is None or x.dim() == 0 else x
        found = _first_extreme_index(flat.to(torch.float32), 0 if dim is None else dim % max(x.dim(), 1),
                                     keepdim and dim is not None and x.dim() > 0, largest)[1]
        return found.reshape([1] * x.dim()) if keepdim and dim is None else found

    return run_traced(f"{op.overloadpacket.__name__}:{dim}:{keepdim}", index, [x])


@lowers(aten.max, aten.min, family="reduction", target="simulator", accepts=_extreme_refusal)
def extreme(op, x, dim=None, keepdim=False):
    """max/min over everything (amax/amin), or along one dim with the first index of the extreme (`max.dim`)."""
    from neuron_dynamo.lowering.generated import run_traced

    largest = op.overloadpacket is aten.max
    if dim is None:
        def value(x):
            wide = x.to(torch.float32)
            return (wide.amax() if largest else wide.amin()).to(x.dtype)

        return run_traced(f"{op.overloadpacket.__name__}:all", value, [x])

    def values_indices(x):
        flat = x.reshape(1) if x.dim() == 0 else x
        values, indices = _first_extreme_index(flat.to(torch.float32), dim % max(x.dim(), 1), keepdim, largest)
        return values.reshape(x.shape if x.dim() == 0 else values.shape).to(x.dtype), indices.reshape(
            x.shape if x.dim() == 0 else indices.shape)

    return run_traced(f"{op.overloadpacket.__name__}:{dim}:{keepdim}", values_indices, [x])


def _logsumexp_refusal(node: fx.Node) -> str | None:
    if isinstance(_arg(node, 1, "dim"), fx.Node):
        return "reduction dims given by a tensor"
    return _exact_in_fp32(node, "logsumexp")


@lowers(aten.logsumexp, family="reduction", target="simulator", accepts=_logsumexp_refusal, handles_empty=True)
def logsumexp(op, x, dim, keepdim=False):
    """log Σ exp(x - m) + m with m the max (0 where it is ±inf, as torch), in fp32. An empty reduction (-inf) or
    result needs no kernel."""
    from neuron_dynamo.lowering.generated import run_traced

    reduced = _dims(x, dim)
    if _count(x.shape, reduced) == 0 or x.numel() == 0:
        return op(x, dim, keepdim)
    out_dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()

    def lse(x):
        wide = x.to(torch.float32)
        peak = wide.amax(reduced, keepdim=True)
        peak = torch.where(peak.abs() == math.inf, torch.zeros_like(peak), peak)
        total = (wide - peak).exp().sum(reduced, keepdim=True).log() + peak
        return total.reshape(_kept_shape(x, reduced, keepdim)).to(out_dtype)

    return run_traced(f"logsumexp:{reduced}:{keepdim}:{out_dtype}", lse, [x])


# ------------------------------------------------------------------------------------------------ products, scans
def _rows_along(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """x as [rows, n] with the dims `dims` along the free axis (the scan and product kernels' layout), in fp32."""
    from neuron_dynamo.lowering.generated import run_traced

    order, rows, cols = codegen.plan_reduction(x.shape, dims)
    view = x.permute(order).reshape(rows, cols).contiguous()
    return run_traced("rows_f32", lambda t: t.to(torch.float32), [view]) if view.dtype != torch.float32 else view


def _from_rows(rows: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """The inverse of `_rows_along(x, [dim])` for a result of x's shape."""
    if x.dim() == 0:
        return rows.reshape(())
    return rows.reshape(x.movedim(dim, -1).shape).movedim(-1, dim)


def _product_refusal(node: fx.Node) -> str | None:
    source, value = node.args[0].meta["val"], node.meta["val"]
    if value.dtype not in codegen.NKI_DTYPES:
        return f"a product into {value.dtype}"
    if isinstance(_arg(node, 1, "dim"), fx.Node):
        return "reduction dims given by a tensor"
    if source.dtype in codegen.FLOAT_DTYPES:
        return None
    if source.dtype not in codegen.NKI_DTYPES:
        return f"a product of {source.dtype}"
    if int_ranges.magnitude(node.args[0]) > 1:  # a product of integers reaches 2**24 after a few factors
        return ("an integer product: the engines multiply in fp32, which rounds above 2**24 (torch multiplies "
                "integers exactly)")
    return None


@lowers(aten.prod, family="reduction", target="simulator", accepts=_product_refusal, handles_empty=True)
def product(op, x, dim=None, keepdim=False, *, dtype=None):
    """The last column of a running product (VectorE scan, sequential in fp32 like torch). An empty product (1)
    or result needs no kernel."""
    from neuron_dynamo.kernels.scans import cumprod_kernel
    from neuron_dynamo.lowering.generated import run_traced

    reduced = _dims(x, dim)
    if _count(x.shape, reduced) == 0 or x.numel() == 0:
        return op(x, dtype=dtype) if op._overloadname == "default" else op(x, dim, keepdim, dtype=dtype)
    out_dtype = dtype or (x.dtype if x.dtype.is_floating_point else torch.int64)
    running = launch(cumprod_kernel, _rows_along(x, reduced))
    shape = _kept_shape(x, reduced, keepdim)
    return run_traced(f"last_column:{shape}:{out_dtype}", lambda r: r[:, -1].reshape(shape).to(out_dtype), [running])


def _scan_refusal(node: fx.Node) -> str | None:
    packet = node.target.overloadpacket
    source = node.args[0].meta["val"]
    if packet in (aten.cummax, aten.cummin):
        return _exact_in_fp32(node, packet.__name__)
    if source.dtype not in codegen.FLOAT_DTYPES or node.meta["val"].dtype not in codegen.FLOAT_DTYPES:
        return f"a {packet.__name__} of {source.dtype} into {node.meta['val'].dtype}"
    return None


@lowers(aten.cumprod, family="reduction", target="simulator", accepts=_scan_refusal, handles_empty=True)
def cumprod(op, x, dim, *, dtype=None):
    """A running product: VectorE scan, sequential in fp32 as torch's CPU kernel."""
    from neuron_dynamo.kernels.scans import cumprod_kernel
    from neuron_dynamo.lowering.generated import run_traced

    if x.numel() == 0:  # an empty scan: nothing to compute
        return op(x, dim, dtype=dtype)
    dim = dim % max(x.dim(), 1)
    running = launch(cumprod_kernel, _rows_along(x, [dim]))
    out_dtype = dtype or x.dtype
    return _from_rows(run_traced(f"cast:{out_dtype}", lambda r: r.to(out_dtype), [running]), x, dim)


@lowers(aten.cummax, aten.cummin, family="reduction", target="simulator", accepts=_scan_refusal, handles_empty=True)
def running_extreme(op, x, dim):
    """Running max (min) and its index as torch's CPU kernel defines it: the last position that reached the
    extreme (ties move the index), and once a NaN has been seen, the last NaN. Two VectorE scans: the values, then
    the running max of the positions that set them."""
    from neuron_dynamo.kernels.scans import cummax_kernel, cummin_kernel
    from neuron_dynamo.lowering.generated import run_traced

    if x.numel() == 0:  # an empty scan: nothing to compute
        return op(x, dim)
    dim = dim % max(x.dim(), 1)
    rows = _rows_along(x, [dim])
    values = launch(cummax_kernel if op.overloadpacket is aten.cummax else cummin_kernel, rows)
    n = rows.shape[1]

    def setters(rows, values):
        positions = torch.arange(n, dtype=torch.float32).reshape(1, n)
        hit = (rows == values) | (rows != rows)
        return torch.where(hit, positions, torch.full_like(positions, -1.0))

    indices = launch(cummax_kernel, run_traced(f"scan_setters:{n}", setters, [rows, values]))

    def cast(values, indices):
        return values.to(x.dtype), indices.to(torch.int64)

    values, indices = run_traced(f"scan_cast:{x.dtype}", cast, [values, indices])
    return _from_rows(values, x, dim), _from_rows(indices, x, dim)


@lowers(aten.logcumsumexp, family="reduction", target="simulator", accepts=_scan_refusal, handles_empty=True)
def logcumsumexp(op, x, dim):
    """An online log-sum-exp: with m the running max, r[i] = r[i-1]·exp(m[i-1] - m[i]) + exp(x[i] - m[i]) (a
    linear-recurrence scan) and the result log r + m. Equal maxima (±inf included) scale by exactly 1, so -inf
    prefixes stay -inf and +inf stays +inf as in torch; a NaN propagates."""
    from neuron_dynamo.kernels.scans import cummax_kernel, linear_recurrence_kernel
    from neuron_dynamo.lowering.generated import run_traced

    if x.numel() == 0:  # an empty scan: nothing to compute
        return op(x, dim)
    dim = dim % max(x.dim(), 1)
    rows = _rows_along(x, [dim])
    peak = launch(cummax_kernel, rows)

    def factors(rows, peak):
        before = torch.cat([torch.full_like(peak[:, :1], -math.inf), peak[:, :-1]], dim=1)
        one = torch.ones_like(peak)
        return (torch.where(before == peak, one, (before - peak).exp()),
                torch.where(rows == peak, one, (rows - peak).exp()))

    scale, addend = run_traced("logcumsumexp_factors", factors, [rows, peak])
    total = launch(linear_recurrence_kernel, scale, addend)
    out = run_traced(f"logcumsumexp_finish:{x.dtype}", lambda t, p: (t.log() + p).to(x.dtype), [total, peak])
    return _from_rows(out, x, dim)
