"""The matmul family: TensorE work, with the transposes and permutes that feed it.

On the NKI targets mm/addmm/bmm/linear call the library's `matmul_kernel`. AOTAutograd feeds them weights through
`t`/`permute`/`transpose` views; those views cost nothing (they only change the access pattern), and the kernel
takes an operand whose last two dims are swapped as it is stored (`transpose_a`/`transpose_b`), so a Linear weight
`t(w)` reaches TensorE without any transpose pass: the layout is read off the strides at run time.
"""

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.registry import lowers
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten


@lowers(aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.linear, aten.matmul, aten.t, aten.permute, family="matmul")
def matmul(op, *args, **kwargs):
    """Reference kernel: torch multiplies; the NKI matmul kernels tile this for TensorE with fp32 PSUM."""
    return op(*args, **kwargs)


@lowers(aten.t, aten.permute, family="matmul", target="simulator", handles_empty=True)
def transpose_view(op, *args, **kwargs):
    """A transpose or permute is the access pattern of the consuming kernel: the strided view, no data moved."""
    return op(*args, **kwargs)


def as_stored(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The operand as it lies in memory and whether its last two dims are swapped (`x` = that tensorᵀ)."""
    if x.dim() >= 2 and not x.is_contiguous() and x.transpose(-1, -2).is_contiguous():
        return x.transpose(-1, -2), True
    return x.contiguous(), False


def run_matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b (+ bias) on the library kernel; a [M, K] or [B, M, K], b [K, N] or [B, K, N]."""
    from neuron_dynamo.kernels.matmul import matmul_kernel

    a_stored, transpose_a = as_stored(a)
    b_stored, transpose_b = as_stored(b)
    return launch(matmul_kernel, a_stored, b_stored, bias, "none", transpose_a, transpose_b)


def _float_operands(node: fx.Node) -> str | None:
    tensors = [arg.meta["val"] for arg in node.all_input_nodes]
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or not dtypes <= set(codegen.FLOAT_DTYPES):
        return f"matmul operands of dtypes {sorted(str(d) for d in dtypes)} (the kernel takes one float dtype)"
    return None


def _addmm_refusal(node: fx.Node) -> str | None:
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return "addmm with beta or alpha other than 1"
    return _float_operands(node)


@lowers(aten.mm, aten.bmm, family="matmul", target="simulator", accepts=_float_operands)
def mm(op, a, b):
    return run_matmul(a, b)


@lowers(aten.addmm, family="matmul", target="simulator", accepts=_addmm_refusal)
def addmm(op, bias, a, b, beta=1, alpha=1):
    """bias + a @ b: a bias row is the kernel's epilogue; any other bias shape is added by a fused kernel."""
    n = b.shape[-1]
    if bias.dim() <= 1 or (bias.dim() == 2 and bias.shape[0] == 1):
        return run_matmul(a, b, bias.expand(n).contiguous())
    from neuron_dynamo.lowering.generated import run_single

    return run_single(aten.add.Tensor, (run_matmul(a, b), bias), {})


@lowers(aten.linear, family="matmul", target="simulator", accepts=_float_operands)
def linear(op, x, weight, bias=None):
    """x @ weightᵀ + bias: the weight goes in as stored ([N, K], transpose_b)."""
    flat = x.reshape(-1, x.shape[-1])
    out = run_matmul(flat, weight.t(), None if bias is None else bias.contiguous())
    return out.reshape(*x.shape[:-1], weight.shape[0])
