"""The `neuron` toolchain: compile each lowered region's NKI kernels with `neuronx-cc` into a NEFF.

The region's kernels (generated NKI source and the library modules it calls) are written as one kernel module
and handed to `neuronx-cc compile` with the documented command line (`reference/nki.md` §3.2): `--target`
(trn1/trn2/trn3, from NEURON_PLATFORM_TARGET_OVERRIDE or the toolchain), `--logical-nc-config` (options.lnc, else
NEURON_LOGICAL_NC_CONFIG, else the generation's default), the NEURON_CC_FLAGS that neuronx-cc itself takes (the
wrapper-only ones such as `--cache_dir` are dropped), then `options.compiler_flags`, and `--output`. It runs in
a private temporary directory with a timeout: a failure or a timeout raises `CompilerError` (the compiler then
runs that region eagerly with a warning and a counted reason, or raises under fallback="error"), and the
directory is removed whatever happens, so nothing half-written is left behind. The NEFF is kept in memory as
the region's artifact (the compile cache stores it).

Running a NEFF needs the Neuron runtime, which this package does not drive yet: a compiled region runs its
kernels through `nki` (the device kernels on a Trainium host, the interpreter elsewhere).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx as fx

from neuron_dynamo import counters
from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.toolchain.simulator import SimulatorRegion

log = logging.getLogger("neuron_dynamo.toolchain.neuronx_cc")

EXECUTABLE = "neuronx-cc"
# NEURON_CC_FLAGS entries that the neuron_cc_wrapper consumes itself and never passes to neuronx-cc (§3.3)
WRAPPER_ONLY_FLAGS = ("--cache_dir", "--no_cache", "--retry_failed_compilation", "--log_level")
DEFAULT_LNC = {"trn1": 1, "trn2": 2, "trn3": 2}


class CompilerError(NeuronDynamoError):
    """neuronx-cc failed, timed out, or wrote no artifact for a region."""


def compiler_flags(extra: Sequence[str] = (), environ: dict[str, str] | None = None) -> list[str]:
    """NEURON_CC_FLAGS (without the wrapper-only flags) followed by the options' flags."""
    environ = os.environ if environ is None else environ
    flags = [f for f in shlex.split(environ.get("NEURON_CC_FLAGS", "")) if not f.startswith(WRAPPER_ONLY_FLAGS)]
    return flags + list(extra)


def logical_nc_config(platform: str, lnc_option: int, environ: dict[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    if lnc_option:
        return lnc_option
    if environ.get("NEURON_LOGICAL_NC_CONFIG"):
        return int(environ["NEURON_LOGICAL_NC_CONFIG"])
    return DEFAULT_LNC.get(platform, 1)


def region_kernel_module(lowered: fx.GraphModule) -> str:
    """The NKI source of every kernel a lowered region launches, as one module (the compiler's input)."""
    sources: dict[str, str] = {}
    for node in lowered.graph.nodes:
        if node.op != "call_function":
            continue
        source = getattr(node.target, "source", None)  # generated kernels carry their source
        if source is not None:
            sources[node.target.__name__] = source
            continue
        implementation = getattr(node.target, "implementation", None)  # registry kernels: their family module
        if implementation is not None:
            module = inspect.getmodule(implementation)
            sources[module.__name__] = inspect.getsource(module)
    return "\n\n".join(f"# ---- {name}\n{text}" for name, text in sorted(sources.items()))


def run_compiler(
    source: str, *, platform: str, lnc: int, flags: Sequence[str], timeout: float, executable: str
) -> bytes:
    """Compile one region's kernel module to a NEFF in a private directory that is removed afterwards."""
    workdir = tempfile.mkdtemp(prefix="neuron_dynamo_cc_")
    try:
        kernels = os.path.join(workdir, "kernels.py")
        output = os.path.join(workdir, "region.neff")
        with open(kernels, "w", encoding="utf-8") as fh:
            fh.write(source)
        argv = [executable, "compile", kernels, "--framework", "XLA", "--target", platform,
                "--logical-nc-config", str(lnc), *flags, "--output", output]
        log.info("compiling a region: %s", shlex.join(argv))
        process = subprocess.Popen(argv, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            out, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the compiler and anything it started
            process.communicate()
            counters.bump("neuronx_cc.timeouts")
            raise CompilerError(f"neuronx-cc timed out after {timeout:g} s (raise options.compile_timeout)") from None
        text = out.decode(errors="replace").strip()
        if process.returncode != 0:
            counters.bump("neuronx_cc.failures")
            raise CompilerError(f"neuronx-cc exited with {process.returncode}: {text[-500:]}")
        if not os.path.isfile(output) or os.path.getsize(output) == 0:
            counters.bump("neuronx_cc.failures")
            raise CompilerError("neuronx-cc exited with 0 but wrote no NEFF")
        with open(output, "rb") as fh:
            neff = fh.read()
        counters.bump("neuronx_cc.compiles")
        return neff
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class NeuronRegion(SimulatorRegion):
    """A region compiled by neuronx-cc: its NEFF, and the kernels it runs (see the module docstring)."""

    def __init__(self, lowered: fx.GraphModule, neff: bytes) -> None:
        super().__init__(lowered)
        self.neff = neff


class NeuronTarget:
    """Target `neuron`: NKI regions compiled by neuronx-cc with the options' flags, platform and LNC."""

    name = "neuron"

    def __init__(self, options: Any, platform: str, executable: str, supports: Callable[[fx.Node], str | None]) -> None:
        self._supports = supports  # the device dtype check, given by toolchain.targets (which imports this module)
        self.platform = platform
        self.executable = executable
        self.lnc = logical_nc_config(platform, getattr(options, "lnc", 0))
        self.flags = compiler_flags(getattr(options, "compiler_flags", ()))
        self.timeout = getattr(options, "compile_timeout", 900)

    def supports(self, node: fx.Node) -> str | None:
        return self._supports(node)

    def compile_region(self, lowered_region: fx.GraphModule, example_inputs: Sequence[Any]) -> NeuronRegion:
        neff = run_compiler(region_kernel_module(lowered_region), platform=self.platform, lnc=self.lnc,
                            flags=self.flags, timeout=self.timeout, executable=self.executable)
        return NeuronRegion(lowered_region, neff)

    def serialize_region(self, compiled: NeuronRegion, lowered_region: fx.GraphModule) -> bytes:
        """The NEFF and the lowered graph that launches the region's kernels: length-prefixed NEFF, then the graph."""
        from neuron_dynamo.lowering.artifact import dump_region

        return len(compiled.neff).to_bytes(8, "little") + compiled.neff + dump_region(lowered_region)

    def load_region(self, data: bytes) -> NeuronRegion:
        """The inverse of `serialize_region`: no neuronx-cc run."""
        from neuron_dynamo.lowering.artifact import load_region

        size = int.from_bytes(data[:8], "little")
        if len(data) < 8 + size:
            raise CompilerError("a truncated neuron region artifact")
        return NeuronRegion(load_region(data[8 + size:]), data[8:8 + size])

    def cache_facts(self) -> dict[str, Any]:
        """What changes a NEFF besides the graph: the compiler binary, its flags, platform and LNC."""
        with open(self.executable, "rb") as fh:
            binary = hashlib.sha256(fh.read()).hexdigest()
        return {"target": self.name, "compiler": binary, "flags": self.flags, "platform": self.platform,
                "lnc": self.lnc}


def find_compiler() -> str | None:
    return shutil.which(EXECUTABLE)


def neuron_target(options: Any, platform: str, supports: Callable[[fx.Node], str | None]) -> NeuronTarget:
    executable = find_compiler()
    if executable is None:
        raise CompilerError(f"target 'neuron' needs {EXECUTABLE} on PATH; use target='simulator' or 'reference'")
    return NeuronTarget(options, platform, executable, supports)
