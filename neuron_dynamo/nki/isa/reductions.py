"""VectorE reductions, scans, statistics, top-8 search and the select-with-reduce instructions."""

from __future__ import annotations

import math

import numpy as np
import torch

from neuron_dynamo.nki import dtypes
from neuron_dynamo.nki.context import current
from neuron_dynamo.nki.isa.enums import _ReduceCmd, reduce_cmd
from neuron_dynamo.nki.isa.operands import (
    _apply,
    _bits,
    _f32,
    _fail,
    _from_bits,
    _need_int,
    _onchip,
    _pf,
    _record,
    _rows,
    _same_layout,
    _scalar_operand,
    _scalar_reader,
    _step,
    _touch,
    _two_inputs,
    _vector_regs,
    _view_as,
    _writer,
)
from neuron_dynamo.nki.ops import resolve_alu, torch_viewable
from neuron_dynamo.nki.tensor import NkiTensor


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
    fast = _torch_extreme(alu.name, data, dst, axes, negate, p, kept) or _sum_into(alu.name, data, dst, axes, negate)
    if alu.kind == "bitvec":
        _need_int(iname, alu, data, dst)
        _step(ctx, lambda: dst._write(_from_bits(alu.reduce(_bits(data._a, data._dt), axes), dst._dt)))
    elif fast is not None:
        _step(ctx, fast, writes=(dst,))
    elif negate:
        _step(ctx, lambda: dst._write(-alu.reduce(dtypes.as_f32(data._a), axes)))
    else:
        _step(ctx, lambda: dst._write(alu.reduce(dtypes.as_f32(data._a), axes)))
    _touch(ctx, (data, dst))
    _record(ctx, iname, "vector", p, f, (data,), dst, alu_op=alu.name)


_EXTREMES = {"maximum": torch.amax, "minimum": torch.amin}


def _torch_extreme(name: str, data: NkiTensor, dst: NkiTensor, axes: tuple, negate: bool, p: int, kept: int):
    """The step of a max/min reduction of an fp32 view by torch (the same values as NumPy's, NaN propagating alike,
    several times faster along short rows), straight into an fp32 dst where torch can view it; None for other
    operators and views torch cannot share."""
    reduce, a = _EXTREMES.get(name), data._a
    if reduce is None or a.dtype != np.float32 or not a.flags.writeable or min(a.strides, default=0) < 0:
        return None
    source, out = torch.from_numpy(a), _view_as(dst._a, a.shape[: axes[0]]) if dst._dt == "float32" else None
    if out is not None and torch_viewable(out):
        target, s = torch.from_numpy(out), dst._s

        def into():
            s.f32_cache = None
            reduce(source, axes, out=target)
            if negate:
                torch.neg(target, out=target)
        return into
    store = _writer(dst, p, kept)
    if negate:
        return lambda: store(torch.neg(reduce(source, axes)).numpy())
    return lambda: store(reduce(source, axes).numpy())


def _sum_into(name: str, data: NkiTensor, dst: NkiTensor, axes: tuple, negate: bool):
    """The step of an add-reduction of an fp32 view straight into an fp32 dst (`out=`, the same NumPy reduction
    without the temporary and the checked store), or None for other operators and views."""
    a = data._a
    out = _view_as(dst._a, a.shape[: axes[0]]) if name == "add" and dst._dt == "float32" else None
    if out is None or a.dtype != np.float32 or data._dt != "float32" or not out.flags.writeable:
        return None
    s = dst._s

    def run():
        s.f32_cache = None
        np.add.reduce(a, axis=axes, out=out)
        if negate:
            np.negative(out, out=out)
    return run


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    """Per partition: `r[i] = op1(op0(data0[i], r[i-1]), data1[i])`, `r[-1] = initial` (fp32)."""
    iname = "tensor_tensor_scan"
    ctx = current()
    data0, data1, dst, p, f = _two_inputs(iname, ("data0", "data1", "dst"), data0, data1, dst)
    a0, a1 = resolve_alu(op0, "op0"), resolve_alu(op1, "op1")
    read_init, init_t = _scalar_reader(iname, "initial", initial, p)

    def run():
        init = read_init()
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

    _step(ctx, run)
    ins = (data0, data1) if init_t is None else (data0, data1, init_t)
    _touch(ctx, (*ins, dst))
    _record(ctx, iname, "vector", p, f, ins, dst, alu_op=a1.name)


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

    def run():
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

    _step(ctx, run)
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

    def run():
        t = _f32(data, p, f).reshape(p, f // 3, 3)
        count, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
        total = count.sum(axis=1)
        safe = np.where(total > 0, total, 1)
        mu = (count * mean).sum(axis=1) / safe
        var = (m2 + count * (mean - mu[:, None]) ** 2).sum(axis=1) / safe
        dst._write(np.stack([mu, var], axis=1).astype(np.float32))

    _step(ctx, run)
    _touch(ctx, (data, dst))
    _record(ctx, op, "vector", p, f, (data,), dst)


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

    def run():
        x = _f32(src, p, f)
        top = -np.sort(-x, axis=1)[:, :8]
        dst._write(top)

    _step(ctx, run)
    _touch(ctx, (src, dst))
    _record(ctx, op, "vector", p, f, (src,), dst)


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
    read0, t0 = _scalar_reader(iname, "operand0", operand0, p)

    def run():
        dst._write(_apply(a0, _f32(data, p, f), read0(), reverse0))
        reduce_res._write(red.reduce(dtypes.as_f32(dst._a.reshape(p, f)), (1,)))

    _step(ctx, run)
    ins = (data,) if t0 is None else (data, t0)
    _touch(ctx, (*ins, dst, reduce_res))
    _record(ctx, iname, "vector", p, f, ins, dst, alu_op=a0.name)




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


_CUMULATIVE_RESET = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}
_CUMULATIVE_DTYPES = ("bfloat16", "float16", "float32", "float8_e4m3", "float8_e5m2", "float8_e4m3fn", "uint8",
                      "uint16", "int8", "int16")


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, name=None):
    """VectorE running reduction per partition: `reg = op1(op0(src[i], imm0), reg); dst[i] = reg`, with the
    accumulator reset to op1's identity (reset_reduce), loaded from imm1 (load_reduce) or kept (reduce)."""
    iname = "tensor_scalar_cumulative"
    ctx = current()
    dst = _onchip(iname, "dst", dst)
    src = _onchip(iname, "src", src)
    p, f = _same_layout(iname, ("src", "dst"), src, dst)
    a0, a1 = resolve_alu(op0, "op0"), resolve_alu(op1, "op1")
    if a0.kind != "arith" or a1.name not in _CUMULATIVE_RESET:
        _fail("alu-op", f"{iname}: op0 must be arithmetic and op1 one of {', '.join(_CUMULATIVE_RESET)}")
    for what, t in (("src", src), ("dst", dst)):
        if t._dt not in _CUMULATIVE_DTYPES:
            _fail("dtype", f"{iname}: {what} dtype {t._dt} is not supported ({', '.join(_CUMULATIVE_DTYPES)})")
    v0, t0 = _scalar_operand(iname, "imm0", imm0, p)
    regs = _vector_regs(ctx)
    ins = [src] + ([t0] if t0 is not None else [])
    if reduce_cmd is _ReduceCmd.reset_reduce:
        regs[:p] = _CUMULATIVE_RESET[a1.name]
    elif reduce_cmd is _ReduceCmd.load_reduce:
        if imm1 is None:
            _fail("operand", f"{iname}: reduce_cmd=load_reduce needs imm1, the accumulator's initial value")
        v1, t1 = _scalar_operand(iname, "imm1", imm1, p)
        regs[:p] = np.broadcast_to(np.asarray(v1, np.float32).reshape(-1), (p,))
        ins += [t1] if t1 is not None else []
    elif reduce_cmd is not _ReduceCmd.reduce:
        _fail("reduce-cmd", f"{iname}: reduce_cmd must be reset_reduce, load_reduce or reduce")
    x = _apply(a0, _f32(src, p, f), v0, False)
    if a1.name == "add":
        out = np.cumsum(np.concatenate([regs[:p, None], x], axis=1), axis=1, dtype=np.float32)[:, 1:]
    else:
        out = np.empty((p, f), np.float32)
        acc = regs[:p].copy()
        for i in range(f):
            acc = a1.fn(x[:, i], acc)
            out[:, i] = acc
    regs[:p] = out[:, -1]
    dst._write(out)
    _touch(ctx, (*ins, dst))
    _record(ctx, iname, "vector", p, f, tuple(ins), dst, alu_op=a1.name)
