"""Ops the target cannot run whole, replaced by PyTorch's own decomposition when every op of it lowers.

AOTAutograd decomposes with the core-aten table only (`decompositions.py`), so ops such as `linalg_vector_norm`,
`addmv`, `hypot` or the batch norms reach the partitioner whole. PyTorch's wider `torch._decomp` table knows how to
write many of them in simpler ops. For each node that would run eagerly, this pass traces that decomposition at the
node's static shapes and, only if the target lowers *every* op of it (and the result has the original layout),
splices it into the graph in place of the node. Otherwise the node stays whole and runs eagerly: a decomposition is
never applied half, so an op either runs on the target in full or exactly as eager runs it.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._decomp import decomposition_table as torch_decompositions

from neuron_dynamo.lowering import registered_op_keys
from neuron_dynamo.lowering.generated import trace_node
from neuron_dynamo.passes.partition import Target, fallback_reason, is_compute_op, matches_op_name


@functools.cache
def _table() -> dict[Any, Any]:
    """torch._decomp's table minus the ops the registry lowers (those must stay whole: a kernel serves them)."""
    kept = set(registered_op_keys())
    return {op: fn for op, fn in torch_decompositions.items()
            if op not in kept and getattr(op, "overloadpacket", None) not in kept}


def _same_layout(original: Any, decomposed: Any) -> bool:
    """The decomposition returns what the op returns: same structure, shapes, dtypes and strides."""
    a, b = pytree.tree_leaves(original), pytree.tree_leaves(decomposed)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor) and (x.shape != y.shape or x.dtype != y.dtype or (
                x.numel() > 1 and x.stride() != y.stride())):
            return False
    return True


def _splice(graph: fx.Graph, node: fx.Node, traced: fx.GraphModule, inputs: list[fx.Node]) -> None:
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    with graph.inserting_before(node):
        result = graph.graph_copy(traced.graph, dict(zip(placeholders, inputs, strict=True)))
    if isinstance(result, (list, tuple)):
        for user in list(node.users):
            if user.target is not operator.getitem:
                return  # the tuple itself is used: leave the node (never reached for aten ops' users)
        for user in list(node.users):
            user.replace_all_uses_with(result[user.args[1]])
            graph.erase_node(user)
    else:
        node.replace_all_uses_with(result)
    graph.erase_node(node)


def decompose_fallbacks(gm: fx.GraphModule, target: Target, eager_ops: Iterable[str] = ()) -> int:
    """Replace, in place, each node the target would run eagerly by its fully lowerable decomposition; the count."""
    eager_ops = tuple(eager_ops)
    replaced = 0
    for node in list(gm.graph.nodes):
        if not is_compute_op(node) or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target not in _table() or matches_op_name(node.target, eager_ops):
            continue
        if fallback_reason(node, target, eager_ops) is None:
            continue
        found = trace_node(node, _table())
        if found is None:
            continue
        traced, inputs = found
        outputs = next(n for n in traced.graph.nodes if n.op == "output").args[0]
        decomposed = pytree.tree_map(lambda n: n.meta.get("val") if isinstance(n, fx.Node) else n, outputs)
        if not _same_layout(node.meta.get("val"), decomposed):
            continue
        if any(fallback_reason(n, target, eager_ops) for n in traced.graph.nodes if is_compute_op(n)):
            continue
        _splice(gm.graph, node, traced, inputs)
        replaced += 1
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return replaced
