"""The operand checks every instruction shares, and the report of each executed instruction to the cost model.

`_step` runs an instruction's reads, arithmetic and writes (kept for replay while a call is recorded, see
`nki.replay`: whatever a step computes from tensor values must happen inside it). `_record` and `_access` feed
`costmodel.Instruction` (engine, sizes, dtypes, buffers, and the storage regions read and written, which order
instructions on different engines).
"""

from __future__ import annotations

import logging
import math

import numpy as np

from neuron_dynamo.nki import dtypes
from neuron_dynamo.nki.costmodel import Instruction
from neuron_dynamo.nki.errors import NkiValidationError, kernel_site
from neuron_dynamo.nki.isa.enums import engine
from neuron_dynamo.nki.tensor import ONCHIP, NkiTensor, buffer_kind

log = logging.getLogger("neuron_dynamo.nki")


def _fail(rule: str, message: str):
    raise NkiValidationError(rule, message)


def _tensor(op: str, what: str, t) -> NkiTensor:
    if not isinstance(t, NkiTensor):
        _fail("operand", f"{op}: {what} must be an NKI tensor, got {type(t).__name__}")
    return t


def _onchip(op: str, what: str, t) -> NkiTensor:
    t = _tensor(op, what, t)
    if t._s.buffer not in ONCHIP:
        _fail(
            "engine-memory",
            f"{op}: {what} is in {t._s.buffer}; compute engines only access SBUF and PSUM. "
            "Move it on chip with nisa.dma_copy / nl.load first",
        )
    if t._idx is not None:
        _fail("indirect-view", f"{op}: {what} is an indirect access pattern; only DMA instructions take those")
    return t


def _pf(t: NkiTensor) -> tuple[int, int]:
    shape = t._a.shape
    return shape[0], math.prod(shape[1:])


def _same_layout(op: str, names: tuple[str, ...], *ts: NkiTensor) -> tuple[int, int]:
    p, f = _pf(ts[0])
    for name, t in zip(names[1:], ts[1:], strict=True):
        if _pf(t) != (p, f):
            _fail(
                "shape-mismatch",
                f"{op}: {names[0]} is {ts[0].shape} ({p} partitions x {f} elements) but {name} is {t.shape} "
                f"({_pf(t)[0]} x {_pf(t)[1]}); operands need the same partitions and elements per partition",
            )
    return p, f


def _two_inputs(op: str, names: tuple[str, str, str], a, b, dst) -> tuple[NkiTensor, NkiTensor, NkiTensor, int, int]:
    """The on-chip operands of a two-input VectorE instruction (`names`: the two inputs, then dst), checked for one
    layout and at most one input in PSUM: (a, b, dst, partitions, elements per partition)."""
    dst = _onchip(op, names[2], dst)
    a, b = _onchip(op, names[0], a), _onchip(op, names[1], b)
    p, f = _same_layout(op, names, a, b, dst)
    if a._s.buffer == "psum" and b._s.buffer == "psum":
        _fail("tensor-tensor-psum", f"{op}: {names[0]} and {names[1]} are both in PSUM; at most one may be")
    return a, b, dst, p, f


def _rows(t: NkiTensor, p: int, f: int) -> np.ndarray:
    """The tensor's values as a [partitions, free] array (a copy only when the view is not reshapeable)."""
    return t._a.reshape(p, f)


def _f32(t: NkiTensor, p: int, f: int) -> np.ndarray:
    """The tensor's values as fp32 [p, f] (cached per view for low-precision dtypes; callers never modify it)."""
    a = t._a
    if a.dtype == np.float32:
        return a.reshape(p, f)
    s = t._s
    cache = s.f32_cache
    if cache is None:
        cache = s.f32_cache = {}
    key = (a.__array_interface__["data"][0], a.shape, a.strides, t._dt)
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = dtypes.as_f32(a).reshape(p, f)
    return hit


def _engine_name(op: str, e, default: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(e, engine):
        _fail("engine", f"{op}: engine={e!r} is not an nisa.engine member (e.g. nisa.engine.vector)")
    if e is engine.unknown:
        return default
    if e.name not in allowed:
        _fail("engine", f"{op} cannot run on the {e.name} engine; allowed: {', '.join(allowed)}")
    return e.name


def _no_gpsimd_psum(op: str, eng: str, *ts: NkiTensor) -> None:
    if eng == "gpsimd" and any(t._s.buffer == "psum" for t in ts):
        _fail("gpsimd-psum", f"{op} on GpSimd cannot access PSUM; use the vector engine or move the data to SBUF")


def _extent(t: NkiTensor) -> tuple[int, int, int, int]:
    """(first partition, last partition, first byte, last byte within a partition) an on-chip view touches."""
    a, base = t._a, t._s.data
    row = base.strides[0] if base.ndim > 1 else base.itemsize
    rel = a.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    p0, f0 = divmod(rel, row)
    p1 = p0 + (a.shape[0] - 1) * a.strides[0] // row if a.ndim else p0
    lo = hi = f0
    for n, st in zip(a.shape[1:], a.strides[1:], strict=True):
        if st > 0:
            hi += st * (n - 1)
        else:
            lo += st * (n - 1)
    return min(p0, p1), max(p0, p1), lo, hi + a.itemsize - 1


def _overlap(x: tuple, y: tuple) -> bool:
    return x[0] <= y[1] and y[0] <= x[1] and x[2] <= y[3] and y[2] <= x[3]


def _touch(ctx, ts, matmul: bool = False) -> None:
    """Mark liveness of on-chip tensors; a non-matmul access to a PSUM region closes the accumulation groups
    open on it (the eviction of their result)."""
    recording = ctx.launch.recording
    if recording is not None and recording.steps is not None:
        recording.fills.operands(ts)
    c = ctx.counter
    for t in ts:
        s = t._s
        u = s.use
        if u is not None:
            if u.first < 0:
                u.first = c
            u.last = c
            if not matmul and s.acc_groups:
                ext = _extent(t)
                for key, group in list(s.acc_groups.items()):
                    if _overlap(ext, group):
                        del s.acc_groups[key]


def _layout_facts(ts) -> dict:
    contiguous = True
    stride_bytes = 0
    for t in ts:
        a = t._a
        if a is None or a.ndim < 2:
            continue
        st = abs(a.strides[-1])
        if a.shape[-1] > 1 and st != a.itemsize:
            contiguous = False
            stride_bytes = max(stride_bytes, st)
    return {"contiguous": contiguous, "stride_bytes": stride_bytes}


def _warn_unwritten(ctx, op: str, ins) -> None:
    """Log (once per tensor) an instruction reading a kernel-allocated tensor nothing has written yet."""
    for t in ins:
        s = t._s
        if not s.written and s.site is not None and id(s) not in ctx.warned_unwritten:
            ctx.warned_unwritten.add(id(s))
            here = kernel_site() or ("?", 0)
            log.warning(
                "%s:%d: %s reads %s allocated at %s:%d, which nothing has written yet (it holds the NaN/4 fill of "
                "fresh memory)", here[0], here[1], op, s.name or "a tensor", s.site[0], s.site[1],
            )


def _record(ctx, op, eng, p, f, ins, dst, **extra) -> None:
    _warn_unwritten(ctx, op, ins)
    dma_bytes = extra.pop("dma_bytes", 0)
    flops = extra.pop("flops", 0)
    extra.update(_layout_facts((*ins, dst) if dst is not None else ins))
    ctx.record(
        Instruction(
            op=op,
            engine=eng,
            partitions=p,
            free_elems=f,
            in_dtypes=tuple(t._dt for t in ins),
            out_dtype=dst._dt if dst is not None else "",
            in_buffers=tuple(buffer_kind(t._s.buffer) for t in ins),
            out_buffer=buffer_kind(dst._s.buffer) if dst is not None else "",
            dma_bytes=dma_bytes,
            flops=flops,
            extra=extra,
            reads=tuple(_access(t) for t in ins),
            writes=(_access(dst),) if dst is not None else (),
        )
    )


def _access(t: NkiTensor) -> tuple[int, tuple[int, int, int, int]]:
    """The storage and the region of it an instruction operand touches (the cost model orders on these); an
    indirect access (no fixed view) may touch all of it."""
    return t._s.serial, _extent(t) if t._a is not None else (0, _EVERYWHERE, 0, _EVERYWHERE)


_EVERYWHERE = 2**62


def _step(ctx, fn, replay_fn=None, writes=()) -> None:
    """Run an instruction's data part now; while the call is recorded, also keep it (or `replay_fn`, which must
    compute exactly what `fn` does) for replay. `writes`: the direct views `fn` stores into without `_write` (its
    `_writer`/`_out2d` stores), whose bookkeeping happens here, once, instead of in every replay."""
    recording = ctx.launch.recording
    if recording is None:
        fn()
    else:
        recording.step(fn, replay_fn, writes)
    for t in writes:
        t._s.written = True


def _out2d(t: NkiTensor, p: int, f: int) -> np.ndarray | None:
    """A writable fp32 [p, f] view of `t`'s memory that a step may compute into (`out=`), or None when the store
    must convert (another dtype, tf32 rounding) or the view cannot be reshaped without a copy."""
    a = t._a
    if t._dt != "float32" or not a.flags.writeable:
        return None
    return _view_2d(a, p, f)


def _view_2d(a: np.ndarray, p: int, f: int) -> np.ndarray | None:
    """`a` as [p, f] sharing its memory, or None when NumPy can only reshape it by copying (a copy bound at record
    time would go stale)."""
    return _view_as(a, (p, f))


def _view_as(a: np.ndarray, shape) -> np.ndarray | None:
    """`a` in `shape` sharing its memory, or None (see `_view_2d`)."""
    v = a.reshape(shape)
    return v if np.may_share_memory(v, a) else None


def _writer(t: NkiTensor, p: int, f: int):
    """`t._write` without its per-call work, for a step that reports `t` in `_step(writes=...)`: the store of [p, f]
    values (cast to t's dtype) into the view bound now, dropping the storage's fp32 cache as `_write` does."""
    a, s, name = t._a, t._s, t._dt
    if not a.flags.writeable:
        _fail("write-to-broadcast", "cannot write into a broadcast view (stride-0 dimension); write the full tile")
    out = _out2d(t, p, f)
    if out is not None:
        def store(values):
            s.f32_cache = None
            out[...] = values.reshape(p, f)
    else:
        shape, to_dtype = a.shape, dtypes.to_dtype

        def store(values):
            s.f32_cache = None
            a[...] = to_dtype(values, name).reshape(shape)
    return store


def _f32_reader(t: NkiTensor, p: int, f: int):
    """A function giving `_f32(t, p, f)`: the fp32 view itself, bound now, when the view is fp32 and reshapes
    without a copy (a copy would go stale); else the per-call (cached) conversion."""
    a = t._a
    v = _view_2d(a, p, f) if a.dtype == np.float32 else None
    if v is not None:
        return lambda: v
    return lambda: _f32(t, p, f)


def _reads_dst(ctx, dst: NkiTensor) -> None:
    """The instruction reads its dst too (it accumulates into it): a replay must keep dst's fresh-memory fill."""
    recording = ctx.launch.recording
    if recording is not None and recording.steps is not None:
        recording.fills.read(dst)


def _dynamic(ctx, why: str) -> None:
    """This call's results depend on something a replay would not reproduce: never replay it."""
    recording = ctx.launch.recording
    if recording is not None:
        recording.refuse(why)


def _scalar_reader(op: str, what: str, x, p: int):
    """A compile-time scalar or a [P, 1] tile operand: (a function giving its fp32 value when the step runs, the
    tile or None)."""
    if isinstance(x, NkiTensor):
        _onchip(op, what, x)
        xp, xf = _pf(x)
        if xp != p or xf != 1:
            _fail("operand-shape", f"{op}: {what} tile must be [{p}, 1] (one value per partition), got {x.shape}")
        column = x._a.reshape(p, 1)
        return (lambda: dtypes.as_f32(column)), x
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        _fail("operand", f"{op}: {what} must be a number or a [P, 1] tile, got {type(x).__name__}")
    value = np.float32(x)
    return (lambda: value), None


def _bound(read):
    """What the reader `read` gives, bound now when every call gives the same object (a constant, an fp32 tile's
    view), else `read` itself."""
    value = read()
    return value if read() is value else read


def _scalar_operand(op: str, what: str, x, p: int):
    """A compile-time scalar (as fp32) or a [P, 1] tile (as a [P, 1] fp32 column), read now."""
    read, tile = _scalar_reader(op, what, x, p)
    return read(), tile


def _bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """Integer values as their unsigned bit patterns (int64), for bit-vector ALU ops."""
    width = dtypes.itemsize(dtype) * 8
    return values.astype(np.int64) & ((1 << width) - 1)


def _from_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """Unsigned bit patterns truncated to dtype's width and reinterpreted as dtype."""
    size = dtypes.itemsize(dtype)
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32}[size]
    return (values & ((1 << (8 * size)) - 1)).astype(unsigned).view(dtypes.STORAGE[dtype])


def _need_int(op: str, alu, *ts: NkiTensor) -> None:
    for t in ts:
        if not dtypes.is_int(t._dt):
            _fail("bitvec-dtype", f"{op}: bit-vector operator {alu.name} needs integer tiles, got {t._dt}")


def _apply(alu, x, operand, reverse):
    return alu.fn(operand, x) if reverse else alu.fn(x, operand)


def _vector_regs(ctx) -> np.ndarray:
    regs = getattr(ctx, "vector_reduce_regs", None)
    if regs is None:
        regs = ctx.vector_reduce_regs = np.full((ctx.limits.pmax,), np.nan, dtype=np.float32)
    return regs
