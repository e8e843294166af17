"""Generated NKI code: fused element-wise groups, and graphs lowered to kernel calls around them.

Walking a graph in order, element-wise and creation nodes of one output shape join the open *group*; a node that
reads a group member closes it (so the group never waits on something that waits on it), and so does an
element-wise node of another shape. Nodes that are independent of the open group are emitted as they come, before
the group's kernel call. Each closed group becomes one `FusedKernel` (generated NKI source) returning the members
the rest of the graph reads (a group without inputs is a constant: its kernel runs at the first call only); every
other node calls its op's kernel for the target, except what needs no data moved: t(t(x)) is x, and so is a cat of
x with empty tensors when x already lies as the result would (`sole_input`).

The op-family modules build on this layer: a lone element-wise call runs as `run_single`, and ops best written as
other ops (a one-hot comparison for an overwriting index write, the moments of a variance) run as
`run_traced`/`run_decomposed` graphs.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.codegen import STORED_AS_OTHER, GroupSpec, Ref, Step
from neuron_dynamo.lowering.registry import kernel_for, kernel_set, lowering_for
from neuron_dynamo.toolchain.simulator import launch, launch_device

FUSED_FAMILIES = frozenset({"elementwise", "creation"})
aten = torch.ops.aten


class FusedKernel:
    """One generated NKI kernel for a fused group, called with the group's input tensors (any broadcastable shape).

    A region calls it with the same shapes again and again, so the per-call work is kept to what the arguments
    need: an input of the group's shape and of a dtype the device stores as it is goes to the kernel untouched
    (the kernel views it as [rows, cols] itself), and the kernel's results come back in the group's shape.
    """

    def __init__(self, spec: GroupSpec, shape: Sequence[int]) -> None:
        self.spec = spec
        self.shape = tuple(int(s) for s in shape)
        self.out_dtypes = [spec.steps[i].dtype for i in spec.outputs]
        self.__name__ = codegen.source_name("fused", repr(spec))
        self.source = codegen.elementwise_source(spec, self.__name__)
        self.kernel = codegen.compile_source(self.source, self.__name__)
        self.rows, self.cols = codegen.plan_elementwise(self.shape)
        self.device_shape = self.shape or (1,)  # a 0-dim result is one element on device
        # The kernel's results are the group's outputs as they are unless a dtype is stored as another, the shape
        # is 0-dim, or no input is a tensor (a kernel called without tensors returns NumPy arrays).
        self.as_returned = bool(spec.inputs) and bool(self.shape) and not STORED_AS_OTHER.intersection(self.out_dtypes)
        # A group without inputs (creation ops and arithmetic on them: iotas, masks, zeros) computes constants, which
        # a compiler folds: the kernel runs once and later calls get copies of its results.
        # Kept per device: the `neuron` target plans a region on the CPU and then runs it on `neuron` tensors.
        self.constants: dict[torch.device | None, tuple[torch.Tensor, ...]] = {}

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if inputs:
            return self._run(inputs)
        device = launch_device()
        constants = self.constants.get(device)
        if constants is None:
            constants = self._run(inputs)
            if not any(isinstance(c, FakeTensor) for c in constants):  # a trace's stand-ins are not values
                self.constants[device] = constants
        return tuple([c.clone() for c in constants])

    def _run(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        shape = self.shape
        if self.rows * self.cols == 0:
            return tuple(torch.empty(shape, dtype=dtype) for dtype in self.out_dtypes)
        args = [x if x.shape == shape and x.dtype not in STORED_AS_OTHER else _device_input(x, shape)
                for x in inputs]
        outs = launch(self.kernel, *args, self.device_shape, self.rows, self.cols)
        if self.as_returned:
            return outs
        return tuple([o if o.dtype is d and o.shape == shape else _host_output(o, d, shape)
                      for o, d in zip(outs, self.out_dtypes, strict=True)])

    def __repr__(self) -> str:
        return f"FusedKernel({self.__name__}, {len(self.spec.steps)} ops, shape={list(self.shape)})"


def _host_output(out: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A kernel result as the graph's tensor: its dtype, and its shape (a 0-dim result is one element on device)."""
    out = codegen.from_device(out, dtype)
    device = launch_device()  # a kernel without tensor inputs ran on the host: its constants go to the region's device
    if device is not None and out.device != device:
        out = out.to(device)
    return out if out.shape == shape else out.reshape(shape)


def _device_input(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """An input as the kernel reads it: in the dtype the device stores (converted before the expand: the same
    values, checked on fewer elements; a bool is viewed as its 0/1 bytes, as generated kernels only read their
    inputs) and broadcast to the group's shape."""
    if x.dtype is torch.bool:
        x = x.view(torch.uint8)
    elif x.dtype in STORED_AS_OTHER:
        x = codegen.to_device(x)
    return x if x.shape == shape else x.expand(shape)


def build_group(nodes: list[fx.Node]) -> tuple[GroupSpec, list[fx.Node], list[fx.Node]]:
    """The spec of a group of nodes, its external tensor inputs, and the members read outside the group."""
    members = {node: index for index, node in enumerate(nodes)}
    inputs: list[fx.Node] = []

    def ref(value: Any) -> Any:
        if isinstance(value, fx.Node):
            if value in members:
                return Ref("step", members[value])
            if value not in inputs:
                inputs.append(value)
            return Ref("in", inputs.index(value))
        if isinstance(value, (list, tuple)):
            return tuple(ref(v) for v in value)
        return value

    steps = []
    for node in nodes:
        args, kwargs = codegen.step_args(node.target, node.args, node.kwargs)
        steps.append(Step(node.target, tuple(ref(a) for a in args),
                          tuple(sorted((k, ref(v)) for k, v in kwargs.items())), node.meta["val"].dtype))
    outputs = [node for node in nodes if any(user not in members for user in node.users)]
    spec = GroupSpec(tuple(n.meta["val"].dtype for n in inputs), tuple(steps), tuple(members[n] for n in outputs))
    return spec, inputs, outputs


def _fusable(node: fx.Node, target: str) -> bool:
    lowering = lowering_for(node.target)
    return (node.op == "call_function" and lowering is not None and lowering.family in FUSED_FAMILIES
            and kernel_set(target) in lowering.kernels and isinstance(node.meta.get("val"), torch.Tensor))


def lower_graph(region: fx.GraphModule, target: str) -> fx.GraphModule:
    """The graph as NKI kernel calls: fused groups of generated code, per-op kernels for the rest (call targets
    that are not aten ops, such as the library-kernel calls of `patterns`, are kept as they are)."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    group: list[fx.Node] = []
    folded: set[fx.Node] = set()  # the t(t(x)) that stand for x

    def close_group() -> None:
        if not group:
            return
        spec, inputs, outputs = build_group(group)
        if not outputs:  # nothing reads the group (dead code that make_fx keeps): element-wise ops have no effects
            group.clear()
            return
        kernel = FusedKernel(spec, group[-1].meta["val"].shape)
        call = graph.call_function(kernel, tuple(env[n] for n in inputs))
        for k, member in enumerate(outputs):
            # named after the member it stands for: region names are unique, generated ones could shadow them
            env[member] = graph.create_node("call_function", operator.getitem, (call, k), name=member.name)
            env[member].meta = dict(member.meta)
        group.clear()

    for node in region.graph.nodes:
        if node.op == "output":
            close_group()
            graph.output(fx.map_arg(node.args[0], lambda value: _as_traced(graph, env[value], value)))
        elif _fusable(node, target):
            if group and node.meta["val"].shape != group[-1].meta["val"].shape:
                close_group()
            group.append(node)
        elif (source := _transposed_back(node)) is not None and node.args[0] not in folded:
            graph.erase_node(env[node.args[0]])  # t(t(x)) is x: no view to make (and none to copy as an output)
            env[node] = env[source]
            folded.add(node)
        elif (source := _sole_input(node)) is not None:
            if source in group:
                close_group()
            env[node] = graph.call_function(sole_input, (env[source], tuple(node.meta["val"].stride()), target))
            env[node].meta = dict(node.meta)
        else:
            if group and any(arg in group for arg in node.all_input_nodes):
                close_group()
            copied = graph.node_copy(node, env.__getitem__)
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                copied.target = kernel_for(node.target, target).for_overload(node.target)
            env[node] = copied
    lowered = fx.GraphModule(region, graph, class_name=f"{target.capitalize()}Region")
    return lowered


def _transposed_back(node: fx.Node) -> fx.Node | None:
    """x when `node` is t(t(x)) (AOTAutograd's weight gradients) and the inner t has no other reader: the same
    shape, strides and storage as x. Not when node is returned and x is an input or returned itself (a graph
    output stays a tensor of its own)."""
    inner = node.args[0] if node.op == "call_function" and node.target is aten.t.default else None
    if not (isinstance(inner, fx.Node) and inner.op == "call_function" and inner.target is aten.t.default
            and len(inner.users) == 1):
        return None
    source = inner.args[0]
    if any(user.op == "output" for user in node.users) and (
            source.op == "placeholder" or any(user.op == "output" for user in source.users)):
        return None
    return source


def _sole_input(node: fx.Node) -> fx.Node | None:
    """x when `node` concatenates x with empty tensors only (a KV cache's first update, cat([empty, x])), in the
    cat's shape and dtype, and x may stand for the result (see `_transposed_back`)."""
    value = node.meta.get("val")
    if not (node.op == "call_function" and node.target is aten.cat.default and isinstance(value, torch.Tensor)):
        return None
    filled = [t for t in node.args[0] if not (isinstance(t, fx.Node) and isinstance(t.meta.get("val"), torch.Tensor)
                                              and not t.meta["val"].numel())]
    if len(filled) != 1 or not isinstance(filled[0], fx.Node):
        return None
    source = filled[0]
    if (source.meta["val"].shape, source.meta["val"].dtype) != (value.shape, value.dtype) or (
            any(user.op == "output" for user in node.users)
            and (source.op == "placeholder" or any(user.op == "output" for user in source.users))):
        return None
    return source


def sole_input(x: torch.Tensor, stride: tuple[int, ...], target: str) -> torch.Tensor:
    """cat([empty..., x]) on `target`: x itself when it already lies as the result would (a library kernel's fresh
    output): nothing to move; else the target's cat kernel copies it into that layout."""
    if x.stride() == stride or x.numel() <= 1:
        return x
    return _cat_kernel(target)([x], 0)


@functools.cache
def _cat_kernel(target: str) -> Any:
    """The target's cat kernel, looked up once (a region calls `sole_input` every run)."""
    return kernel_for(aten.cat.default, target).for_overload(aten.cat.default)


def match_strides(value: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """`value` laid out with the strides the graph was traced with (a copy only when they differ)."""
    if value.stride() == stride or value.numel() <= 1 or 0 in stride:  # stride 0: an expanded view, kept as is
        return value
    return torch.empty_strided(value.shape, stride, dtype=value.dtype).copy_(value)


def _as_traced(graph: fx.Graph, lowered: fx.Node, original: fx.Node) -> fx.Node:
    """A region output in the layout eager produces: kernels write contiguous tensors where eager may not, and the
    ops after the region (AOTAutograd's views, eager fallbacks with layout-sensitive CPU kernels) rely on it."""
    value = original.meta.get("val")
    if not isinstance(value, torch.Tensor) or original.op == "placeholder":
        return lowered
    restrided = graph.call_function(match_strides, (lowered, tuple(value.stride())))
    restrided.meta = dict(original.meta)
    return restrided


def run_single(op: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """One element-wise or creation op as its own generated kernel (a lone call outside any fused group)."""
    tensors: list[torch.Tensor] = []

    def ref(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return Ref("in", len(tensors) - 1)
        if isinstance(value, (list, tuple)):
            return tuple(ref(v) for v in value)
        return value

    def meta(value: Any) -> Any:
        return value.to("meta") if isinstance(value, torch.Tensor) else value

    expected = op(*[meta(a) for a in args], **{k: meta(v) for k, v in kwargs.items()})
    step_args, step_kwargs = codegen.step_args(op, args, kwargs)
    step = Step(op, tuple(ref(a) for a in step_args), tuple(sorted((k, ref(v)) for k, v in step_kwargs.items())),
                expected.dtype)
    spec = GroupSpec(tuple(t.dtype for t in tensors), (step,), (0,))
    (result,) = FusedKernel(spec, expected.shape)(*tensors)
    return result


_DECOMPOSED: dict[tuple, fx.GraphModule] = {}


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.stride())
    return tuple(map(_describe, value)) if isinstance(value, (list, tuple)) else value


def run_traced(name: str, fn: Any, tensors: list[torch.Tensor], target: str = "simulator") -> Any:
    """Run the torch function `fn(*tensors)` as NKI kernels: traced once per shape, lowered like any region.

    For ops best expressed by other ops the NKI targets already lower (a one-hot comparison for an index gather,
    the moments of a variance), the lowering is written as plain torch code.
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    key = (name, _describe(tensors))
    lowered = _DECOMPOSED.get(key)
    if lowered is None:
        lowered = _DECOMPOSED[key] = lower_graph(make_fx(fn, tracing_mode="fake")(*tensors), target)
    return lowered(*tensors)


def run_decomposed(op: Any, args: tuple, kwargs: dict, target: str = "simulator") -> Any:
    """Run `op` as the NKI kernels of its PyTorch decomposition, lowered once per shape and argument set.

    For ops whose decomposition is all element-wise work and reductions (group norm and its backward): the
    decomposition is traced with fake tensors at the call's shapes and lowered like any region.
    """
    from torch._decomp import core_aten_decompositions, get_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    tensors = [arg for arg in args if isinstance(arg, torch.Tensor)]
    key = (op, _describe(args), _describe(sorted(kwargs.items())))
    lowered = _DECOMPOSED.get(key)
    if lowered is None:

        def call(*inputs: torch.Tensor) -> Any:  # the tensors are the graph's inputs, the rest are constants
            supply = iter(inputs)
            return op(*[next(supply) if isinstance(a, torch.Tensor) else a for a in args], **kwargs)

        table = {**core_aten_decompositions(), **get_decompositions([op])}
        traced = make_fx(call, decomposition_table=table, tracing_mode="fake")(*tensors)
        lowered = _DECOMPOSED[key] = lower_graph(traced, target)
    return lowered(*tensors)


def _example(value: torch.Tensor) -> torch.Tensor:
    """A real tensor of the argument's shape, strides and dtype for make_fx to fake (no data is read)."""
    return torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype)


def trace_node(node: fx.Node, table: dict) -> tuple[fx.GraphModule, list[fx.Node]] | None:
    """`node`'s call traced by make_fx with the decomposition `table` at its static shapes, and the graph nodes
    that feed the traced graph's placeholders, in order; None when it does not trace (data-dependent, or a
    decomposition that does not apply to these arguments)."""
    import torch.utils._pytree as pytree
    from torch.fx.experimental.proxy_tensor import make_fx

    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    inputs = [leaf for leaf in leaves if isinstance(leaf, fx.Node)]
    values = [leaf.meta.get("val") for leaf in inputs]
    if not all(isinstance(value, torch.Tensor) for value in values):
        return None  # a symbolic scalar operand: nothing static to trace with
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, fx.Node)]

    def call(*tensors: torch.Tensor) -> Any:
        filled = list(leaves)
        for slot, tensor in zip(slots, tensors, strict=True):
            filled[slot] = tensor
        args, kwargs = pytree.tree_unflatten(filled, spec)
        return node.target(*args, **kwargs)

    try:
        return make_fx(call, decomposition_table=table, tracing_mode="fake")(*map(_example, values)), inputs
    except Exception:  # noqa: BLE001 - the op stays whole
        return None


def decomposition_refusal(node: fx.Node) -> str | None:
    """None when every op of PyTorch's decomposition of `node` (as `run_decomposed` traces it, at the node's
    shapes) has a simulator kernel that accepts its call; else the first op that does not, and why."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    traced = trace_node(node, {**core_aten_decompositions(), **get_decompositions([node.target])})
    if traced is None:
        return "its decomposition does not trace at these arguments"
    for inner in traced[0].graph.nodes:
        if inner.op != "call_function" or not isinstance(inner.target, torch._ops.OpOverload):
            continue
        kernel = kernel_for(inner.target, "simulator")
        if kernel is None:
            return f"its decomposition needs {inner.target}, which has no NKI kernel"
        refusal = kernel.refusal(inner)
        if refusal is not None:
            return f"its decomposition's {inner.target}: {refusal}"
    return None
