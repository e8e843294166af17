"""Which graph ops are collectives: torch.distributed runs them, the backend compiles what lies between them.

Dynamo turns `torch.distributed` calls (and DTensor's redistributions, after AOTAutograd unwraps the subclass) into
the functional collectives of `torch.ops._c10d_functional` (`all_reduce`, `all_gather_into_tensor`,
`reduce_scatter_tensor`, ... and `wait_tensor`, which waits for one). A collective is communication between ranks,
not a kernel of one core: it is never lowered. The partitioner leaves it to PyTorch with the reason kind
"collective", so that reports tell it apart from ops the target lacks.
"""

from __future__ import annotations

from typing import Any

import torch

# The namespaces of the collective ops a graph can hold: the functional ones (and their autograd variants), the
# legacy functional namespace and the in-place `c10d` ops.
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd", "c10d_functional", "c10d"})


def is_collective(op: Any) -> bool:
    """Whether a node target is a torch.distributed collective (or the wait for one)."""
    return isinstance(op, torch._ops.OpOverload) and op.namespace in COLLECTIVE_NAMESPACES
