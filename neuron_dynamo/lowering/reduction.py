"""Reductions and scans along one or more dims: VectorE work in NKI, fused with the element-wise ops around them.

On the NKI targets sum/mean/amax/amin are generated kernels over a [rows, cols] view with the kept dims on
partitions and the reduced dims along the free axis (`codegen.plan_reduction`). When the reduced dims lead (the
bias gradients of a backward graph: a sum over batch and sequence), the data is turned by the library's TensorE
transpose kernel first, so every partition works.
"""

import math

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen, int_ranges
from neuron_dynamo.lowering.registry import lowers
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten


@lowers(
    aten.sum, aten.mean, aten.amax, aten.amin, aten.max, aten.min, aten.var, aten.var_mean, aten.std, aten.prod,
    aten.argmax, aten.argmin, aten.any, aten.all, aten.logsumexp, aten.cumsum,
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
    packet = op.overloadpacket
    out_dtype = dtype or (torch.int64 if packet is aten.sum and not x.dtype.is_floating_point else x.dtype)
    dims = _dims(x, dims)
    shape = [1 if d in dims else s for d, s in enumerate(x.shape)] if keepdim else [
        s for d, s in enumerate(x.shape) if d not in dims]
    order, rows, cols = codegen.plan_reduction(x.shape, dims)
    if rows * cols == 0:  # nothing to move or add: the (empty or identity) result needs no kernel
        exact = {aten.sum: aten.sum.dim_IntList, aten.mean: aten.mean.dim}
        if packet in exact:
            return exact[packet](x, dims, keepdim, dtype=dtype)
        return op(x, dims, keepdim)
    leading = order != list(range(x.dim()))
    if leading and order == [*range(len(dims), x.dim()), *range(len(dims))] and x.dtype.is_floating_point:
        from neuron_dynamo.kernels.transpose import transpose_kernel

        view = launch(transpose_kernel, x.contiguous().reshape(cols, rows))
    else:
        view = x.permute(order).reshape(rows, cols) if leading else x.reshape(rows, cols)
    in_dtype = codegen.nki_dtype(x.dtype)
    kind = KINDS[packet]
    name = codegen.source_name(f"reduce_{kind}", f"{in_dtype}:{codegen.nki_dtype(out_dtype)}")
    kernel = codegen.compile_source(codegen.reduction_source(kind, in_dtype, codegen.nki_dtype(out_dtype), name), name)
    out = launch(kernel, codegen.to_device(view.contiguous()), rows, cols)
    return codegen.from_device(out.reshape(shape if shape else []), out_dtype).reshape(shape)


def _float_refusal(node: fx.Node) -> str | None:
    source = node.args[0].meta.get("val")
    if source.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"a variance of {source.dtype}"
    return _refusal(node) if isinstance(node.meta.get("val"), torch.Tensor) else None


@lowers(aten.var, aten.var_mean, family="reduction", target="simulator", accepts=_float_refusal)
def variance(op, x, dims=None, correction=None, keepdim=False, **kwargs):
    """Two-pass variance (exact when |mean| ≫ std): a mean kernel, a fused (x - mean)² kernel, a sum kernel."""
    from neuron_dynamo.lowering.generated import run_single

    correction = kwargs.get("unbiased", True) if correction is None else correction
    dims = _dims(x, dims)
    count = 1
    for d in dims:
        count *= x.shape[d]
    mean = reduce(aten.mean.dim, x, dims, True)
    squares = run_single(aten.pow.Tensor_Scalar, (run_single(aten.sub.Tensor, (x, mean), {}), 2), {})
    total = reduce(aten.sum.dim_IntList, squares, dims, keepdim)
    var = run_single(aten.mul.Tensor, (total, 1.0 / max(count - float(correction), 0.0)), {})
    if op.overloadpacket is aten.var:
        return var
    return var, mean if keepdim else mean.reshape(var.shape)


def _cumsum_refusal(node: fx.Node) -> str | None:
    value, source = node.meta.get("val"), node.args[0].meta["val"]
    if value.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32):
        return f"a cumsum into {value.dtype}"
    length = _static_int(source.shape[node.args[1]]) if source.dim() else 1
    if length is None or length > 4096:
        return "a cumsum over more than 4096 elements"
    if not value.dtype.is_floating_point:
        magnitude = int_ranges.magnitude(node.args[0])
        if length * magnitude >= int_ranges.FP32_EXACT:
            name = str(source.dtype).removeprefix("torch.")
            return (f"an integer cumsum of {name} that can reach 2**24: TensorE accumulates in fp32, which would "
                    "round (torch adds integers exactly)")
    return None


@lowers(aten.cumsum, family="reduction", target="simulator", accepts=_cumsum_refusal)
def cumsum(op, x, dim, dtype=None):
    """Prefix sums as a matmul with an upper-triangular ones matrix on TensorE (fp32 accumulation in PSUM).

    Integer sums are exact while they stay below 2²⁴ (fp32's integer range): `_cumsum_refusal` runs the others
    eagerly, and a sum that reaches it anyway raises rather than rounds.
    """
    from neuron_dynamo.lowering.generated import run_traced

    out_dtype = dtype or (torch.int64 if not x.dtype.is_floating_point else x.dtype)
    if not out_dtype.is_floating_point and x.numel() and x.to(torch.int64).abs().sum() >= 2**24:
        raise codegen.CodegenError("an integer cumsum beyond 2**24 is not exact in fp32 PSUM")

    def prefix(x):
        moved = x.movedim(dim, -1)
        n = moved.shape[-1]
        upper = (torch.arange(n).unsqueeze(1) <= torch.arange(n)).to(torch.float32)
        sums = moved.to(torch.float32).reshape(-1, n) @ upper
        return sums.reshape(moved.shape).movedim(-1, dim).to(out_dtype)

    return run_traced(f"cumsum:{dim}:{out_dtype}", prefix, [x])
