"""Layer, RMS and group norm with their backward: library kernels, kept out of the decomposition table.

On the NKI targets `native_layer_norm` is the library's `layernorm_kernel` plus a generated row kernel for the
mean and 1/std that the backward graph saves; `native_layer_norm_backward` is a generated kernel with rows on
partitions (dx from the row statistics) and partition reductions for the weight and bias gradients.
"""

import math

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen, generated
from neuron_dynamo.lowering.registry import lowers
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten


@lowers(
    aten.native_layer_norm, aten.native_layer_norm_backward, aten._fused_rms_norm, aten._fused_rms_norm_backward,
    family="norm",
)
def norm(op, *args, **kwargs):
    """Reference kernel: torch normalises; the NKI norm kernels use bn_stats/bn_aggr on VectorE."""
    return op(*args, **kwargs)


@lowers(aten.native_group_norm, aten.native_group_norm_backward, family="norm")
def group_norm(op, *args, **kwargs):
    """Reference kernel: torch normalises, from contiguous inputs.

    PyTorch's CPU group-norm kernel asserts a dense input in the layout it infers from the strides, and an
    AOTAutograd graph can hand it a view whose size-1 dims carry other strides than the traced ones
    (pytorch/pytorch#124181, fixed upstream by #186414). `.contiguous()` is free for inputs that already are.
    """
    return op(*(arg.contiguous() if isinstance(arg, torch.Tensor) else arg for arg in args), **kwargs)


@lowers(aten.native_group_norm, aten.native_group_norm_backward, family="norm", target="simulator")
def group_norm_nki(op, *args, **kwargs):
    """Group norm as the generated NKI kernels of its decomposition (per-group statistics, then element-wise).

    Its inputs are made contiguous first, as the reference kernel does, for the same PyTorch issue.
    """

    args = tuple(arg.contiguous() if isinstance(arg, torch.Tensor) else arg for arg in args)
    return generated.run_decomposed(op, args, kwargs)



BATCH_NORMS = (aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional,
               aten._native_batch_norm_legit_no_training, aten._batch_norm_with_update_functional)


@lowers(*BATCH_NORMS, family="norm")
def batch_norm(op, *args, **kwargs):
    """Reference kernel: torch normalises (and returns the updated running statistics)."""
    return op(*args, **kwargs)


def _batch_norm_refusal(node: fx.Node) -> str | None:
    x = node.args[0].meta["val"]
    if x.dtype not in codegen.FLOAT_DTYPES:
        return f"batch norm of {x.dtype}"
    return generated.decomposition_refusal(node)


@lowers(*BATCH_NORMS, family="norm", target="simulator", accepts=_batch_norm_refusal, handles_empty=True)
def batch_norm_nki(op, *args, **kwargs):
    """Batch norm as the generated NKI kernels of its decomposition: per-channel statistics (var_mean), the
    normalisation and the running-statistics update, all element-wise work and reductions."""

    return generated.run_decomposed(op, args, kwargs)


def _refusal(node: fx.Node) -> str | None:
    backward = node.target.overloadpacket is aten.native_layer_norm_backward
    x = node.args[1 if backward else 0].meta["val"]
    normalized = node.args[2 if backward else 1]
    if len(normalized) == 0:
        return "layer norm over no dim"
    if x.dtype not in codegen.FLOAT_DTYPES:
        return f"layer norm of {x.dtype}"
    if math.prod(x.shape[-len(normalized):]) > codegen.ROW_COLS:
        return f"layer norm over rows longer than {codegen.ROW_COLS}"
    params = [a.meta["val"] for a in node.args[3:5] if isinstance(a, fx.Node)] if not backward else []
    if any(p.dtype != x.dtype for p in params):
        return "layer norm parameters in another dtype than the input"
    return None


def _stat_shape(x: torch.Tensor, normalized: int) -> list[int]:
    return [*x.shape[:x.dim() - normalized], *[1] * normalized]


def _flat(param: torch.Tensor | None) -> torch.Tensor | None:
    return None if param is None else param.contiguous().reshape(-1)


@lowers(aten.native_layer_norm, family="norm", target="simulator", accepts=_refusal, handles_empty=True)
def layer_norm(op, x, normalized_shape, weight, bias, eps):
    """Over the last k dims as over one: the rows are [rows, product of the normalized dims]. With no element,
    there is nothing to compute (the result is empty, or NaN statistics of empty rows)."""
    from neuron_dynamo.kernels.norms import layernorm_kernel

    if x.numel() == 0:
        return op(x, normalized_shape, weight, bias, eps)

    k = len(normalized_shape)
    rows = x.contiguous().reshape(-1, math.prod(x.shape[x.dim() - k:]))
    out = launch(layernorm_kernel, rows, _flat(weight), _flat(bias), float(eps))
    mean, rstd = codegen.run_row_kernel("row_moments", rows, extra=(float(eps),))
    stats = _stat_shape(x, k)  # in x's dtype, as eager returns them when the parameters share it (`_refusal`)
    return out.reshape(x.shape), mean.reshape(stats).to(x.dtype), rstd.reshape(stats).to(x.dtype)


def _backward_source(dtype: str, has_weight: bool, name: str) -> str:
    """dx = rstd · (g·w - mean(g·w) - x̂ · mean(g·w·x̂)); dw = Σ_rows g·x̂; db = Σ_rows g (GpSimd partition sums)."""
    f32 = "nl.float32"
    weight = [f"gw = nl.multiply(g, w_rows[0:pr, 0:cols], dtype={f32})"] if has_weight else ["gw = g"]
    hoisted = ["    w_rows = broadcast_rows(w, 0, cols, nl.float32)"] if has_weight else []  # once for all rows
    lines = [
        codegen.HEADER.rstrip("\n"), "from neuron_dynamo.kernels.tiling import broadcast_rows", "", "",
        "@nki.jit",
        f"def {name}(grad, x, mean, rstd, w, rows, cols):",
        f"    dx = nl.ndarray((rows, cols), dtype=nl.{dtype}, buffer=nl.shared_hbm)",
        f"    dw = nl.ndarray((1, cols), dtype={f32}, buffer=nl.shared_hbm)",
        f"    db = nl.ndarray((1, cols), dtype={f32}, buffer=nl.shared_hbm)",
        f"    dw_acc = nl.zeros((1, cols), dtype={f32}, buffer=nl.sbuf)",
        f"    db_acc = nl.zeros((1, cols), dtype={f32}, buffer=nl.sbuf)",
        *hoisted,
        f"    for r0 in range(0, rows, {codegen.PMAX}):",
        f"        pr = min({codegen.PMAX}, rows - r0)",
    ]
    body = [
        "g = nl.load(grad[r0:r0 + pr, 0:cols], dtype=nl.float32)",
        "xt = nl.load(x[r0:r0 + pr, 0:cols], dtype=nl.float32)",
        "mu = nl.load(mean[r0:r0 + pr, 0:1])",
        "rs = nl.load(rstd[r0:r0 + pr, 0:1])",
        f"xhat = nl.ndarray((pr, cols), dtype={f32}, buffer=nl.sbuf)",
        "nisa.tensor_scalar(dst=xhat, data=xt, op0=nl.subtract, operand0=mu, op1=nl.multiply, operand1=rs)",
        *weight,
        f"a1 = nl.multiply(nl.sum(gw, axis=1, keepdims=True, dtype={f32}), 1.0 / cols, dtype={f32})",
        f"a2 = nl.multiply(nl.sum(nl.multiply(gw, xhat, dtype={f32}), axis=1, keepdims=True, dtype={f32}), "
        f"1.0 / cols, dtype={f32})",
        f"t = nl.ndarray((pr, cols), dtype={f32}, buffer=nl.sbuf)",
        "nisa.tensor_scalar(dst=t, data=xhat, op0=nl.multiply, operand0=a2)",
        f"u = nl.ndarray((pr, cols), dtype={f32}, buffer=nl.sbuf)",
        "nisa.tensor_scalar(dst=u, data=gw, op0=nl.subtract, operand0=a1)",
        f"u = nl.subtract(u, t, dtype={f32})",
        f"d = nl.ndarray((pr, cols), dtype=nl.{dtype}, buffer=nl.sbuf)",
        "nisa.tensor_scalar(dst=d, data=u, op0=nl.multiply, operand0=rs)",
        "nl.store(dx[r0:r0 + pr, 0:cols], value=d)",
        f"part = nl.ndarray((1, cols), dtype={f32}, buffer=nl.sbuf)",
        f"nisa.tensor_partition_reduce(dst=part, op=nl.add, data=nl.multiply(g, xhat, dtype={f32}))",
        f"dw_acc = nl.add(dw_acc, part, dtype={f32})",
        "nisa.tensor_partition_reduce(dst=part, op=nl.add, data=g)",
        f"db_acc = nl.add(db_acc, part, dtype={f32})",
    ]
    tail = ["    nl.store(dw[0:1, 0:cols], value=dw_acc)", "    nl.store(db[0:1, 0:cols], value=db_acc)",
            "    return dx, dw, db"]
    return "\n".join(lines + [f"        {line}" for line in body] + tail) + "\n"


@lowers(aten.native_layer_norm_backward, family="norm", target="simulator", accepts=_refusal)
def layer_norm_backward(op, grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    k = len(normalized_shape)
    cols = math.prod(x.shape[x.dim() - k:])
    rows = math.prod(x.shape[:x.dim() - k])
    dtype = codegen.nki_dtype(x.dtype)
    name = codegen.source_name("layer_norm_backward", f"{dtype}:{weight is not None}")
    kernel = codegen.compile_source(_backward_source(dtype, weight is not None, name), name)
    w = _flat(weight) if weight is not None else torch.ones(cols, dtype=x.dtype)
    dx, dw, db = launch(kernel, grad.contiguous().reshape(rows, cols), x.contiguous().reshape(rows, cols),
                        mean.contiguous().reshape(rows, 1).float(), rstd.contiguous().reshape(rows, 1).float(),
                        w.contiguous(), rows, cols)
    param_dtype = x.dtype if weight is None else weight.dtype
    return (
        dx.reshape(x.shape) if output_mask[0] else None,
        dw.reshape(weight.shape).to(param_dtype) if output_mask[1] and weight is not None else None,
        db.reshape(bias.shape).to(param_dtype) if output_mask[2] and bias is not None else None,
    )


# ------------------------------------------------------------------------------------------------ decompositions
