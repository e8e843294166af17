"""DMA instructions: copies, transposes and the DMA engines' element-wise compute (HBM <-> SBUF, never PSUM)."""

from __future__ import annotations

import math

import numpy as np

from neuron_dynamo.nki import dtypes
from neuron_dynamo.nki.context import current
from neuron_dynamo.nki.isa.enums import _DgeMode, _OobMode, dge_mode, engine, oob_mode
from neuron_dynamo.nki.isa.operands import _fail, _record, _step, _tensor, _touch
from neuron_dynamo.nki.ops import resolve_alu
from neuron_dynamo.nki.tensor import NkiTensor


def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, engine=engine.unknown,
             name=None, **removed):
    """Copy `src` to `dst` (HBM/SBUF, any layouts with equal element counts); dtypes differing cast via fp32."""
    op = "dma_copy"
    if removed:
        _removed_dma_copy_argument(removed)
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
    cast = src._dt != dst._dt

    def run():
        mask = _in_bounds(op, oob_mode, src, dst)
        values = src._read()
        if cast:
            values = dtypes.as_f32(values)
        dst._write(values.reshape(-1) if values.shape != dst.shape else values, mask)

    _step(ctx, run, None if cast else _plain_copy(src, dst))
    sb = dst if dst._s.buffer == "sbuf" else (src if src._s.buffer == "sbuf" else None)
    parts = sb.shape[0] if sb is not None else 1
    nbytes = n_dst * dtypes.itemsize(dst._dt)
    extra = {"dge_mode": dge_mode.name}
    run = _contiguous_run_bytes(src, dst)
    if run is not None:
        extra["contiguous_bytes"] = run
    offsets = tuple(t._idx.offsets for t in (src, dst) if t._idx is not None)  # the index tiles are read too
    _touch(ctx, (src, dst, *offsets))
    _record(ctx, op, "dma", parts, n_dst // max(parts, 1), (src,), dst, dma_bytes=nbytes, **extra)


def _plain_copy(src: NkiTensor, dst: NkiTensor):
    """A copy between direct views of one dtype as a replay runs it: `dma_copy`'s step without the index, cast and
    broadcast checks the recorded run made (None where those matter: indirect views, tf32's rounding)."""
    if src._idx is not None or dst._idx is not None or dst._dt == "tfloat32":
        return None
    s, d, storage = src._a, dst._a, dst._s
    if s.shape == d.shape:
        def copy():
            storage.f32_cache = None
            d[...] = s
    else:
        def copy():
            storage.f32_cache = None
            d[...] = s.reshape(-1).reshape(d.shape)
    return copy


def _in_bounds(op: str, mode, src: NkiTensor, dst: NkiTensor) -> np.ndarray | None:
    """The flat mask of the elements an indirect DMA copies now (None: all); out-of-bounds indices raise unless
    `oob_mode=skip` (the indices are the index tile's values at this point of the kernel)."""
    mask = None
    for what, t in (("src", src), ("dst", dst)):
        if t._idx is None:
            continue
        oob = t._idx.resolve()[1]
        if oob is None:
            continue
        if mode is _OobMode.error:
            _fail("dma-oob", f"{op}: the dynamic indices of {what} reach outside its tensor; fix the indices "
                  "or pass oob_mode=nisa.oob_mode.skip to skip those rows")
        if what == "src":
            mask = ~oob.reshape(-1)
    return mask


def _removed_dma_copy_argument(removed: dict) -> None:
    """NKI 0.3 removed dma_copy's read-modify-write (migration guide: "dst_rmw_op and unique_indices removed")."""
    name = next(iter(removed))
    if name in ("dst_rmw_op", "unique_indices"):
        _fail("removed-api", f"dma_copy({name}=...) was removed in NKI 0.3; accumulate with "
              "nisa.dma_compute(dst, [src, dst], reduce_op=nl.add) instead")
    _fail("operand", f"dma_copy() got an unexpected keyword argument {name!r}")


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
    def run():
        total = dtypes.as_f32(srcs[0]._read()).reshape(-1).copy()
        for t in srcs[1:]:
            total += dtypes.as_f32(t._read()).reshape(-1)
        dst._write(total)

    _step(ctx, run)
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
    _step(ctx, lambda: dst._write(np.transpose(src._read(), want)))
    _touch(ctx, (src, dst))
    n = math.prod(dst.shape)
    _record(ctx, op, "dma", dst.shape[0], n // dst.shape[0], (src,), dst, dma_bytes=n * 2,
            dge_mode=dge_mode.name)
