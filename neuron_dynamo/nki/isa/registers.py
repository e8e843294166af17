"""Virtual registers: runtime scalars for dynamic loop bounds and offsets (the interpreter knows their values)."""

from __future__ import annotations

import math

import numpy as np

from neuron_dynamo.nki import dtypes
from neuron_dynamo.nki.context import current
from neuron_dynamo.nki.isa.operands import _fail, _step, _tensor, _touch


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
    value = np.array([int(src)], dtype=np.int64) if dtypes.is_int(dst._dt) else np.float32([int(src)])
    _step(ctx, lambda: dst._write(value))  # a register only holds a data-dependent value after a refused load
    _touch(ctx, (dst,))
