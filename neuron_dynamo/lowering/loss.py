"""Cross-entropy: `nll_loss_forward`/`nll_loss_backward` kept whole, and the library cross-entropy kernels.

AOTAutograd traces `F.cross_entropy` as `_log_softmax → nll_loss_forward` in the forward (the log-softmax is saved
for the backward) and `nll_loss_backward → _log_softmax_backward_data` in the backward. `patterns.rewrite` turns
these chains into the library kernels (`kernels.cross_entropy`):

- forward: `cross_entropy_kernel(logits)` gives each row's loss and logsumexp; the reduction (sum, or mean over
  the rows whose label is not `ignore_index`) is a generated kernel. When the graph saves the log-softmax for the
  backward, it is rebuilt as `logits - lse` (one fused kernel) instead of a second pass of the softmax kernel.
- backward: only the log-softmax `y` is saved, and `softmax = exp(y - 0)`, so `cross_entropy_backward_kernel(y,
  lse=0)` gives `(softmax - onehot) · grad_row` in one pass: the same value as `grad - exp(y) · Σ grad` of the
  decomposed chain, without materialising the one-hot gradient.

An `nll_loss_*` call that is not part of such a chain runs as the NKI kernels of its decomposition.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen, generated
from neuron_dynamo.lowering.matching import is_call, private, val
from neuron_dynamo.lowering.registry import lowers
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten
MEAN, SUM = 1, 2  # torch's reduction enum (0 is "none")


@lowers(aten.nll_loss_forward, aten.nll_loss_backward, family="loss")
def nll_loss(op, *args, **kwargs):
    """Reference kernel: torch computes the loss; on the NKI targets it is the cross-entropy library kernel."""
    return op(*args, **kwargs)


def _refusal(node: fx.Node) -> str | None:
    """Any form PyTorch's decomposition writes in lowered ops: class weights, [C] or [N, C] log-probabilities,
    every reduction."""

    backward = node.target.overloadpacket is aten.nll_loss_backward
    log_probs = node.args[1] if backward else node.args[0]
    if log_probs.meta["val"].dtype not in codegen.FLOAT_DTYPES:
        return f"nll_loss of {log_probs.meta['val'].dtype}"
    return generated.decomposition_refusal(node)


@lowers(aten.nll_loss_forward, aten.nll_loss_backward, family="loss", target="simulator", accepts=_refusal)
def nll_loss_decomposed(op, *args):
    """A lone `nll_loss_*` (not after a log-softmax): the generated kernels of its decomposition (gather, masks,
    sums)."""
    from neuron_dynamo.lowering.generated import run_decomposed

    return run_decomposed(op, args, {})


def _labels(target: torch.Tensor, classes: int, ignore_index: int) -> torch.Tensor:
    """The labels as the kernel reads them (int32), after the bounds check torch itself makes: an out-of-range
    label would make the indirect DMA read another row."""
    if target.numel():
        error = codegen.CodegenError(f"a cross-entropy label is outside [0, {classes}) and is not the ignore_index "
                                     f"{ignore_index}")
        if classes:  # the ignored labels as 0, a class: one min and max over the rest
            least, most = torch.aminmax(torch.where(target == ignore_index, 0, target))
        else:  # every label must be ignored: as if the only class were the ignore_index
            least = most = (target != ignore_index).any().to(target.dtype)
        codegen.check_within(least, most, 0, max(classes - 1, 0), error)
        if target.dtype == torch.int64 and codegen.INT32_RANGE[0] <= ignore_index <= codegen.INT32_RANGE[1]:
            return target.to(torch.int32)  # every value is checked to fit
    return codegen.to_device(target)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, reduction: int, ignore_index: int):
    """(loss, total_weight, lse) of `nll_loss_forward(log_softmax(logits))` for [N, C] logits, reduction sum/mean:
    one kernel, which also reduces the rows."""
    from neuron_dynamo.kernels.cross_entropy import cross_entropy_loss_kernel

    loss, total_weight, lse = launch(cross_entropy_loss_kernel, logits.contiguous(),
                                     _labels(target, logits.shape[1], ignore_index), ignore_index, reduction == MEAN)
    return loss.reshape(()), total_weight.reshape(()), lse


def log_softmax_from_lse(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits) = logits - logsumexp, from the cross-entropy kernel's lse: one fused kernel."""
    from neuron_dynamo.lowering.generated import run_traced

    def subtract(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        return (logits - lse.unsqueeze(1)).to(logits.dtype)

    return run_traced("log_softmax_from_lse", subtract, [logits, lse])


def cross_entropy_backward(grad: torch.Tensor, log_probs: torch.Tensor, target: torch.Tensor, reduction: int,
                           ignore_index: int, total_weight: torch.Tensor) -> torch.Tensor:
    """`_log_softmax_backward_data(nll_loss_backward(grad, ...), log_probs)` for [N, C] log-probabilities: one
    kernel, which gives each row that counts grad (÷ total_weight for a mean) and the ignored rows 0."""
    from neuron_dynamo.kernels.cross_entropy import cross_entropy_backward_kernel

    n = log_probs.shape[0]
    zero_lse = torch.zeros(n, dtype=torch.float32)  # log_probs are already normalised: softmax = exp(log_probs - 0)
    mean = reduction == MEAN
    return launch(cross_entropy_backward_kernel, log_probs.contiguous(),
                  _labels(target, log_probs.shape[1], ignore_index), zero_lse, grad.reshape(1), ignore_index,
                  "mean" if mean else "sum", total_weight.reshape(1) if mean else None)


# The forms the cross-entropy library kernels compute (`patterns` rewrites them; the softmax lowering asks too).
def nll_args(nll: fx.Node, count: int) -> tuple | None:
    """The positional args of an `nll_loss_*` node when it is the form the library kernel computes: no class
    weights, a sum or mean reduction, [N, C] log-probabilities of a float dtype, [N] integer labels."""
    args = nll.args
    if len(args) != count or nll.kwargs or args[-4 if count == 7 else -3] is not None:
        return None
    log_probs, target = (args[1], args[2]) if count == 7 else (args[0], args[1])
    lp, labels = val(log_probs), val(target)
    if args[-3 if count == 7 else -2] not in (MEAN, SUM) or lp is None or labels is None:
        return None
    if lp.dim() != 2 or lp.dtype not in codegen.FLOAT_DTYPES or labels.dim() != 1 or labels.dtype not in (
            torch.int64, torch.int32):
        return None
    return args


def cross_entropy_backward_operands(backward: fx.Node) -> tuple | None:
    """The cross-entropy backward kernel's operands when `backward` is
    `_log_softmax_backward_data(nll_loss_backward(grad, ...), log_probs)` in a form it computes, else None.
    (The softmax lowering asks too: the kernel tiles rows of any length, the generated row kernel does not.)"""
    nll, log_probs, dim = backward.args[:3]
    if not (is_call(nll, aten.nll_loss_backward) and private(nll) and dim in (1, -1)):
        return None
    args = nll_args(nll, 7)
    if args is None or val(log_probs).dtype != val(backward).dtype or val(log_probs).shape != val(nll).shape:
        return None
    grad, _, target, _, reduction, ignore_index, total_weight = args
    return grad, log_probs, target, reduction, ignore_index, total_weight
