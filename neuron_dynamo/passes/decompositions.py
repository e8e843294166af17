"""The decomposition table AOTAutograd traces with.

PyTorch's core-aten table, minus every op the lowering registry lowers: softmax, layer/RMS norm, attention, the
matmul family and the activations reach the partitioner whole, where one NKI library kernel serves each, instead
of as a dozen element-wise ops. Everything else is decomposed to core aten, so fewer distinct ops need a lowering,
and `slice_backward` with static bounds becomes a zero pad (below).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch._decomp import core_aten_decompositions

from neuron_dynamo.lowering import registered_op_keys

aten = torch.ops.aten


@functools.cache
def decomposition_table() -> dict[torch._ops.OperatorBase, Callable]:
    """Built once per process: it walks every core-aten decomposition, and every Dynamo graph asks for it."""
    kept = set(registered_op_keys())
    table = {
        op: decomposition
        for op, decomposition in core_aten_decompositions().items()
        if op not in kept and getattr(op, "overloadpacket", None) not in kept
    }
    core = table.get(aten.slice_backward.default)
    if core is not None:
        table[aten.slice_backward.default] = functools.partial(_slice_backward, core)
    return table


def _slice_backward(core: Callable, grad_output, input_sizes, dim: int, start, end, step):
    """The gradient of a slice with static bounds and step 1 is the slice's gradient padded with zeros: one pad
    kernel, where core aten's `new_zeros` + `slice_scatter` launches a zeros kernel and a strided write (rotary
    embeddings' `rotate_half` has four per layer in its backward). Anything symbolic or strided keeps core aten's."""
    size = input_sizes[dim]
    if step != 1 or not all(type(v) is int for v in (size, start, end)):
        return core(grad_output, input_sizes, dim, start, end, step)
    start = min(max(start + size if start < 0 else start, 0), size)
    end = min(max(end + size if end < 0 else end, start), size)
    pad = [0, 0] * (grad_output.dim() - 1 - dim % grad_output.dim()) + [start, size - end]
    return aten.constant_pad_nd.default(grad_output, pad, 0.0)
