"""Build aten graphs with chosen symbolic dims for the bucketing tests (no Dynamo: fast)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext


def symbolic_graph(fn: Callable, inputs: Sequence[torch.Tensor], dynamic: Mapping[int, Sequence[int]]):
    """`fn` traced to an aten graph where dim d of input i is symbolic when d is in `dynamic[i]`.

    Inputs sharing a dynamic size share one symbol when they are listed with the same size (duck sizing).
    """
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    fakes = []
    for index, tensor in enumerate(inputs):
        dims = set(dynamic.get(index, ()))
        sizes = [DimDynamic.DUCK if d in dims else DimDynamic.STATIC for d in range(tensor.dim())]
        fakes.append(mode.from_tensor(tensor, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes)))
    with mode:
        return make_fx(fn, tracing_mode="real")(*fakes)


def dynamo_graph(fn: Callable, inputs: Sequence[torch.Tensor], dynamic: Mapping[int, Sequence[int]]):
    """The aten inference graph Dynamo + AOTAutograd capture for `fn` with the given dims marked dynamic.

    Slower than `symbolic_graph`, but records ops exactly as the backend receives them (e.g. `F.pad` stays
    `constant_pad_nd` instead of being specialised away).
    """
    from torch._dynamo.backends.common import aot_autograd

    captured = []

    def keep(gm, example_inputs):
        captured.append(gm)
        return gm

    torch._dynamo.reset()
    inputs = [t.clone() for t in inputs]
    for index, dims in dynamic.items():
        for dim in dims:
            torch._dynamo.mark_dynamic(inputs[index], dim)
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=keep), fullgraph=True)(*inputs)
    torch._dynamo.reset()
    return _tensor_inputs_only(captured[-1])


def _tensor_inputs_only(gm):
    """Replace SymInt placeholders by `sym_size` of a tensor input, so the graph takes exactly `fn`'s tensors."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tensors = [n for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor)]
    for node in placeholders:
        value = node.meta.get("val")
        if not isinstance(value, torch.SymInt):
            continue
        source, dim = next(
            (t, d) for t in tensors for d, size in enumerate(t.meta["val"].shape)
            if isinstance(size, torch.SymInt) and size.node.expr == value.node.expr
        )
        with gm.graph.inserting_after(tensors[-1]):
            size = gm.graph.call_function(torch.ops.aten.sym_size.int, (source, dim))
        size.meta["val"] = value
        node.replace_all_uses_with(size)
        gm.graph.erase_node(node)
    gm.recompile()
    return gm
