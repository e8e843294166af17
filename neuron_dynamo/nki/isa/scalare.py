"""ScalarE instructions: activation functions (piecewise-polynomial, fp32) with the add-reduce registers."""

from __future__ import annotations

import functools

import numpy as np
import torch

from neuron_dynamo.nki.context import DEVICE, current
from neuron_dynamo.nki.errors import kernel_site
from neuron_dynamo.nki.isa.enums import _ReduceCmd, reduce_cmd
from neuron_dynamo.nki.isa.operands import (
    _apply,
    _bound,
    _f32,
    _f32_reader,
    _fail,
    _onchip,
    _out2d,
    _pf,
    _record,
    _same_layout,
    _scalar_operand,
    _scalar_reader,
    _step,
    _touch,
    _view_2d,
    _writer,
    log,
)
from neuron_dynamo.nki.ops import (
    ALU,
    TORCH_ACTIVATIONS,
    alu_into,
    partial_overlap,
    resolve_activation,
    resolve_alu,
    torch_viewable,
)


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
    ins = [data]
    read_scale, sc_t = _scalar_reader(iname, "scale", scale, p)
    if sc_t is not None:
        ins.append(sc_t)
    scaled = sc_t is not None or read_scale() != 1.0
    read_bias, b_t = None, None
    if bias is not None:
        read_bias, b_t = _scalar_reader(iname, "bias", bias, p)
        if b_t is None and ctx.limits.nc_version == 2:
            _fail("activation-bias", f"{iname}: on trn1 bias must be a [P, 1] tile, not a scalar")
        if b_t is not None:
            ins.append(b_t)
    if not isinstance(reduce_cmd, _ReduceCmd):
        _fail("reduce-cmd", f"{iname}: reduce_cmd must be an nisa.reduce_cmd member")
    reducing = reduce_op is not None or reduce_res is not None or reduce_cmd is not _ReduceCmd.idle
    if reduce_op is not None and resolve_alu(reduce_op, "reduce_op").name != "add":
        _fail("activation-reduce-op", f"{iname}: reduce_op must be nl.add")
    touched = [*ins, dst]
    if reduce_res is not None:
        reduce_res = _onchip(iname, "reduce_res", reduce_res)
        if _pf(reduce_res) != (p, 1):
            _fail("operand-shape", f"{iname}: reduce_res must be [{p}, 1], got {reduce_res.shape}")
        touched.append(reduce_res)
    regs = ctx.scalar_reduce_regs
    cmd = reduce_cmd.name
    compute, values = _activation_step(ctx, act_name, fn, dst, data, p, f, read_scale if scaled else None,
                                       read_bias, [t for t in (sc_t, b_t) if t is not None])
    reset, accumulate = cmd in ("reset", "reset_reduce"), cmd in ("reduce", "reset_reduce", "load_reduce")
    add_sums = _row_sums_into(regs[:p], values) if accumulate else None
    store_res = None if reduce_res is None else _writer(reduce_res, p, 1)

    def run(check=None):
        out = compute(check)
        if reset:
            regs[:p] = 0.0
        if add_sums is not None:
            add_sums(out)
        if store_res is not None:
            store_res(regs[:p].copy())

    def first_run():  # the range warning belongs to the full run, not to replays
        run(functools.partial(_check_activation_range, ctx, act_name) if act_name in _ACTIVATION_RANGES else None)

    _step(ctx, first_run, run, writes=(dst,) if reduce_res is None else (dst, reduce_res))
    _touch(ctx, touched)
    _record(ctx, iname, "scalar", p, f, tuple(ins), dst, act=act_name, reduce=reducing)


_IDENTITY_ACTIVATIONS = frozenset(("copy", "identity"))


def _activation_step(ctx, act_name: str, fn, dst, data, p: int, f: int, read_scale, read_bias, tiles):
    """The activation `fn(data * scale + bias)` bound to its operands: (`compute(check) -> fp32 [p, f] values`,
    which also stores them in dst, and those values' array when every call gives the same one, else None); `check`,
    if given, sees the function's input.

    The stages compute in fp32 in a C-contiguous fp32 dst (`out=`), else in a shared scratch buffer copied (and
    cast) into dst at the end: no temporaries, and a scale/bias tile or data view overlapping dst is read before
    dst is written. The function is one torch kernel where torch has one (`ops.TORCH_ACTIVATIONS`), NumPy's ufunc
    with `out=`, else NumPy on a temporary.
    """
    out = _out2d(dst, p, f)
    src = _view_2d(data._a, p, f) if torch_viewable(data._a) else None
    if act_name in _IDENTITY_ACTIVATIONS and read_scale is None and read_bias is None:
        return _copy_step(dst, data, src, p, f)
    direct = out is not None and out.flags.c_contiguous and not any(
        np.may_share_memory(t._a, out) for t in tiles) and not (
        partial_overlap(src, out) if src is not None else np.may_share_memory(data._a, out))
    target = out if direct else _scratch(p, f)
    before = []
    x = src
    if x is None:
        read = _f32_reader(data, p, f)
        before.append(lambda: np.copyto(target, read()))
        x = target
    for alu, read_operand in ((ALU["multiply"], read_scale), (ALU["add"], read_bias)):
        if read_operand is not None:
            before.append(alu_into(alu, x, _bound(read_operand), target))
            x = target
    after = []
    if act_name in _IDENTITY_ACTIVATIONS:
        pass  # the stages computed it
    elif act_name in TORCH_ACTIVATIONS:
        after.append(TORCH_ACTIVATIONS[act_name](torch.from_numpy(x), torch.from_numpy(target)))
    elif isinstance(fn, np.ufunc):
        after.append(functools.partial(fn, x, out=target))
    else:
        after.append(lambda: np.copyto(target, fn(x)))
    if target is not out:
        after.append(functools.partial(out.__setitem__, Ellipsis, target) if out is not None
                     else functools.partial(_writer(dst, p, f), target))
    s = dst._s

    def compute(check):
        s.f32_cache = None
        for step in before:
            step()
        if check is not None:
            check(x)
        for step in after:
            step()
        return target

    return compute, target


def _copy_step(dst, data, src, p: int, f: int):
    """`_activation_step` of copy/identity without scale or bias: the store (with its cast) of data's values."""
    out = _out2d(dst, p, f)
    if src is not None and out is not None:
        s = dst._s

        def copy(check):
            s.f32_cache = None
            out[...] = src
            return src

        return copy, src
    read = _f32_reader(data, p, f) if src is None else (lambda: src)
    store = _writer(dst, p, f)

    def compute(check):
        x = read()
        store(x)
        return x

    return compute, src


def _row_sums_into(regs: np.ndarray, values: np.ndarray | None):
    """A function adding the free-axis sums of the fp32 [p, f] values an activation computed to the registers, in
    fp32 (by torch, bound to `values` when they are always the same array, in its vectorised order)."""
    if values is None or not torch_viewable(values):
        return lambda out: np.add(regs, out.sum(axis=1, dtype=np.float32), out=regs)
    source, sums, acc = torch.from_numpy(values), torch.empty(regs.shape, dtype=torch.float32), torch.from_numpy(regs)

    def add(out):
        torch.sum(source, dim=1, out=sums)
        acc.add_(sums)
    return add


def _scratch(p: int, f: int) -> np.ndarray:
    """An fp32 [p, f] buffer activations compute in (one per shape: steps run one at a time)."""
    return DEVICE.buffer(("activation", p, f), lambda: np.empty((p, f), np.float32))


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


_REDUCE_IDENTITY = {"add": 0.0, "maximum": -np.inf, "minimum": np.inf, "abs_max": 0.0, "abs_min": np.inf}


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False, reduce_op=None,
              reduce_res=None, reduce_cmd=reduce_cmd.idle, name=None):
    """trn3 ScalarE `dst = op((data op0 imm0) op1 imm1)` (`nl.bypass` skips a stage; `relu_param` is the PReLU
    slope), with the optional reduction into the ScalarE accumulators that `activation` shares."""
    iname = "activate2"
    ctx = current()
    if ctx.limits.nc_version < 4:
        _fail("engine", f"{iname} is a trn3 (NeuronCore-v4) instruction; the target is {ctx.target}")
    dst = _onchip(iname, "dst", dst)
    data = _onchip(iname, "data", data)
    p, f = _same_layout(iname, ("data", "dst"), data, dst)
    a0, a1 = resolve_alu(op0, "op0"), resolve_alu(op1, "op1")
    combos = {("multiply", "add"), ("multiply", "subtract"), ("multiply", "bypass"), ("add", "bypass"),
              ("subtract", "bypass"), ("bypass", "bypass")}
    if (a0.name, a1.name) not in combos:
        _fail("alu-op", f"{iname}: (op0, op1) = ({a0.name}, {a1.name}) is not one of {sorted(combos)}")
    act_name, fn = resolve_activation(op)
    ins = [data]
    x = _f32(data, p, f)
    for alu, imm, rev, what in ((a0, imm0, reverse0, "imm0"), (a1, imm1, reverse1, "imm1")):
        value, tile = _scalar_operand(iname, what, imm, p)
        if tile is not None:
            ins.append(tile)
        if alu.name != "bypass":
            x = _apply(alu, x, value, rev)
    if act_name == "prelu":
        slope, slope_t = _scalar_operand(iname, "relu_param", relu_param, p)
        if slope_t is not None:
            ins.append(slope_t)
        out = np.where(x >= 0, x, x * slope).astype(np.float32)
    else:
        if act_name in _ACTIVATION_RANGES:
            _check_activation_range(ctx, act_name, x)
        out = fn(x)
    regs = ctx.scalar_reduce_regs
    red = resolve_alu(reduce_op, "reduce_op") if reduce_op is not None else None
    if red is not None and red.name not in _REDUCE_IDENTITY:
        _fail("activation-reduce-op", f"{iname}: reduce_op must be add, maximum, minimum, abs_max or abs_min")
    if reduce_cmd in (_ReduceCmd.reset, _ReduceCmd.reset_reduce):
        regs[:p] = _REDUCE_IDENTITY[red.name if red else "add"]
    if red is not None and reduce_cmd in (_ReduceCmd.reduce, _ReduceCmd.reset_reduce):
        regs[:p] = _reduce_rows(red, regs[:p], out)
    dst._write(out)
    touched = [*ins, dst]
    if reduce_res is not None:
        reduce_res = _onchip(iname, "reduce_res", reduce_res)
        if _pf(reduce_res) != (p, 1):
            _fail("operand-shape", f"{iname}: reduce_res must be [{p}, 1], got {reduce_res.shape}")
        reduce_res._write(regs[:p].copy())
        touched.append(reduce_res)
    _touch(ctx, touched)
    _record(ctx, iname, "scalar", p, f, tuple(ins), dst, act=act_name, reduce=red is not None)


def _reduce_rows(red, regs: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Fold each row of `out` into the accumulators with the element-wise operator `red`."""
    if red.name == "add":
        return regs + out.sum(axis=1, dtype=np.float32)
    acc = regs.astype(np.float32)
    for i in range(out.shape[1]):
        acc = red.fn(acc, out[:, i])
    return acc
