"""The replayed steps of element-wise instructions, bound at record time to views of their operands.

A step keeps, once, the views it reads and writes in one shape ([P, F], or dst's own when that would copy), the
operator's `out=` form (`ops.alu_into`: NumPy, or torch where it is one vectorised pass) and any buffer it needs,
so that a replay runs the arithmetic alone: no reshapes, conversions, temporaries or checked stores per call.
Each returns None (or falls back to the general form) where a shortcut would change a value.
"""

from __future__ import annotations

import functools

import numpy as np

from neuron_dynamo.nki import dtypes
from neuron_dynamo.nki.isa.operands import _apply, _bound, _f32_reader, _view_2d, _view_as, _writer
from neuron_dynamo.nki.ops import alu_into
from neuron_dynamo.nki.tensor import NkiTensor


def _elementwise(alu, a, b, dst: NkiTensor, p: int, f: int):
    """The step `dst = alu(a, b)` in fp32 (a, b: tensors or fp32 constants): into dst's own fp32 memory when it
    and the tensors have views of one shape (`ops.alu_into`: no temporaries), a comparison's 0/1 straight into an
    integer dst; else on temporaries, then one store."""
    tensors = [x for x in (a, b) if isinstance(x, NkiTensor)]
    views = _views((dst, *tensors), p, f)
    if views is not None and views[0].flags.writeable:
        inputs = dict(zip(map(id, tensors), views[1:], strict=True))
        a_, b_ = (_as_f32(x, inputs[id(x)]) if isinstance(x, NkiTensor) else x for x in (a, b))
        step = _into(alu, dst, views[0], a_, b_)
        if step is not None:
            return step
    read1, read2 = (_reader(x, p, f) if isinstance(x, NkiTensor) else _constant(x) for x in (a, b))
    store = _store(dst, p, f)
    return lambda: store(alu.fn(read1(), read2()))


def _stages(data: NkiTensor, stages, dst: NkiTensor, p: int, f: int):
    """The step `dst = ((data op0 v0) op1 v1)` of tensor_scalar / scalar_tensor_tensor (stages: (operator, operand,
    reverse), the operand a `_scalar_reader` function or a full tile): stage by stage in dst's own memory
    (`_chain`), else on temporaries, then one store."""
    tiles = [operand for _, operand, _ in stages if isinstance(operand, NkiTensor)]
    views = _views((dst, data, *tiles), p, f)
    if views is not None and views[0].flags.writeable:
        out, inputs = views[0], dict(zip(map(id, tiles), views[2:], strict=True))
        operands = [_as_f32(op, inputs[id(op)]) if isinstance(op, NkiTensor) else _column(op, out)
                    for _, op, _ in stages]
        x = _as_f32(data, views[1])
        exact = _integer_compare(stages[0][0], views[1], operands[0]) if len(stages) == 1 and callable(x) else None
        if exact is not None:
            x, operands = exact
        later = [inputs[id(op)] if isinstance(op, NkiTensor) else v
                 for (_, op, _), v in zip(stages[1:], operands[1:], strict=True)]
        if not any(isinstance(v, np.ndarray) and np.may_share_memory(v, out) for v in later):
            step = _chain(dst, out, x, stages, operands)  # no later stage reads what an earlier one overwrote
            if step is not None:
                return step
    read = _reader(data, p, f)
    plan = [(alu, _reader(op, p, f) if isinstance(op, NkiTensor) else op, rev) for alu, op, rev in stages]
    store = _store(dst, p, f)

    def run():
        x = read()
        for alu, operand, rev in plan:
            x = _apply(alu, x, operand(), rev)
        store(x)
    return run


def _integer_compare(alu, view: np.ndarray, value):
    """(view, [value in view's integer type]) when comparing the integer view with the constant `value` gives what
    comparing their fp32 values does (an integral constant below 2**24 in magnitude: no other integer rounds to it
    in fp32, and the rounding keeps the order), so that NumPy compares the integers without converting them."""
    if not hasattr(alu.fn, "into") or view.dtype.kind not in "iu" or not isinstance(value, np.float32):
        return None
    info = np.iinfo(view.dtype)
    if not (abs(value) < 2**24 and value == np.floor(value) and info.min <= value <= info.max):
        return None
    return view, [view.dtype.type(int(value))]


def _chain(dst: NkiTensor, out: np.ndarray, x, stages, operands):
    """The stages computed one after the other into `out` (`_into`; more than one only into an fp32 dst), or None
    when one cannot be."""
    steps = []
    for (alu, _, rev), v in zip(stages, operands, strict=True):
        if steps and dst._dt != "float32":
            return None
        step = _into(alu, dst, out, *((v, x) if rev else (x, v)))
        if step is None:
            return None
        steps.append(step)
        x = out
    if len(steps) == 1:
        return steps[0]
    first, second = steps

    def run():
        first()
        second()
    return run


def _into(alu, dst: NkiTensor, out: np.ndarray, a, b):
    """The step computing `alu(a, b)` into `out`, a view of dst's memory (`ops.alu_into`): fp32 arithmetic into an
    fp32 dst, or a comparison's 0/1 into an integer dst; None for anything else."""
    if dst._dt != "float32" and not (out.dtype.kind in "iu" and hasattr(alu.fn, "into")):
        return None
    if out.dtype.kind in "iu" and out.itemsize == 1:
        out = out.view(np.bool_)  # the same 0/1 bytes, without NumPy's cast from its bool result
    step, s = alu_into(alu, a, b, out), dst._s
    if step is None:
        return None

    def run():
        s.f32_cache = None
        step()
    return run


def _views(ts, p: int, f: int) -> list | None:
    """Views of the tensors `ts` in one shape sharing their memory (a step binds them: no per-call reshape): [p, f],
    else the first one's own shape, which element-wise steps may use as well; None if neither works."""
    for shape in ((p, f), ts[0]._a.shape):
        views = [_view_2d(t._a, p, f) if shape == (p, f) else _view_as(t._a, shape) for t in ts]
        if all(v is not None for v in views):
            return views
    return None


def _as_f32(t: NkiTensor, view: np.ndarray):
    """An input view as the fp32 values an element-wise step reads: the view itself (fp32, bound now), or a
    function converting it per call."""
    if view.dtype == np.float32 and t._dt == "float32":
        return view
    return functools.partial(dtypes.as_f32, view)


def _reader(t: NkiTensor, p: int, f: int):
    """`_f32_reader`, but an integer view converts per call without the fp32 cache (its key costs more than the
    conversion)."""
    view = _view_2d(t._a, p, f) if dtypes.is_int(t._dt) else None
    return _f32_reader(t, p, f) if view is None else functools.partial(dtypes.as_f32, view)


def _store(dst: NkiTensor, p: int, f: int):
    """`_writer` for fp32 values; into an integer dst, the conversion of `dtypes.to_dtype` (round half to even,
    saturate, NaN to 0) done in a float64 buffer of the step's own, with no temporaries."""
    view = _view_2d(dst._a, p, f) if dtypes.is_int(dst._dt) else None
    if view is None or not view.flags.writeable:
        return _writer(dst, p, f)
    info, wide, s = np.iinfo(view.dtype), np.empty((p, f), np.float64), dst._s
    low, high = float(info.min), float(info.max)

    def store(values):
        s.f32_cache = None
        np.rint(values.reshape(p, f), out=wide)
        np.maximum(wide, low, out=wide)  # NaN stays NaN
        np.minimum(wide, high, out=wide)
        np.copyto(wide, 0.0, where=np.isnan(wide))
        np.copyto(view, wide, casting="unsafe")
    return store


def _column(read, out: np.ndarray):
    """A `_scalar_reader` operand, bound now when it can be (`_bound`; a [P, 1] tile as [P, 1, ...], to broadcast
    against `out`'s shape), else the reader."""
    value = _bound(read)
    if isinstance(value, np.ndarray) and out.ndim != 2:
        value = value.reshape((value.shape[0],) + (1,) * (out.ndim - 1))
    return value


def _copy(s, dst_view: np.ndarray, src_view: np.ndarray):
    """The step copying a view into dst's view of the same dtype (bit for bit); `s`: dst's storage."""

    def run():
        s.f32_cache = None
        dst_view[...] = src_view
    return run


def fill_step(dst: NkiTensor, values: np.ndarray, p: int, f: int):
    """The step storing the constant [p, f] `values` in dst, cast to dst's dtype once, now."""
    view = _view_2d(dst._a, p, f)
    if view is None or not view.flags.writeable:
        store = _writer(dst, p, f)
        return lambda: store(values)
    cast, s = dtypes.to_dtype(values, dst._dt).reshape(p, f), dst._s
    return _copy(s, view, cast)


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32}
_COMMUTATIVE = frozenset(("bitwise_and", "bitwise_or", "bitwise_xor"))


def _bitvec_step(alu, data: NkiTensor, operand, rev: bool, dst: NkiTensor, p: int, f: int):
    """A bit-vector step on the unsigned bit patterns of dst's width, straight into dst: the bits `_bits` /
    `_from_bits` give when data, a tile operand and dst have one width, or the operand is an integer constant whose
    bits beyond that width cannot reach the result (any, for and/or/xor; a shift amount >= 0 not reversed). None
    otherwise."""
    width = dst._a.itemsize
    tensors = [dst, data] + ([operand] if isinstance(operand, NkiTensor) else [])
    if any(t._a.itemsize != width for t in tensors) or (rev and alu.name not in _COMMUTATIVE):
        return None
    unsigned = _UNSIGNED.get(width)
    views = _views(tensors, p, f)
    if unsigned is None or views is None or not views[0].flags.writeable or not isinstance(alu.fn, np.ufunc):
        return None
    out, x = (v.view(unsigned) for v in views[:2])
    if isinstance(operand, NkiTensor):
        value = views[2].view(unsigned)
    elif alu.name in _COMMUTATIVE:
        value = unsigned(operand & ((1 << 8 * width) - 1))
    elif alu.name in ("left_shift", "right_shift") and operand >= 0:
        value = unsigned(min(operand, 8 * width))  # a shift by the width or more leaves no bits, as in int64
    else:
        return None
    fn, s = alu.fn, dst._s

    def run():
        s.f32_cache = None
        fn(x, value, out=out)
    return run


def _predicated_copy(dst: NkiTensor, src, predicate: NkiTensor, reverse: bool, p: int, f: int):
    """tensor_copy_predicated's replay: `np.copyto(where=)` on views bound now (src a tile or the constant array),
    the mask into a buffer of its own; None when a view would need a copy."""
    tensors = [dst, predicate] + ([src] if isinstance(src, NkiTensor) else [])
    views = _views(tensors, p, f)
    if views is None or not views[0].flags.writeable:
        return None
    out, pred = views[:2]
    values = views[2] if isinstance(src, NkiTensor) else src.reshape(out.shape)
    mask = np.empty(out.shape, dtype=bool)
    test, s = np.equal if reverse else np.not_equal, dst._s

    def run():
        s.f32_cache = None
        test(pred, 0, out=mask)
        np.copyto(out, values, where=mask)
    return run


def _constant(value):
    return lambda: value
