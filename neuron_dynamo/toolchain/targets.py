"""Targets: where a lowered region runs, and which nodes it can take.

A target answers two questions for the partitioner and the compiler:

- `supports(node) -> None | reason`: can this node run here (given it has a kernel for this target)? The base
  check is the dtype of every tensor the node reads or writes; a target may refuse more (shapes, layouts).
- `compile_region(lowered_region, example_inputs) -> callable`: turn a region whose ops already call this
  target's kernels into something to run.

The NKI targets plug in here and in the lowering registry (their kernels), never in the partitioner.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves

from neuron_dynamo.errors import NeuronDynamoError


class TargetUnavailableError(NeuronDynamoError):
    """The requested target cannot run on this machine."""


# What Trainium stores natively (fp8 included); int64 stays for indices, which the NKI kernels narrow to int32.
DEVICE_DTYPES = frozenset({
    torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
})


def _tensors(value: Any) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def node_tensor_values(node: fx.Node) -> list[torch.Tensor]:
    """The (fake) tensors a node reads and writes, from the `val` metadata AOTAutograd and make_fx record."""
    values = _tensors(node.meta.get("val"))
    for arg in node.all_input_nodes:
        values.extend(_tensors(arg.meta.get("val")))
    return values


class Target(Protocol):
    """What the partitioner and the compiler need from a target."""

    name: str

    def supports(self, node: fx.Node) -> str | None: ...

    def compile_region(self, lowered_region: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]: ...


@dataclasses.dataclass(frozen=True)
class InProcessTarget:
    """A target whose lowered regions run in this Python process.

    `reference` kernels call torch (the debugging baseline that stays for good); `simulator` kernels call the NKI
    interpreter. Either way the lowered region is an FX GraphModule calling those kernels, so compiling it is
    running it.
    """

    name: str
    description: str
    dtypes: frozenset[torch.dtype] = DEVICE_DTYPES

    def supports(self, node: fx.Node) -> str | None:
        for value in node_tensor_values(node):
            if value.dtype not in self.dtypes:
                return f"unsupported dtype ({str(value.dtype).removeprefix('torch.')})"
        return None

    def compile_region(self, lowered_region: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        if self.name == "simulator":
            from neuron_dynamo.toolchain.simulator import compile_for_simulator

            return compile_for_simulator(lowered_region, example_inputs)
        return lowered_region


@dataclasses.dataclass(frozen=True)
class SimulatorTarget(InProcessTarget):
    """The interpreter target, with what the compile cache needs: its facts and its regions as bytes."""

    def cache_facts(self) -> dict[str, Any]:
        """What changes a simulator artifact: the interpreter version and platform, and every kernel source."""
        info = nki_toolchain_info()
        return {"target": self.name, "interpreter": info.get("version"), "platform": info.get("target"),
                "sources": source_digest()}

    def serialize_region(self, compiled: Any, lowered_region: fx.GraphModule) -> bytes:
        from neuron_dynamo.lowering.artifact import dump_region  # the artifact is the lowered graph

        return dump_region(lowered_region)

    def load_region(self, data: bytes) -> Any:
        from neuron_dynamo.lowering.artifact import load_region
        from neuron_dynamo.toolchain.simulator import SimulatorRegion

        return SimulatorRegion(load_region(data))


def source_digest() -> str:
    """sha256 over the sources that make the NKI kernels: lowering, toolchain, the kernel library, the interpreter."""
    digest = hashlib.sha256()
    for package in ("lowering", "toolchain", "kernels", "nki"):
        spec = importlib.util.find_spec(f"neuron_dynamo.{package}")  # nki_kernels/ installs from outside the package
        for location in spec.submodule_search_locations:
            for path in sorted(Path(location).rglob("*.py")):
                digest.update(f"{package}/{path.relative_to(location).as_posix()}".encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


REFERENCE = InProcessTarget("reference", "region aten graphs executed by torch (debugging baseline)")
DEVICE = InProcessTarget("neuron", "the dtypes a Trainium region accepts (target neuron's capability check)")
SIMULATOR = SimulatorTarget("simulator", "NKI kernels executed by the CPU interpreter of neuron_dynamo.nki")
TARGET_NAMES = ("auto", "neuron", "simulator", "reference")


def nki_toolchain_info() -> dict[str, Any]:
    """`neuron_dynamo.nki.toolchain_info()`: genuine NKI or the interpreter, its version, the target generation.

    Imported on first use, so that importing the backend does not load the NKI interpreter.
    """
    from neuron_dynamo.nki import toolchain_info

    return toolchain_info()


def resolve_target(name: str, options: Any = None, example_inputs: Sequence[Any] | None = None) -> Any:
    """The target object for an option value and a graph's inputs; raises before compiling anything if it cannot
    run here.

    `auto` is `neuron` when TorchNeuron is there (torch_neuronx imports, `torch.neuron.is_available()`) and the
    graph's inputs live on the `neuron` device, and the `simulator` otherwise: CPU inputs keep the simulator.
    `neuron` asked for explicitly is an error where it cannot run, never a silent substitute. Without inputs (a
    check before tracing), `auto` and `neuron` only check what they can.
    """
    if name == "reference":
        return REFERENCE
    if name == "simulator":
        if example_inputs is not None and _on_device(example_inputs):
            raise TargetUnavailableError(
                "target 'simulator' runs on CPU tensors, and this graph's inputs are on the 'neuron' device: use "
                "target='auto' or 'neuron' there, or move the model and inputs to the CPU")
        return SIMULATOR
    if name not in ("auto", "neuron"):
        raise TargetUnavailableError(f"unknown target {name!r}; valid targets: {', '.join(TARGET_NAMES)}")
    from neuron_dynamo.toolchain import torchneuron

    if name == "auto":
        if example_inputs is None or not _on_device(example_inputs):
            return SIMULATOR
    elif not torchneuron.runtime_available():
        raise TargetUnavailableError(
            f"target 'neuron' needs TorchNeuron on a Trainium host: {torchneuron.unavailable_reason()}. "
            "Use target='simulator' or 'reference' for CPU tensors.")
    elif example_inputs is not None and not _on_device(example_inputs):
        raise TargetUnavailableError(
            "target 'neuron' runs on 'neuron'-device tensors and this graph's inputs are on the CPU: move the model "
            "and inputs with .to('neuron') (or device_map='neuron'), or use target='auto' to keep CPU inputs on the "
            "simulator")
    torchneuron.runtime()  # inputs on the device: TorchNeuron must be usable, or this says why
    return torchneuron.TorchNeuronTarget(DEVICE.supports, getattr(options, "device_mode", "eager"),
                                         getattr(options, "lnc", 0))


def _on_device(example_inputs: Sequence[Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.device.type == "neuron" for v in example_inputs)


def target_note(target_name: str) -> str:
    """Where a target runs regions and, for the simulator, why not on Trainium: `explain()` prints it."""
    if target_name == "simulator":
        from neuron_dynamo.toolchain import torchneuron

        where = "CPU inputs run on the NKI interpreter (the neuron target takes 'neuron'-device tensors"
        if not torchneuron.runtime_available():
            return f"{where}; TorchNeuron: {torchneuron.unavailable_reason()})"
        return f"{where})"
    if target_name == "neuron":
        return "TorchNeuron runs the regions' NKI kernels on the 'neuron' device"
    if target_name == "reference":
        return "regions run as their aten graphs in PyTorch (the debugging baseline)"
    return ""
