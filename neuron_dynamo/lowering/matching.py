"""FX node predicates shared by the pattern matchers and by the refusals that ask what a matcher would take."""

from __future__ import annotations

from typing import Any

import torch.fx as fx


def is_call(node: Any, *packets: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and getattr(
        node.target, "overloadpacket", None) in packets


def val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def private(*nodes: fx.Node) -> bool:
    """Each node is read by exactly one other node (the next one of the chain)."""
    return all(len(node.users) == 1 for node in nodes)
