"""Split a static aten graph into regions the target runs and nodes that run eagerly, each with a reason.

Support is decided per node, in this order: a collective is never lowered (torch.distributed runs it: reason
"collective", not a failure), then forced eager by the user (`eager_ops`), a lowering registered for the
op (the registry), a kernel for the active target, and finally the target's own check (`target.supports`: dtypes
and whatever else that target refuses). Regions are the maximal groups of supported nodes that create no cycle,
found by torch's `CapabilityBasedPartitioner` (the same engine as Torch-TensorRT's global partitioner); regions
with fewer than `min_region_size` compute ops run eagerly.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable
from typing import Any, Protocol

import torch
import torch.fx as fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from neuron_dynamo.lowering import kernel_for, lowering_for, op_name
from neuron_dynamo.passes.collectives import is_collective

REGION_PREFIX = "region_"

# The reason kinds a fallback node can carry (the text after the kind gives the detail).
FORCED_EAGER = "forced eager"
UNSUPPORTED_OP = "unsupported op"
UNSUPPORTED_DTYPE = "unsupported dtype"
REGION_TOO_SMALL = "region too small"
LOWERING_FAILED = "lowering failed"
COLLECTIVE = "collective"  # not a failure: torch.distributed runs it between the regions (passes/collectives.py)
HOST_CHECK = "host check"  # not a failure: a check of LAPACK's `info` that raises eager's error, no device work


class Target(Protocol):
    name: str

    def supports(self, node: fx.Node) -> str | None: ...


@dataclasses.dataclass(frozen=True)
class Fallback:
    """One node that runs eagerly, and why."""

    node: str
    op: str
    reason: str


@dataclasses.dataclass
class PartitionedGraph:
    """The split graph: each region is a `call_module` to a submodule named `region_<i>`; the rest runs eagerly."""

    module: fx.GraphModule
    regions: dict[str, list[str]]  # region submodule name → the original node names it holds
    fallbacks: list[Fallback]


def is_compute_op(node: fx.Node) -> bool:
    """A node that does work: a call_function other than unpacking a tuple."""
    return node.op == "call_function" and node.target is not operator.getitem


def matches_op_name(op: Any, names: Iterable[str]) -> bool:
    """Whether `op` is named in `names` by overload (`aten.mm.default`) or by packet (`aten.mm`)."""
    wanted = set(names)
    if not wanted:
        return False
    candidates = {op_name(op)}
    if isinstance(op, torch._ops.OpOverload):
        candidates.add(op_name(op.overloadpacket))
    return bool(candidates & wanted)


def _is_error_check(node: fx.Node) -> bool:
    """AOTAutograd's `with_effects(aten._linalg_check_errors, info)`: the ordered raise of `linalg.inv`, `solve`,
    `cholesky`... on a failed factorization (torch/_higher_order_ops/effects.py)."""
    return (node.target is torch.ops.higher_order.with_effects and len(node.args) > 1
            and node.args[1] is torch.ops.aten._linalg_check_errors.default)


def fallback_reason(node: fx.Node, target: Target, eager_ops: Iterable[str] = ()) -> str | None:
    """None if `target` can run this compute node, else the reason it runs eagerly."""
    if is_collective(node.target):
        return f"{COLLECTIVE} (run by torch.distributed)"
    if _is_error_check(node):
        return f"{HOST_CHECK} (raises the error eager raises from the factorization's info)"
    if matches_op_name(node.target, eager_ops):
        return f"{FORCED_EAGER} (eager_ops)"
    if lowering_for(node.target) is None:
        return f"{UNSUPPORTED_OP} (no lowering registered)"
    kernel = kernel_for(node.target, target.name)
    if kernel is None:
        return f"{UNSUPPORTED_OP} (no {target.name} kernel yet)"
    refusal = target.supports(node) or kernel.refusal(node)  # the target's dtype check, then the kernel's own
    if refusal is None or refusal.startswith(UNSUPPORTED_DTYPE):
        return refusal
    return f"{UNSUPPORTED_OP} ({refusal})"


class _RegistrySupport(OperatorSupportBase):
    def __init__(self, supported: set[fx.Node]) -> None:
        self.supported = supported

    def is_node_supported(self, submodules: Any, node: fx.Node) -> bool:
        return node in self.supported


def partition(
    gm: fx.GraphModule, target: Target, *, eager_ops: Iterable[str] = (), min_region_size: int = 1
) -> PartitionedGraph:
    """Partition a copy of `gm` (left untouched) for `target`."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, val_map={}))
    module = fx.GraphModule(gm, graph)

    fallbacks: dict[fx.Node, str] = {}
    supported: set[fx.Node] = set()
    for node in module.graph.nodes:
        if node.op != "call_function":
            continue
        reason = None if node.target is operator.getitem else fallback_reason(node, target, eager_ops)
        if reason is None:
            supported.add(node)
        else:
            fallbacks[node] = reason

    partitioner = CapabilityBasedPartitioner(module, _RegistrySupport(supported), allows_single_node_partition=True)
    proposed = partitioner.propose_partitions()
    regions = []
    for candidate in proposed:
        size = sum(1 for node in candidate.nodes if is_compute_op(node))
        if size >= min_region_size:
            regions.append(candidate)
        else:
            for node in candidate.nodes:
                if is_compute_op(node):
                    fallbacks[node] = f"{REGION_TOO_SMALL} ({size} < min_region_size {min_region_size})"

    # Names and order are taken before fusing: fusing replaces the region's nodes by one call_module each.
    order = {node: index for index, node in enumerate(module.graph.nodes)}
    region_nodes = [sorted(region.nodes, key=order.__getitem__) for region in regions]
    fallback_list = [
        Fallback(node.name, op_name(node.target), reason)
        for node, reason in sorted(fallbacks.items(), key=lambda item: order[item[0]])
    ]
    if regions:
        module = partitioner.fuse_partitions(regions, prefix=REGION_PREFIX)
    return PartitionedGraph(
        module=module,
        regions={f"{REGION_PREFIX}{i}": [node.name for node in nodes] for i, nodes in enumerate(region_nodes)},
        fallbacks=fallback_list,
    )

