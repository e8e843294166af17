"""Random numbers: rng, rand2 and the PRNG seed/state instructions.

The engines' PRNG is XORWOW; the interpreter draws from the program instance's NumPy generator instead, so values
differ from hardware while their ranges, dtypes and the determinism of a seed match.
"""

from __future__ import annotations

import numpy as np

from neuron_dynamo.nki import dtypes
from neuron_dynamo.nki.context import current
from neuron_dynamo.nki.isa.enums import engine
from neuron_dynamo.nki.isa.operands import _engine_name, _fail, _onchip, _pf, _record, _scalar_operand, _touch

_INT_OUT = ("int8", "int16", "int32", "uint8", "uint16", "uint32")
_STATE_WORDS = {"gpsimd": 6, "vector": 24}  # XORWOW state per compute lane


def rng(dst, engine=engine.vector, name=None):
    """32 random bits per element, truncated to the integer dtype of `dst` (least significant bits)."""
    op = "rng"
    ctx = current()
    dst = _onchip(op, "dst", dst)
    allowed = ("vector",) if ctx.limits.nc_version == 2 else ("vector", "gpsimd")
    eng = _engine_name(op, engine, "vector", allowed)
    if eng == "gpsimd" and dst._s.buffer == "psum":
        _fail("gpsimd-psum", f"{op}: GpSimd cannot write PSUM")
    if dst._dt not in _INT_OUT:
        _fail("rng-dtype", f"{op}: dst must be an integer dtype ({', '.join(_INT_OUT)}), got {dst._dt}")
    p, f = _pf(dst)
    bits = ctx.rng.integers(0, 2**32, size=(p, f), dtype=np.uint64)
    width = 8 * dtypes.itemsize(dst._dt)
    dst._write((bits & ((1 << width) - 1)).astype(np.int64).astype(dtypes.STORAGE["uint" + str(width)])
               .view(dtypes.STORAGE[dst._dt]))
    _touch(ctx, (dst,))
    _record(ctx, op, eng, p, f, (), dst)


def rand2(dst, min, max, name=None):  # noqa: A002 - the documented parameter names
    """trn3 VectorE: uniform fp32 values in [min, max] (scalars or [P, 1] tiles), cast to dst."""
    op = "rand2"
    ctx = current()
    if ctx.limits.nc_version < 4:
        _fail("engine", f"{op} is a trn3 (NeuronCore-v4) instruction; the target is {ctx.target}")
    dst = _onchip(op, "dst", dst)
    p, f = _pf(dst)
    lo, lo_t = _scalar_operand(op, "min", min, p)
    hi, hi_t = _scalar_operand(op, "max", max, p)
    if np.any(np.asarray(lo) >= np.asarray(hi)):
        _fail("rand2-range", f"{op}: min must be below max")
    dst._write(lo + (hi - lo) * ctx.rng.random((p, f), dtype=np.float32))
    ins = tuple(t for t in (lo_t, hi_t) if t is not None)
    _touch(ctx, (*ins, dst))
    _record(ctx, op, "vector", p, f, ins, dst)


def set_rng_seed(src_seeds, name=None):
    """Seed the VectorE PRNG from a [1, 1] 32-bit tensor: the same seed gives the same rng() sequence."""
    op = "set_rng_seed"
    ctx = current()
    src = _onchip(op, "src_seeds", src_seeds)
    if _pf(src) != (1, 1) or dtypes.itemsize(src._dt) != 4:
        _fail("rng-seed", f"{op}: src_seeds must be a [1, 1] 32-bit tensor, got {src.shape} {src._dt}")
    ctx.rng = np.random.default_rng(int(np.asarray(src._a).view(np.uint32).reshape(-1)[0]))
    _touch(ctx, (src,))
    _record(ctx, op, "vector", 1, 1, (src,), None)


def _state_engine(op: str, ctx, e) -> str:
    if ctx.limits.nc_version < 3:
        _fail("engine", f"{op} needs trn2 or newer (target {ctx.target})")
    return _engine_name(op, e, "gpsimd", ("gpsimd",) if ctx.limits.nc_version == 3 else ("gpsimd", "vector"))


def rand_set_state(src_seeds, engine=engine.gpsimd, name=None):
    """Seed the per-lane PRNG states from a uint32 SBUF tile (6 words per lane on GpSimd, 24 on VectorE)."""
    op = "rand_set_state"
    ctx = current()
    eng = _state_engine(op, ctx, engine)
    src = _onchip(op, "src_seeds", src_seeds)
    p, f = _pf(src)
    if src._s.buffer != "sbuf" or src._dt != "uint32" or f != _STATE_WORDS[eng]:
        _fail("rng-state", f"{op}: src_seeds must be a uint32 SBUF tile of {_STATE_WORDS[eng]} words per lane")
    state = np.array(src._a).reshape(p, f)
    ctx.rng = np.random.default_rng(state.astype(np.uint64).reshape(-1).tolist())
    ctx.rand_states = {**getattr(ctx, "rand_states", {}), eng: state}
    _touch(ctx, (src,))
    _record(ctx, op, eng, p, f, (src,), None)


def rand_get_state(dst, engine=engine.gpsimd, name=None):
    """Store the per-lane PRNG states (the interpreter returns the last state set, zeros before any)."""
    op = "rand_get_state"
    ctx = current()
    eng = _state_engine(op, ctx, engine)
    dst = _onchip(op, "dst", dst)
    p, f = _pf(dst)
    if dst._dt != "uint32" or f != _STATE_WORDS[eng] or (eng == "gpsimd" and dst._s.buffer == "psum"):
        _fail("rng-state", f"{op}: dst must be a uint32 tile of {_STATE_WORDS[eng]} words per lane (SBUF for GpSimd)")
    state = getattr(ctx, "rand_states", {}).get(eng)
    out = np.zeros((p, f), np.uint32)
    if state is not None:
        rows = min(p, state.shape[0])
        out[:rows] = state[:rows]
    dst._write(out)
    _touch(ctx, (dst,))
    _record(ctx, op, eng, p, f, (), dst)
