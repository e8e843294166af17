"""The matmul family: TensorE work, with the transposes and permutes that feed it.

On the NKI targets mm/addmm/bmm/baddbmm/addmv/addbmm/linear call the library's `matmul_kernel`. AOTAutograd
feeds them weights through `t`/`permute`/`transpose` views; those views cost nothing (they only change the access
pattern), and the kernel takes an operand whose last two dims are swapped as it is stored
(`transpose_a`/`transpose_b`), so a Linear weight `t(w)` reaches TensorE without any transpose pass: the layout
is read off the strides at run time. A scale (alpha, beta) or a bias other than a row is a fused element-wise
kernel after the product.
"""

import functools
import math

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.registry import lowers
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten


@lowers(aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.addmv, aten.addbmm, aten.linear, aten.matmul, aten.t,
        aten.permute, family="matmul")
def matmul(op, *args, **kwargs):
    """Reference kernel: torch multiplies; the NKI matmul kernels tile this for TensorE with fp32 PSUM."""
    return op(*args, **kwargs)


@lowers(aten.t, aten.permute, family="matmul", target="simulator", handles_empty=True,
        direct={aten.t.default: torch.Tensor.t, aten.permute.default: torch.Tensor.permute})
def transpose_view(op, *args, **kwargs):
    """A transpose or permute is the access pattern of the consuming kernel: the strided view, no data moved."""
    return op(*args, **kwargs)


def as_stored(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The operand as it lies in memory and whether its last two dims are swapped (`x` = that tensorᵀ)."""
    if x.dim() >= 2 and not x.is_contiguous():
        swapped = x.transpose(-1, -2)
        if swapped.is_contiguous():
            return swapped, True
    return x.contiguous(), False


@functools.cache
def _matmul_kernel():
    """The library kernel, imported at the first matmul (the reference target never loads the interpreter)."""
    from neuron_dynamo.kernels.matmul import matmul_kernel

    return matmul_kernel


def run_matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b (+ bias) (+ residual, of the product's shape) on the library kernel; a [M, K] or [B, M, K], b [K, N] or
    [B, K, N]."""
    a_stored, transpose_a = as_stored(a)
    b_stored, transpose_b = as_stored(b)
    return launch(_matmul_kernel(), a_stored, b_stored, bias, "none", transpose_a, transpose_b, residual)


def _float_operands(node: fx.Node) -> str | None:
    tensors = [arg.meta["val"] for arg in node.all_input_nodes]
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or not dtypes <= set(codegen.FLOAT_DTYPES):
        return f"matmul operands of dtypes {sorted(str(d) for d in dtypes)} (the kernel takes one float dtype)"
    return None


def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b on the library kernel, or what needs no kernel: an empty result, or zeros for an empty contraction
    (a memset: eager's [n, 0] @ [0, m] is zeros, not an error)."""
    if a.numel() and b.numel():  # K > 0 and a result with elements (the common case first)
        return run_matmul(a, b)
    from neuron_dynamo.lowering.generated import run_single

    shape = [*a.shape[:-1], b.shape[-1]]
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=a.dtype)
    if a.shape[-1] == 0:
        return run_single(aten.full.default, (shape, 0.0), {"dtype": a.dtype})
    return run_matmul(a, b)


def scaled_sum(bias: torch.Tensor, result: torch.Tensor, beta=1, alpha=1) -> torch.Tensor:
    """beta · bias + alpha · result, as torch's add*mm define it: with beta = 0 the bias is ignored (its NaN and
    inf do not propagate)."""
    from neuron_dynamo.lowering.generated import run_traced

    def epilogue(bias: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
        scaled = result if alpha == 1 else result * alpha
        if beta == 0:
            return scaled.expand(torch.broadcast_shapes(bias.shape, result.shape)).clone()
        return scaled + (bias if beta == 1 else bias * beta)

    return run_traced(f"matmul_epilogue:{beta!r}:{alpha!r}", epilogue, [bias, result])


@lowers(aten.mm, aten.bmm, family="matmul", target="simulator", accepts=_float_operands, handles_empty=True)
def mm(op, a, b):
    return product(a, b)


@lowers(aten.addmm, family="matmul", target="simulator", accepts=_float_operands, handles_empty=True)
def addmm(op, bias, a, b, beta=1, alpha=1):
    """bias + a @ b: a bias row is the kernel's epilogue; any other bias, or a scale, is a fused kernel."""
    if beta == alpha == 1 and a.numel() * b.numel() > 0 and bias.numel() > 0 and (
            bias.dim() <= 1 or (bias.dim() == 2 and bias.shape[0] == 1)):
        return run_matmul(a, b, bias.expand(b.shape[-1]).contiguous())
    return scaled_sum(bias, product(a, b), beta, alpha)


@lowers(aten.baddbmm, family="matmul", target="simulator", accepts=_float_operands, handles_empty=True)
def baddbmm(op, bias, a, b, beta=1, alpha=1):
    return scaled_sum(bias, product(a, b), beta, alpha)


@lowers(aten.addmv, family="matmul", target="simulator", accepts=_float_operands, handles_empty=True)
def addmv(op, bias, mat, vec, beta=1, alpha=1):
    """bias + mat @ vec with the vector as a one-column matrix."""
    return scaled_sum(bias, product(mat, vec.reshape(-1, 1)).reshape(-1), beta, alpha)


@lowers(aten.addbmm, family="matmul", target="simulator", accepts=_float_operands, handles_empty=True)
def addbmm(op, bias, a, b, beta=1, alpha=1):
    """bias + Σ_b a[b] @ b[b]: one matmul contracting over batch and K together ([M, B·K] @ [B·K, N])."""
    batch, m, k = a.shape
    flat_a = a.permute(1, 0, 2).reshape(m, batch * k)
    return scaled_sum(bias, product(flat_a, b.reshape(batch * k, b.shape[-1])), beta, alpha)


@lowers(aten.linear, family="matmul", target="simulator", accepts=_float_operands)
def linear(op, x, weight, bias=None):
    """x @ weightᵀ + bias: the weight goes in as stored ([N, K], transpose_b)."""
    flat = x.reshape(-1, x.shape[-1])
    out = run_matmul(flat, weight.t(), None if bias is None else bias.contiguous())
    return out.reshape(*x.shape[:-1], weight.shape[0])
