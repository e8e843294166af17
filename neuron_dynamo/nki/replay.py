"""Record a kernel call's NumPy computations once per signature, replay them on later calls.

The backend calls the same kernels at the same static shapes again and again; the checks and the cost model give the
same verdict and the same profile every time. So the first call at a signature (argument shapes and dtypes, the
compile-time arguments, target, LNC) runs in full, every rule checked and priced, while its `Recording` keeps each
instruction's arithmetic as a closure over the resolved views (`step`) and each allocation's fill. Later calls copy
their inputs into the recorded argument arrays and run the closures in the recorded order: no kernel Python, no
checks, no pricing; the profile is the recorded one. A step may keep a leaner closure for replay than the one it ran
(a DMA copy without its index and cast checks), and fills no instruction observes are not replayed (`fills`).

A replay is only correct if nothing the kernel's Python did depended on tensor *values*. Every write goes through a
recorded step and every read into Python (`_read` outside a step: dynamic `select`, `ap(scalar_offset=tensor)`,
indirect DMA indices, registers, `while_loop`, seeds) marks the recording unusable (`refuse`), as do random numbers;
such signatures always run in full. A step whose *instruction choice* depends on data (nc_matmul's bit-exact identity
transpose) guards it and raises `ReplayDiverged`, which makes the caller rerun in full.

`NEURON_DYNAMO_NKI_REPLAY=0` turns replay off (every call runs in full).
"""

from __future__ import annotations

import enum
import itertools
import os
import types
import weakref

import numpy as np

from neuron_dynamo.nki.fills import UnseenFills

ENV = "NEURON_DYNAMO_NKI_REPLAY"
MAX_RECORDED_BYTES = 256 * 2**20  # a call allocating more is not kept: a replay holds all its arrays
MAX_PROGRAMS_PER_KERNEL = 64


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


class ReplayDiverged(Exception):
    """A replayed step saw data that would have made the full interpreter take another path."""


class Recording:
    """The steps of one kernel call in execution order (all program instances interleaved as they ran), and which
    of its fresh-memory fills no instruction observes (`fills.UnseenFills`: a replay skips those)."""

    __slots__ = ("steps", "in_step", "reason", "nbytes", "storages", "fills")

    def __init__(self) -> None:
        self.steps: list | None = []
        self.in_step = False
        self.reason: str | None = None
        self.nbytes = 0
        self.storages: list = []  # weak references to every Storage of the call (their caches reset per replay)
        self.fills = UnseenFills()

    def step(self, fn, replay_fn=None, writes=()) -> None:
        """Run `fn` (an instruction's reads, arithmetic and writes) now, and keep it, or the equivalent `replay_fn`
        (the same data movement without the checks only the full run needs), for replay. `writes`: the views `fn`
        stores into in full without going through `NkiTensor._write`."""
        self.fills.step_started()
        for t in writes:
            self.fills.wrote(t, True)
        self.in_step = True
        try:
            fn()
        finally:
            self.in_step = False
        if self.steps is not None:
            self.steps.append(replay_fn or fn)

    def allocated(self, storage, fill_value) -> None:
        """A fresh allocation: replay refills it at this point (NaN/4, as the full run saw it)."""
        if self.steps is None:
            return
        data = storage.data
        self.nbytes += data.nbytes
        if self.nbytes > MAX_RECORDED_BYTES:
            self.refuse(f"it allocates more than {MAX_RECORDED_BYTES >> 20} MiB")
            return
        self.storages.append(weakref.ref(storage))
        self.fills.filled(storage, len(self.steps))
        self.steps.append(lambda: data.fill(fill_value))

    def refuse(self, reason: str) -> None:
        """This call cannot be replayed: drop what was recorded (the arrays go back to the tile pool)."""
        if self.reason is None:
            self.reason = reason
        self.steps = None
        self.storages = []
        self.fills = UnseenFills()


class Program:
    """A recorded call: its steps, argument tensors, result, and profile, with what the runtime bound for its
    replays: where each tensor argument is loaded (`loads`) and how the caller gets fresh copies of the results
    (`copy_out`)."""

    def __init__(self, recording: Recording, arguments: list, written: list[int], result, contexts, profile,
                 loads, copy_out) -> None:
        recording.fills.finish(_tensors_in(result))
        unseen = recording.fills.unseen
        self.steps = tuple(fn for i, fn in enumerate(recording.steps) if i not in unseen)
        self.fills_dropped = len(unseen)
        self.arguments = arguments  # runtime._Argument of the recorded call, in conversion order
        self.written = written  # indices of the arguments the kernel wrote
        self.profile = profile
        self.loads = loads  # runtime._Loads: where each tensor argument of a replay is copied
        self.copy_out = copy_out  # gives the caller fresh copies of the results
        alive = (ref() for ref in recording.storages)
        self.storages = tuple([s for s in alive if s is not None] + [arg.tensor._s for arg in arguments])
        self.registers = tuple(regs for ctx in contexts for regs in ctx.registers())  # the ones the steps can use
        for ctx in contexts:  # what only the full run needed
            ctx.cost = None
            ctx.allocations = []

    def run(self) -> None:
        """Replay every step on the argument arrays (already holding this call's inputs), from the state the
        recorded call started in (no cached upcasts, fresh registers)."""
        for s in self.storages:
            s.f32_cache = None
        for regs in self.registers:
            regs.fill(np.nan)
        for fn in self.steps:
            fn()


def _tensors_in(result) -> list:
    """The tensors a kernel returned (one, or nested in tuples and lists)."""
    if isinstance(result, (tuple, list)):
        return [t for part in result for t in _tensors_in(part)]
    return [] if result is None else [result]


class Programs:
    """A kernel's recorded programs by signature (the least recently used dropped first); `None` marks a signature
    that must always run in full. Each entry holds its last use on a clock: a lookup, on every launch, pays one
    hash of the key (an ordered dict's move to the end pays two)."""

    def __init__(self) -> None:
        self._by_key: dict = {}  # key -> [program or None, last use]
        self._clock = itertools.count()

    def get(self, key):
        entry = self._by_key.get(key)
        if entry is None:
            return MISSING
        entry[1] = next(self._clock)
        return entry[0]

    def values(self) -> list:
        return [entry[0] for entry in self._by_key.values()]

    def put(self, key, program: Program | None) -> None:
        self._by_key[key] = [program, next(self._clock)]
        if len(self._by_key) > MAX_PROGRAMS_PER_KERNEL:
            del self._by_key[min(self._by_key, key=lambda k: self._by_key[k][1])]


MISSING = object()


class Unkeyable(Exception):
    """An argument whose value a signature cannot capture (the call runs in full)."""


_PLAIN = (int, str, bytes, type(None), bool, complex, range, slice)


def static_key(value):
    """A hashable key that is equal only for compile-time arguments the kernel cannot tell apart."""
    if isinstance(value, float):
        return float, value.hex()  # 0.0 and -0.0 differ, as they may in a kernel
    if isinstance(value, np.generic):
        return type(value), value.tobytes()
    if isinstance(value, _PLAIN) or isinstance(value, (type, enum.Enum, np.dtype)):
        return type(value), value
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, np.ufunc)):
        return type(value), value  # by identity (kept alive by the key)
    if isinstance(value, tuple):
        return tuple, tuple(static_key(v) for v in value)
    if isinstance(value, dict):
        return dict, tuple(sorted((k, static_key(v)) for k, v in value.items()))
    raise Unkeyable(type(value).__name__)
