"""Specialise a graph with symbolic sizes to one static shape (a bucket, or the exact sizes of a call).

Trainium programs are static, so a Dynamo graph with symbolic dims is re-traced once per bucket with `make_fx` on
fake tensors: every size becomes a constant and the result is an ordinary static aten graph for the partitioner.
SymInt inputs are baked in (they are sizes, fixed per bucket); only tensors remain inputs.
"""

from __future__ import annotations

import dataclasses
import functools
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
    """An integer size expression at concrete symbol values (memoised: bucket dispatch evaluates the same input and
    output sizes at every call, and sympy's substitution costs tens of microseconds each)."""
    return _evaluate(expr, tuple(values.items()))


@functools.lru_cache(maxsize=65536)
def _evaluate(expr, values: tuple[tuple[sympy.Symbol, int], ...]) -> int:
    result = sympy.sympify(sympy.sympify(expr).xreplace(dict(values)))
    if not result.is_number:
        raise SpecializationError(f"size {expr} still depends on {sorted(map(str, result.free_symbols))}")
    return int(result)


def static_shape(value: torch.Tensor, values: Mapping[sympy.Symbol, int]) -> list[int]:
    return [evaluate(s.node.expr, values) if isinstance(s, torch.SymInt) else int(s) for s in value.shape]


def specialize(gm: fx.GraphModule, values: Mapping[sympy.Symbol, int], strided: bool = False) -> StaticGraph:
    """`gm` with every symbol replaced by its value in `values`.

    Placeholders without metadata (the real-size inputs added by the padding proof) are 0-d int64 tensors. Example
    inputs are contiguous, or with `strided` laid out as the placeholders are (at exact sizes the call's own tensors,
    a transposed feature map or a slice, have those strides: the graph then traces as the static graph Dynamo made
    at those sizes did, and finds its stored program).
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constants: dict[int, object] = {}
    examples, tensor_inputs = [], []
    for index, node in enumerate(placeholders):
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt):
            constants[index] = evaluate(value.node.expr, values)
        elif isinstance(value, torch.Tensor):
            examples.append(_example(value, values, strided))
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
        return _Retrace(gm).run(*args)

    try:
        with torch.no_grad():  # graph constants (get_attr) are real tensors: allowed next to the fake inputs
            static = make_fx(run, tracing_mode="fake", _allow_non_fake_inputs=True)(*examples)
        _Retrace.drop_failed_views(static)
    except Exception as error:  # a guard or an op that cannot take these sizes
        raise SpecializationError(f"could not trace the graph at sizes {_show(values)}: {error}") from error
    return StaticGraph(static, examples, tensor_inputs)


def _example(value: torch.Tensor, values: Mapping[sympy.Symbol, int], strided: bool) -> torch.Tensor:
    shape = static_shape(value, values)
    if not strided:
        return torch.empty(shape, dtype=value.dtype, device=value.device)
    try:
        strides = [evaluate(s.node.expr, values) if isinstance(s, torch.SymInt) else int(s) for s in value.stride()]
    except SpecializationError:  # a stride of a size this call does not fix: any layout computes the same values
        return torch.empty(shape, dtype=value.dtype, device=value.device)
    return torch.empty_strided(shape, strides, dtype=value.dtype, device=value.device)


class _SizeChecked(fx.Interpreter):
    """Runs a graph at new (fake or symbolic) sizes, checking the shapes an op's meta function leaves unchecked.

    The CPU attention ops (`_scaled_dot_product_flash_attention_for_cpu`, the efficient and cuDNN kernels) take
    any `attn_mask` at trace time; eager checks at run time that it broadcasts to `[..., queries, keys]`. Checked
    here as an element-wise op would be: a mask length that must equal a fixed key length (NucleusMoEImage's mask
    over 144 image and 8 text tokens, whose keys come from float inputs) is specialised to it when the graph is
    generalised, and a bucket whose mask cannot serve the keys fails to trace instead of failing to run.
    """

    def call_function(self, target, args, kwargs):
        if isinstance(target, torch._ops.OpOverload):
            _check_attention_mask(target, args, kwargs)
        return super().call_function(target, args, kwargs)


def _check_attention_mask(target: torch._ops.OpOverload, args, kwargs) -> None:
    names = _attention_arguments(target)
    if names is None:
        return
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    mask = bound.get("attn_mask", bound.get("attn_bias"))
    if isinstance(mask, torch.Tensor):
        query, key = bound["query"], bound["key"]
        torch.broadcast_shapes(mask.shape, (*query.shape[:-1], key.shape[-2]))


@functools.cache
def _attention_arguments(target: torch._ops.OpOverload) -> tuple[str, ...] | None:
    """The argument names of an attention op taking a mask (query, key and attn_mask or attn_bias), else None."""
    names = tuple(argument.name for argument in target._schema.arguments)
    return names if {"query", "key"} <= set(names) and {"attn_mask", "attn_bias"} & set(names) else None


class _Retrace(_SizeChecked):
    """Runs a functional graph at new sizes, copying where a recorded view no longer applies.

    A `view` is recorded for the strides seen at trace time. The padding proof inserts masks (`masked_fill`,
    `where`) whose results take TensorIterator's layout rather than the masked input's, so at a bucket's sizes a
    later `view` can meet strides it cannot view. In a functional graph nothing writes through a view, so the copy
    a `reshape` makes there computes the same values.
    """

    VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)

    def call_function(self, target, args, kwargs):
        if target not in self.VIEWS:
            return super().call_function(target, args, kwargs)
        try:
            return super().call_function(target, args, kwargs)
        except Exception:  # noqa: BLE001 - retried as a copy, which raises again if the shape itself is wrong
            return torch.ops.aten.reshape.default(*args, **kwargs)

    @classmethod
    def drop_failed_views(cls, gm: fx.GraphModule) -> None:
        """The tracer records a view before its fake run fails: those nodes are left without users."""
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and node.target in cls.VIEWS and not node.users:
                gm.graph.erase_node(node)
        gm.recompile()


def _show(values: Mapping[sympy.Symbol, int]) -> str:
    return ", ".join(f"{symbol}={value}" for symbol, value in sorted(values.items(), key=lambda kv: str(kv[0])))



def is_length_dim(value: torch.Tensor, dim: int) -> bool:
    """Where a static graph's length lives: the last dim of an integer/bool input of rank 1 or 2 (token ids,
    attention masks, labels, positions). Float inputs and weights keep their sizes."""
    integral = value.dtype == torch.bool or not value.dtype.is_floating_point and not value.dtype.is_complex
    return integral and value.dim() in (1, 2) and dim == value.dim() - 1 and value.shape[dim] >= 2


def _fixes_a_length(gm: fx.GraphModule, values: list[torch.Tensor], lengths: set[int]) -> bool:
    """Cheap tests, before any retrace, that the graph ties a length to a fixed size.

    A dim of another input with the same size may be the same length (a float `values` tensor indexed by the ids),
    and only the integer inputs would become symbolic: refuse rather than guess. An integer argument equal to a
    length (`view(x, [1, 37, 64])`) means the graph bakes it in: the retrace would specialise it back anyway.
    """
    for value in values:
        if any(value.shape[d] in lengths for d in range(value.dim()) if not is_length_dim(value, d)):
            return True
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        for leaf in torch.utils._pytree.tree_leaves((node.args, node.kwargs)):
            if isinstance(leaf, int) and not isinstance(leaf, bool) and leaf in lengths:
                return True
    return False


def generalize(gm: fx.GraphModule) -> fx.GraphModule | None:
    """`gm` (static) retraced with its length dims symbolic, or None when the graph fixes those sizes itself.

    Inputs of equal length share one symbol (duck sizing). A graph that bakes a length into an op (a `view` to a
    constant shape, as Dynamo records for `dynamic=False` code that reads `x.shape`) specialises the symbol back to
    a constant, and is reported as not generalisable; so does an attention mask whose length must equal keys of a
    fixed length (`_SizeChecked`).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    values = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    if not all(isinstance(v, torch.Tensor) for v in values):
        return None
    lengths = {v.shape[d] for v in values for d in range(v.dim()) if is_length_dim(v, d)}
    if not lengths or _fixes_a_length(gm, values, lengths):
        return None
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    fakes = []
    for value in values:
        dims = [DimDynamic.DUCK if is_length_dim(value, d) else DimDynamic.STATIC for d in range(value.dim())]
        real = torch.empty(value.shape, dtype=value.dtype, device=value.device)
        fakes.append(mode.from_tensor(real, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims)))
    try:
        with mode, torch.no_grad():
            symbolic = make_fx(_SizeChecked(gm).run, tracing_mode="real")(*fakes)
    except Exception:  # an op that cannot be traced with symbolic sizes: keep the static graph
        return None
    placeholders = [n.meta.get("val") for n in symbolic.graph.nodes if n.op == "placeholder"]
    sizes = [s.node.expr for v in placeholders for s in v.shape if isinstance(s, torch.SymInt)]
    if not any(mode.shape_env.replace(expr).free_symbols for expr in sizes):
        return None  # every length was specialised back to a constant by the graph itself
    return symbolic
