"""`nki.isa`: the NKI 0.6 instruction set on CPU.

Every instruction checks the hardware rules it is subject to (reference/nki.md §1.5–1.7, §2.1) *before* touching
memory, executes as one vectorised NumPy call in fp32 (bit-vector ops on integer bit patterns), casts the result to
`dst.dtype`, and reports itself to the program instance's cost model with the engine that runs it.
"""

from __future__ import annotations

import enum
import logging
import math

import numpy as np

from neuron_dynamo.nki import dtypes
from neuron_dynamo.nki.context import current
from neuron_dynamo.nki.costmodel import Instruction
from neuron_dynamo.nki.errors import NkiValidationError, kernel_site
from neuron_dynamo.nki.ops import resolve_activation, resolve_alu
from neuron_dynamo.nki.tensor import ONCHIP, NkiTensor, buffer_kind

__all__ = [
    "NkiValidationError", "engine", "reduce_cmd", "oob_mode", "dge_mode", "matmul_perf_mode", "nc_version",
    "dma_engine", "get_nc_version", "dma_copy", "dma_transpose", "tensor_copy", "memset", "nc_matmul", "nc_transpose",
    "activation", "activation_reduce", "tensor_tensor", "tensor_scalar", "scalar_tensor_tensor", "tensor_reduce",
    "tensor_tensor_scan", "iota", "affine_select", "reciprocal", "bn_stats", "bn_aggr", "tensor_partition_reduce",
    "dropout", "max8", "tensor_copy_predicated", "core_barrier", "sendrecv", "dma_compute", "tensor_scalar_reduce",
    "select_reduce", "range_select", "exponential", "nc_stream_shuffle", "nc_find_index8", "nc_match_replace8",
    "tensor_copy_dynamic_src", "tensor_copy_dynamic_dst", "VirtualRegister", "register_alloc", "register_move",
    "register_load", "register_store",
]


class engine(enum.Enum):  # noqa: N801 - NKI spells its enums in lower case
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class reduce_cmd(enum.Enum):  # noqa: N801
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class oob_mode(enum.Enum):  # noqa: N801
    error = 0
    skip = 1


class dge_mode(enum.Enum):  # noqa: N801
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class matmul_perf_mode(enum.Enum):  # noqa: N801
    none = 0
    double_row = 1


class nc_version(enum.Enum):  # noqa: N801
    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.Enum):  # noqa: N801
    dma = 0
    gpsimd_dma = 1


tensor_engine = engine.tensor  # deprecated aliases, still used by many kernels
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown
# the enums under names the instruction parameters (engine=, dge_mode=, ...) do not shadow
_Engine, _DgeMode, _OobMode, _ReduceCmd = engine, dge_mode, oob_mode, reduce_cmd

log = logging.getLogger("neuron_dynamo.nki")

_MATMUL_INPUTS = ("float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32", "float32")
_F32_FAMILY = ("float32", "tfloat32")


def get_nc_version() -> nc_version:
    return nc_version(current().limits.nc_version)


# ------------------------------------------------------------------------------------------------ helpers
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
    return id(t._s), _extent(t) if t._a is not None else (0, _EVERYWHERE, 0, _EVERYWHERE)


_EVERYWHERE = 2**62


def _scalar_operand(op: str, what: str, x, p: int):
    """A compile-time scalar (as fp32) or a [P, 1] tile (as a [P, 1] fp32 column)."""
    if isinstance(x, NkiTensor):
        _onchip(op, what, x)
        xp, xf = _pf(x)
        if xp != p or xf != 1:
            _fail("operand-shape", f"{op}: {what} tile must be [{p}, 1] (one value per partition), got {x.shape}")
        return dtypes.as_f32(x._a.reshape(p, 1)), x
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        _fail("operand", f"{op}: {what} must be a number or a [P, 1] tile, got {type(x).__name__}")
    return np.float32(x), None


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


# ------------------------------------------------------------------------------------------------ data movement
def dma_copy(dst, src, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, priority=None,
             engine=engine.unknown, name=None):
    """Copy `src` to `dst` (HBM/SBUF, any layouts with equal element counts); dtypes differing cast via fp32."""
    op = "dma_copy"
    ctx = current()
    dst = _tensor(op, "dst", dst)
    src = _tensor(op, "src", src)
    for what, t in (("src", src), ("dst", dst)):
        if t._s.buffer == "psum":
            _fail("dma-psum", f"{op}: {what} is in PSUM; DMA cannot access PSUM. Copy PSUM to SBUF with "
                  "nisa.tensor_copy first")
    n_src, n_dst = math.prod(src.shape), math.prod(dst.shape)
    if n_src != n_dst:
        _fail("dma-elements", f"{op}: src has {n_src} elements {src.shape} but dst has {n_dst} {dst.shape}")
    if dge_mode is _DgeMode.hwdge:
        if ctx.limits.nc_version < 3:
            _fail("dge-mode", f"{op}: hardware DGE needs trn2 or newer (target {ctx.target})")
        if src._dt != dst._dt:
            _fail("dge-mode", f"{op}: hardware DGE cannot cast ({src._dt} -> {dst._dt}); use equal dtypes")
    rmw = None
    if dst_rmw_op is not None:
        rmw = resolve_alu(dst_rmw_op, "dst_rmw_op")
        if rmw.name != "add":
            _fail("dma-rmw", f"{op}: dst_rmw_op supports only add, got {rmw.name}")
    mask = None
    for what, t in (("src", src), ("dst", dst)):
        if t._idx is not None and t._idx[1] is not None:
            if oob_mode is _OobMode.error:
                _fail("dma-oob", f"{op}: the dynamic indices of {what} reach outside its tensor; fix the indices "
                      "or pass oob_mode=nisa.oob_mode.skip to skip those rows")
            if what == "src":
                mask = ~t._idx[1]
    values = src._read()
    if rmw is not None:
        values = dtypes.as_f32(dst._read()).reshape(-1) + dtypes.as_f32(values).reshape(-1)
    elif src._dt != dst._dt:
        values = dtypes.as_f32(values)
    dst._write(values.reshape(-1) if values.shape != dst.shape else values,
               None if mask is None else mask.reshape(-1))
    sb = dst if dst._s.buffer == "sbuf" else (src if src._s.buffer == "sbuf" else None)
    parts = sb.shape[0] if sb is not None else 1
    nbytes = n_dst * dtypes.itemsize(dst._dt)
    extra = {"dge_mode": dge_mode.name}
    run = _contiguous_run_bytes(src, dst)
    if run is not None:
        extra["contiguous_bytes"] = run
    offsets = tuple(t._idx[2] for t in (src, dst) if t._idx is not None)  # the index tiles are read too
    _touch(ctx, (src, dst, *offsets))
    _record(ctx, op, "dma", parts, n_dst // max(parts, 1), (src,), dst, dma_bytes=nbytes, **extra)


def _contiguous_run_bytes(*ts: NkiTensor) -> int | None:
    """Bytes per contiguous run of the least contiguous side, when it is not one row per partition."""
    runs = []
    for t in ts:
        if t._idx is not None:
            runs.append(t.shape[-1] * t.itemsize if t.ndim else t.itemsize)
            continue
        a = t._a
        if a.flags.c_contiguous or a.ndim == 0:
            continue
        run, expect = 1, a.itemsize
        for n, st in zip(reversed(a.shape), reversed(a.strides), strict=True):
            if st != expect and n > 1:
                break
            run *= n
            expect *= n
        runs.append(run * a.itemsize)
    return min(runs) if runs else None


def dma_compute(dst, srcs, scales=None, reduce_op=None, unique_indices=True, oob_mode=oob_mode.error, name=None):
    """DMA-engine `dst = srcs[0] * scales[0] + srcs[1] * scales[1] + ...` in fp32 (add only, scales all 1.0)."""
    op = "dma_compute"
    ctx = current()
    dst = _tensor(op, "dst", dst)
    srcs = [_tensor(op, f"srcs[{i}]", t) for i, t in enumerate(srcs)]
    if not 1 <= len(srcs) <= 16:
        _fail("dma-compute", f"{op}: takes 1 to 16 source tensors, got {len(srcs)}")
    if reduce_op is not None and resolve_alu(reduce_op, "reduce_op").name != "add":
        _fail("dma-compute", f"{op}: reduce_op supports only add")
    if scales is not None and any(float(sc) != 1.0 for sc in scales):
        _fail("dma-compute", f"{op}: every scale must be 1.0, got {list(scales)}")
    n = math.prod(dst.shape)
    for t in (dst, *srcs):
        if t._s.buffer == "psum":
            _fail("dma-psum", f"{op}: DMA cannot access PSUM")
        if math.prod(t.shape) != n:
            _fail("dma-elements", f"{op}: every tensor needs {n} elements, {t.shape} has {math.prod(t.shape)}")
    total = dtypes.as_f32(srcs[0]._read()).reshape(-1).copy()
    for t in srcs[1:]:
        total += dtypes.as_f32(t._read()).reshape(-1)
    dst._write(total)
    _touch(ctx, (*srcs, dst))
    sb = dst if dst._s.buffer == "sbuf" else None
    parts = sb.shape[0] if sb is not None else 1
    _record(ctx, op, "dma", parts, n // parts, tuple(srcs), dst, dma_bytes=n * dst.itemsize * (len(srcs) + 1))


_DMA_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(dst, src, axes=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error, priority=None,
                  name=None):
    """Transpose `src` (HBM or SBUF, 2-byte dtype) into SBUF `dst` with the DMA engines."""
    op = "dma_transpose"
    ctx = current()
    dst = _tensor(op, "dst", dst)
    src = _tensor(op, "src", src)
    if dst._s.buffer != "sbuf":
        _fail("dma-transpose-dst", f"{op}: dst must be in SBUF, got {dst._s.buffer}")
    if src._s.buffer == "psum":
        _fail("dma-psum", f"{op}: src is in PSUM; DMA cannot access PSUM")
    nd = src.ndim
    if nd not in _DMA_TRANSPOSE_AXES:
        _fail("dma-transpose-axes", f"{op}: src must be 2-, 3- or 4-D, got {src.shape}")
    want = _DMA_TRANSPOSE_AXES[nd]
    if axes is not None and tuple(axes) != want:
        _fail("dma-transpose-axes", f"{op}: axes {tuple(axes)} unsupported for a {nd}-D src; only {want}")
    if dtypes.itemsize(src._dt) != 2 or dst._dt != src._dt:
        _fail("dma-transpose-dtype", f"{op}: needs a 2-byte dtype on both sides, got {src._dt} -> {dst._dt}")
    out_shape = tuple(src.shape[a] for a in want)
    if dst.shape != out_shape:
        _fail("dma-transpose-shape", f"{op}: dst shape {dst.shape} must be the transposed shape {out_shape}")
    if dge_mode is _DgeMode.hwdge:
        if src.shape[0] not in (1, 2, 4, 8, 16) or src.shape[-1] > 128:
            _fail("dge-mode", f"{op}: hardware DGE transpose needs src.shape[0] in (1, 2, 4, 8, 16) and "
                  f"src.shape[-1] <= 128, got {src.shape}")
    dst._write(np.transpose(src._read(), want))
    _touch(ctx, (src, dst))
    n = math.prod(dst.shape)
    _record(ctx, op, "dma", dst.shape[0], n // dst.shape[0], (src,), dst, dma_bytes=n * 2,
            dge_mode=dge_mode.name)


def tensor_copy(dst, src, engine=engine.unknown, name=None, _dynamic=False):
    """Copy on chip (SBUF/PSUM); bit-exact when dtypes match, else via fp32."""
    op = "tensor_copy"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    src = _onchip(op, "src", src)
    p, f = _same_layout(op, ("src", "dst"), src, dst)
    eng = _engine_name(op, engine, "vector", ("vector", "scalar", "gpsimd"))
    _no_gpsimd_psum(op, eng, src, dst)
    if eng == "scalar" and ctx.limits.nc_version == 2:
        _fail("engine", f"{op}: NC-v2 (trn1) ScalarE cannot run tensor_copy; use activation(op=nl.copy)")
    values = _rows(src, p, f) if src._dt == dst._dt else _f32(src, p, f)
    dst._write(values)
    _touch(ctx, (src, dst))
    _record(ctx, op, eng, p, f, (src,), dst, dynamic_address=_dynamic)


def tensor_copy_dynamic_src(dst, src, engine=engine.unknown, name=None):
    """`tensor_copy` whose `src` view starts at a runtime offset (a register in its slice: `src[:, nl.ds(reg, n)]`).

    The interpreter knows every register's value, so the view is already resolved; the instruction is charged the
    dynamic-address cost.
    """
    tensor_copy(dst, src, engine=engine, _dynamic=True)


def tensor_copy_dynamic_dst(dst, src, engine=engine.unknown, name=None):
    """`tensor_copy` whose `dst` view starts at a runtime offset (see tensor_copy_dynamic_src)."""
    tensor_copy(dst, src, engine=engine, _dynamic=True)


def memset(dst, value, engine=engine.unknown, name=None):
    """Fill `dst` with a compile-time constant."""
    op = "memset"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    eng = _engine_name(op, engine, "vector", ("vector", "gpsimd", "scalar"))
    _no_gpsimd_psum(op, eng, dst)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        _fail("memset-value", f"{op}: value must be a compile-time number, got {type(value).__name__}")
    if dtypes.is_int(dst._dt) and not isinstance(value, (int, np.integer)):
        _fail("memset-value", f"{op}: value {value!r} is a float but dst is {dst._dt}; pass an integer value")
    p, f = _pf(dst)
    fill = np.full((p, f), value, dtype=np.int64 if dtypes.is_int(dst._dt) else np.float32)
    dst._write(fill)
    _touch(ctx, (dst,))
    _record(ctx, op, eng, p, f, (), dst, value=float(value))


# ------------------------------------------------------------------------------------------------ TensorE
def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none,
              psum_accumulate_flag=None, name=None):
    """`dst = stationary.T @ moving` on TensorE, accumulated in fp32 PSUM.

    `accumulate`: False overwrites dst, True adds to it, None (default) opens an accumulation group on the first
    matmul into this dst view and adds for the following ones, until another instruction reads or writes an
    overlapping part of the PSUM tensor (the eviction of the result), which closes the group.
    """
    op = "nc_matmul"
    ctx = current()
    limits = ctx.limits
    dst = _tensor(op, "dst", dst)
    stationary = _tensor(op, "stationary", stationary)
    moving = _tensor(op, "moving", moving)
    for what, t in (("stationary", stationary), ("moving", moving)):
        if t._s.buffer != "sbuf" or t._idx is not None:
            _fail("tensor-engine-reads-sbuf", f"{op}: {what} is in {t._s.buffer}; TensorE reads its operands from "
                  "SBUF only")
    if dst._s.buffer != "psum":
        _fail("tensor-engine-writes-psum", f"{op}: dst is in {dst._s.buffer}; TensorE writes PSUM only")
    double_row = perf_mode is matmul_perf_mode.double_row
    if double_row:
        if limits.nc_version < 3:
            _fail("matmul-perf-mode", f"{op}: double_row needs trn2 or newer")
        for what, t in (("stationary", stationary), ("moving", moving)):
            if t._dt not in ("float8_e4m3", "float8_e5m2") or t.ndim < 3 or t.shape[1] != 2:
                _fail("matmul-perf-mode", f"{op}: double_row takes fp8 {what} of shape [K, 2, ...], got "
                      f"{t._dt} {t.shape}")
    k, m = _pf(stationary)
    k2, n = _pf(moving)
    if double_row:
        m //= 2
        n //= 2
    if k != k2:
        _fail("matmul-k", f"{op}: stationary {stationary.shape} and moving {moving.shape} must have the same "
              "partition (contraction) size")
    row_max, col_max = limits.pmax, limits.gemm_stationary_fmax
    if tile_position or tile_size:
        if len(tile_position) != 2 or len(tile_size) != 2:
            _fail("matmul-tiling", f"{op}: tile_position and tile_size must both be (row, column) pairs")
        for size, pos in zip(tile_size, tile_position, strict=True):
            if size not in (32, 64, 128) or pos % size or pos + size > 128:
                _fail("matmul-tiling", f"{op}: tile_size {tile_size} / tile_position {tile_position} must use 32, 64 "
                      "or 128 pieces at multiples of the size")
        row_max, col_max = tile_size
    if k > row_max:
        _fail("matmul-k", f"{op}: contraction size K={k} exceeds {row_max}; split K into {row_max}-row tiles and "
              "accumulate in PSUM")
    if m > col_max:
        _fail("matmul-stationary-free", f"{op}: stationary free size M={m} exceeds {col_max}")
    n_max = limits.matmul_moving_fmax(dst._dt)
    if n > n_max:
        _fail("matmul-moving-free", f"{op}: moving free size N={n} exceeds {n_max} on {ctx.target}")
    dp, df = _pf(dst)
    if (dp, df) != (m, n):
        _fail("matmul-dst-shape", f"{op}: dst {dst.shape} must be [M={m}, N={n}]")
    sd, md = stationary._dt, moving._dt
    allowed = _MATMUL_INPUTS + (("float8_e4m3fn",) if limits.nc_version >= 4 else ())
    for what, dt in (("stationary", sd), ("moving", md)):
        if dt not in allowed:
            _fail("matmul-dtype", f"{op}: {what} dtype {dt} is not a TensorE input dtype ({', '.join(allowed)})")
    if (sd in _F32_FAMILY) != (md in _F32_FAMILY):
        _fail("matmul-fp32-pairing", f"{op}: stationary is {sd} and moving is {md}; an fp32/tf32 operand must be "
              "paired with another fp32/tf32 operand")
    if is_transpose:
        if dst._dt != sd:
            _fail("matmul-dst-dtype", f"{op}: transpose mode writes the input dtype {sd}, dst is {dst._dt}")
    else:
        dst_ok = ("float32",) if limits.nc_version < 4 else ("float32", "bfloat16")
        if dst._dt not in dst_ok:
            _fail("matmul-dst-dtype", f"{op}: dst must be {' or '.join(dst_ok)} on {ctx.target}, got {dst._dt}")
    if limits.nc_version < 4:
        _check_one_bank(op, dst, limits.psum_bank_bytes)
    if double_row:
        s = dtypes.as_f32(stationary._a).reshape(k * 2, m)
        mv = dtypes.as_f32(moving._a).reshape(k * 2, n)
    else:
        s = _f32(stationary, k, m)
        mv = _f32(moving, k, n)
    if is_transpose and k == n and np.array_equal(mv, np.eye(k, dtype=np.float32)):
        result = _rows(stationary, k, m).T  # bit-exact transpose through the identity (NC-v3+ behaviour)
        dst._write(result)
    else:
        result = (dtypes.torch_view(s).T @ dtypes.torch_view(mv)).numpy()  # one fp32 GEMM
        if psum_accumulate_flag is not None:
            add = not (psum_accumulate_flag & 1)
        elif accumulate is None:
            groups = dst._s.acc_groups
            key = (dst._a.__array_interface__["data"][0], dst._a.shape, dst._a.strides)
            add = key in groups
            if not add:
                groups[key] = _extent(dst)
        else:
            add = bool(accumulate)
        if add:
            if dst._dt == "float32":
                dst._s.written = True
                dst._s.f32_cache = None
                dst._a += result.reshape(dst._a.shape)
            else:
                dst._write(dtypes.as_f32(dst._a).reshape(m, n) + result)
        else:
            dst._write(result)
    _touch(ctx, (stationary, moving, dst), matmul=True)
    _record(ctx, op, "tensor", k, n, (stationary, moving), dst, flops=0 if is_transpose else 2 * k * m * n,
            M=m, K=k, N=n, is_transpose=bool(is_transpose), perf_mode=perf_mode.name)


def _check_one_bank(op: str, dst: NkiTensor, bank: int) -> None:
    row = math.prod(dst._s.data.shape[1:])
    item = dst._a.itemsize
    start = dst.offset % row
    span = 1 + sum((n - 1) * st for n, st in zip(dst.shape[1:], dst.strides[1:], strict=True))
    if (start * item) // bank != ((start + span) * item - 1) // bank:
        _fail("psum-bank", f"{op}: dst spans bytes {start * item}..{(start + span) * item} of its PSUM partition, "
              f"crossing a {bank}-byte bank boundary; a matmul output must fit in one PSUM bank")


def nc_transpose(dst, data, engine=engine.unknown, name=None):
    """Swap the partition and (flattened) free dims: TensorE up to 128x128 (SBUF -> PSUM), VectorE up to 32x32."""
    op = "nc_transpose"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    data = _onchip(op, "data", data)
    p, f = _pf(data)
    dp, df = _pf(dst)
    if (dp, df) != (f, p):
        _fail("transpose-shape", f"{op}: data is [{p}, {f}] so dst must be [{f}, {p}], got {dst.shape}")
    if dst._dt != data._dt:
        _fail("transpose-dtype", f"{op}: dst dtype {dst._dt} must equal data dtype {data._dt}")
    if engine is _Engine.unknown:
        on_te = data._s.buffer == "sbuf" and dst._s.buffer == "psum"
        eng = "tensor" if on_te or max(p, f) > 32 else "vector"
    else:
        eng = _engine_name(op, engine, "tensor", ("tensor", "vector"))
    if eng == "tensor":
        if data._s.buffer != "sbuf" or dst._s.buffer != "psum":
            _fail("tensor-engine-writes-psum", f"{op}: TensorE transpose reads SBUF and writes PSUM; data is in "
                  f"{data._s.buffer}, dst in {dst._s.buffer}")
        if p > 128 or f > 128:
            _fail("transpose-size", f"{op}: TensorE transposes at most 128x128, got [{p}, {f}]")
    elif p > 32 or f > 32:
        _fail("transpose-size", f"{op}: VectorE transposes at most 32x32, got [{p}, {f}]")
    dst._write(_rows(data, p, f).T)
    _touch(ctx, (data, dst))
    _record(ctx, op, eng, p, f, (data,), dst)


# ------------------------------------------------------------------------------------------------ ScalarE
def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               name=None):
    """`dst = op(data * scale + bias)` on ScalarE, with the optional add-reduction into the reduce registers.

    Register semantics follow the ISA pseudo code: `reset`/`reset_reduce` zero the 128 per-partition registers,
    `reduce`/`reset_reduce` add this instruction's free-axis sum, and `reduce_res` (if given) receives the registers
    (with the default `idle`, an earlier value; the registers start uninitialised, NaN).
    """
    iname = "activation"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    data = _onchip(iname, "data", data)
    p, f = _same_layout(iname, ("data", "dst"), data, dst)
    act_name, fn = resolve_activation(op)
    x = _f32(data, p, f)
    ins = [data]
    sc, sc_t = _scalar_operand(iname, "scale", scale, p)
    if sc_t is not None:
        ins.append(sc_t)
    if sc_t is not None or sc != 1.0:
        x = x * sc
    if bias is not None:
        b, b_t = _scalar_operand(iname, "bias", bias, p)
        if b_t is None and ctx.limits.nc_version == 2:
            _fail("activation-bias", f"{iname}: on trn1 bias must be a [P, 1] tile, not a scalar")
        if b_t is not None:
            ins.append(b_t)
        x = x + b
    if act_name in _ACTIVATION_RANGES:
        _check_activation_range(ctx, act_name, x)
    out = fn(x)
    if not isinstance(reduce_cmd, _ReduceCmd):
        _fail("reduce-cmd", f"{iname}: reduce_cmd must be an nisa.reduce_cmd member")
    reducing = reduce_op is not None or reduce_res is not None or reduce_cmd is not _ReduceCmd.idle
    if reduce_op is not None and resolve_alu(reduce_op, "reduce_op").name != "add":
        _fail("activation-reduce-op", f"{iname}: reduce_op must be nl.add")
    regs = ctx.scalar_reduce_regs
    cmd = reduce_cmd.name
    if cmd in ("reset", "reset_reduce"):
        regs[:p] = 0.0
    if cmd in ("reduce", "reset_reduce", "load_reduce"):
        regs[:p] += out.sum(axis=1, dtype=np.float32)
    dst._write(out)
    touched = [*ins, dst]
    if reduce_res is not None:
        reduce_res = _onchip(iname, "reduce_res", reduce_res)
        if _pf(reduce_res) != (p, 1):
            _fail("operand-shape", f"{iname}: reduce_res must be [{p}, 1], got {reduce_res.shape}")
        reduce_res._write(regs[:p].copy())
        touched.append(reduce_res)
    _touch(ctx, touched)
    _record(ctx, iname, "scalar", p, f, tuple(ins), dst, act=act_name, reduce=reducing)


# ScalarE evaluates these functions with piecewise polynomials that are only valid on these input ranges
# (reference/nki.md §1.9): outside them the hardware returns garbage where NumPy returns the exact value.
_ACTIVATION_RANGES = {
    "log": (2.0**-64, 2.0**64, False),
    "sqrt": (2.0**-116, 2.0**118, False),
    "rsqrt": (2.0**-87, 2.0**97, False),
    "reciprocal": (2.0**-42, 2.0**42, True),  # symmetric: |x| in range
    "sin": (-np.pi, np.pi, False),
    "arctan": (-np.pi / 2, np.pi / 2, False),
}


def _check_activation_range(ctx, act_name: str, x: np.ndarray) -> None:
    lo, hi, symmetric = _ACTIVATION_RANGES[act_name]
    values = np.abs(x) if symmetric else x
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return
    vmin, vmax = float(finite.min()), float(finite.max())
    slack = 1e-6 * max(abs(lo), abs(hi))  # fp32 rounding of the bounds themselves (e.g. pi)
    if vmin >= lo - slack and vmax <= hi + slack:
        return
    here = kernel_site() or ("?", 0)
    if (here, act_name) in ctx.warned_ranges:
        return
    ctx.warned_ranges.add((here, act_name))
    log.warning(
        "%s:%d: activation %s gets inputs in [%.3g, %.3g]%s, outside its valid ScalarE range [%.3g, %.3g]: the "
        "hardware result is invalid there (the interpreter computes the exact value)", here[0], here[1], act_name,
        vmin, vmax, " (absolute values)" if symmetric else "", lo, hi,
    )


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """`activation` with `reduce_cmd=reset_reduce`: `reduce_res` receives the free-axis sum of the output."""
    activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
               reduce_cmd=reduce_cmd.reset_reduce)


# ------------------------------------------------------------------------------------------------ VectorE / GpSimd
def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    """Element-wise `dst = data1 op data2` (fp32 arithmetic or integer bit-vector ops)."""
    iname = "tensor_tensor"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    data1 = _onchip(iname, "data1", data1)
    data2 = _onchip(iname, "data2", data2)
    p, f = _same_layout(iname, ("data1", "data2", "dst"), data1, data2, dst)
    if data1._s.buffer == "psum" and data2._s.buffer == "psum":
        _fail("tensor-tensor-psum", f"{iname}: data1 and data2 are both in PSUM; at most one input may be in PSUM")
    alu = resolve_alu(op)
    default = "gpsimd" if alu.name == "power" else "vector"
    if default == "vector" and {data1._dt, data2._dt} <= {"int32", "uint32"} and "psum" not in (
        data1._s.buffer, data2._s.buffer, dst._s.buffer
    ):
        default = "gpsimd"
    eng = _engine_name(iname, engine, default, ("vector", "gpsimd"))
    _no_gpsimd_psum(iname, eng, data1, data2, dst)
    if alu.kind == "bitvec":
        _need_int(iname, alu, data1, data2, dst)
        out = _from_bits(alu.fn(_bits(_rows(data1, p, f), data1._dt), _bits(_rows(data2, p, f), data2._dt)),
                         dst._dt)
    else:
        out = alu.fn(_f32(data1, p, f), _f32(data2, p, f))
    dst._write(out)
    _touch(ctx, (data1, data2, dst))
    _record(ctx, iname, eng, p, f, (data1, data2), dst, alu_op=alu.name)


def _apply(alu, x, operand, reverse):
    return alu.fn(operand, x) if reverse else alu.fn(x, operand)


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.unknown, name=None):
    """`dst = (data op0 operand0) op1 operand1`, operands scalars or [P, 1] tiles broadcast along the free dim."""
    iname = "tensor_scalar"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    data = _onchip(iname, "data", data)
    p, f = _same_layout(iname, ("data", "dst"), data, dst)
    a0 = resolve_alu(op0, "op0")
    a1 = resolve_alu(op1, "op1") if op1 is not None else None
    if (op1 is None) != (operand1 is None):
        _fail("operand", f"{iname}: op1 and operand1 go together; pass both or neither")
    if a1 is not None and a1.kind != a0.kind:
        _fail("alu-kind", f"{iname}: op0 ({a0.name}) and op1 ({a1.name}) must both be arithmetic or both bit-vector")
    eng = _engine_name(iname, engine, "vector", ("vector", "scalar", "gpsimd"))
    _no_gpsimd_psum(iname, eng, data, dst)
    if eng == "scalar" and ctx.limits.nc_version == 3:
        combo = (a0.name, a1.name if a1 else None)
        if combo not in (("multiply", "add"), ("multiply", None), ("add", None)):
            _fail("scalar-engine-ops", f"{iname}: trn2 ScalarE supports only multiply+add, multiply or add, got "
                  f"{combo}")
    ins = [data]
    if a0.kind == "bitvec":
        if eng != "vector":
            _fail("engine", f"{iname}: bit-vector operators run on the vector engine only")
        _need_int(iname, a0, data, dst)
        x = _bits(_rows(data, p, f), data._dt)
        for alu, operand, rev in ((a0, operand0, reverse0), (a1, operand1, reverse1)):
            if alu is None:
                continue
            if isinstance(operand, NkiTensor):
                _onchip(iname, "operand", operand)
                ins.append(operand)
                val = _bits(operand._a.reshape(p, 1), operand._dt)
            elif isinstance(operand, (int, np.integer)) and not isinstance(operand, bool):
                val = np.int64(operand)
            else:
                _fail("operand", f"{iname}: bit-vector operands must be integers or integer [P, 1] tiles")
            x = _apply(alu, x, val, rev)
        out = _from_bits(x, dst._dt)
    else:
        x = _f32(data, p, f)
        v0, t0 = _scalar_operand(iname, "operand0", operand0, p)
        x = _apply(a0, x, v0, reverse0)
        if t0 is not None:
            ins.append(t0)
        if a1 is not None:
            v1, t1 = _scalar_operand(iname, "operand1", operand1, p)
            x = _apply(a1, x, v1, reverse1)
            if t1 is not None:
                ins.append(t1)
        out = x
    dst._write(out)
    _touch(ctx, (*ins, dst))
    _record(ctx, iname, eng, p, f, tuple(ins), dst, alu_op=a0.name, alu_op1=a1.name if a1 else None)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    """`dst = (data op0 operand0) op1 operand1`: operand0 a scalar or [P, 1] tile, operand1 a full tile."""
    iname = "scalar_tensor_tensor"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    data = _onchip(iname, "data", data)
    operand1 = _onchip(iname, "operand1", operand1)
    p, f = _same_layout(iname, ("data", "operand1", "dst"), data, operand1, dst)
    if data._s.buffer == "psum" and operand1._s.buffer == "psum":
        _fail("tensor-tensor-psum", f"{iname}: data and operand1 are both in PSUM; at most one may be")
    a0, a1 = resolve_alu(op0, "op0"), resolve_alu(op1, "op1")
    if a0.kind != "arith" or a1.kind != "arith":
        _fail("alu-kind", f"{iname}: op0 and op1 must be arithmetic operators")
    v0, t0 = _scalar_operand(iname, "operand0", operand0, p)
    x = _apply(a0, _f32(data, p, f), v0, reverse0)
    out = _apply(a1, x, _f32(operand1, p, f), reverse1)
    dst._write(out)
    ins = (data, operand1) if t0 is None else (data, t0, operand1)
    _touch(ctx, (*ins, dst))
    _record(ctx, iname, "vector", p, f, ins, dst, alu_op=a1.name)


def _reduce_axes(op: str, data: NkiTensor, axis) -> tuple[int, ...]:
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    nd = data.ndim
    axes = tuple(sorted(int(a) + nd if int(a) < 0 else int(a) for a in axes))
    if not axes or axes[0] < 1 or axes != tuple(range(axes[0], nd)):
        _fail("reduce-axis", f"{op}: axis {axis} must be the trailing free dims of the {nd}-D input (e.g. "
              f"{tuple(range(1, nd))[-1:]} or {tuple(range(1, nd))}); the partition dim (0) cannot be reduced")
    return axes


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce the trailing free axes of `data` with an ALU operator (fp32 for arithmetic ops)."""
    iname = "tensor_reduce"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    data = _onchip(iname, "data", data)
    alu = resolve_alu(op)
    if alu.reduce is None:
        _fail("reduce-op", f"{iname}: {alu.name} is not a reduction operator")
    axes = _reduce_axes(iname, data, axis)
    p, f = _pf(data)
    kept = math.prod(data.shape[1 : axes[0]])
    if _pf(dst) != (p, kept):
        _fail("shape-mismatch", f"{iname}: reducing axes {axes} of {data.shape} leaves {kept} elements per "
              f"partition, dst {dst.shape} has {_pf(dst)[1]}")
    if alu.kind == "bitvec":
        _need_int(iname, alu, data, dst)
        out = _from_bits(alu.reduce(_bits(data._a, data._dt), axes), dst._dt)
    else:
        out = alu.reduce(dtypes.as_f32(data._a), axes)
        if negate:
            out = -out
    dst._write(out)
    _touch(ctx, (data, dst))
    _record(ctx, iname, "vector", p, f, (data,), dst, alu_op=alu.name)


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    """Per partition: `r[i] = op1(op0(data0[i], r[i-1]), data1[i])`, `r[-1] = initial` (fp32)."""
    iname = "tensor_tensor_scan"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    data0 = _onchip(iname, "data0", data0)
    data1 = _onchip(iname, "data1", data1)
    p, f = _same_layout(iname, ("data0", "data1", "dst"), data0, data1, dst)
    if data0._s.buffer == "psum" and data1._s.buffer == "psum":
        _fail("tensor-tensor-psum", f"{iname}: data0 and data1 are both in PSUM; at most one may be")
    a0, a1 = resolve_alu(op0, "op0"), resolve_alu(op1, "op1")
    init, init_t = _scalar_operand(iname, "initial", initial, p)
    d0, d1 = _f32(data0, p, f), _f32(data1, p, f)
    if a0.name == "multiply" and a1.name == "add" and not reverse1 and np.all(d0 == 1.0):
        # running sum: sequential fp32 accumulation, the same order as the engine's
        first = (d1[:, :1] + init).astype(np.float32)
        out = np.cumsum(np.concatenate([first, d1[:, 1:]], axis=1), axis=1, dtype=np.float32)
    else:
        out = np.empty((p, f), dtype=np.float32)
        prev = np.broadcast_to(np.asarray(init, dtype=np.float32).reshape(-1), (p,)) if init_t is None \
            else init.reshape(p)
        for i in range(f):
            t = a0.fn(prev, d0[:, i]) if reverse0 else a0.fn(d0[:, i], prev)
            prev = a1.fn(d1[:, i], t) if reverse1 else a1.fn(t, d1[:, i])
            out[:, i] = prev
    dst._write(out)
    ins = (data0, data1) if init_t is None else (data0, data1, init_t)
    _touch(ctx, (*ins, dst))
    _record(ctx, iname, "vector", p, f, ins, dst, alu_op=a1.name)


def _affine_values(op: str, dst: NkiTensor, pattern, offset, channel_multiplier) -> np.ndarray:
    p, f = _pf(dst)
    pattern = [list(map(int, pair)) for pair in pattern]
    if not 1 <= len(pattern) <= 4 or any(len(pair) != 2 for pair in pattern):
        _fail("pattern", f"{op}: pattern must be 1 to 4 [step, num] pairs, got {pattern}")
    counts = [n for _, n in pattern]
    if math.prod(counts) != f:
        _fail("pattern", f"{op}: pattern {pattern} has {math.prod(counts)} elements but dst has {f} per partition")
    values = np.zeros(counts, dtype=np.int64)
    for k, (step, n) in enumerate(pattern):
        shape = [1] * len(pattern)
        shape[k] = n
        values = values + (np.arange(n, dtype=np.int64) * step).reshape(shape)
    chan = np.arange(p, dtype=np.int64).reshape(p, 1) * int(channel_multiplier)
    out = int(offset) + chan + values.reshape(1, f)
    return ((out + 2**31) % 2**32 - 2**31).astype(np.int32)  # int32 arithmetic wraps


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """GpSimd: `dst[c, ...] = offset + c * channel_multiplier + sum(step_i * index_i)` (int32, cast to dst)."""
    op = "iota"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    if dst._s.buffer != "sbuf":
        _fail("gpsimd-psum", f"{op}: dst must be in SBUF (GpSimd cannot access PSUM)")
    values = _affine_values(op, dst, pattern, offset, channel_multiplier)
    dst._write(values if dtypes.is_int(dst._dt) else values.astype(np.float32))
    _touch(ctx, (dst,))
    p, f = _pf(dst)
    _record(ctx, op, "gpsimd", p, f, (), dst)


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=np.equal, offset=0,
                  name=None):
    """GpSimd: `dst = on_true_tile where cmp_op(affine_value, 0) else on_false_value` (causal masks)."""
    op = "affine_select"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    on_true_tile = _onchip(op, "on_true_tile", on_true_tile)
    for what, t in (("dst", dst), ("on_true_tile", on_true_tile)):
        if t._s.buffer != "sbuf":
            _fail("gpsimd-psum", f"{op}: {what} must be in SBUF (GpSimd cannot access PSUM)")
    p, f = _same_layout(op, ("on_true_tile", "dst"), on_true_tile, dst)
    cmp = resolve_alu(cmp_op, "cmp_op")
    if cmp.name not in ("equal", "not_equal", "greater", "greater_equal", "less", "less_equal"):
        _fail("alu-op", f"{op}: cmp_op must be a comparison, got {cmp.name}")
    values = _affine_values(op, dst, pattern, offset, channel_multiplier).astype(np.float32)
    keep = cmp.fn(values, np.float32(0)) != 0
    true_vals = _rows(on_true_tile, p, f) if on_true_tile._dt == dst._dt else _f32(on_true_tile, p, f)
    out = np.where(keep, dtypes.as_f32(true_vals), np.float32(on_false_value))
    dst._write(out)
    _touch(ctx, (on_true_tile, dst))
    _record(ctx, op, "gpsimd", p, f, (on_true_tile,), dst)


def reciprocal(dst, data, name=None):
    """VectorE `dst = 1 / data` in fp32."""
    op = "reciprocal"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    data = _onchip(op, "data", data)
    p, f = _same_layout(op, ("data", "dst"), data, dst)
    dst._write(np.float32(1.0) / _f32(data, p, f))
    _touch(ctx, (data, dst))
    _record(ctx, op, "vector", p, f, (data,), dst)


def bn_stats(dst, data, name=None):
    """Per partition (count, mean, var*count) of the even and of the odd elements: 6 values."""
    op = "bn_stats"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    data = _onchip(op, "data", data)
    p, f = _pf(data)
    if f > ctx.limits.bn_stats_fmax:
        _fail("bn-stats-fmax", f"{op}: data has {f} elements per partition; at most {ctx.limits.bn_stats_fmax} "
              "(nl.tile_size.bn_stats_fmax): split it and aggregate with bn_aggr")
    if _pf(dst) != (p, 6):
        _fail("shape-mismatch", f"{op}: dst must hold 6 values per partition ([{p}, 6]), got {dst.shape}")
    x = _f32(data, p, f)
    out = np.empty((p, 6), dtype=np.float32)
    for k, half in enumerate((x[:, 0::2], x[:, 1::2])):
        n = half.shape[1]
        mean = half.mean(axis=1, dtype=np.float32) if n else np.zeros(p, np.float32)
        m2 = ((half - mean[:, None]) ** 2).sum(axis=1, dtype=np.float32) if n else np.zeros(p, np.float32)
        out[:, 3 * k] = n
        out[:, 3 * k + 1] = mean
        out[:, 3 * k + 2] = m2
    dst._write(out)
    _touch(ctx, (data, dst))
    _record(ctx, op, "vector", p, f, (data,), dst)


def bn_aggr(dst, data, name=None):
    """Aggregate (count, mean, var*count) triples from bn_stats into (mean, variance) per partition."""
    op = "bn_aggr"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    data = _onchip(op, "data", data)
    p, f = _pf(data)
    if f % 3:
        _fail("shape-mismatch", f"{op}: data must hold (count, mean, var*count) triples; {f} elements per partition")
    if _pf(dst) != (p, 2):
        _fail("shape-mismatch", f"{op}: dst must hold (mean, variance) per partition ([{p}, 2]), got {dst.shape}")
    t = _f32(data, p, f).reshape(p, f // 3, 3)
    count, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    total = count.sum(axis=1)
    safe = np.where(total > 0, total, 1)
    mu = (count * mean).sum(axis=1) / safe
    var = (m2 + count * (mean - mu[:, None]) ** 2).sum(axis=1) / safe
    dst._write(np.stack([mu, var], axis=1).astype(np.float32))
    _touch(ctx, (data, dst))
    _record(ctx, op, "vector", p, f, (data,), dst)


def tensor_partition_reduce(dst, op, data, name=None):
    """GpSimd reduction across partitions: dst [1, F] = reduce over the P rows of data [P, F]."""
    iname = "tensor_partition_reduce"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    data = _onchip(iname, "data", data)
    _no_gpsimd_psum(iname, "gpsimd", dst, data)
    alu = resolve_alu(op)
    if alu.name not in ("add", "maximum", "bitwise_or", "bitwise_and"):
        _fail("reduce-op", f"{iname}: op must be add, maximum, bitwise_or or bitwise_and, got {alu.name}")
    p, f = _pf(data)
    if _pf(dst) != (1, f):
        _fail("shape-mismatch", f"{iname}: dst must be [1, {f}], got {dst.shape}")
    if alu.kind == "bitvec":
        out = _from_bits(alu.reduce(_bits(_rows(data, p, f), data._dt), (0,)), dst._dt)
    else:
        out = alu.reduce(_f32(data, p, f), (0,))
    dst._write(out)
    _touch(ctx, (data, dst))
    _record(ctx, iname, "gpsimd", p, f, (data,), dst, alu_op=alu.name)


def dropout(dst, data, prob, name=None):
    """VectorE: zero each element with probability `prob` (scalar or [P, 1] tile); kept values are not rescaled."""
    op = "dropout"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    data = _onchip(op, "data", data)
    p, f = _same_layout(op, ("data", "dst"), data, dst)
    rate, rate_t = _scalar_operand(op, "prob", prob, p)
    keep = ctx.rng.random((p, f), dtype=np.float32) >= rate
    dst._write(np.where(keep, _f32(data, p, f), np.float32(0)))
    ins = (data,) if rate_t is None else (data, rate_t)
    _touch(ctx, (*ins, dst))
    _record(ctx, op, "vector", p, f, ins, dst)


def max8(dst, src, name=None):
    """VectorE: the 8 largest values of each partition, in descending order."""
    op = "max8"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    src = _onchip(op, "src", src)
    p, f = _pf(src)
    if not 8 <= f <= 16384:
        _fail("shape-mismatch", f"{op}: src needs 8..16384 elements per partition, got {f}")
    if _pf(dst) != (p, 8):
        _fail("shape-mismatch", f"{op}: dst must be [{p}, 8], got {dst.shape}")
    x = _f32(src, p, f)
    top = -np.sort(-x, axis=1)[:, :8]
    dst._write(top)
    _touch(ctx, (src, dst))
    _record(ctx, op, "vector", p, f, (src,), dst)


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """VectorE: copy `src` into `dst` where `predicate` is non-zero (or zero, with reverse_pred)."""
    op = "tensor_copy_predicated"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    predicate = _onchip(op, "predicate", predicate)
    p, f = _same_layout(op, ("dst", "predicate"), dst, predicate)
    ins = [predicate]
    if isinstance(src, NkiTensor):
        src = _onchip(op, "src", src)
        _same_layout(op, ("dst", "src"), dst, src)
        if src._dt != dst._dt:
            _fail("dtype-mismatch", f"{op}: src ({src._dt}) and dst ({dst._dt}) must share a dtype")
        if src._s.buffer == "psum" and predicate._s.buffer == "psum":
            _fail("tensor-tensor-psum", f"{op}: src and predicate may not both be in PSUM")
        values = _rows(src, p, f)
        ins.insert(0, src)
    else:
        values = np.full((p, f), src, dtype=dtypes.STORAGE[dst._dt])
    if predicate._dt not in ("uint8", "uint16", "uint32"):
        _fail("predicate-dtype", f"{op}: predicate must be uint8/uint16/uint32, got {predicate._dt}")
    mask = _rows(predicate, p, f) != 0
    if reverse_pred:
        mask = ~mask
    dst._write(np.asarray(values).reshape(p, f), mask)
    _touch(ctx, (*ins, dst))
    _record(ctx, op, "vector", p, f, tuple(ins), dst)


# ------------------------------------------------------------------------------------------------ LNC communication
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
    ctx.launch.post((pipe_id, me, send_to_rank), np.array(_rows(src, p, f)))
    _touch(ctx, (src, dst))
    _record(ctx, op, "dma", p, f, (src,), dst, dma_bytes=p * f * src.itemsize)
    ctx.launch.barrier(me, op)
    dst._write(ctx.launch.collect((pipe_id, recv_from_rank, me)))


# ------------------------------------------------------------------------------------------------ more VectorE/GpSimd
def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res, reverse0=False, name=None):
    """`dst = data op0 operand0` and `reduce_res = reduce_op(dst)` over the free axes (VectorE)."""
    iname = "tensor_scalar_reduce"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    data = _onchip(iname, "data", data)
    reduce_res = _onchip(iname, "reduce_res", reduce_res)
    p, f = _same_layout(iname, ("data", "dst"), data, dst)
    if _pf(reduce_res) != (p, 1):
        _fail("operand-shape", f"{iname}: reduce_res must be [{p}, 1], got {reduce_res.shape}")
    a0, red = resolve_alu(op0, "op0"), resolve_alu(reduce_op, "reduce_op")
    if a0.kind != "arith" or red.name not in ("add", "subtract", "multiply", "maximum", "minimum"):
        _fail("alu-op", f"{iname}: op0 must be arithmetic and reduce_op one of add/subtract/multiply/max/min")
    v0, t0 = _scalar_operand(iname, "operand0", operand0, p)
    out = _apply(a0, _f32(data, p, f), v0, reverse0)
    dst._write(out)
    reduce_res._write(red.reduce(dtypes.as_f32(dst._a.reshape(p, f)), (1,)))
    ins = (data,) if t0 is None else (data, t0)
    _touch(ctx, (*ins, dst, reduce_res))
    _record(ctx, iname, "vector", p, f, ins, dst, alu_op=a0.name)


def _vector_regs(ctx) -> np.ndarray:
    regs = getattr(ctx, "vector_reduce_regs", None)
    if regs is None:
        regs = ctx.vector_reduce_regs = np.full((ctx.limits.pmax,), np.nan, dtype=np.float32)
    return regs


def _max_reduce(iname, ctx, out, p, reduce_cmd, reduce_res, reduce_op):
    """VectorE accumulator semantics shared by select_reduce/range_select (max only)."""
    if resolve_alu(reduce_op, "reduce_op").name != "maximum":
        _fail("reduce-op", f"{iname}: reduce_op must be max")
    row = out.max(axis=1)
    regs = _vector_regs(ctx)
    if reduce_cmd is _ReduceCmd.reset_reduce:
        regs[:p] = row
    elif reduce_cmd is _ReduceCmd.reduce:
        regs[:p] = np.maximum(regs[:p], row)
    elif reduce_cmd is _ReduceCmd.reset:
        regs[:p] = -np.inf
    if reduce_res is not None:
        reduce_res = _onchip(iname, "reduce_res", reduce_res)
        if _pf(reduce_res) != (p, 1):
            _fail("operand-shape", f"{iname}: reduce_res must be [{p}, 1], got {reduce_res.shape}")
        reduce_res._write(row if reduce_cmd is _ReduceCmd.idle else regs[:p].copy())
        return (reduce_res,)
    return ()


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                  reduce_op=np.amax, reverse_pred=False, name=None):
    """`dst = where(predicate, on_true, on_false)` with an optional max into the accumulators / reduce_res."""
    iname = "select_reduce"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    predicate = _onchip(iname, "predicate", predicate)
    on_true = _onchip(iname, "on_true", on_true)
    p, f = _same_layout(iname, ("on_true", "predicate", "dst"), on_true, predicate, dst)
    if on_true._s.buffer == "psum" and predicate._s.buffer == "psum":
        _fail("tensor-tensor-psum", f"{iname}: on_true and predicate may not both be in PSUM")
    if not dtypes.is_int(predicate._dt):
        _fail("predicate-dtype", f"{iname}: predicate must be an integer tile, got {predicate._dt}")
    mask = _rows(predicate, p, f) != 0
    if reverse_pred:
        mask = ~mask
    false_vals, false_t = _scalar_operand(iname, "on_false", on_false, p)
    out = np.where(mask, _f32(on_true, p, f), false_vals).astype(np.float32)
    dst._write(out)
    extra = _max_reduce(iname, ctx, out, p, reduce_cmd, reduce_res, reduce_op)
    ins = (on_true, predicate) if false_t is None else (on_true, predicate, false_t)
    _touch(ctx, (*ins, dst, *extra))
    _record(ctx, iname, "vector", p, f, ins, dst)


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.idle, reduce_res=None,
                 reduce_op=np.amax, range_start=0.0, on_false_value=0.0, name=None):
    """Keep elements whose free index + range_start satisfies both comparisons with the [P, 1] bounds (trn2+)."""
    iname = "range_select"
    ctx = current()
    if ctx.limits.nc_version < 3:
        _fail("engine", f"{iname} needs trn2 or newer")
    dst = _onchip(iname, "dst", dst)
    on_true_tile = _onchip(iname, "on_true_tile", on_true_tile)
    p, f = _same_layout(iname, ("on_true_tile", "dst"), on_true_tile, dst)
    c0, c1 = resolve_alu(comp_op0, "comp_op0"), resolve_alu(comp_op1, "comp_op1")
    for c in (c0, c1):
        if c.name not in ("equal", "less", "less_equal", "greater", "greater_equal"):
            _fail("alu-op", f"{iname}: comparison operators must be equal/less/less_equal/greater/greater_equal")
    b0, t0 = _scalar_operand(iname, "bound0", bound0, p)
    b1, t1 = _scalar_operand(iname, "bound1", bound1, p)
    index = np.float32(range_start) + np.arange(f, dtype=np.float32)[None, :]
    keep = (c0.fn(index, b0) != 0) & (c1.fn(index, b1) != 0)
    out = np.where(keep, _f32(on_true_tile, p, f), np.float32(on_false_value)).astype(np.float32)
    dst._write(out)
    extra = _max_reduce(iname, ctx, out, p, reduce_cmd, reduce_res, reduce_op)
    ins = tuple(t for t in (on_true_tile, t0, t1) if t is not None)
    _touch(ctx, (*ins, dst, *extra))
    _record(ctx, iname, "vector", p, f, ins, dst)


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_init=0.0, name=None):
    """trn3 VectorE `dst = exp(src - max_value)`, with an optional running sum into reduce_res."""
    iname = "exponential"
    ctx = current()
    if ctx.limits.nc_version < 4:
        _fail("engine", f"{iname} is a trn3 (NeuronCore-v4) instruction; the target is {ctx.target}")
    dst = _onchip(iname, "dst", dst)
    src = _onchip(iname, "src", src)
    p, f = _same_layout(iname, ("src", "dst"), src, dst)
    mv, mv_t = _scalar_operand(iname, "max_value", max_value, p)
    out = np.exp(_f32(src, p, f) - mv)
    dst._write(out)
    touched = [src, dst] + ([mv_t] if mv_t is not None else [])
    regs = _vector_regs(ctx)
    if reduce_cmd in (_ReduceCmd.reset, _ReduceCmd.reset_reduce):
        regs[:p] = np.float32(reduce_init)
    if reduce_cmd in (_ReduceCmd.reduce, _ReduceCmd.reset_reduce):
        regs[:p] += out.sum(axis=1, dtype=np.float32)
    if reduce_res is not None:
        reduce_res = _onchip(iname, "reduce_res", reduce_res)
        reduce_res._write(regs[:p].copy())
        touched.append(reduce_res)
    _touch(ctx, touched)
    _record(ctx, iname, "vector", p, f, (src,), dst)


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Within each 32-partition quadrant, `dst[i] = src[shuffle_mask[i]]` (255 leaves dst[i] unchanged)."""
    iname = "nc_stream_shuffle"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    src = _onchip(iname, "src", src)
    p, f = _pf(src)
    if _pf(dst) != (p, f) or dst._dt != src._dt:
        _fail("shape-mismatch", f"{iname}: dst must have src's partitions, elements per partition and dtype")
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32 or any(not (0 <= m < 32 or m == 255) for m in mask):
        _fail("shuffle-mask", f"{iname}: shuffle_mask must be 32 entries in [0, 32) or 255")
    values = np.array(_rows(src, p, f))
    out = np.array(_rows(dst, p, f))
    for q in range(0, p, 32):
        for i, m in enumerate(mask):
            if m != 255 and q + i < p:
                if q + m >= p:
                    _fail("shuffle-mask", f"{iname}: partition {q + i} reads partition {q + m}, outside src")
                out[q + i] = values[q + m]
    dst._write(out)
    _touch(ctx, (src, dst))
    _record(ctx, iname, "vector", p, f, (src,), dst)


def _find8(iname, data, vals, p):
    if _pf(vals) != (p, 8):
        _fail("shape-mismatch", f"{iname}: vals must hold 8 values per partition ([{p}, 8]), got {vals.shape}")
    return _f32(vals, p, 8)


def nc_find_index8(dst, data, vals, name=None):
    """Index (in the flattened free dims) of the first occurrence of each of the 8 values per partition."""
    iname = "nc_find_index8"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    data = _onchip(iname, "data", data)
    vals = _onchip(iname, "vals", vals)
    p, f = _pf(data)
    if dst._dt not in ("uint16", "uint32") or _pf(dst) != (p, 8):
        _fail("shape-mismatch", f"{iname}: dst must be a uint16/uint32 [{p}, 8] tile")
    x, v = _f32(data, p, f), _find8(iname, data, vals, p)
    eq = x[:, None, :] == v[:, :, None]
    found = eq.any(axis=2)
    first = eq.argmax(axis=2).astype(np.int64)
    unmatched = (1 << (8 * dst.itemsize)) - 1  # all ones, as the hardware returns
    dst._write(np.where(found, first, unmatched))
    _touch(ctx, (data, vals, dst))
    _record(ctx, iname, "vector", p, f, (data, vals), dst)


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """Replace the first occurrence of each of the 8 values per partition with `imm`; indices into dst_idx."""
    iname = "nc_match_replace8"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    data = _onchip(iname, "data", data)
    vals = _onchip(iname, "vals", vals)
    p, f = _same_layout(iname, ("data", "dst"), data, dst)
    v = _find8(iname, data, vals, p)
    x = np.array(_f32(data, p, f))
    taken = np.zeros((p, f), dtype=bool)
    index = np.zeros((p, 8), dtype=np.int64)
    rows = np.arange(p)
    for j in range(8):  # successive equal values replace successive occurrences
        eq = (x == v[:, j:j + 1]) & ~taken
        hit = eq.any(axis=1)
        first = eq.argmax(axis=1)
        index[:, j] = first
        taken[rows[hit], first[hit]] = True
    out = np.where(taken, np.float32(imm), x)
    dst._write(out)
    touched = [data, vals, dst]
    if dst_idx is not None:
        dst_idx = _onchip(iname, "dst_idx", dst_idx)
        dst_idx._write(index)
        touched.append(dst_idx)
    _touch(ctx, touched)
    _record(ctx, iname, "vector", p, f, (data, vals), dst)


# ------------------------------------------------------------------------------------------------ registers
class VirtualRegister:
    """`nisa.register_alloc()`: a scalar register. The interpreter knows its value, so it acts as a Python int
    wherever one is expected (loop bounds, `range()`, `nl.ds` starts, index arithmetic)."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        self.value = int(value)

    def __index__(self) -> int:
        return self.value

    __int__ = __index__

    def __repr__(self) -> str:
        return f"VirtualRegister({self.value})"


def _register_arith(name):
    def method(self, other):
        return getattr(self.value, name)(int(other))

    method.__name__ = name
    return method


for _op in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__", "__rfloordiv__",
            "__mod__", "__rmod__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"):
    setattr(VirtualRegister, _op, _register_arith(_op))
VirtualRegister.__hash__ = None


def register_alloc(x=None) -> VirtualRegister:
    current()
    return VirtualRegister(0 if x is None else int(x))


def register_move(dst, imm) -> None:
    current()
    dst.value = int(imm)


def register_load(dst, src) -> None:
    """Load the single value of a 1-element HBM/SBUF tensor into a register."""
    ctx = current()
    src = _tensor("register_load", "src", src)
    if math.prod(src.shape) != 1:
        _fail("register", f"register_load: src must hold exactly one element, got shape {src.shape}")
    dst.value = int(np.asarray(src._read()).reshape(-1)[0])
    _touch(ctx, (src,))


def register_store(dst, src) -> None:
    """Store a register's value into a 1-element HBM/SBUF tensor."""
    ctx = current()
    dst = _tensor("register_store", "dst", dst)
    if math.prod(dst.shape) != 1:
        _fail("register", f"register_store: dst must hold exactly one element, got shape {dst.shape}")
    dst._write(np.array([int(src)], dtype=np.int64) if dtypes.is_int(dst._dt) else np.float32([int(src)]))
    _touch(ctx, (dst,))
