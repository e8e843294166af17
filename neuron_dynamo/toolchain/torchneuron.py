"""Target `neuron`: lowered regions run on Trainium through TorchNeuron (torch-neuronx), on `neuron`-device tensors.

This is the one module that speaks to TorchNeuron; every name of `torch_neuronx` the project uses is here. What it
uses is AWS's documented surface (the "How to work with NKI kernels from torch-neuronx" guide, SDK 2.33):

* `torch_neuronx.nki_op(name, mutates_args=...)` registers a typed Python function that calls an NKI kernel as a
  PyTorch op, and `torch_neuronx.wrap_nki(kernel)` makes the kernel callable on `neuron` tensors. Each kernel call a
  region makes becomes one op, `neuron_dynamo::<kernel>_<hash>` (the hash covers the kernel's source and its
  non-tensor arguments), registered once per process with a fake implementation that gives its output shapes.
* TorchNeuron's `torch.compile` backend, loaded from its `torch_dynamo_backends` entry point object (the name
  `neuron` is claimed by this package too, so it is never looked up by that string).

A region's kernels are known when it is lowered: `plan_region` runs the lowered region once on the interpreter at
the bucket's shapes and records every kernel call (generated kernels and the traced sub-lowerings included), their
non-tensor arguments and output shapes. Two ways to run the region then (option `device_mode`):

* `eager` (default): the lowered region runs in Python; each kernel call is its op on `neuron` tensors (TorchNeuron
  compiles each kernel signature once and caches the NEFF), the glue between kernels runs on the device through
  TorchNeuron's eager mode, and tensors made without inputs are made on the region's device.
* `graph`: the region is traced (glue as aten ops, each kernel as its op) and handed to TorchNeuron's compiler:
  one NEFF per region and bucket. If that hand-off fails, the region runs in `eager` mode, counted.

Nothing of this has run on Trainium: the tests drive it with a fake `neuron` device and a fake `torch_neuronx`
written from AWS's documentation (tests/fakes).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import inspect
import json
import logging
import os
import shlex
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import torch
import torch.fx as fx
from torch.utils._python_dispatch import _disable_current_modes

from neuron_dynamo import counters
from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.toolchain import simulator

log = logging.getLogger("neuron_dynamo.toolchain.torchneuron")

DEVICE_TYPE = "neuron"
MODULE = "torch_neuronx"
TESTED_RELEASES = ("2.14",)  # the torch-neuronx lines this adapter was written against
DOCUMENTED = ("nki_op", "wrap_nki")  # the attributes of torch_neuronx this module calls
OP_NAMESPACE = "neuron_dynamo"
VERSION_FACTS = {"torch_neuronx": "torch-neuronx", "nki": "nki", "neuronx_cc": "neuronx-cc"}


class TorchNeuronError(NeuronDynamoError):
    """TorchNeuron is missing, of a release whose interface changed, or refused a region."""


# ------------------------------------------------------------------------------------------------ the runtime
@functools.cache
def _runtime() -> tuple[Any, str]:
    """(torch_neuronx or None, why not): imported once; importing it registers the `neuron` device."""
    try:
        module = importlib.import_module(MODULE)
    except ImportError as exc:
        return None, f"{MODULE} does not import ({exc})"
    device = getattr(torch, DEVICE_TYPE, None)
    if device is None or not device.is_available():
        return None, f"{MODULE} imports but torch.{DEVICE_TYPE}.is_available() is False (no Neuron device)"
    missing = [name for name in DOCUMENTED if not hasattr(module, name)]
    if missing:
        return None, (f"{MODULE} {release()} has no {', '.join(missing)}: its interface changed since the "
                      f"{'/'.join(TESTED_RELEASES)} release this backend was written against; upgrade neuron-dynamo "
                      f"or install torch-neuronx {TESTED_RELEASES[-1]}")
    if not release().startswith(TESTED_RELEASES):
        log.warning("%s %s: this backend was written against %s; if a region fails, please report it",
                    MODULE, release(), "/".join(TESTED_RELEASES))
    return module, ""


def runtime_available() -> bool:
    """TorchNeuron imports, has the documented interface, and a Neuron device is available."""
    return _runtime()[0] is not None


def unavailable_reason() -> str:
    return _runtime()[1]


def runtime() -> Any:
    module, reason = _runtime()
    if module is None:
        raise TorchNeuronError(f"target 'neuron' needs TorchNeuron on a Trainium host: {reason}. "
                               "Use target='simulator' (CPU tensors) or 'reference'.")
    return module


def release() -> str:
    version = versions()["torch_neuronx"]
    return version or str(getattr(importlib.import_module(MODULE), "__version__", "unknown"))


def versions() -> dict[str, str | None]:
    """The installed torch-neuronx, nki and neuronx-cc versions (None: not installed)."""
    found: dict[str, str | None] = {}
    for key, dist in VERSION_FACTS.items():
        try:
            found[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[key] = None
    return found


def platform() -> str:
    """trn1/trn2/trn3: NEURON_PLATFORM_TARGET_OVERRIDE (what nki reads), else the NKI toolchain's target."""
    from neuron_dynamo.nki.target import current_target

    return current_target()


def logical_nc_config(lnc_option: int) -> int:
    """options.lnc, else NEURON_LOGICAL_NC_CONFIG (what TorchNeuron and nki read), else 1 (nki's default)."""
    if lnc_option:
        return lnc_option
    value = os.environ.get("NEURON_LOGICAL_NC_CONFIG", "").strip() or "1"
    if value not in ("1", "2"):
        raise TorchNeuronError(f"NEURON_LOGICAL_NC_CONFIG={value!r}: the logical NeuronCore degree is 1 or 2")
    return int(value)


def compiler_flags() -> list[str]:
    """The neuronx-cc flags TorchNeuron adds from NEURON_CC_FLAGS: they change the NEFFs, so they are key facts."""
    return shlex.split(os.environ.get("NEURON_CC_FLAGS", ""))


@functools.cache
def compiler_backend() -> Callable[..., Any]:
    """TorchNeuron's torch.compile backend, from its own entry point object (never by the name `neuron`)."""
    for entry in metadata.entry_points(group="torch_dynamo_backends"):
        if entry.value.split(":")[0].split(".")[0] == MODULE:
            return entry.load()
    raise TorchNeuronError(f"{MODULE} {release()} declares no torch_dynamo_backends entry point: device_mode='graph' "
                           "needs its compiler; use device_mode='eager'")


# ------------------------------------------------------------------------------------------------ kernel calls
@dataclasses.dataclass(frozen=True)
class Slot:
    """Where a tensor argument goes in a kernel call whose other arguments are constants."""

    index: int


def _split(args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], tuple, dict]:
    """A kernel call as (its tensors, its arguments with each tensor replaced by a Slot)."""
    tensors: list[torch.Tensor] = []

    def slot(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return Slot(len(tensors) - 1)
        return value

    return tensors, tuple(slot(a) for a in args), {k: slot(v) for k, v in kwargs.items()}


def _fill(template: Any, tensors: Sequence[torch.Tensor]) -> Any:
    return tensors[template.index] if isinstance(template, Slot) else template


def kernel_source(kernel: Any) -> str:
    """The NKI source a kernel is built from: generated kernels carry theirs; a library kernel, its module's."""
    source = getattr(kernel, "source", None)
    if source is not None:
        return source
    function = inspect.unwrap(getattr(kernel, "fn", None) or getattr(kernel, "func", None) or kernel)
    module = inspect.getmodule(function)
    return inspect.getsource(module if module is not None else function)


@functools.cache
def _source_hash(kernel: Any) -> str:
    return hashlib.sha256(kernel_source(kernel).encode()).hexdigest()


def op_name(kernel: Any, template: tuple, kw_template: dict) -> str:
    """`<kernel>_<hash>`: stable across processes for the same kernel source and non-tensor arguments."""
    digest = hashlib.sha256(f"{_source_hash(kernel)}|{template!r}|{sorted(kw_template.items())!r}".encode())
    base = getattr(kernel, "__name__", None) or type(kernel).__name__
    return f"{base}_{digest.hexdigest()[:16]}"


Spec = tuple[tuple[int, ...], torch.dtype]


@dataclasses.dataclass
class KernelOp:
    """One kernel call shape registered as a TorchNeuron op: its output specs per input specs, for the fake."""

    name: str
    op: Any
    outputs: dict[tuple[Spec, ...], tuple[list[Spec], bool]] = dataclasses.field(default_factory=dict)


class KernelOps:
    """The process's registered kernel ops (registration is once per process and name)."""

    def __init__(self) -> None:
        self.ops: dict[str, KernelOp] = {}

    def get(self, kernel: Any, template: tuple, kw_template: dict) -> KernelOp:
        name = op_name(kernel, template, kw_template)
        entry = self.ops.get(name)
        if entry is None:
            entry = self.ops[name] = self._register(name, kernel, template, kw_template)
        return entry

    def _register(self, name: str, kernel: Any, template: tuple, kw_template: dict) -> KernelOp:
        module = runtime()
        call = module.wrap_nki(kernel)

        def run_kernel(tensors):
            result = call(*[_fill(t, tensors) for t in template],
                          **{k: _fill(v, tensors) for k, v in kw_template.items()})
            return list(result) if isinstance(result, (tuple, list)) else [result]

        run_kernel.__annotations__ = {"tensors": list[torch.Tensor], "return": list[torch.Tensor]}
        run_kernel.__name__ = name
        op = module.nki_op(f"{OP_NAMESPACE}::{name}", mutates_args=())(run_kernel)
        entry = KernelOp(name, op)

        def fake(tensors):
            key = tuple((tuple(t.shape), t.dtype) for t in tensors)
            if key not in entry.outputs:
                raise TorchNeuronError(f"{name}: no planned call with inputs {key}")
            specs, _ = entry.outputs[key]
            device = tensors[0].device if tensors else torch.device(DEVICE_TYPE)
            return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in specs]

        op.register_fake(fake)
        counters.bump("neuron.kernel_ops_registered")
        log.debug("registered %s::%s", OP_NAMESPACE, name)
        return entry


KERNEL_OPS = KernelOps()


def _specs(tensors: Sequence[torch.Tensor]) -> tuple[Spec, ...]:
    return tuple((tuple(t.shape), t.dtype) for t in tensors)


@dataclasses.dataclass(frozen=True)
class PlannedCall:
    """One kernel call of a region, as its lowering-time plan recorded it."""

    kernel: Any
    op: str
    inputs: tuple[Spec, ...]
    outputs: tuple[Spec, ...]


def record_call(kernel: Any, args: tuple, kwargs: dict, result: Any) -> PlannedCall | None:
    """Register the call's op (once) and what it returns for these inputs (the op's fake answers from that).
    None for a call without tensors, which stays on the host (see `device_launch`)."""
    tensors, template, kw_template = _split(args, kwargs)
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    if not tensors or not all(isinstance(o, torch.Tensor) for o in outs):
        return None
    entry = KERNEL_OPS.get(kernel, template, kw_template)
    entry.outputs[_specs(tensors)] = ([(tuple(o.shape), o.dtype) for o in outs], isinstance(result, tuple))
    return PlannedCall(kernel, entry.name, _specs(tensors), _specs(outs))


def plan_region(lowered: fx.GraphModule, inputs: Sequence[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]
                ) -> list[PlannedCall]:
    """Every kernel call the lowered region makes at these input layouts, each registered as its op.

    The region runs once on the interpreter on zeros: that finishes every lowering that waits for its shapes
    (traced sub-lowerings, generated kernels), and records the calls with their non-tensor arguments and results.
    A call already recorded (the next layer's, another bucket's) is not run again: zeros of its recorded outputs
    stand in, since only the calls and their shapes matter here.
    """
    calls: list[PlannedCall] = []

    def record(kernel: Any, args: tuple, kwargs: dict) -> Any:
        result = _recorded(kernel, args, kwargs)
        if result is None:
            result = simulator.simulate(kernel, *args, **kwargs)
        call = record_call(kernel, args, kwargs, result)
        if call is not None:
            calls.append(call)
        return result

    start = time.perf_counter()
    zeros = [torch.empty_strided(shape, stride, dtype=dtype).zero_() for shape, stride, dtype in inputs]
    with torch.no_grad(), simulator.launching_with(record, None), torch.device("cpu"):
        lowered(*zeros)
    counters.bump("neuron.planned_calls", len(calls))
    counters.bump("neuron.plan_seconds", time.perf_counter() - start)
    return calls


def _recorded(kernel: Any, args: tuple, kwargs: dict) -> Any:
    """Zeros shaped as a recorded call's results, or None when the call was never recorded."""
    tensors, template, kw_template = _split(args, kwargs)
    entry = KERNEL_OPS.ops.get(op_name(kernel, template, kw_template)) if tensors else None
    planned = None if entry is None else entry.outputs.get(_specs(tensors))
    if planned is None:
        return None
    outs = [torch.zeros(shape, dtype=dtype) for shape, dtype in planned[0]]
    return tuple(outs) if planned[1] else outs[0]


def _on_host(kernel: Any, args: tuple, kwargs: dict) -> Any:
    """The kernel on the interpreter, with the call's tensors copied to the CPU."""
    cpu = lambda t: t.detach().to("cpu") if isinstance(t, torch.Tensor) else t  # noqa: E731
    with torch.device("cpu"):
        return simulator.simulate(kernel, *map(cpu, args), **{k: cpu(v) for k, v in kwargs.items()})


def device_launch(kernel: Any, args: tuple, kwargs: dict) -> Any:
    """A kernel call inside a device region: its op on the call's `neuron` tensors."""
    tensors, template, kw_template = _split(args, kwargs)
    if not tensors:  # a kernel of constants only (iotas, masks): made once on the interpreter, then moved
        counters.bump("neuron.constant_kernels_on_host")
        device = simulator.launch_device()
        result = _on_host(kernel, args, kwargs)
        move = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
        return tuple(map(move, result)) if isinstance(result, tuple) else move(result)
    entry = KERNEL_OPS.get(kernel, template, kw_template)
    planned = entry.outputs.get(_specs(tensors))
    if planned is None:  # a call the plan did not see (a shape decided by data): its fake comes from the interpreter
        counters.bump("neuron.unplanned_calls")
        log.warning("%s: a kernel call with inputs %s that the lowering-time plan did not record", entry.name,
                    _specs(tensors))
        record_call(kernel, args, kwargs, _on_host(kernel, args, kwargs))
        planned = entry.outputs[_specs(tensors)]
    with torch.device("cpu"):  # TorchNeuron's own allocations are explicit; keep ours from leaking into its code
        outs = entry.op(list(tensors))
    counters.bump("neuron.kernel_calls")
    return tuple(outs) if planned[1] else outs[0]


# ------------------------------------------------------------------------------------------------ regions
InputLayout = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]


def input_layouts(example_inputs: Sequence[Any]) -> list[InputLayout]:
    return [(tuple(int(s) for s in x.shape), tuple(int(s) for s in x.stride()), x.dtype) for x in example_inputs]


class DeviceRegion(torch.nn.Module):
    """A lowered region on `neuron` tensors: its kernel calls are TorchNeuron ops (see the module docstring)."""

    def __init__(self, lowered: fx.GraphModule, layouts: list[InputLayout], mode: str, prepare: bool = True) -> None:
        super().__init__()
        self.lowered = lowered
        self.layouts = layouts
        self.mode = mode
        self.calls: list[PlannedCall] | None = None
        self.compiled: Callable[..., Any] | None = None
        self.returns_tuple = False
        if prepare:
            self.prepare()

    def prepare(self) -> None:
        """Plan and register the kernels (and in `graph` mode hand the region over): at lowering, or at the first
        run of a region read from the cache (reading an entry back to check it must not compile it)."""
        self.calls = plan_region(self.lowered, self.layouts)
        if self.mode == "graph":
            self.compiled = self._hand_off()

    def _hand_off(self) -> Callable[..., Any] | None:
        """The region traced to aten glue and kernel ops, compiled by TorchNeuron (one NEFF); None if that fails."""
        try:  # a compile of its own: not under the dispatch modes of the run that asked for this bucket
            with _disable_current_modes():
                return self._compile_traced()
        except Exception as exc:  # TorchNeuron refused it: the eager kernel calls still run it
            counters.bump("neuron.graph_handoff_failed")
            log.warning("a region could not be handed to TorchNeuron's compiler, its kernels run one by one: %s: %s",
                        type(exc).__name__, str(exc).splitlines()[0][:300] if str(exc) else "")
            return None

    def _compile_traced(self) -> Callable[..., Any]:
        from torch.fx.experimental.proxy_tensor import make_fx

        device = torch.device(DEVICE_TYPE)
        inputs = [torch.empty_strided(shape, stride, dtype=dtype, device=device)
                  for shape, stride, dtype in self.layouts]
        traced = make_fx(lambda *args: self._as_tuple(self._run_eager(*args)), tracing_mode="fake")(*inputs)
        compiled = compiler_backend()(traced, inputs)  # a graph that returns a tuple, as Dynamo's do
        counters.bump("neuron.graph_handoffs")
        return compiled

    def _run_eager(self, *args: Any) -> Any:
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device(DEVICE_TYPE))
        with simulator.launching_with(device_launch, device), torch.device(device):
            return self.lowered(*args)

    def _as_tuple(self, result: Any) -> tuple:
        self.returns_tuple = isinstance(result, tuple)
        return result if self.returns_tuple else (result,)

    def forward(self, *args: Any) -> Any:
        if self.calls is None:
            self.prepare()
        if self.compiled is None:
            return self._run_eager(*args)
        result = self.compiled(*args)
        return tuple(result) if self.returns_tuple else result[0]


@dataclasses.dataclass(frozen=True)
class TorchNeuronTarget:
    """Target `neuron`: NKI regions as TorchNeuron ops on `neuron` tensors."""

    supports_node: Callable[[fx.Node], str | None]
    mode: str = "eager"
    lnc: int = 0
    name: str = "neuron"

    def supports(self, node: fx.Node) -> str | None:
        return self.supports_node(node)

    def compile_region(self, lowered_region: fx.GraphModule, example_inputs: Sequence[Any]) -> DeviceRegion:
        return DeviceRegion(lowered_region, input_layouts(example_inputs), self.mode)

    def serialize_region(self, compiled: DeviceRegion, lowered_region: fx.GraphModule) -> bytes:
        """The input layouts (to plan again on load) and the lowered graph; no NEFF: TorchNeuron caches those."""
        from neuron_dynamo.lowering.artifact import dump_region

        header = json.dumps([[list(s), list(st), str(d).removeprefix("torch.")] for s, st, d in compiled.layouts])
        return len(header).to_bytes(4, "little") + header.encode() + dump_region(lowered_region)

    def load_region(self, data: bytes) -> DeviceRegion:
        from neuron_dynamo.lowering.artifact import ArtifactError, load_region
        from neuron_dynamo.toolchain.targets import DEVICE_DTYPES

        size = int.from_bytes(data[:4], "little")
        try:
            rows = json.loads(data[4:4 + size])
            dtypes = {str(d).removeprefix("torch."): d for d in DEVICE_DTYPES}
            layouts = [(tuple(int(s) for s in shape), tuple(int(s) for s in stride), dtypes[dtype])
                       for shape, stride, dtype in rows]
        except (ValueError, TypeError, KeyError) as exc:
            raise ArtifactError(f"a malformed neuron region header: {exc}") from None
        return DeviceRegion(load_region(data[4 + size:]), layouts, self.mode, prepare=False)

    def cache_facts(self) -> dict[str, Any]:
        """What changes what TorchNeuron builds from a region: its release, nki's, neuronx-cc's, the platform, the
        LNC, the compile flags it passes, the device mode, and every kernel source."""
        from neuron_dynamo.toolchain.targets import source_digest

        return {"target": self.name, **versions(), "platform": platform(), "lnc": logical_nc_config(self.lnc),
                "flags": compiler_flags(), "mode": self.mode, "sources": source_digest()}

