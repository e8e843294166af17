"""GpSimd gathers and index searches: nc_n_gather, local_gather, sequence_bounds, nonzero_with_count, topk.

Each GpSimd core is wired to 16 contiguous partitions (trainium arch guides), which is why several of these work in
16-partition groups.
"""

from __future__ import annotations

import numpy as np

from neuron_dynamo.nki import dtypes
from neuron_dynamo.nki.context import current
from neuron_dynamo.nki.isa.operands import _fail, _onchip, _pf, _record, _rows, _touch

_CORE_PARTITIONS = 16


def _sbuf(op: str, what: str, t):
    t = _onchip(op, what, t)
    if t._s.buffer != "sbuf":
        _fail("gpsimd-psum", f"{op}: {what} must be in SBUF (GpSimd cannot access PSUM)")
    return t


def nc_n_gather(dst, data, indices, name=None):
    """Per partition, `dst[p, i] = data[p].flatten()[indices[p, i]]` (uint32 indices)."""
    op = "nc_n_gather"
    ctx = current()
    dst, data, indices = _sbuf(op, "dst", dst), _sbuf(op, "data", data), _sbuf(op, "indices", indices)
    p, f = _pf(data)
    ip, n = _pf(indices)
    if indices._dt != "uint32" or dst._dt != data._dt or ip != p or _pf(dst) != (p, n):
        _fail("gather", f"{op}: indices must be uint32 [{p}, N], dst [{p}, N] of data's dtype {data._dt}")
    idx = _rows(indices, p, n).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= f):
        _fail("gather", f"{op}: indices must lie in [0, {f}), the elements per partition of data")
    dst._write(np.take_along_axis(_rows(data, p, f), idx, axis=1))
    _touch(ctx, (data, indices, dst))
    _record(ctx, op, "gpsimd", p, n, (data, indices), dst)


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """Per 16-partition core: the core's indices, flattened partition-first, select `num_elem_per_idx` elements at a
    time from each of its partitions' rows."""
    op = "local_gather"
    ctx = current()
    dst, src, index = _sbuf(op, "dst", dst), _sbuf(op, "src_buffer", src_buffer), _sbuf(op, "index", index)
    p, f = _pf(src)
    ip, k = _pf(index)
    if ip != p or p % _CORE_PARTITIONS or index._dt != "uint16" or dst._dt != src._dt:
        _fail("gather", f"{op}: index must be uint16 with src_buffer's partitions ({p}, a multiple of 16), dst of "
              f"src_buffer's dtype")
    if num_elem_per_idx not in (1, 2, 4, 8, 16, 32):
        _fail("gather", f"{op}: num_elem_per_idx must be 1, 2, 4, 8, 16 or 32, got {num_elem_per_idx}")
    valid = _CORE_PARTITIONS * k if num_valid_indices is None else int(num_valid_indices)
    if not 0 < valid <= min(_CORE_PARTITIONS * k, 4096):
        _fail("gather", f"{op}: num_valid_indices must be in 1..{min(_CORE_PARTITIONS * k, 4096)}, got {valid}")
    if _pf(dst) != (p, valid * num_elem_per_idx):
        _fail("gather", f"{op}: dst must hold {valid} x {num_elem_per_idx} elements per partition, got {dst.shape}")
    rows, idx = _rows(src, p, f), _rows(index, p, k).astype(np.int64)
    span = np.arange(num_elem_per_idx)
    out = np.empty((p, valid * num_elem_per_idx), dtype=rows.dtype)
    for c in range(0, p, _CORE_PARTITIONS):
        flat = idx[c:c + _CORE_PARTITIONS].flatten(order="F")[:valid]
        cols = (flat[:, None] + span[None, :]).reshape(-1)
        if cols.max() >= f:
            _fail("gather", f"{op}: an index reads element {cols.max()} of a {f}-element partition")
        out[c:c + _CORE_PARTITIONS] = rows[c:c + _CORE_PARTITIONS][:, cols]
    dst._write(out)
    _touch(ctx, (src, index, dst))
    _record(ctx, op, "gpsimd", p, valid * num_elem_per_idx, (src, index), dst)


def sequence_bounds(dst, segment_ids, name=None):
    """For each element, [start, end) of the run of equal segment ids it belongs to; id 0 (padding) gives (n, -1)."""
    op = "sequence_bounds"
    ctx = current()
    dst, ids = _sbuf(op, "dst", dst), _sbuf(op, "segment_ids", segment_ids)
    p, n = _pf(ids)
    if p != 1 or _pf(dst) != (1, 2 * n) or {ids._dt, dst._dt} - {"float32", "int32"}:
        _fail("sequence-bounds", f"{op}: segment_ids must be float32/int32 [1, n] and dst [1, 2, n] of those dtypes")
    s = dtypes.as_f32(_rows(ids, 1, n))[0]
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = s[1:] != s[:-1]
    run_end = np.ones(n, dtype=bool)
    run_end[:-1] = s[:-1] != s[1:]
    start = np.maximum.accumulate(np.where(new_run, np.arange(n), 0))
    end = np.minimum.accumulate(np.where(run_end, np.arange(n) + 1, n)[::-1])[::-1]
    pad = s == 0
    out = np.stack([np.where(pad, n, start), np.where(pad, -1, end)]).astype(np.float32)
    dst._write(out.reshape(1, 2 * n))
    _touch(ctx, (ids, dst))
    _record(ctx, op, "gpsimd", 1, n, (ids,), dst)


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """On partitions 0, 16, ..., 112: the indices (+ index_offset) of the non-zero elements, padding, then the count.
    Other partitions of dst keep their values (trn2+)."""
    op = "nonzero_with_count"
    ctx = current()
    if ctx.limits.nc_version < 3:
        _fail("engine", f"{op} needs trn2 or newer (target {ctx.target})")
    dst, src = _sbuf(op, "dst", dst), _sbuf(op, "src", src)
    p, f = _pf(src)
    if src._dt not in ("float32", "int32") or dst._dt != "int32" or _pf(dst) != (p, f + 1):
        _fail("nonzero", f"{op}: src must be float32/int32 [P, F] and dst int32 [P, F + 1], got {src.shape} "
              f"{src._dt} -> {dst.shape} {dst._dt}")
    out = np.array(_rows(dst, p, f + 1)).astype(np.int64)
    values = _rows(src, p, f)
    for q in range(0, p, _CORE_PARTITIONS):
        hits = np.flatnonzero(values[q] != 0)
        out[q, :] = int(padding_val)
        out[q, : hits.size] = hits + int(index_offset)
        out[q, f] = hits.size
    dst._write(out)
    _touch(ctx, (src, dst))
    _record(ctx, op, "gpsimd", p, f, (src,), dst)


def topk(val_dst, idx_dst, src, n, name=None):
    """Top-K of the bf16 "snake" of each 16-partition group (element i at partition i % 16, column i // 16): the K
    largest values in ascending order and their snake indices, written to every partition of the group."""
    op = "topk"
    ctx = current()
    val_dst, idx_dst, src = _sbuf(op, "val_dst", val_dst), _sbuf(op, "idx_dst", idx_dst), _sbuf(op, "src", src)
    p, x = _pf(src)
    _, k = _pf(val_dst)
    if src._dt != "bfloat16" or val_dst._dt != "bfloat16" or idx_dst._dt != "uint32":
        _fail("topk", f"{op}: src and val_dst must be bfloat16 and idx_dst uint32")
    if p % _CORE_PARTITIONS or _pf(val_dst) != (p, k) or _pf(idx_dst) != (p, k):
        _fail("topk", f"{op}: partitions must be a multiple of 16 and val_dst, idx_dst [{p}, K]")
    if not 8 <= n < 65536 or not 1 <= k <= n or x < -(-n // 16):
        _fail("topk", f"{op}: needs 8 <= n < 65536, 1 <= K <= n and src free size >= ceil(n / 16); n={n}, K={k}")
    rows = dtypes.as_f32(_rows(src, p, x))
    vals, idxs = np.empty((p, k), np.float32), np.empty((p, k), np.int64)
    for q in range(0, p, _CORE_PARTITIONS):
        snake = rows[q:q + _CORE_PARTITIONS].flatten(order="F")[:n]
        best = np.argsort(-snake, kind="stable")[:k][::-1]
        vals[q:q + _CORE_PARTITIONS], idxs[q:q + _CORE_PARTITIONS] = snake[best], best
    val_dst._write(vals)
    idx_dst._write(idxs)
    _touch(ctx, (src, val_dst, idx_dst))
    _record(ctx, op, "gpsimd", p, 4 * n + k, (src,), val_dst)
