"""The `simulator` toolchain: lowered regions run their NKI kernels on the project's CPU interpreter.

Every kernel launch goes through `launch`, which runs the kernel with the interpreter's profiler and adds its
estimated device time (the cost model's figure, not a measurement) to the innermost `device_time()` block. A
compiled region is the lowered FX graph wrapped in `SimulatorRegion`, which keeps the estimate of its last run so
the compiler can report the estimated device time per graph, and sets up the interpreter's launch environment once
per run (`nki.runtime.launch_scope`: torch on one thread, the target read once) rather than once per kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx

from neuron_dynamo import counters
from neuron_dynamo.nki import runtime as nki_runtime

_local = threading.local()


@dataclasses.dataclass(slots=True)
class DeviceTime:
    """Estimated device time accumulated by the kernel launches inside one `device_time()` block."""

    ns: float = 0.0
    kernels: int = 0


@contextlib.contextmanager
def device_time() -> Iterator[DeviceTime]:
    """Sum the estimated device time of the kernels launched inside the block (nested blocks each see theirs)."""
    stack = _local.__dict__.setdefault("stack", [])
    total = DeviceTime()
    stack.append(total)
    try:
        yield total
    finally:
        stack.pop()
        if stack:
            stack[-1].ns += total.ns
            stack[-1].kernels += total.kernels


@contextlib.contextmanager
def launching_with(launcher: Callable[[Any, tuple, dict], Any], device: torch.device | None) -> Iterator[None]:
    """Inside the block, `launch` hands every kernel call to `launcher(kernel, args, kwargs)` instead of the
    interpreter: the `neuron` target runs them through TorchNeuron, and its lowering-time plan records them.
    `device` is where the block's tensors live (None: the CPU), for code that makes tensors without inputs."""
    saved = getattr(_local, "launcher", None), getattr(_local, "device", None)
    _local.launcher, _local.device = launcher, device
    try:
        yield
    finally:
        _local.launcher, _local.device = saved


def launch_device() -> torch.device | None:
    """The device of the innermost `launching_with` block (None on the simulator)."""
    return getattr(_local, "device", None)


def launch(kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """Run an NKI kernel: on the interpreter, accounting its estimated device time, unless a `launching_with`
    block routes it elsewhere.

    A kernel of the genuine `nki` package (a Trainium host) has no interpreter profile: it just runs.
    """
    launcher = getattr(_local, "launcher", None)
    if launcher is not None:
        return launcher(kernel, args, kwargs)
    return simulate(kernel, *args, **kwargs)


def simulate(kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """Run an NKI kernel on the interpreter and account its estimated device time."""
    estimated = getattr(kernel, "estimated", None)
    if estimated is None:
        return kernel(*args, **kwargs)
    result, estimated_ns = estimated(*args, **kwargs)
    stack = getattr(_local, "stack", None)
    if stack:
        block = stack[-1]
        block.ns += estimated_ns
        block.kernels += 1
    return result


class SimulatorRegion(torch.nn.Module):
    """A lowered region on the interpreter: runs the graph and remembers its estimated device time per run."""

    def __init__(self, lowered: fx.GraphModule) -> None:
        super().__init__()
        self.lowered = lowered
        self.last_device_ns = 0.0
        self.on_run: Callable[[SimulatorRegion], None] | None = None  # the compiler's hook: refresh the report

    def forward(self, *args: Any) -> Any:
        with device_time() as spent, nki_runtime.launch_scope():  # set up once for all the region's launches
            result = self.lowered(*args)
        self.last_device_ns = spent.ns
        counters.bump("estimated_device_ns", spent.ns)
        counters.bump("kernels_launched", spent.kernels)
        if self.on_run is not None:
            self.on_run(self)
        return result


def compile_for_simulator(lowered: fx.GraphModule, example_inputs: Sequence[Any]) -> SimulatorRegion:
    """Nothing to build ahead of time: generated kernels were compiled (exec'd) at lowering, library ones import."""
    return SimulatorRegion(lowered)
