"""VectorE (and engine-selectable Vector/Scalar/GpSimd) element-wise instructions: copies, fills, ALU ops."""

from __future__ import annotations

import numpy as np

from neuron_dynamo.nki import dtypes
from neuron_dynamo.nki.context import current
from neuron_dynamo.nki.isa.bound import (
    _bitvec_step,
    _constant,
    _copy,
    _elementwise,
    _predicated_copy,
    _reader,
    _stages,
    _store,
    _views,
    fill_step,
)
from neuron_dynamo.nki.isa.enums import _ReduceCmd, engine, reduce_cmd
from neuron_dynamo.nki.isa.operands import (
    _apply,
    _bits,
    _dynamic,
    _engine_name,
    _f32,
    _fail,
    _from_bits,
    _need_int,
    _no_gpsimd_psum,
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
    _writer,
)
from neuron_dynamo.nki.ops import ALU, resolve_alu
from neuron_dynamo.nki.tensor import NkiTensor


def tensor_copy(dst, src, engine=engine.unknown, name=None):
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
    views = _views((dst, src), p, f) if src._dt == dst._dt != "tfloat32" else None
    if views is not None and views[0].flags.writeable:
        _step(ctx, _copy(dst._s, *views), writes=(dst,))
    else:
        store = _store(dst, p, f) if src._dt != dst._dt else _writer(dst, p, f)
        read = _reader(src, p, f) if src._dt != dst._dt else (lambda: _rows(src, p, f))
        _step(ctx, lambda: store(read()), writes=(dst,))
    _touch(ctx, (src, dst))
    _record(ctx, op, eng, p, f, (src,), dst, dynamic_address=False)


def tensor_copy_dynamic_src(dst, src, engine=engine.unknown, name=None):
    """Removed in NKI 0.4 (migration guide, "Deprecated and removed APIs")."""
    _removed_dynamic_copy("tensor_copy_dynamic_src", "src")


def tensor_copy_dynamic_dst(dst, src, engine=engine.unknown, name=None):
    """Removed in NKI 0.4 (migration guide, "Deprecated and removed APIs")."""
    _removed_dynamic_copy("tensor_copy_dynamic_dst", "dst")


def _removed_dynamic_copy(op: str, side: str) -> None:
    _fail("removed-api", f"nisa.{op} was removed in NKI 0.4; use nisa.tensor_copy with a runtime-offset view of "
          f"{side}: {side}.ap(pattern, scalar_offset=register_or_1x1_tile, indirect_dim=1)")


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
    _step(ctx, fill_step(dst, fill, p, f), writes=(dst,))
    _touch(ctx, (dst,))
    _record(ctx, op, eng, p, f, (), dst, value=float(value))


def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    """Element-wise `dst = data1 op data2` (fp32 arithmetic or integer bit-vector ops)."""
    iname = "tensor_tensor"
    ctx = current()
    data1, data2, dst, p, f = _two_inputs(iname, ("data1", "data2", "dst"), data1, data2, dst)
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
        fast = _bitvec_step(alu, data1, data2, False, dst, p, f)
        if fast is not None:
            _step(ctx, fast, writes=(dst,))
        else:
            _step(ctx, lambda: dst._write(_from_bits(
                alu.fn(_bits(_rows(data1, p, f), data1._dt), _bits(_rows(data2, p, f), data2._dt)), dst._dt)))
    else:
        _step(ctx, _elementwise(alu, data1, data2, dst, p, f), writes=(dst,))
    _touch(ctx, (data1, data2, dst))
    _record(ctx, iname, eng, p, f, (data1, data2), dst, alu_op=alu.name)


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
    stages = []  # (operator, operand reader, reverse)
    fast = None
    if a0.kind == "bitvec":
        if eng != "vector":
            _fail("engine", f"{iname}: bit-vector operators run on the vector engine only")
        _need_int(iname, a0, data, dst)
        for alu, operand, rev in ((a0, operand0, reverse0), (a1, operand1, reverse1)):
            if alu is None:
                continue
            if isinstance(operand, NkiTensor):
                _onchip(iname, "operand", operand)
                ins.append(operand)
                stages.append((alu, _bits_reader(operand, p), rev))
            elif isinstance(operand, (int, np.integer)) and not isinstance(operand, bool):
                stages.append((alu, _constant(np.int64(operand)), rev))
            else:
                _fail("operand", f"{iname}: bit-vector operands must be integers or integer [P, 1] tiles")
        if a1 is None and not isinstance(operand0, NkiTensor):
            fast = _bitvec_step(a0, data, int(operand0), reverse0, dst, p, f)

        def run():
            x = _bits(_rows(data, p, f), data._dt)
            for alu, read, rev in stages:
                x = _apply(alu, x, read(), rev)
            dst._write(_from_bits(x, dst._dt))
    else:
        for alu, operand, rev, what in ((a0, operand0, reverse0, "operand0"), (a1, operand1, reverse1, "operand1")):
            if alu is None:
                continue
            read, tile = _scalar_reader(iname, what, operand, p)
            stages.append((alu, read, rev))
            if tile is not None:
                ins.append(tile)

        run = _stages(data, stages, dst, p, f)
    _step(ctx, fast or run, writes=() if a0.kind == "bitvec" and fast is None else (dst,))
    _touch(ctx, (*ins, dst))
    _record(ctx, iname, eng, p, f, tuple(ins), dst, alu_op=a0.name, alu_op1=a1.name if a1 else None)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    """`dst = (data op0 operand0) op1 operand1`: operand0 a scalar or [P, 1] tile, operand1 a full tile."""
    iname = "scalar_tensor_tensor"
    ctx = current()
    data, operand1, dst, p, f = _two_inputs(iname, ("data", "operand1", "dst"), data, operand1, dst)
    a0, a1 = resolve_alu(op0, "op0"), resolve_alu(op1, "op1")
    if a0.kind != "arith" or a1.kind != "arith":
        _fail("alu-kind", f"{iname}: op0 and op1 must be arithmetic operators")
    read0, t0 = _scalar_reader(iname, "operand0", operand0, p)
    _step(ctx, _stages(data, ((a0, read0, reverse0), (a1, operand1, reverse1)), dst, p, f), writes=(dst,))
    ins = (data, operand1) if t0 is None else (data, t0, operand1)
    _touch(ctx, (*ins, dst))
    _record(ctx, iname, "vector", p, f, ins, dst, alu_op=a1.name)


def reciprocal(dst, data, name=None):
    """VectorE `dst = 1 / data` in fp32."""
    op = "reciprocal"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    data = _onchip(op, "data", data)
    p, f = _same_layout(op, ("data", "dst"), data, dst)
    _step(ctx, _elementwise(ALU["divide"], np.float32(1.0), data, dst, p, f), writes=(dst,))
    _touch(ctx, (data, dst))
    _record(ctx, op, "vector", p, f, (data,), dst)


def dropout(dst, data, prob, name=None):
    """VectorE: zero each element with probability `prob` (scalar or [P, 1] tile); kept values are not rescaled."""
    op = "dropout"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    data = _onchip(op, "data", data)
    p, f = _same_layout(op, ("data", "dst"), data, dst)
    _dynamic(ctx, "it draws random numbers")
    rate, rate_t = _scalar_operand(op, "prob", prob, p)
    keep = ctx.rng.random((p, f), dtype=np.float32) >= rate
    dst._write(np.where(keep, _f32(data, p, f), np.float32(0)))
    ins = (data,) if rate_t is None else (data, rate_t)
    _touch(ctx, (*ins, dst))
    _record(ctx, op, "vector", p, f, ins, dst)


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
        ins.insert(0, src)
        read = _constant(None)
    else:
        read = _constant(np.full((p, f), src, dtype=dtypes.STORAGE[dst._dt]))
    if predicate._dt not in ("uint8", "uint16", "uint32"):
        _fail("predicate-dtype", f"{op}: predicate must be uint8/uint16/uint32, got {predicate._dt}")

    def run():
        values = read()
        values = _rows(src, p, f) if values is None else values
        mask = _rows(predicate, p, f) != 0
        dst._write(np.asarray(values).reshape(p, f), ~mask if reverse_pred else mask)

    _step(ctx, run, _predicated_copy(dst, src if read() is None else read(), predicate, reverse_pred, p, f))
    _touch(ctx, (*ins, dst))
    _record(ctx, op, "vector", p, f, tuple(ins), dst)


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


def _bits_reader(operand: NkiTensor, p: int):
    column = operand._a.reshape(p, 1)
    return lambda: _bits(column, operand._dt)


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
