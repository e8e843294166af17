"""Softmax and log-softmax with their backward: one library kernel each, kept out of the decomposition table."""

import torch

from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten


@lowers(
    aten._softmax, aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data,
    family="softmax",
)
def softmax(op, *args, **kwargs):
    """Reference kernel: torch computes the (log-)softmax; the NKI kernel does it row-wise in one pass over SBUF."""
    return op(*args, **kwargs)
