"""Lowered regions as bytes and back, for the persistent compile cache (`Target.serialize_region`/`load_region`).

A simulator region's artifact is its lowered graph: nodes calling registry kernels (stored by op name and
target) and generated kernels (stored by their fused-group spec, from which the same NKI source is generated and
exec'd again on load: no partitioning, no lowering, no matching). Aten ops are stored by name. A region that reads
graph constants (get_attr) is not stored: the program is then simply not cached.
"""

from __future__ import annotations

import io
import operator
import pickle
from typing import Any

import torch
import torch.fx as fx

from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.lowering.fusion import FusedKernel
from neuron_dynamo.lowering.patterns import PATTERN_KERNELS, PatternKernel
from neuron_dynamo.lowering.registry import Kernel, kernel_for, op_name

FORMAT = 1


class ArtifactError(NeuronDynamoError):
    """A lowered region that cannot be stored, or stored bytes that do not decode."""


def _resolve_op(name: str) -> torch._ops.OpOverload:
    namespace, rest = name.split(".", 1)
    packet, overload = rest.rsplit(".", 1)
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, index: dict[fx.Node, int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.index = index

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, fx.Node):
            return ("node", self.index[obj])
        if isinstance(obj, Kernel):
            return ("kernel", op_name(obj.op), obj.target)
        if isinstance(obj, FusedKernel):
            return ("fused", obj.spec, obj.shape)
        if isinstance(obj, torch._ops.OpOverload):
            return ("op", op_name(obj))
        if isinstance(obj, PatternKernel):
            return ("pattern", obj.__name__)
        if obj is operator.getitem:
            return ("getitem",)
        return None


# What an artifact may name: cache entries hold code, so a planted entry must not reach anything else on load.
_ALLOWED_CLASSES = {
    "neuron_dynamo.lowering.codegen": {"GroupSpec", "Ref", "Step"},
    "neuron_dynamo.lowering.fusion": {"match_strides"},
    "torch.fx.immutable_collections": {"immutable_dict", "immutable_list"},
    "builtins": {"slice", "tuple", "list", "dict", "set", "frozenset"},
    "torch": {"device"},
}
_TORCH_VALUE_TYPES = (torch.dtype, torch.memory_format, torch.layout)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, built: list[fx.Node]) -> None:
        super().__init__(file)
        self.built = built

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module in ("torch", "torch._utils"):  # dtypes, memory formats and layouts are stored by name
            value = getattr(torch, name.removeprefix("torch."), None)
            if isinstance(value, _TORCH_VALUE_TYPES):
                return value
        raise ArtifactError(f"an artifact names {module}.{name}, which a lowered region never holds")

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0]
        if kind == "node":
            return self.built[pid[1]]
        if kind == "kernel":
            op = _resolve_op(pid[1])
            kernel = kernel_for(op, pid[2])
            if kernel is None:
                raise ArtifactError(f"no {pid[2]!r} kernel is registered for {pid[1]} any more")
            return kernel.for_overload(op)
        if kind == "fused":
            return FusedKernel(pid[1], pid[2])
        if kind == "op":
            return _resolve_op(pid[1])
        if kind == "pattern":
            return PATTERN_KERNELS[pid[1]]
        if kind == "getitem":
            return operator.getitem
        raise ArtifactError(f"unknown artifact reference {pid!r}")


def dump_region(lowered: fx.GraphModule) -> bytes:
    """The lowered region graph as bytes."""
    index: dict[fx.Node, int] = {}
    rows = []
    for position, node in enumerate(lowered.graph.nodes):
        if node.op not in ("placeholder", "call_function", "output"):
            raise ArtifactError(f"a lowered region with a {node.op} node ({node.name}) is not stored")
        rows.append((node.op, node.name, node.target, node.args, node.kwargs))
        index[node] = position
    buffer = io.BytesIO()
    buffer.write(bytes([FORMAT]))
    for row in rows:  # one record per node, so a record only refers to nodes already decoded
        _Pickler(buffer, index).dump(row)
    return buffer.getvalue()


def load_region(data: bytes) -> fx.GraphModule:
    """The inverse of `dump_region`: the lowered region, its generated kernels rebuilt from their specs."""
    if not data or data[0] != FORMAT:
        raise ArtifactError("not a lowered-region artifact of this version")
    buffer = io.BytesIO(data[1:])
    graph = fx.Graph()
    built: list[fx.Node] = []
    while buffer.tell() < len(data) - 1:
        op, name, target, args, kwargs = _Unpickler(buffer, built).load()
        built.append(graph.create_node(op, target, args, kwargs, name=name))
    return fx.GraphModule(torch.nn.Module(), graph, class_name="LoadedRegion")
