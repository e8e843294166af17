"""The decomposition table AOTAutograd traces with.

PyTorch's core-aten table, minus every op the lowering registry lowers: softmax, layer/RMS norm, attention, the
matmul family and the activations reach the partitioner whole, where one NKI library kernel serves each, instead
of as a dozen element-wise ops. Everything else is decomposed to core aten, so fewer distinct ops need a lowering.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch._decomp import core_aten_decompositions

from neuron_dynamo.lowering import registered_op_keys


@functools.cache
def decomposition_table() -> dict[torch._ops.OperatorBase, Callable]:
    """Built once per process: it walks every core-aten decomposition, and every Dynamo graph asks for it."""
    kept = set(registered_op_keys())
    return {
        op: decomposition
        for op, decomposition in core_aten_decompositions().items()
        if op not in kept and getattr(op, "overloadpacket", None) not in kept
    }
