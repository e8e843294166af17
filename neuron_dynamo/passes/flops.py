"""FLOPs of one aten node, for the reports: matmul, convolution and attention work (element-wise ops count 0).

The formulas are PyTorch's own (`torch.utils.flop_counter`), applied to the shapes recorded in the node's `val`
metadata; the CPU flavour of scaled-dot-product attention, which PyTorch's table lacks, uses its SDPA formulas.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.utils import flop_counter

aten = torch.ops.aten


def _meta(value):
    return value.meta.get("val") if isinstance(value, fx.Node) else value


def _cpu_attention(query, key, value, *args, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape)


def _cpu_attention_backward(grad_out, query, key, value, *args, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


_EXTRA_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward,
}


def node_flops(node: fx.Node) -> int:
    """Floating-point operations of a call_function node with static shapes; 0 if it is not a counted op."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return 0
    packet = node.target.overloadpacket
    args = fx.node.map_aggregate(node.args, _meta)
    kwargs = fx.node.map_aggregate(node.kwargs, _meta)
    if packet in _EXTRA_FORMULAS:
        return int(_EXTRA_FORMULAS[packet](*args, **kwargs))
    formula = flop_counter.flop_registry.get(packet)
    if formula is None:
        return 0
    return int(formula(*args, **kwargs, out_val=node.meta.get("val")))
