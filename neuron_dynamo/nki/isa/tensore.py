"""TensorE instructions: the 128x128 systolic array (matmul and transpose, SBUF -> PSUM)."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from neuron_dynamo.nki import dtypes
from neuron_dynamo.nki.context import DEVICE, current
from neuron_dynamo.nki.isa.enums import _Engine, engine, matmul_perf_mode
from neuron_dynamo.nki.isa.operands import (
    _engine_name,
    _extent,
    _f32,
    _fail,
    _onchip,
    _out2d,
    _pf,
    _reads_dst,
    _record,
    _rows,
    _step,
    _tensor,
    _touch,
    _view_2d,
    _writer,
)
from neuron_dynamo.nki.replay import ReplayDiverged
from neuron_dynamo.nki.tensor import NkiTensor

_F32_FAMILY = ("float32", "tfloat32")
_MATMUL_INPUTS = ("float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32", "float32")


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
        def operands():
            return dtypes.as_f32(stationary._a).reshape(k * 2, m), dtypes.as_f32(moving._a).reshape(k * 2, n)
    else:
        def operands():
            return _f32(stationary, k, m), _f32(moving, k, n)
    # a transpose through the identity is bit-exact (NC-v3+ behaviour): the path depends on the moving data
    identity = is_transpose and k == n and _is_identity(operands()[1])
    if identity:
        def run():
            if not _is_identity(operands()[1]):
                raise ReplayDiverged("nc_matmul: the moving tile of an identity transpose changed")
            dst._write(_rows(stationary, k, m).T)
    else:
        add = _accumulates(dst, psum_accumulate_flag, accumulate)
        if add:
            _reads_dst(ctx, dst)
        gemm = _gemm(ctx, operands, None if double_row else (stationary, moving), k, m, n, is_transpose)
        direct = None if double_row or is_transpose else _identity_operand(stationary, moving, k, m, n)
        run = _accumulate(gemm, dst, m, n, direct) if add else _overwrite(gemm, dst, m, n, direct)
    _step(ctx, run, writes=() if identity else (dst,))
    _touch(ctx, (stationary, moving, dst), matmul=True)
    _record(ctx, op, "tensor", k, n, (stationary, moving), dst, flops=0 if is_transpose else 2 * k * m * n,
            M=m, K=k, N=n, is_transpose=bool(is_transpose), perf_mode=perf_mode.name)


def _gemm(ctx, operands, bindable, k: int, m: int, n: int, is_transpose: bool):
    """The step's fp32 GEMM `stationary.T @ moving` as a function `(out) -> out` (out: a torch [m, n] fp32 tensor),
    with the torch views of fp32 operands bound once (`bindable`: the two tiles, None when they need the per-call
    cast). A transpose whose moving tile becomes the identity would take another path: it diverges."""
    if bindable is not None and not is_transpose:
        s_t, mv_t = _torch_2d(bindable[0], k, m), _torch_2d(bindable[1], k, n)
        if s_t is not None and mv_t is not None:
            s_t = s_t.T
            return lambda out: torch.mm(s_t, mv_t, out=out)

    def gemm(out):
        s, mv = operands()
        if is_transpose and k == n and _is_identity(mv):
            raise ReplayDiverged("nc_matmul: the moving tile of a transpose became the identity")
        return torch.mm(dtypes.torch_view(s).T, dtypes.torch_view(mv), out=out)

    return gemm


def _identity_operand(stationary: NkiTensor, moving: NkiTensor, k: int, m: int, n: int):
    """Where the stationary tile is the identity (kernels add masks into PSUM scores as identityᵀ @ mask), a function
    giving `moving` as the product without the GEMM, or None when the GEMM must run: Iᵀ @ moving is moving exactly
    (every other product is ±0) as long as moving is finite (0 · inf would be NaN). Only a stationary that was the
    identity when the instruction was recorded is watched (else None); the verdict on it is kept in its storage's
    `f32_cache`, which every write drops."""
    if k != m or stationary._dt != "float32" or moving._dt != "float32":
        return None
    s_view, mv = _view_2d(stationary._a, k, m), _view_2d(moving._a, k, n)
    if s_view is None or mv is None or not _is_identity(s_view):
        return None
    storage, key = stationary._s, ("identity", s_view.__array_interface__["data"][0], s_view.shape, s_view.strides)

    def product():
        cache = storage.f32_cache
        if cache is None:
            cache = storage.f32_cache = {}
        verdict = cache.get(key)
        if verdict is None:
            verdict = cache[key] = _is_identity(s_view)
        return mv if verdict and np.isfinite(mv).all() else None

    return product


def _torch_2d(t: NkiTensor, rows: int, cols: int):
    """`t` as a torch fp32 [rows, cols] tensor sharing its memory, or None (another dtype needs the per-call cast;
    a view that reshapes only by copying would go stale)."""
    a = t._a
    if a.dtype != np.float32 or not a.flags.writeable:
        return None
    v = _view_2d(a, rows, cols)
    if v is None or min(v.strides) < 0:
        return None
    return torch.from_numpy(v)


def _scratch(m: int, n: int):
    """A torch fp32 [m, n] buffer matmuls compute into (one per shape: steps run one at a time)."""
    return DEVICE.buffer(("matmul", m, n), lambda: torch.empty((m, n), dtype=torch.float32))


def _overwrite(gemm, dst: NkiTensor, m: int, n: int, direct=None):
    """dst = the GEMM (or `direct()`'s values, see `_identity_operand`): straight into dst when it is an fp32 view
    with rows of adjacent elements (torch's GEMM takes the row stride), else through the scratch buffer."""
    out = _out2d(dst, m, n)
    if out is not None and out.strides[1] == out.itemsize and out.strides[0] >= 0:
        s, target = dst._s, torch.from_numpy(out)

        def run():
            s.f32_cache = None
            values = None if direct is None else direct()
            if values is None:
                gemm(target)
            else:
                out[...] = values
        return run
    buf, store = _scratch(m, n), _writer(dst, m, n)
    result = buf.numpy()

    def run():
        values = None if direct is None else direct()
        if values is None:
            gemm(buf)
            values = result
        store(values)
    return run


def _accumulate(gemm, dst: NkiTensor, m: int, n: int, direct=None):
    """dst += the GEMM (or `direct()`'s values), in fp32 (PSUM accumulation); a bf16 dst (trn3) adds in fp32 and
    rounds."""
    buf = _scratch(m, n)
    result = buf.numpy()
    out = _out2d(dst, m, n)
    s, store = dst._s, None if out is not None else _writer(dst, m, n)

    def run():
        values = None if direct is None else direct()
        if values is None:
            gemm(buf)
            values = result
        if store is not None:
            store(dtypes.as_f32(dst._a).reshape(m, n) + values)
            return
        s.f32_cache = None
        np.add(out, values, out=out)
    return run


def _is_identity(moving: np.ndarray) -> bool:
    return np.array_equal(moving, _eye(moving.shape[0]))


@functools.cache
def _eye(n: int) -> np.ndarray:
    eye = np.eye(n, dtype=np.float32)
    eye.flags.writeable = False
    return eye


def _accumulates(dst: NkiTensor, psum_accumulate_flag, accumulate) -> bool:
    """Whether this matmul adds to dst: the flags, or (by default) an accumulation group already open on dst."""
    if psum_accumulate_flag is not None:
        return not (psum_accumulate_flag & 1)
    if accumulate is not None:
        return bool(accumulate)
    groups = dst._s.acc_groups
    key = (dst._a.__array_interface__["data"][0], dst._a.shape, dst._a.strides)
    if key in groups:
        return True
    groups[key] = _extent(dst)
    return False


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
    src = _view_2d(data._a, p, f)
    if src is None:  # a copy made now would go stale: read the view at every run
        _step(ctx, lambda: dst._write(_rows(data, p, f).T))
    else:
        _step(ctx, _transposer(src, _writer(dst, f, p)), writes=(dst,))
    _touch(ctx, (data, dst))
    _record(ctx, op, eng, p, f, (data,), dst)


def _transposer(src: np.ndarray, store):
    """The step storing `src.T`. Read column by column, a tile whose rows lie far apart in a wider allocation (a
    block of a [128, 2048] score tile) lands its rows on the same few cache sets, and the copy gets several times
    slower: such a source is first copied row by row into a contiguous shared buffer."""
    p, f = src.shape
    if src.flags.c_contiguous or min(p, f) < 32:
        return lambda: store(src.T)
    buf = DEVICE.buffer(("transpose", p, f, src.dtype.str), lambda: np.empty((p, f), dtype=src.dtype))

    def run():
        buf[...] = src
        store(buf.T)
    return run
