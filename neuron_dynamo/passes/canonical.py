"""Canonical text of an FX graph: the part of a cache key that says *what* is compiled.

Two graphs that compile to the same artifact must give the same text, and any difference that changes the
artifact must change it (reference/peers.md §9.2: Torch-TensorRT's op-names-only key is the bug to avoid). So:

* node and placeholder names are replaced by their position (`%0`, `%1`, ...), since Dynamo's names vary with the
  user's variable names and the order of compilation;
* every argument is written out, constants included (the `dim=-1` of a softmax, the `0.5` of a `mul`, dtypes,
  devices, memory formats), recursively through lists, tuples, slices and dicts;
* source locations, stack traces and other `meta` are left out (aws-neuron-sdk #1386: a key that includes line
  numbers misses after any edit of the user's file);
* tensors held by the module (`get_attr`) are written by shape, dtype and content hash: they are constants of the
  graph, unlike parameters, which Dynamo lifts into inputs (DESIGN §4: weights are runtime inputs).
"""

from __future__ import annotations

import hashlib

import torch
import torch.fx as fx


def canonical_graph_text(gm: fx.GraphModule) -> str:
    """One line per node, independent of node names and metadata."""
    index: dict[fx.Node, str] = {}
    lines = []
    for position, node in enumerate(gm.graph.nodes):
        index[node] = f"%{position}"
        if node.op == "get_attr":
            target = _describe_attr(gm, str(node.target))
        elif node.op in ("placeholder", "output"):
            target = ""
        else:
            target = _describe_target(node.target)
        args = _describe(node.args, index)
        kwargs = _describe(dict(sorted(node.kwargs.items())), index)
        lines.append(f"{index[node]} = {node.op} {target} {args} {kwargs}")
    return "\n".join(lines)


def _describe_target(target: object) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", "")
    return f"{module}.{getattr(target, '__qualname__', repr(target))}"


def _describe_attr(gm: fx.GraphModule, target: str) -> str:
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        raw = data.reshape(-1).view(torch.uint8)  # flat first: a 0-dim tensor cannot be viewed as bytes
        digest = hashlib.sha256(raw.numpy().tobytes() if data.numel() else b"").hexdigest()
        return f"tensor{tuple(data.shape)}:{data.dtype}:{digest[:16]}"
    if isinstance(value, fx.GraphModule):
        return "graph{" + canonical_graph_text(value).replace("\n", "; ") + "}"
    return f"{type(value).__name__}"


def _describe(value: object, index: dict[fx.Node, str]) -> str:
    if isinstance(value, fx.Node):
        return index[value]
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v, index) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_describe(v, index)}" for k, v in value.items()) + "}"
    if isinstance(value, slice):
        return f"slice({_describe(value.start, index)}, {_describe(value.stop, index)}, {_describe(value.step, index)})"
    if isinstance(value, float):
        return repr(value)  # repr round-trips exactly: 0.1 and 0.1000000001 differ
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value)
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return f"sym({value.node.expr})"
    return repr(value)


def input_signature(example_inputs: list) -> list:
    """Shapes, strides and dtypes of the (post-bucketing, static) inputs; scalars by type and value."""
    signature = []
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            signature.append(["tensor", list(value.shape), list(value.stride()), str(value.dtype)])
        else:
            signature.append([type(value).__name__, repr(value)])
    return signature
