"""Specialise a graph with symbolic sizes to one static shape (a bucket, or the exact sizes of a call).

Trainium programs are static, so a Dynamo graph with symbolic dims is re-traced once per bucket with `make_fx` on
fake tensors: every size becomes a constant and the result is an ordinary static aten graph for the partitioner.
SymInt inputs are baked in (they are sizes, fixed per bucket); only tensors remain inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import sympy
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_dynamo.errors import NeuronDynamoError


class SpecializationError(NeuronDynamoError):
    """The graph could not be traced at the requested static sizes."""


@dataclasses.dataclass
class StaticGraph:
    """A static graph and the inputs it takes: `tensor_inputs[i]` is the index of the original input it receives."""

    gm: fx.GraphModule
    example_inputs: list[torch.Tensor]
    tensor_inputs: list[int]


def evaluate(expr, values: Mapping[sympy.Symbol, int]) -> int:
    """An integer size expression at concrete symbol values."""
    result = sympy.sympify(sympy.sympify(expr).xreplace(dict(values)))
    if not result.is_number:
        raise SpecializationError(f"size {expr} still depends on {sorted(map(str, result.free_symbols))}")
    return int(result)


def static_shape(value: torch.Tensor, values: Mapping[sympy.Symbol, int]) -> list[int]:
    return [evaluate(s.node.expr, values) if isinstance(s, torch.SymInt) else int(s) for s in value.shape]


def specialize(gm: fx.GraphModule, values: Mapping[sympy.Symbol, int]) -> StaticGraph:
    """`gm` with every symbol replaced by its value in `values`.

    Placeholders without metadata (the real-size inputs added by the padding proof) are 0-d int64 tensors.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constants: dict[int, object] = {}
    examples, tensor_inputs = [], []
    for index, node in enumerate(placeholders):
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt):
            constants[index] = evaluate(value.node.expr, values)
        elif isinstance(value, torch.Tensor):
            examples.append(torch.empty(static_shape(value, values), dtype=value.dtype, device=value.device))
            tensor_inputs.append(index)
        elif value is None:
            examples.append(torch.zeros((), dtype=torch.int64))
            tensor_inputs.append(index)
        else:
            constants[index] = value

    def run(*tensors):
        args = [None] * len(placeholders)
        for index, tensor in zip(tensor_inputs, tensors, strict=True):
            args[index] = tensor
        for index, constant in constants.items():
            args[index] = constant
        return fx.Interpreter(gm).run(*args)

    try:
        with torch.no_grad():  # graph constants (get_attr) are real tensors: allowed next to the fake inputs
            static = make_fx(run, tracing_mode="fake", _allow_non_fake_inputs=True)(*examples)
    except Exception as error:  # a guard or an op that cannot take these sizes
        raise SpecializationError(f"could not trace the graph at sizes {_show(values)}: {error}") from error
    return StaticGraph(static, examples, tensor_inputs)


def _show(values: Mapping[sympy.Symbol, int]) -> str:
    return ", ".join(f"{symbol}={value}" for symbol, value in sorted(values.items(), key=lambda kv: str(kv[0])))

