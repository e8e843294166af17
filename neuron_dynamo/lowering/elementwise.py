"""Element-wise ops, casts and tensor creation: the chains the NKI code generator fuses into one kernel."""

import torch

from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten
prims = torch.ops.prims


@lowers(
    # arithmetic and comparisons
    aten.abs, aten.add, aten.sub, aten.rsub, aten.mul, aten.div, aten.neg, aten.reciprocal, aten.pow,
    aten.maximum, aten.minimum, aten.clamp, aten.clamp_min, aten.clamp_max, aten.sign, aten.floor, aten.ceil,
    aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge, aten.where, aten.masked_fill,
    aten.logical_not, aten.logical_and, aten.logical_or, aten.bitwise_not, aten.bitwise_and, aten.bitwise_or,
    # transcendental functions and activations
    aten.exp, aten.exp2, aten.expm1, aten.log, aten.log1p, aten.log2, aten.sqrt, aten.rsqrt, aten.sin, aten.cos,
    aten.tanh, aten.erf, aten.sigmoid, aten.relu, aten.gelu, aten.silu, aten.hardtanh, aten.softplus, aten.mish,
    # their derivatives (backward graphs)
    aten.threshold_backward, aten.gelu_backward, aten.silu_backward, aten.sigmoid_backward, aten.tanh_backward,
    # casts and copies
    aten._to_copy, prims.convert_element_type, aten.clone, aten.copy, aten.copy_, aten.lift_fresh_copy,
    family="elementwise",
)
def elementwise(op, *args, **kwargs):
    """Reference kernel: torch computes the op; the NKI code generator fuses such chains into one kernel."""
    return op(*args, **kwargs)


@lowers(
    aten.full, aten.full_like, aten.zeros, aten.zeros_like, aten.ones, aten.ones_like, aten.empty, aten.empty_like,
    aten.new_zeros, aten.new_ones, aten.new_full, aten.new_empty, aten.scalar_tensor, aten.arange, aten.fill,
    family="creation",
)
def creation(op, *args, **kwargs):
    """Reference kernel: torch creates the tensor; on device these are memsets and iota patterns in SBUF."""
    return op(*args, **kwargs)
