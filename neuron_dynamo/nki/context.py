"""The state of one program instance while a kernel runs: target limits, cost model, allocations, registers.

ISA and language calls find it through `current()`; outside a running kernel they raise a clear error instead of
silently executing. Each LNC program instance gets its own context (its own SBUF/PSUM, its own cost model); the
instances of one launch share their `shared_hbm` tensors through the `Launch` object.
"""

from __future__ import annotations

import threading

import numpy as np

from neuron_dynamo.nki.costmodel import CostModel, Instruction
from neuron_dynamo.nki.errors import NkiValidationError
from neuron_dynamo.nki.target import TargetLimits

_state = threading.local()


class _Aborted(Exception):
    """Another program instance of the launch failed; this one stops."""


class DeviceMemory:
    """The process's on-chip tile arrays and the steps' working buffers, shared by every kernel launch.

    Launches run one at a time (`lock`). A launch draws the arrays of its SBUF/PSUM tiles from `free` and hands them
    all back when it ends, also the ones its recorded program keeps: a replay needs its arrays only while it runs,
    and every byte it reads it has written or refilled first in that run (`nki.fills`). So the programs of a process
    share one set of arrays, as kernels share the device's SBUF, and consecutive launches find them in the CPU's
    caches; with an array set per program, a tiny Llama's training step held 44 MB of them, more than the L3 cache.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.free: dict = {}  # (shape, storage dtype) -> arrays no running launch holds
        self._buffers: dict = {}  # working buffers of the steps, by key (see `buffer`)

    def buffer(self, key, make):
        """The working buffer `key` (made by `make()` the first time): steps share it, each only while it runs."""
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = make()
        return buf


DEVICE = DeviceMemory()


class Launch:
    """One kernel call: its program instances and what they share (`shared_hbm` tensors, barriers, mailboxes).

    LNC program instances run as threads under a cooperative, deterministic schedule: exactly one runs at a time,
    in program-id order, and control passes only when an instance finishes or waits at `core_barrier`/`sendrecv`.
    Results therefore never depend on thread timing, and a barrier behaves as on hardware (nobody passes it until
    every instance reached it).
    """

    def __init__(self, num_programs: int) -> None:
        self.num_programs = num_programs
        self.shared_hbm: list = []  # Storage objects, in allocation order
        self.free_tiles: dict = {}  # (shape, storage dtype) -> arrays of this launch's dead on-chip tiles
        self.drawn: list = []  # (key, array) taken from `DEVICE.free`, handed back by `release`
        self.finished = False
        self._cond = threading.Condition()
        self._turn = 0
        self._waiting: set[int] = set()
        self._done: set[int] = set()
        self._failed = False
        self._mail: dict = {}
        self.recording = None  # replay.Recording while the first call at a signature is recorded

    def tile(self, key, shape, dtype) -> np.ndarray:
        """An array for an on-chip tile (unfilled): a dead tile's of this launch, else one from the device's pool."""
        free = self.free_tiles.get(key)
        if free:
            return free.pop()
        pool = DEVICE.free.get(key)
        data = pool.pop() if pool else np.empty(shape, dtype=dtype)
        self.drawn.append((key, data))
        return data

    def release(self) -> None:
        """The launch is over: every array it drew goes back to the device's pool."""
        self.finished = True
        for key, data in self.drawn:
            DEVICE.free.setdefault(key, []).append(data)
        self.drawn, self.free_tiles = [], {}

    def run(self, bodies) -> None:
        """Run one callable per program instance (a plain call when there is only one)."""
        if len(bodies) == 1:
            bodies[0]()
            return
        errors: dict[int, BaseException] = {}

        def thread_main(pid: int) -> None:
            try:
                self._wait_turn(pid)
                bodies[pid]()
            except _Aborted:
                pass
            except BaseException as exc:  # handed to the caller below
                errors[pid] = exc
                with self._cond:
                    self._failed = True
                    self._cond.notify_all()
            finally:
                with self._cond:
                    self._done.add(pid)
                    if self._waiting and not self._failed:  # the others wait at a barrier this one never reached
                        waiter = min(self._waiting)
                        errors[waiter] = NkiValidationError(
                            "core-barrier",
                            f"program instance {waiter} waits at a core_barrier/sendrecv that program instance {pid} "
                            "finished without reaching; every instance must execute the same barriers (it would "
                            "hang on hardware)",
                            site=None,
                        )
                        self._failed = True
                    self._pass_turn(pid)

        threads = [threading.Thread(target=thread_main, args=(pid,), name=f"nki-program-{pid}")
                   for pid in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[min(errors)]

    def _wait_turn(self, pid: int) -> None:
        with self._cond:
            while self._turn != pid and not self._failed:
                self._cond.wait()
            if self._failed:
                raise _Aborted

    def _pass_turn(self, pid: int) -> None:
        """Give control to the next instance that can run (called with the condition held)."""
        n = self.num_programs
        for step in range(1, n + 1):
            nxt = (pid + step) % n
            if nxt not in self._done and nxt not in self._waiting:
                self._turn = nxt
                break
        self._cond.notify_all()

    def barrier(self, pid: int, what: str) -> None:
        """Block until every program instance reached a barrier."""
        with self._cond:
            if self._done:
                raise NkiValidationError(
                    "core-barrier",
                    f"{what}: program instance {min(self._done)} finished without reaching this point; every "
                    "instance must execute the same barriers (it would hang on hardware)",
                )
            self._waiting.add(pid)
            if len(self._waiting) == self.num_programs:
                self._waiting.clear()
                self._turn = 0
                self._cond.notify_all()
            else:
                self._pass_turn(pid)
        self._wait_turn(pid)

    def post(self, key, payload) -> None:
        self._mail.setdefault(key, []).append(payload)

    def collect(self, key):
        return self._mail[key].pop(0)


class Allocation:
    """Liveness record of one SBUF/PSUM tensor: first and last instruction that touched it."""

    __slots__ = ("buffer", "bytes", "banks", "site", "first", "last", "name")

    def __init__(self, buffer: str, nbytes: int, banks: int, site, name: str) -> None:
        self.buffer = buffer
        self.bytes = nbytes
        self.banks = banks
        self.site = site
        self.name = name
        self.first = -1
        self.last = -1


class ProgramContext:
    """Everything one program instance of a running kernel needs."""

    def __init__(self, limits: TargetLimits, program_id: int, launch: Launch, kernel_name: str) -> None:
        self.limits = limits
        self.target = limits.name
        self.program_id = program_id
        self.launch = launch
        self.kernel_name = kernel_name
        self.cost = CostModel(limits.name)
        self.counter = 0  # instructions executed so far
        self.allocations: list[Allocation] = []
        self.shared_seen = 0  # shared_hbm allocations made by this instance so far
        self.rng = np.random.default_rng(program_id)
        self.warned_unwritten: set[int] = set()  # storages already reported as read before any write
        self.warned_ranges: set = set()  # (kernel site, activation) pairs already reported out of range

    @property
    def scalar_reduce_regs(self) -> np.ndarray:
        """ScalarE's reduce registers (NaN in a fresh instance), made when an instruction first asks: a replay
        resets only the registers its recorded instructions hold (`registers`)."""
        regs = self.__dict__.get("_scalar_regs")
        if regs is None:
            regs = self._scalar_regs = np.full((self.limits.pmax,), np.nan, dtype=np.float32)
        return regs

    def registers(self) -> list[np.ndarray]:
        """The register arrays made so far (a replay refills them with NaN, the state of a fresh instance)."""
        return [regs for regs in (self.__dict__.get("_scalar_regs"), getattr(self, "vector_reduce_regs", None))
                if regs is not None]

    def record(self, instr: Instruction) -> None:
        self.counter += 1
        self.cost.record(instr)


def current() -> ProgramContext:
    ctx = getattr(_state, "ctx", None)
    if ctx is None:
        raise NkiValidationError(
            "outside-kernel",
            "NKI language/ISA calls only run inside a kernel launched through nki.jit or nki.simulate; "
            "decorate the top-level kernel with @nki.jit and call it",
        )
    return ctx


def active() -> ProgramContext | None:
    return getattr(_state, "ctx", None)


def set_current(ctx: ProgramContext | None) -> None:
    _state.ctx = ctx
