"""Softmax and log-softmax with their backward: one library kernel each, kept out of the decomposition table.

On the NKI targets the forward ops call the library's row-wise kernels (`kernels.softmax`) and the backward ops
generated row kernels (`codegen.row_source`): both work along the last dim, which is how the models' graphs
give it (attention scores, logits); another softmax dim is moved last around the kernel.
"""

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen, loss
from neuron_dynamo.lowering.registry import lowers
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten


@lowers(
    aten._softmax, aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data,
    family="softmax",
)
def softmax(op, *args, **kwargs):
    """Reference kernel: torch computes the (log-)softmax; the NKI kernel does it row-wise in one pass over SBUF."""
    return op(*args, **kwargs)


def _refusal(node: fx.Node) -> str | None:
    backward = "backward" in str(node.target)
    x = node.args[0].meta["val"]
    dim = node.args[2] if backward else node.args[1]
    length = x.shape[dim] if x.dim() else 1
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"softmax of {x.dtype}"
    if node.meta["val"].dtype != x.dtype:
        return "softmax with half_to_float"
    if length > codegen.ROW_COLS and backward and loss.cross_entropy_backward_operands(
            node) is None:  # a cross-entropy backward is rewritten to its library kernel, which tiles long rows
        return f"softmax backward over rows longer than {codegen.ROW_COLS}"
    return None


def _rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x as [rows, length of dim]: the kernels work along the last dim, so another dim is moved there first."""
    if x.dim() == 0:
        return x.reshape(1, 1)
    return x.movedim(dim, -1).contiguous().reshape(-1, x.shape[dim])


def _unrows(rows: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """The inverse of `_rows`."""
    if x.dim() == 0:
        return rows.reshape(())
    return rows.reshape(x.movedim(dim, -1).shape).movedim(-1, dim).contiguous()


@lowers(aten._softmax, aten._log_softmax, family="softmax", target="simulator", accepts=_refusal, handles_empty=True)
def softmax_forward(op, x, dim, half_to_float=False):
    from neuron_dynamo.kernels.softmax import log_softmax_kernel, softmax_kernel

    if x.numel() == 0:  # nothing to compute: the empty result
        return op(x, dim, half_to_float)

    kernel = log_softmax_kernel if op.overloadpacket is aten._log_softmax else softmax_kernel
    return _unrows(launch(kernel, _rows(x, dim)), x, dim)


@lowers(aten._softmax_backward_data, aten._log_softmax_backward_data, family="softmax", target="simulator",
        accepts=_refusal, handles_empty=True)
def softmax_backward(op, grad, output, dim, input_dtype):
    if grad.numel() == 0:  # nothing to compute: the empty result
        return op(grad, output, dim, input_dtype)
    kind = "log_softmax_backward" if op.overloadpacket is aten._log_softmax_backward_data else "softmax_backward"
    return _unrows(codegen.run_row_kernel(kind, _rows(grad, dim), _rows(output, dim)), grad, dim)
