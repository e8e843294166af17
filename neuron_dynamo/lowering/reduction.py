"""Reductions and scans along one or more dims: VectorE work in NKI, fused with the element-wise ops around them."""

import torch

from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten


@lowers(
    aten.sum, aten.mean, aten.amax, aten.amin, aten.max, aten.min, aten.var, aten.var_mean, aten.std, aten.prod,
    aten.argmax, aten.argmin, aten.any, aten.all, aten.logsumexp, aten.cumsum,
    family="reduction",
)
def reduction(op, *args, **kwargs):
    """Reference kernel: torch reduces; the NKI code generator emits reduction chains."""
    return op(*args, **kwargs)
