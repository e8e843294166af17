"""Scaled dot-product attention, forward and backward: the flash-attention library kernels."""

import torch

from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten


@lowers(
    aten.scaled_dot_product_attention,
    aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_efficient_attention_backward,
    family="attention",
)
def attention(op, *args, **kwargs):
    """Reference kernel: torch attends; the NKI kernel streams key/value blocks with an online softmax."""
    return op(*args, **kwargs)
