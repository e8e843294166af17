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
import os
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


def neuron_device_visible() -> bool:
    """A Neuron device node exists (what the Neuron runtime opens)."""
    return os.path.exists("/dev/neuron0")


def resolve_target(name: str, options: Any = None) -> Any:
    """The target object for an option value; raises before compiling anything if it cannot run here.

    `auto` is `neuron` on a Trainium host (genuine NKI toolchain, neuronx-cc and a visible device) and the
    `simulator` everywhere else. `neuron` needs the genuine toolchain and neuronx-cc on PATH, so asking for it
    elsewhere is an error rather than a silent substitute.
    """
    if name == "reference":
        return REFERENCE
    if name == "simulator":
        return SIMULATOR
    if name not in ("auto", "neuron"):
        raise TargetUnavailableError(f"unknown target {name!r}; valid targets: {', '.join(TARGET_NAMES)}")
    from neuron_dynamo.toolchain.neuronx_cc import find_compiler, neuron_target

    toolchain = nki_toolchain_info()
    ready = toolchain.get("genuine") and find_compiler() is not None
    if name == "auto":
        return neuron_target(options, toolchain["target"], DEVICE.supports) if ready and neuron_device_visible() \
            else SIMULATOR
    if not ready:
        raise TargetUnavailableError(
            "target 'neuron' needs a Trainium host with the genuine NKI toolchain (nki, and neuronx-cc on PATH); "
            f"this machine has provider {toolchain.get('provider')!r}"
            f"{'' if find_compiler() else ' and no neuronx-cc'}. Use target='simulator' or 'reference'."
        )
    return neuron_target(options, toolchain["target"], DEVICE.supports)
