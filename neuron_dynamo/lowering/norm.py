"""Layer, RMS and group norm with their backward: library kernels, kept out of the decomposition table."""

import torch

from neuron_dynamo.lowering.registry import lowers

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
