"""Lowering: aten ops → target kernels.

Importing this package registers every op family (one module each). `lower_region` turns a region's aten graph
into the same graph calling the target's kernels, which the target then compiles.
"""

from __future__ import annotations

import operator

import torch.fx as fx

from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.lowering import (  # noqa: F401
    attention,
    conv,
    distance,
    elementwise,
    indexing,
    linalg_factor,
    linalg_solve,
    loss,
    math_functions,
    matmul,
    norm,
    pooling,
    reduction,
    resample,
    softmax,
    sorting,
    special_functions,
    views,
)
from neuron_dynamo.lowering.registry import (
    Kernel,
    Lowering,
    kernel_for,
    lowering_for,
    lowers,
    op_name,
    registered_op_keys,
    registered_ops,
)

__all__ = [
    "Kernel",
    "Lowering",
    "LoweringError",
    "kernel_for",
    "lower_region",
    "lowering_for",
    "lowers",
    "op_name",
    "registered_op_keys",
    "registered_ops",
]


NKI_TARGETS = frozenset({"simulator", "neuron"})  # targets whose regions become NKI kernels


class LoweringError(NeuronDynamoError):
    """A region contains an op that has no kernel for the target."""


def lower_region(region: fx.GraphModule, target: str) -> fx.GraphModule:
    """A copy of `region` whose aten ops call the `target` kernels (node metadata kept for later passes).

    The NKI targets fuse element-wise chains into generated kernels (`fusion.lower_region_nki`); the reference
    target (and any other registered target) maps each op to its kernel one to one.
    """
    if target in NKI_TARGETS:
        from neuron_dynamo.lowering.fusion import lower_region_nki

        return lower_region_nki(region, target)
    graph = fx.Graph()
    graph.output(graph.graph_copy(region.graph, val_map={}))
    lowered = fx.GraphModule(region, graph, class_name=f"{target.capitalize()}Region")
    for node in lowered.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        kernel = kernel_for(node.target, target)
        if kernel is None:
            raise LoweringError(f"{op_name(node.target)} (node {node.name}) has no {target!r} kernel")
        node.target = kernel.for_overload(node.target)
    lowered.recompile()
    return lowered
