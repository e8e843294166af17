"""The lowering registry: the set of registered lowerings *is* the set of ops the backend supports.

As in Inductor's `lowering.py`, one decorator registers the implementation of one or more aten ops for one target::

    @lowers(aten.mm, aten.addmm, family="matmul")
    def matmul(op, *args, **kwargs): ...

An op is registered either as a whole packet (`aten.add`: every overload) or as one overload (`aten.add.Tensor`).
Each op's `Lowering` keeps one kernel per target name, so the NKI targets add their kernels with
`@lowers(aten.mm, family="matmul", target="simulator")` and the partitioner picks them up without being touched.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from neuron_dynamo.errors import NeuronDynamoError

OpKey = torch._ops.OpOverload | torch._ops.OpOverloadPacket


class RegistryError(NeuronDynamoError):
    """A lowering registered twice for one op and target, or registered for something that is not an aten op."""


class Kernel(functools.partial):
    """One op's implementation on one target, callable like the op itself.

    A lowered region is the region's FX graph with each op replaced by its kernel, so a Kernel carries a readable
    `__name__` for the generated code (`reference_mm`) and remembers the op and family it implements.
    A region calls hundreds of kernels per run, so a Kernel is a `functools.partial` (called without a Python frame
    of its own): of its implementation bound to the op, or of the `direct` callable given for its overload (a tensor
    method that is the op itself, taking the op's arguments).
    """

    def __new__(
        cls, op: OpKey, family: str, target: str, implementation: Callable[..., Any],
        accepts: Callable[[Any], str | None] | None = None, handles_empty: bool | None = None,
        direct: dict[OpKey, Callable[..., Any]] | None = None,
    ) -> Kernel:
        call = (direct or {}).get(op)
        self = super().__new__(cls, call) if call is not None else super().__new__(cls, implementation, op)
        self.op = op
        self.family = family
        self.target = target
        self.implementation = implementation
        self.accepts = accepts
        self.direct = direct
        # Whether the kernel is exact on tensors with no elements; by default only the reference kernels (torch)
        # are: NKI kernels need at least one element per dim, so a node with an empty tensor runs eagerly.
        if handles_empty is None:
            handles_empty = target == "reference" or family in EMPTY_SAFE_FAMILIES
        self.handles_empty = handles_empty
        self.__name__ = f"{target}_{op_name(op).replace('.', '_')}"
        self.__module__ = implementation.__module__
        return self

    def __reduce__(self) -> tuple:
        """Rebuilt from its registration (a copy of a lowered graph copies its kernels; partial's own would not)."""
        return Kernel, (self.op, self.family, self.target, self.implementation, self.accepts, self.handles_empty,
                        self.direct)

    def for_overload(self, overload: torch._ops.OpOverload) -> Kernel:
        """This kernel bound to one overload of its packet, so it runs exactly the op the graph recorded."""
        if overload is self.op:
            return self
        return Kernel(overload, self.family, self.target, self.implementation, self.accepts, self.handles_empty,
                      self.direct)

    def refusal(self, node: Any) -> str | None:
        """None if this kernel can take the FX `node` (its args, shapes, dtypes), else the reason it cannot."""
        if not self.handles_empty and has_empty_tensor(node):
            return EMPTY_TENSOR
        return None if self.accepts is None else self.accepts(node)

    def __repr__(self) -> str:
        return f"Kernel({op_name(self.op)}, family={self.family!r}, target={self.target!r})"


# Families whose NKI kernels are exact on empty tensors: views are access patterns, and cat, padding and the
# scatters copy nothing. (The embedding DMA kernel behind embedding, gather and index needs a non-empty shape:
# those say `handles_empty=False`; tests/lowering/test_integers.py runs each on empties.)
EMPTY_SAFE_FAMILIES = frozenset({"views"})
EMPTY_TENSOR = "an empty tensor (a dim of size 0): nothing to compute, and the kernel needs at least one element"


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def has_empty_tensor(node: Any) -> bool:
    """Whether the FX `node` reads or produces a tensor with no elements (a 0-dim tensor has one element)."""
    values = [node.meta.get("val"), *(arg.meta.get("val") for arg in getattr(node, "all_input_nodes", ()))]
    return holds_empty_tensor(values)


def holds_empty_tensor(values: Any) -> bool:
    """Whether `values` (a tensor, or tensors nested in tuples and lists) hold one with no elements; a symbolic
    size is not known to be empty."""
    for tensor in _tensors(values):
        try:
            if int(tensor.numel()) == 0:
                return True
        except (TypeError, ValueError, RuntimeError):  # a symbolic size: not known to be empty
            continue
    return False


@dataclasses.dataclass
class Lowering:
    """Everything the backend knows about lowering one op: its family and one kernel per target."""

    op: OpKey
    family: str
    kernels: dict[str, Kernel] = dataclasses.field(default_factory=dict)


_LOWERINGS: dict[OpKey, Lowering] = {}


def op_name(op: Any) -> str:
    """`aten.mm.default` for an overload, `aten.mm` for a packet, the qualified name for anything else."""
    if isinstance(op, torch._ops.OpOverload):
        return f"{op.namespace}.{op._opname}.{op._overloadname}"
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op._qualified_op_name.replace("::", ".")
    return getattr(op, "__qualname__", None) or getattr(op, "__name__", None) or str(op)


def lowers(
    *ops: OpKey, family: str, target: str = "reference", accepts: Callable[[Any], str | None] | None = None,
    handles_empty: bool | None = None, direct: dict[OpKey, Callable[..., Any]] | None = None,
) -> Callable[[Callable], Callable]:
    """Register the decorated `implementation(op, *args, **kwargs)` as the `target` kernel of every op in `ops`.

    `accepts(node) -> None | reason` lets a kernel refuse particular calls of its op (a layout or an argument its
    NKI implementation does not handle); the partitioner then runs that node eagerly with the reason.
    A node reading or producing an empty tensor is refused the same way (`EMPTY_TENSOR`) unless `handles_empty`
    (default: only for the reference target, whose kernels are torch itself).
    `direct` maps overloads to callables that give exactly what the implementation gives for them, called with the
    op's own arguments (`aten.t.default: torch.Tensor.t`): their kernels call those without the implementation.
    """

    def register(implementation: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            if not isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
                raise RegistryError(f"@lowers expects aten ops such as torch.ops.aten.mm, got {op!r}")
            lowering = _LOWERINGS.setdefault(op, Lowering(op, family))
            if target in lowering.kernels:
                raise RegistryError(f"{op_name(op)} already has a {target!r} lowering ({lowering.kernels[target]!r})")
            if lowering.family != family:
                raise RegistryError(f"{op_name(op)} is in family {lowering.family!r}, not {family!r}")
            lowering.kernels[target] = Kernel(op, family, target, implementation, accepts, handles_empty, direct)
        return implementation

    return register


def lowering_for(op: Any) -> Lowering | None:
    """The lowering of an op overload: registered for the overload itself, else for its packet."""
    if not isinstance(op, torch._ops.OpOverload):
        return None
    return _LOWERINGS.get(op) or _LOWERINGS.get(op.overloadpacket)


# Targets that run another target's kernels: the neuron toolchain compiles the very NKI kernels the simulator runs.
KERNEL_SETS = {"neuron": "simulator"}


def kernel_set(target: str) -> str:
    """The registry target name whose kernels `target` uses."""
    return KERNEL_SETS.get(target, target)


def kernel_for(op: Any, target: str) -> Kernel | None:
    lowering = lowering_for(op)
    return None if lowering is None else lowering.kernels.get(kernel_set(target))


def registered_ops(target: str | None = None) -> dict[str, list[str]]:
    """The registered op names per family (only those with a kernel for `target`, when given)."""
    families: dict[str, list[str]] = {}
    for op, lowering in _LOWERINGS.items():
        if target is None or target in lowering.kernels:
            families.setdefault(lowering.family, []).append(op_name(op))
    return {family: sorted(names) for family, names in sorted(families.items())}


def registered_op_keys() -> list[OpKey]:
    """Every registered op (packets and overloads), e.g. to keep them out of the decomposition table."""
    return list(_LOWERINGS)
