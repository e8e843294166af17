"""Which fresh-memory fills of a recorded kernel call no instruction can observe, so that its replays skip them.

The full run fills every fresh allocation (NaN, integers 4) so that reads of unwritten memory show up in results.
A replay must reproduce what the full run computed, so it keeps a fill unless the recording proves that every byte
of the allocation was written before any instruction read it. The proof follows the instructions in order: each
written view (an instruction's dst, the NkiTensor its step wrote through) adds its bytes to the allocation's written
set; each other operand naming the allocation is a read, which must lie inside the bytes already written (an
instruction reading its own dst, as PSUM accumulation does, declares it). An allocation is decided at its first
uncovered read (fill kept) or when its written set covers it (fill dropped); at the end of the call the caller reads
the kernel's results, and the fills of allocations never read where unwritten are dropped (a 128-row tile of which a
short sequence uses 64 rows). Anything the proof cannot see keeps the fill: masked or indirect writes add no bytes,
and a write not followed by the operands of its instruction counts as an uncovered read.
"""

from __future__ import annotations

import numpy as np

_EXACT = 1  # a write of exactly the view's bytes
_IRREGULAR = 0  # a masked or indirect write: which bytes is not tracked


class UnseenFills:
    """The fill steps of one recording, and the verdict on each."""

    __slots__ = ("pending", "written", "unseen", "step_writes")

    def __init__(self) -> None:
        self.pending: dict[int, int] = {}  # storage serial -> index of its fill step, while undecided
        self.written: dict[int, np.ndarray] = {}  # storage serial -> which of its bytes were written (pending only)
        self.unseen: set[int] = set()  # indices of fill steps no instruction observes
        self.step_writes: list = []  # (NkiTensor, _EXACT | _IRREGULAR) written by the running step

    def filled(self, storage, step_index: int) -> None:
        self.pending[storage.serial] = step_index

    def wrote(self, tensor, exact: bool) -> None:
        """The running step wrote through `tensor` (`exact`: all of the view's bytes, nothing else)."""
        if tensor._s.serial in self.pending:
            self.step_writes.append((tensor, _EXACT if exact else _IRREGULAR))

    def read(self, tensor) -> None:
        """An instruction reads `tensor` in a way its operands do not show (an accumulating dst): the fill stays
        unless every byte of the view was written before (the matmul that opened the accumulation group)."""
        if tensor._s.serial in self.pending and not self._covered(tensor):
            self._seen(tensor._s.serial)

    def step_started(self) -> None:
        """Writes of a step whose operands were never reported: their allocations keep their fills."""
        for tensor, _ in self.step_writes:
            self._seen(tensor._s.serial)
        self.step_writes = []

    def operands(self, tensors) -> None:
        """The instruction whose step just ran has these operands: the ones its step wrote through are its writes
        (once per write), every other one naming a pending allocation is a read of it."""
        writes: dict[int, int] = {}
        for tensor, _ in self.step_writes:
            writes[id(tensor)] = writes.get(id(tensor), 0) + 1
        named = set()
        for t in tensors:
            serial = t._s.serial
            named.add(serial)
            if serial not in self.pending:
                continue
            if writes.get(id(t), 0):
                writes[id(t)] -= 1
            elif not self._covered(t):
                self._seen(serial)
        for tensor, kind in self.step_writes:
            serial = tensor._s.serial
            if serial not in named:  # written through a view the instruction does not name: not followed
                self._seen(serial)
            elif serial in self.pending and kind == _EXACT:
                self._add(tensor)
        self.step_writes = []

    def finish(self, results) -> None:
        """The call is over and the caller reads `results` (NkiTensors): every fill not seen so far is unseen."""
        self.step_started()
        for t in results:
            if t._s.serial in self.pending and not self._covered(t):
                self._seen(t._s.serial)
        self.unseen.update(self.pending.values())
        self.pending = {}
        self.written = {}

    def _covered(self, t) -> bool:
        done = self.written.get(t._s.serial)
        return done is not None and t._a is not None and bool(_bytes_of(done, t._a, t._s.data).all())

    def _add(self, tensor) -> None:
        serial, data = tensor._s.serial, tensor._s.data
        done = self.written.get(serial)
        if done is None:
            done = self.written[serial] = np.zeros(data.nbytes, dtype=np.bool_)
        _bytes_of(done, tensor._a, data)[...] = True
        if done.all():
            self.unseen.add(self.pending.pop(serial))
            del self.written[serial]

    def _seen(self, serial: int) -> None:
        self.pending.pop(serial, None)
        self.written.pop(serial, None)


def _bytes_of(done: np.ndarray, view: np.ndarray, data: np.ndarray) -> np.ndarray:
    """The entries of the per-byte array `done` (one per byte of `data`) that `view` (a view of `data`) addresses."""
    offset = view.__array_interface__["data"][0] - data.__array_interface__["data"][0]
    return np.lib.stride_tricks.as_strided(done[offset:], view.shape + (view.itemsize,), view.strides + (1,))
