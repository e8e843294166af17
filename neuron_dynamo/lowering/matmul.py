"""The matmul family: TensorE work, with the transposes and permutes that feed it."""

import torch

from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten


@lowers(aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.linear, aten.matmul, aten.t, aten.permute, family="matmul")
def matmul(op, *args, **kwargs):
    """Reference kernel: torch multiplies; the NKI matmul kernels tile this for TensorE with fp32 PSUM."""
    return op(*args, **kwargs)
