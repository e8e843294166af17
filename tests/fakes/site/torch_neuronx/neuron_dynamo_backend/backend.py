"""TorchNeuron's ``torch.compile`` backend, faked: ``neuron_backend(gm, example_inputs)``.

Same module path and name as TorchNeuron's entry point
(``torch_dynamo_backends: neuron = torch_neuronx.neuron_dynamo_backend.backend:neuron_backend``).
Like the real one it goes through AOTAutograd and hands each ATen graph to the compiler; here the
"compiler" only records the hand-off (``record.handoffs``) and runs the graph eagerly on the fake
device. Documented behaviour (torch.compile backend reference page): static shapes only,
``dynamic=True`` is rejected during compilation, shapes that vary between steps recompile per new
shape; ``mode`` other than ``"default"`` logs a warning and is ignored.
"""

from __future__ import annotations

import logging

import torch

from .. import nki_hop
from .._fake import record

logger = logging.getLogger(__name__)


def _symbolic(x) -> bool:
    if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
        return True
    if isinstance(x, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in (*x.shape, *x.stride()))
    return False


def _graph_is_symbolic(gm, example_inputs) -> bool:
    values = list(example_inputs)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            values.append(node.meta.get("example_value", node.meta.get("val")))
    return any(_symbolic(v) for v in values)


def _shape(x):
    return tuple(x.shape) if isinstance(x, torch.Tensor) else None


def _handoff(kind: str, gm, inputs) -> None:
    targets = [str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    record.handoffs.append(
        {"kind": kind, "targets": targets, "input_shapes": [_shape(x) for x in inputs]}
    )


def _run_as_graph(fn):
    """Kernels inside a compiled graph compile with the graph, not one by one."""

    def run(*args):
        previous = getattr(nki_hop._graph, "active", False)
        nki_hop._graph.active = True
        try:
            return fn(*args)
        finally:
            nki_hop._graph.active = previous

    return run


def _compiler(kind: str):
    from functorch.compile import make_boxed_func

    def compile_graph(gm, example_inputs):
        _handoff(kind, gm, example_inputs)
        return make_boxed_func(_run_as_graph(gm.forward))

    return compile_graph


def _per_shape(gm):
    """Dynamo made sizes symbolic on its own (automatic dynamic): recompile per concrete shape."""
    seen = set()

    def run(*args):
        key = tuple(_shape(a) if isinstance(a, torch.Tensor) else a for a in args)
        if key not in seen:
            seen.add(key)
            _handoff("per_shape", gm, args)
        return _run_as_graph(gm.forward)(*args)

    return run


def create_neuron_backend():
    from torch._dynamo.backends.common import aot_autograd

    def neuron_backend(gm, example_inputs, *, options=None, mode="default"):
        if mode not in (None, "default"):
            logger.warning("Neuron backend does not support mode=%r; using 'default'", mode)
        if _graph_is_symbolic(gm, example_inputs):
            if not torch._dynamo.config.assume_static_by_default:
                raise RuntimeError(
                    "Neuron backend: dynamic shapes are not supported (torch.compile was called "
                    "with dynamic=True); compile with dynamic=False and pad or bucket inputs"
                )
            return _per_shape(gm)
        aot = aot_autograd(
            fw_compiler=_compiler("forward"),
            bw_compiler=_compiler("backward"),
            inference_compiler=_compiler("inference"),
            keep_inference_input_mutations=True,
        )
        return aot(gm, example_inputs)

    return neuron_backend


neuron_backend = create_neuron_backend()
