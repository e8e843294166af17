"""The closed table of what a stored graph may call, and the bounds on the sizes it may ask for.

A cache entry is untrusted data (lowering/artifact.py). Naming a *registered* op is not enough to make it harmless:
aten also registers ops that map or write files (`aten.from_file`, `aten.save`), print (`aten._print`, `aten.warn`),
set process-wide state (`aten.manual_seed`, `aten.set_grad_enabled`) or, as TorchScript builtins, build strings
and lists. So a stored `{"op": ...}` decodes only if the op is in `pure_ops()`, built by one rule from torch's own
schemas (a program graph may hold any aten op that ran eagerly as a fallback, so no hand-written list of what the
lowering emits would do):

    an overload in the `aten` or `prims` namespace whose every argument and return is tensor-program data —
    Tensor, int/SymInt, float, bool, complex, Scalar, dtype/layout/memory format (ints in a schema), Device, an
    optional Generator (only None can be stored), and lists/optionals of these — where a `str` argument is
    allowed only under a name that selects a mode or carries an assertion message (`_MODE_STRINGS`: `approximate`,
    `rounding_mode`, `reduce`, ...), and whose packet is not in `_DENIED` (data-only schemas that still reach out of
    their tensors: the RNG seed, grad mode, plan caches, re-pointing a tensor at other memory, warnings, test ops).

This excludes, by schema, every op with a path, file name, message to print, module name, stream, storage,
script object, dict, generic list or string result. (`torch.Tag` marks no I/O, so the rule reads schemas, not
tags; `nondeterministic_seeded` ops are in the table: an RNG draw is data.) Ops write only into their
`Tensor(a!)` arguments (the schema says so), which is the graph's own business. With torch 2.13 the table holds
3,593 overloads (`pure_ops()`).

Besides it: the functional collectives of torch.distributed (`COLLECTIVES`: they talk only to the process groups
this process already joined, named by `group_name`; point-to-point sends and receives are not in it), the
higher-order ops that run the graph's own subgraphs (`HIGHER_ORDER`; never `print`, `call_torchbind`,
`inline_asm_elementwise`, delegates...), and the tensor methods of `TENSOR_METHODS` for `call_method` nodes, whose
receiver must be a tensor when they run. Registry kernels, pattern kernels and fused groups are closed tables of
their own (artifact.py).

Sizes: an entry's integers can ask for memory. `size_refusal` bounds every constant size argument of an op call —
the product of the ints of a size-like argument (`size`, `shape`, `repeats`, `pad`, `n`, `steps`, ...), the span of a
constant size/stride pair, the length of a constant `arange` — by `max_elements()`: `MAX_ELEMENTS` at most, and while
a program entry is decoded for a graph of this process, a margin over that graph's own largest tensor (the stored
graph's sizes are the attacker's to write, the live graph's are not).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Iterator
from typing import Any

import torch

# No stored graph may ask for a tensor of more elements than this: 16 Gi elements, 32 GiB in bf16, more than one
# NeuronCore's share of device memory.
MAX_ELEMENTS = 2**34
# While a program entry is decoded for a graph of this process: that graph's own largest tensor, times a margin
# (`element_limit`). An entry then cannot ask for more memory than the program it claims to be would use.
_limit: contextvars.ContextVar[int] = contextvars.ContextVar("neuron_dynamo_element_limit", default=MAX_ELEMENTS)


def max_elements() -> int:
    """The most elements a decoded size may ask for now (see `element_limit`)."""
    return _limit.get()


@contextlib.contextmanager
def element_limit(elements: int) -> Iterator[None]:
    """Decode inside with sizes bounded by `elements` (never above MAX_ELEMENTS)."""
    token = _limit.set(min(int(elements), MAX_ELEMENTS))
    try:
        yield
    finally:
        _limit.reset(token)

_NAMESPACES = ("aten", "prims")
# Schema type kinds that are plain data (dtype, layout and memory format are ints in a schema).
_DATA_KINDS = frozenset({"TensorType", "IntType", "SymIntType", "FloatType", "SymFloatType", "BoolType",
                         "SymBoolType", "ComplexType", "NumberType", "DeviceObjType", "ScalarTypeType",
                         "LayoutType", "MemoryFormatType", "NoneType"})
# `str` arguments that pick one of a few modes (checked by the op), or carry an assertion's message.
_MODE_STRINGS = frozenset({"approximate", "rounding_mode", "reduce", "padding", "indexing", "interpolation", "side",
                           "UPLO", "mode", "ord", "p", "norm", "driver", "equation", "pad_mode", "padding_side",
                           "assert_msg"})
# Packets whose schemas are data only, but which act outside their tensors.
_DENIED = frozenset({
    "aten::manual_seed", "aten::seed", "aten::initial_seed", "aten::set_grad_enabled",  # process-wide state
    "aten::_cufft_set_plan_cache_max_size", "aten::_cufft_clear_plan_cache",
    "aten::set_", "aten::set", "aten::set_data", "aten::requires_grad_", "aten::retain_grad",  # other memory/autograd
    "aten::record_stream",
    "aten::_print", "aten::warn", "aten::save", "aten::from_file",  # I/O (also refused by their `str` arguments)
})

# The functional collectives Dynamo and DTensor put in graphs (passes/collectives.py), run by torch.distributed.
COLLECTIVES = frozenset({
    *(f"_c10d_functional::{name}" for name in (
        "all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_", "all_gather_into_tensor",
        "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
        "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast",
        "broadcast_", "wait_tensor")),
    *(f"_c10d_functional_autograd::{name}" for name in (
        "all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")),
})

# Higher-order ops that only run subgraphs of the graph itself (a stored graph reaches those by `get_attr`).
HIGHER_ORDER = frozenset({"cond", "while_loop", "while_loop_stack_output", "scan", "map_impl", "associative_scan",
                          "invoke_subgraph", "flex_attention", "flex_attention_backward"})

# Tensor methods a `call_method` node may name: views, shapes, conversions and plain arithmetic (what Dynamo-level
# graphs hold; AOTAutograd's aten graphs have none). The receiver must be a tensor (artifact.TensorMethod).
TENSOR_METHODS = frozenset({
    "view", "reshape", "view_as", "reshape_as", "expand", "expand_as", "repeat", "contiguous", "size", "stride",
    "dim", "numel", "permute", "transpose", "t", "unsqueeze", "squeeze", "flatten", "unflatten", "narrow", "select",
    "chunk", "split", "unbind", "to", "type_as", "float", "half", "bfloat16", "double", "int", "long", "bool",
    "clone", "detach", "add", "sub", "mul", "div", "neg", "pow", "matmul", "sum", "mean", "amax", "softmax",
    "relu", "masked_fill", "new_zeros", "new_ones", "new_empty", "new_full"})
# Their methods whose integer arguments are the sizes of a result.
SIZING_METHODS = frozenset({"view", "reshape", "expand", "repeat", "new_zeros", "new_ones", "new_empty", "new_full"})

# Op arguments whose integers are (factors of) the number of elements of a result.
_SIZE_ARGUMENTS = frozenset({"size", "sizes", "shape", "output_size", "input_size", "input_sizes", "self_size",
                             "repeats", "pad", "s", "n", "m", "length", "steps", "window_length", "num_weights",
                             "total_length", "row", "col", "last_dim_size", "outer_length"})
_STRIDE_ARGUMENTS = frozenset({"stride", "strides"})
_RANGES = frozenset({"aten::arange", "aten::range"})


def _is_data(kind_of: Any, name: str) -> bool:
    kind = kind_of.kind()
    if kind == "OptionalType":
        inner = kind_of.getElementType()
        return inner.kind() == "GeneratorType" or _is_data(inner, name)
    if kind == "ListType":
        return _is_data(kind_of.getElementType(), name)
    if kind == "StringType":
        return name in _MODE_STRINGS
    return kind in _DATA_KINDS


def _qualified(op: torch._ops.OpOverload) -> str:
    return op._schema.name


def refusal(op: Any) -> str | None:
    """None if a stored graph may call `op` (an op overload), else why not."""
    if not isinstance(op, torch._ops.OpOverload):
        return f"{op!r} is not an op overload"
    name = _qualified(op)
    if name in COLLECTIVES:
        return None
    if op.namespace not in _NAMESPACES:
        return f"{name} is not an aten or prims op"
    if name in _DENIED or op._opname.startswith("_test"):
        return f"{name} acts outside its tensors"
    schema = op._schema
    for argument in schema.arguments:
        if not _is_data(argument.type, argument.name):
            return f"{name} takes {argument.name}: {argument.type}, which is not tensor-program data"
    for result in schema.returns:
        if not _is_data(result.type, ""):
            return f"{name} returns {result.type}, which is not tensor-program data"
    return None


@functools.cache
def pure_ops() -> frozenset[torch._ops.OpOverload]:
    """Every aten/prims overload the rule admits (for reports and tests; decoding asks `refusal` per op)."""
    found = set()
    for schema in torch._C._jit_get_all_schemas():
        namespace, _, name = schema.name.partition("::")
        if namespace not in _NAMESPACES:
            continue
        try:
            op = getattr(getattr(getattr(torch.ops, namespace), name), schema.overload_name or "default")
        except (AttributeError, RuntimeError):
            continue
        if refusal(op) is None:
            found.add(op)
    return frozenset(found)


# ------------------------------------------------------------------------------------------------------ sizes
def _ints(value: Any) -> list[int] | None:
    """The constant ints of a size argument (an int or a list of them; nodes and SymInts are not constants)."""
    if type(value) is int:
        return [value]
    if isinstance(value, list | tuple) and all(type(v) is int for v in value):
        return list(value)
    return None


def _product(values: list[int]) -> int:
    total = 1
    for value in values:
        total *= max(abs(value), 1)
        if total > max_elements():  # stop early: the ints themselves may be huge
            break
    return total


def size_refusal(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str | None:
    """None if the constant size arguments of this call of `op` ask for at most max_elements() elements."""
    named: dict[str, Any] = {}
    for position, argument in enumerate(op._schema.arguments):
        if position < len(args) and not argument.kwarg_only:
            named[argument.name] = args[position]
        elif argument.name in kwargs:
            named[argument.name] = kwargs[argument.name]
    sizes: list[int] = []
    for name, value in named.items():
        ints = _ints(value)
        if ints is None:
            continue
        if name in _SIZE_ARGUMENTS:
            sizes += ints
        elif name in _STRIDE_ARGUMENTS and any(abs(v) > max_elements() for v in ints):
            return f"{_qualified(op)} has a stride beyond {max_elements()}"
    if _product(sizes) > max_elements():
        return f"{_qualified(op)} asks for more than {max_elements()} elements"
    size, stride = _ints(named.get("size")), _ints(named.get("stride"))
    if size and stride and len(size) == len(stride):
        span = sum((max(s, 1) - 1) * abs(t) for s, t in zip(size, stride, strict=True)) + 1
        if span > max_elements():
            return f"{_qualified(op)} spans more than {max_elements()} elements"
    if _qualified(op) in _RANGES:
        return _range_refusal(op, named)
    return None


def _range_refusal(op: torch._ops.OpOverload, named: dict[str, Any]) -> str | None:
    start, end, step = named.get("start", 0), named.get("end"), named.get("step", 1)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (start, end, step)):
        return None  # a symbolic bound: sized by the program's inputs
    if step == 0 or not all(math.isfinite(v) for v in (start, end, step)):
        return None  # torch refuses these itself
    if (end - start) / step > max_elements():
        return f"{_qualified(op)} asks for more than {max_elements()} elements"
    return None


def method_size_refusal(name: str, args: tuple) -> str | None:
    """None if a `call_method` node's constant sizes ask for at most max_elements() elements (args after the
    receiver: `x.view(2, 3)` or `x.view((2, 3))`)."""
    if name not in SIZING_METHODS:
        return None
    sizes = [v for arg in args for v in (_ints(arg) or [])]
    if _product(sizes) > max_elements():
        return f"Tensor.{name} asks for more than {max_elements()} elements"
    return None
