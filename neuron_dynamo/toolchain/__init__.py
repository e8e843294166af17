"""Toolchains and targets: compile lowered regions for where they run (torch, the NKI interpreter, Trainium)."""

from neuron_dynamo.toolchain.targets import (
    DEVICE_DTYPES,
    REFERENCE,
    SIMULATOR,
    InProcessTarget,
    Target,
    TargetUnavailableError,
    nki_toolchain_info,
    resolve_target,
    target_note,
)

__all__ = [
    "DEVICE_DTYPES",
    "REFERENCE",
    "SIMULATOR",
    "InProcessTarget",
    "Target",
    "TargetUnavailableError",
    "nki_toolchain_info",
    "resolve_target",
    "target_note",
]
