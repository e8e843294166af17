"""GpSimd instructions: affine index generation (iota, causal masks) and cross-partition reduction."""

from __future__ import annotations

import math

import numpy as np

from neuron_dynamo.nki import dtypes
from neuron_dynamo.nki.context import current
from neuron_dynamo.nki.isa.bound import fill_step
from neuron_dynamo.nki.isa.operands import (
    _bits,
    _f32,
    _fail,
    _from_bits,
    _no_gpsimd_psum,
    _onchip,
    _pf,
    _record,
    _rows,
    _same_layout,
    _step,
    _touch,
)
from neuron_dynamo.nki.ops import resolve_alu
from neuron_dynamo.nki.tensor import NkiTensor


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
    values = values if dtypes.is_int(dst._dt) else values.astype(np.float32)
    p, f = _pf(dst)
    _step(ctx, fill_step(dst, values, p, f), writes=(dst,))
    _touch(ctx, (dst,))
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
    same = on_true_tile._dt == dst._dt

    def run():
        true_vals = _rows(on_true_tile, p, f) if same else _f32(on_true_tile, p, f)
        dst._write(np.where(keep, dtypes.as_f32(true_vals), np.float32(on_false_value)))

    _step(ctx, run)
    _touch(ctx, (on_true_tile, dst))
    _record(ctx, op, "gpsimd", p, f, (on_true_tile,), dst)


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
        _step(ctx, lambda: dst._write(_from_bits(alu.reduce(_bits(_rows(data, p, f), data._dt), (0,)), dst._dt)))
    else:
        _step(ctx, lambda: dst._write(alu.reduce(_f32(data, p, f), (0,))))
    _touch(ctx, (data, dst))
    _record(ctx, iname, "gpsimd", p, f, (data,), dst, alu_op=alu.name)
