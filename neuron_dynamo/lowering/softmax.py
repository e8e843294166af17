"""Softmax and log-softmax with their backward: one library kernel each, kept out of the decomposition table.

On the NKI targets the forward ops call the library's row-wise kernels (`kernels.softmax`) and the backward ops
generated row kernels (`codegen.row_source`): both want the softmax dim last, which is how the models' graphs
give it (attention scores, logits).
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
    if x.dim() and dim % x.dim() != x.dim() - 1:
        return "softmax over a dim that is not the last"
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"softmax of {x.dtype}"
    if node.meta["val"].dtype != x.dtype:
        return "softmax with half_to_float"
    if x.dim() and x.shape[-1] > codegen.ROW_COLS and backward and loss.cross_entropy_backward_operands(
            node) is None:  # a cross-entropy backward is rewritten to its library kernel, which tiles long rows
        return f"softmax backward over rows longer than {codegen.ROW_COLS}"
    return None


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().reshape(-1, x.shape[-1]) if x.dim() != 2 else x.contiguous()


@lowers(aten._softmax, aten._log_softmax, family="softmax", target="simulator", accepts=_refusal)
def softmax_forward(op, x, dim, half_to_float=False):
    from neuron_dynamo.kernels.softmax import log_softmax_kernel, softmax_kernel

    kernel = log_softmax_kernel if op.overloadpacket is aten._log_softmax else softmax_kernel
    return launch(kernel, _rows(x)).reshape(x.shape)


@lowers(aten._softmax_backward_data, aten._log_softmax_backward_data, family="softmax", target="simulator",
        accepts=_refusal)
def softmax_backward(op, grad, output, dim, input_dtype):
    kind = "log_softmax_backward" if op.overloadpacket is aten._log_softmax_backward_data else "softmax_backward"
    return codegen.run_row_kernel(kind, grad, output).reshape(grad.shape)
