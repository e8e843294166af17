"""Graphs as data: program graphs and lowered regions to JSON and back, for the persistent compile cache.

A cache entry is read from disk, so decoding treats it as untrusted data that must not be able to run code of its
own (the directory checks of cache.py keep strangers out; this keeps a planted entry harmless even so):

* a call target is looked up by *name* in closed tables, never by module path and never imported: aten/prims ops
  admitted by the rule of lowering/op_table.py (pure by their schemas: no file, print, process state or string
  that names anything), torch.distributed's functional collectives, the higher-order ops that run the graph's own
  subgraphs, registry kernels (op + target), pattern kernels, a fixed set of Python functions (`operator.getitem`,
  size arithmetic, ...), and generated kernels, which are stored as their fused-group spec and whose NKI source
  is generated again on load;
* a `call_method` node names a method of `op_table.TENSOR_METHODS` and runs only on a tensor (`TensorMethod`);
  size arithmetic takes numbers only and stays within int64 (`_Arithmetic`);
* constant sizes are bounded (`op_table.max_elements()` elements per size argument or fused-group shape);
* every string that `torch.fx` pastes into the Python source of a GraphModule (placeholder and attribute targets,
  method names, keyword names, node names) must be an identifier;
* constants are JSON scalars or tagged values (floats by `repr`, dtypes, devices, memory formats, layouts,
  slices, lists, tuples, dicts); a fused-group spec is typed and checked (each operand refers to an input or an
  earlier step, each op has an NKI emitter, string constants are identifiers) before any source is generated.

A region artifact is `FORMAT` (one byte) + the JSON node list. A region that reads graph constants (get_attr) is
not stored by `dump_region`: the program is then simply not cached.
"""

from __future__ import annotations

import json
import math
import operator
import re
from typing import Any

import torch
import torch.fx as fx

from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.lowering import op_table
from neuron_dynamo.lowering.codegen import GroupSpec, Ref, Step, emitter_for
from neuron_dynamo.lowering.generated import FusedKernel, match_strides, sole_input
from neuron_dynamo.lowering.patterns import PATTERN_KERNELS, PatternKernel
from neuron_dynamo.lowering.registry import Kernel, kernel_for, op_name

FORMAT = 2

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ATTRIBUTE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_OP_PART = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*\Z")  # no dunders: `aten.__class__...` names no op


class ArtifactError(NeuronDynamoError):
    """A graph that cannot be stored, or stored data that does not decode to one."""


_NUMBERS = (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool, torch.Tensor)
_INT64 = 2**63


class _Arithmetic:
    """A Python function of size arithmetic (`operator.mul`, `math.ceil`, ...) as a decoded graph calls it: on
    numbers, SymInts and tensors only (never `list * n`), with an int exponent of at most 64 and an int result
    within int64, so that no chain of stored operations grows an integer or a sequence without bound."""

    def __init__(self, name: str, fn: Any) -> None:
        self.fn = fn
        self.__name__ = f"bounded_{name.replace('.', '_')}"  # not `mul` of `_operator`: fx would inline `a * b`
        self.__module__ = __name__

    def __call__(self, *args: Any) -> Any:
        if not all(isinstance(arg, _NUMBERS) for arg in args):
            raise ArtifactError(f"{self.__name__} of {[type(arg).__name__ for arg in args]}: numbers only")
        if self.fn is operator.pow and type(args[1]) is int and abs(args[1]) > 64:
            raise ArtifactError(f"an integer power of {args[1]}")
        result = self.fn(*args)
        if type(result) is int and not -_INT64 <= result < _INT64:
            raise ArtifactError("size arithmetic beyond int64")
        return result

    def __repr__(self) -> str:
        return f"_Arithmetic({self.__name__})"


class TensorMethod:
    """A decoded `call_method` node: the method `name` of its first argument, which must be a tensor (a storage,
    a list or another object has methods that import modules or map files). Encoded back as a `call_method` row."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.__name__ = f"tensor_{name}"
        self.__module__ = __name__

    def __call__(self, receiver: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(receiver, torch.Tensor):
            raise ArtifactError(f"a stored graph calls .{self.name}() on a {type(receiver).__name__}, not a tensor")
        return getattr(receiver, self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"TensorMethod({self.name})"


# The Python functions a stored graph may call: what Dynamo/AOTAutograd and the lowering put in graphs.
_ARITHMETIC: dict[str, Any] = {
    **{f"operator.{name}": getattr(operator, name) for name in (
        "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "eq", "ne", "lt", "le",
        "gt", "ge", "and_", "or_", "xor", "invert", "not_")},
    **{f"math.{name}": getattr(math, name) for name in ("floor", "ceil", "trunc", "sqrt")},
    **{f"torch.{name}": getattr(torch, name) for name in (
        "sym_int", "sym_float", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sqrt")},
}
_FUNCTIONS: dict[str, Any] = {
    "operator.getitem": operator.getitem,
    **{name: _Arithmetic(name, fn) for name, fn in _ARITHMETIC.items()},
    "neuron_dynamo.match_strides": match_strides,
    "neuron_dynamo.sole_input": sole_input,
}
# Encoding names the plain functions (in graphs being stored) and their bounded forms (in graphs read back).
_FUNCTION_NAMES = {id(fn): name for name, fn in {**_ARITHMETIC, **_FUNCTIONS}.items()}
_TORCH_TYPES = {"dtype": torch.dtype, "memory_format": torch.memory_format, "layout": torch.layout}
_NODE_OPS = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")


def _checked(pattern: re.Pattern, text: Any, what: str) -> str:
    if not isinstance(text, str) or not pattern.match(text):
        raise ArtifactError(f"{what} {text!r} is not a plain identifier")
    return text


# ------------------------------------------------------------------------------------------------------ values
def encode_value(value: Any, index: dict[fx.Node, int] | None = None) -> Any:
    """A JSON-serialisable form of a graph argument or a fused-group constant (`Ref`s, nodes by position)."""
    if isinstance(value, fx.Node):
        if index is None:
            raise ArtifactError("a graph node where only constants may appear")
        return {"node": index[value]}
    if isinstance(value, Ref):
        return {"ref": [value.kind, value.index]}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return {"float": repr(value)}  # repr round-trips exactly, inf and nan included
    if isinstance(value, list | tuple):
        return {"list" if isinstance(value, list) else "tuple": [encode_value(v, index) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[_checked(_IDENTIFIER, k, "a keyword"), encode_value(v, index)] for k, v in value.items()]}
    if isinstance(value, slice):
        return {"slice": [encode_value(part, index) for part in (value.start, value.stop, value.step)]}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    for kind, cls in _TORCH_TYPES.items():
        if isinstance(value, cls):
            return {kind: str(value).removeprefix("torch.")}
    raise ArtifactError(f"cannot store the graph argument {value!r} ({type(value).__name__})")


def decode_value(value: Any, built: list[fx.Node] | None = None) -> Any:
    """The inverse of `encode_value`; `built` holds the nodes decoded so far (None: no node may appear)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise ArtifactError(f"malformed stored value {value!r}")
    ((kind, inner),) = value.items()
    if kind == "node" and built is not None and type(inner) is int and 0 <= inner < len(built):
        return built[inner]
    if kind == "ref" and isinstance(inner, list) and len(inner) == 2:
        return Ref(inner[0], inner[1])  # checked against its spec by `_decode_spec`
    if kind == "float" and isinstance(inner, str):
        return float(inner)
    if kind in ("list", "tuple", "slice") and isinstance(inner, list):
        items = [decode_value(v, built) for v in inner]
        if kind == "slice":
            if len(items) != 3 or not all(item is None or type(item) is int for item in items):
                raise ArtifactError(f"malformed stored slice {inner!r}")
            return slice(*items)
        return items if kind == "list" else tuple(items)
    if kind == "dict" and isinstance(inner, list):
        return {_checked(_IDENTIFIER, k, "a keyword"): decode_value(v, built) for k, v in inner}
    if kind == "device" and isinstance(inner, str):
        return torch.device(inner)
    if kind in _TORCH_TYPES and isinstance(inner, str) and _IDENTIFIER.match(inner):
        found = getattr(torch, inner, None)
        if isinstance(found, _TORCH_TYPES[kind]):
            return found
    raise ArtifactError(f"malformed stored value {value!r}")


# ----------------------------------------------------------------------------------------------------- targets
def resolve_op(name: Any) -> torch._ops.OpOverload:
    """The registered op overload named `namespace.op.overload` (e.g. `aten.mm.default`), or ArtifactError.

    Registered is not harmless (`aten.from_file` is registered): a stored graph calls ops of `listed_op`, and the
    kernels and fused steps resolved here are closed by the registry and by the NKI emitters."""
    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) != 3 or not all(_OP_PART.match(part) for part in parts):
        raise ArtifactError(f"{name!r} does not name an op overload")
    found = getattr(getattr(getattr(torch.ops, parts[0]), parts[1], None), parts[2], None)
    if not isinstance(found, torch._ops.OpOverload):
        raise ArtifactError(f"no op {name!r} is registered")
    return found


def listed_op(name: Any) -> torch._ops.OpOverload:
    """The op named `name` if it is in the closed op table (op_table.py), else ArtifactError."""
    op = resolve_op(name)
    reason = op_table.refusal(op)
    if reason is not None:
        raise ArtifactError(f"a stored graph calls {name}, which is not in the op table: {reason}")
    return op


def _encode_target(target: Any) -> dict[str, Any]:
    if isinstance(target, Kernel):
        return {"kernel": op_name(target.op), "target": target.target}
    if isinstance(target, FusedKernel):
        return {"fused": _encode_spec(target.spec), "shape": list(target.shape)}
    if isinstance(target, PatternKernel):
        return {"pattern": target.__name__}
    if isinstance(target, torch._ops.OpOverload):
        return {"op": op_name(target)}
    if isinstance(target, torch._ops.HigherOrderOperator):
        return {"hop": target.name()}
    if id(target) in _FUNCTION_NAMES:
        return {"function": _FUNCTION_NAMES[id(target)]}
    raise ArtifactError(f"cannot name the call target {target!r} in a cache entry")


def _decode_target(target: Any) -> Any:
    if not isinstance(target, dict):
        raise ArtifactError(f"malformed call target {target!r}")
    if "kernel" in target:
        op = resolve_op(target["kernel"])
        kernel = kernel_for(op, target.get("target"))
        if kernel is None:
            raise ArtifactError(f"no {target.get('target')!r} kernel is registered for {target['kernel']}")
        return kernel.for_overload(op)
    if "fused" in target:
        shape = target.get("shape")
        if not isinstance(shape, list) or not all(type(size) is int and size >= 0 for size in shape):
            raise ArtifactError(f"malformed fused kernel shape {shape!r}")
        if math.prod(shape) > op_table.max_elements():
            raise ArtifactError(f"a fused kernel of more than {op_table.max_elements()} elements")
        return FusedKernel(_decode_spec(target["fused"]), shape)
    if "pattern" in target:
        if target["pattern"] not in PATTERN_KERNELS:
            raise ArtifactError(f"no pattern kernel {target['pattern']!r}")
        return PATTERN_KERNELS[target["pattern"]]
    if "op" in target:
        return listed_op(target["op"])
    if "hop" in target:
        if target["hop"] not in op_table.HIGHER_ORDER:
            raise ArtifactError(f"a stored graph calls the higher-order op {target['hop']!r}, not in the table")
        found = getattr(torch.ops.higher_order, target["hop"], None)
        if not isinstance(found, torch._ops.HigherOrderOperator):
            raise ArtifactError(f"no higher-order op {target['hop']!r}")
        return found
    if target.get("function") in _FUNCTIONS:
        return _FUNCTIONS[target["function"]]
    raise ArtifactError(f"a stored graph calls {target!r}, which is not in the table of callable targets")


# ------------------------------------------------------------------------------------------- fused-group specs
def _encode_spec(spec: GroupSpec) -> dict[str, Any]:
    return {
        "inputs": [encode_value(dtype) for dtype in spec.inputs],
        "steps": [{"op": op_name(step.op), "args": encode_value(step.args),
                   "kwargs": [[name, encode_value(value)] for name, value in step.kwargs],
                   "dtype": encode_value(step.dtype)} for step in spec.steps],
        "outputs": list(spec.outputs),
    }


def _decode_spec(data: Any) -> GroupSpec:
    """A fused-group spec, checked so that the source generated from it says only what a lowering could say."""
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        raise ArtifactError("malformed fused-group spec")
    inputs = tuple(_dtype(value) for value in _list(data.get("inputs")))
    steps: list[Step] = []
    for row in data["steps"]:
        if not isinstance(row, dict):
            raise ArtifactError("malformed fused-group step")
        op = resolve_op(row.get("op"))
        if emitter_for(op) is None:
            raise ArtifactError(f"{op_name(op)} has no NKI emitter: not a fused-group step")
        args = _step_constant(decode_value(row.get("args")), len(inputs), len(steps))
        kwargs = tuple((_checked(_IDENTIFIER, pair[0], "a keyword"),
                        _step_constant(decode_value(pair[1]), len(inputs), len(steps)))
                       for pair in _list(row.get("kwargs")) if isinstance(pair, list) and len(pair) == 2)
        if not isinstance(args, tuple) or len(kwargs) != len(_list(row.get("kwargs"))):
            raise ArtifactError("malformed fused-group step arguments")
        _bounded(op, args, dict(kwargs))
        steps.append(Step(op, args, kwargs, _dtype(row.get("dtype"))))
    outputs = tuple(_list(data.get("outputs")))
    if not outputs or not all(type(i) is int and 0 <= i < len(steps) for i in outputs):
        raise ArtifactError("malformed fused-group outputs")
    return GroupSpec(inputs, tuple(steps), outputs)


def _step_constant(value: Any, inputs: int, steps: int) -> Any:
    """A step operand: a `Ref` to an input or an earlier step, a number, None, a torch dtype, layout, memory format
    or device, or an identifier string."""
    if isinstance(value, Ref):
        limit = {"in": inputs, "step": steps}.get(value.kind)
        if limit is None or type(value.index) is not int or not 0 <= value.index < limit:
            raise ArtifactError(f"a fused-group operand refers to nothing: {value!r}")
        return value
    if isinstance(value, list | tuple):
        return type(value)(_step_constant(v, inputs, steps) for v in value)
    if isinstance(value, str):
        return _checked(_IDENTIFIER, value, "a fused-group constant")
    if value is None or isinstance(value, (bool, int, float, torch.device, *_TORCH_TYPES.values())):
        return value
    raise ArtifactError(f"a fused-group constant of type {type(value).__name__}")


def _dtype(value: Any) -> torch.dtype:
    decoded = decode_value(value)
    if not isinstance(decoded, torch.dtype):
        raise ArtifactError(f"{value!r} is not a dtype")
    return decoded


def _list(value: Any) -> list:
    if not isinstance(value, list):
        raise ArtifactError(f"malformed stored list {value!r}")
    return value


# ------------------------------------------------------------------------------------------------------ graphs
def encode_graph(graph: fx.Graph, attr_index: dict[str, int] | None = None) -> list:
    """A JSON-serialisable node list; `attr_index` maps get_attr targets to their stable position (None: none)."""
    index: dict[fx.Node, int] = {}
    rows = []
    for position, node in enumerate(graph.nodes):
        index[node] = position
        if node.op == "get_attr":
            if attr_index is None or node.target not in attr_index:
                raise ArtifactError(f"get_attr {node.target!r} is not a constant of the compiled graph")
            target: Any = {"attr": attr_index[node.target]}
        elif isinstance(node.target, TensorMethod):  # a call_method node read back from an entry
            target = node.target.name
        elif node.op == "call_function":
            target = _encode_target(node.target)
        else:
            target = _checked(_ATTRIBUTE, node.target, f"the {node.op} target")
        op = "call_method" if isinstance(node.target, TensorMethod) else node.op
        rows.append([op, _checked(_IDENTIFIER, node.name, "a node name"), target,
                     encode_value(node.args, index), encode_value(dict(node.kwargs), index)])
    return rows


def decode_graph(rows: Any, attr_targets: list[str] | None = None) -> fx.Graph:
    """The inverse of `encode_graph`; `attr_targets[i]` is the attribute name of the i-th constant here."""
    graph = fx.Graph()
    built: list[fx.Node] = []
    for row in _list(rows):
        if not isinstance(row, list) or len(row) != 5 or row[0] not in _NODE_OPS:
            raise ArtifactError(f"malformed stored node {row!r}")
        op, name, target, args, kwargs = row
        if op == "get_attr":
            position = target.get("attr") if isinstance(target, dict) else None
            if attr_targets is None or type(position) is not int or not 0 <= position < len(attr_targets):
                raise ArtifactError(f"a stored get_attr refers to no constant: {target!r}")
            target = attr_targets[position]
        elif op == "call_function":
            target = _decode_target(target)
        elif op == "call_method":
            if target not in op_table.TENSOR_METHODS:
                raise ArtifactError(f"{target!r} is not a tensor method a stored graph may call")
            op, target = "call_function", TensorMethod(target)
        else:
            target = _checked(_ATTRIBUTE, target, f"the {op} target")
        args, kwargs = decode_value(args, built), decode_value(kwargs, built)
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise ArtifactError(f"malformed arguments of stored node {name!r}")
        if op == "call_function":
            _check_call(target, args, kwargs)
        built.append(graph.create_node(op, target, args, kwargs, name=_checked(_IDENTIFIER, name, "a node name")))
    return graph


def _check_call(target: Any, args: tuple, kwargs: dict) -> None:
    """The constant arguments of a decoded call are within bounds: sizes (op_table.size_refusal), a tensor
    method's receiver (a node of the graph) and sizes, the strides the layout functions lay tensors out with."""
    op = target.op if isinstance(target, Kernel) else target
    if isinstance(op, torch._ops.OpOverload):
        _bounded(op, args, kwargs)
    elif isinstance(target, TensorMethod):
        if not args or not isinstance(args[0], fx.Node):
            raise ArtifactError(f"a stored .{target.name}() call without a receiver from the graph")
        reason = op_table.method_size_refusal(target.name, args[1:])
        if reason is not None:
            raise ArtifactError(f"a stored graph asks for too much memory: {reason}")
    elif target is match_strides or target is sole_input:
        stride = args[1] if len(args) > 1 else None
        limit = op_table.max_elements()
        if not isinstance(stride, tuple) or not all(type(v) is int and 0 <= v <= limit for v in stride):
            raise ArtifactError(f"a stored layout with strides {stride!r}")


def _bounded(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> None:
    reason = op_table.size_refusal(op, args, kwargs)
    if reason is not None:
        raise ArtifactError(f"a stored graph asks for too much memory: {reason}")


def dump_region(lowered: fx.GraphModule) -> bytes:
    """The lowered region graph as bytes."""
    for node in lowered.graph.nodes:
        if node.op not in ("placeholder", "call_function", "output"):
            raise ArtifactError(f"a lowered region with a {node.op} node ({node.name}) is not stored")
    return bytes([FORMAT]) + json.dumps(encode_graph(lowered.graph), separators=(",", ":")).encode()


def load_region(data: bytes) -> fx.GraphModule:
    """The inverse of `dump_region`: the lowered region, its generated kernels rebuilt from their specs."""
    if not data or data[0] != FORMAT:
        raise ArtifactError("not a lowered-region artifact of this version")
    try:
        rows = json.loads(data[1:])
    except ValueError as exc:
        raise ArtifactError(f"a lowered-region artifact that is not JSON: {exc}") from None
    graph = decode_graph(rows)
    for node in graph.nodes:
        if node.op not in ("placeholder", "call_function", "output") or isinstance(node.target, TensorMethod):
            raise ArtifactError(f"a lowered-region artifact with a {node.op} node")
    return fx.GraphModule(torch.nn.Module(), graph, class_name="LoadedRegion")
