"""LNC=2 communication between the two program instances of one logical NeuronCore."""

from __future__ import annotations

import numpy as np

from neuron_dynamo.nki.context import current
from neuron_dynamo.nki.isa.enums import engine
from neuron_dynamo.nki.isa.operands import _fail, _onchip, _record, _rows, _same_layout, _step, _tensor, _touch


def _lnc_check(op: str, ctx) -> None:
    if ctx.limits.nc_version < 3:
        _fail("lnc", f"{op} needs trn2 or newer (target {ctx.target})")
    if ctx.launch.num_programs < 2:
        _fail("lnc", f"{op} needs an LNC=2 launch (kernel[2]); this launch has one program instance")


def core_barrier(data, cores, engine=engine.unknown, name=None):
    """Wait until both LNC program instances reach this barrier (they share `data`, a shared_hbm tensor)."""
    op = "core_barrier"
    ctx = current()
    _lnc_check(op, ctx)
    data = _tensor(op, "data", data)
    if data._s.buffer != "shared_hbm":
        _fail("core-barrier", f"{op}: data must be a shared_hbm tensor, got {data._s.buffer}")
    if tuple(cores) != (0, 1):
        _fail("core-barrier", f"{op}: only cores=(0, 1) is supported, got {cores}")
    _record(ctx, op, "sync", 1, 1, (), None)
    ctx.launch.barrier(ctx.program_id, op)


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, name=None):
    """Send `src` to program `send_to_rank` and receive `dst` from `recv_from_rank` (SBUF tiles, same layout)."""
    op = "sendrecv"
    ctx = current()
    _lnc_check(op, ctx)
    src = _onchip(op, "src", src)
    dst = _onchip(op, "dst", dst)
    for what, t in (("src", src), ("dst", dst)):
        if t._s.buffer != "sbuf":
            _fail("sendrecv", f"{op}: {what} must be in SBUF, got {t._s.buffer}")
    p, f = _same_layout(op, ("src", "dst"), src, dst)
    if src._dt != dst._dt:
        _fail("sendrecv", f"{op}: src ({src._dt}) and dst ({dst._dt}) must share a dtype")
    for what, rank in (("send_to_rank", send_to_rank), ("recv_from_rank", recv_from_rank)):
        if rank not in range(ctx.launch.num_programs):
            _fail("sendrecv", f"{op}: {what}={rank} is not a program instance of this launch")
    me = ctx.program_id
    sent = [None]  # the mailbox slot: the step fills it, the receiver's step reads it (also when replayed)

    def send():
        sent[0] = np.array(_rows(src, p, f))

    _step(ctx, send)
    ctx.launch.post((pipe_id, me, send_to_rank), sent)
    _touch(ctx, (src, dst))
    _record(ctx, op, "dma", p, f, (src,), dst, dma_bytes=p * f * src.itemsize)
    ctx.launch.barrier(me, op)
    received = ctx.launch.collect((pipe_id, recv_from_rank, me))
    _step(ctx, lambda: dst._write(received[0]))
