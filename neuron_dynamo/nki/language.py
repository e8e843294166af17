"""`nki.language`: tensors, buffers, dtypes, loops and the convenience math of NKI 0.6, on CPU.

The `nl.*` operations return new SBUF tiles and expand into the ISA instructions they stand for (a binary op is a
`tensor_tensor` or `tensor_scalar`, a unary op an `activation`, a reduction a `tensor_reduce`, `nl.load` a
`dma_copy`, ...), so the cost model sees what the compiler would emit. The operations real hardware rejects even
though the official simulator accepts them (reference/nki.md §1.8 known limitations) raise `NkiValidationError`:
`nl.divide`, `nl.fmod`/`nl.mod`, `nl.power` with a scalar exponent, broadcasting binary ops, `nl.matmul`
without `transpose_x=True` and `nl.store` from PSUM.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import math

import numpy as np

from neuron_dynamo.nki import dtypes, isa
from neuron_dynamo.nki.context import current
from neuron_dynamo.nki.errors import NkiValidationError
from neuron_dynamo.nki.isa.operands import _record, _step, _touch
from neuron_dynamo.nki.target import tile_size
from neuron_dynamo.nki.tensor import HBM, MemoryRegion, NkiTensor, allocate

# ------------------------------------------------------------------------------------------------ dtypes, buffers
float32 = "float32"
tfloat32 = "tfloat32"
float16 = "float16"
bfloat16 = "bfloat16"
float8_e4m3 = "float8_e4m3"
float8_e5m2 = "float8_e5m2"
float8_e4m3fn = "float8_e4m3fn"
float8_e8m0fnu = "float8_e8m0fnu"
int8 = "int8"
int16 = "int16"
int32 = "int32"
uint8 = "uint8"
uint16 = "uint16"
uint32 = "uint32"
bool_ = "bool"

sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm

__all__ = ["NkiTensor", "MemoryRegion", "tile_size"]  # plus every public name below


class NKIObject:
    """Base class of user classes passed into kernels (the NKI compiler requires it).

    NKI treats every such class as a data class, with or without `@dataclass` (nki-language-guide.rst, "Class
    Support"): unless the class defines `__init__`, the compiler's initializer takes each class field (annotated or
    not) as an optional argument, default None or the field's default, then calls `__post_init__`. A subclass gets
    that initializer at creation, so a later `@dataclass` keeps it (it never replaces an `__init__` in the class).
    """

    def __init__(self, **kwargs) -> None:
        for key, value in kwargs.items():
            object.__setattr__(self, key, value)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            cls.__init__ = _nki_object_init


def _nki_object_fields(cls) -> list[tuple[str, object]]:
    """(name, default factory) of the class fields in definition order, base classes first."""
    fields: dict[str, object] = {}
    for klass in reversed(cls.__mro__[:-1]):
        dc = klass.__dict__.get("__dataclass_fields__", {})
        names = list(klass.__dict__.get("__annotations__", {}))
        names += [n for n, v in klass.__dict__.items() if n not in names and _is_field_value(n, v)]
        for name in names:
            f = dc.get(name)
            if f is not None and f.default_factory is not dataclasses.MISSING:
                fields[name] = f.default_factory
            else:
                default = klass.__dict__.get(name, None)
                fields[name] = (lambda d=default: d)
    return list(fields.items())


def _is_field_value(name: str, value) -> bool:
    return not name.startswith("__") and not callable(value) and not isinstance(
        value, (property, classmethod, staticmethod, dataclasses.Field)
    )


def _nki_object_init(self, *args, **kwargs) -> None:
    fields = _nki_object_fields(type(self))
    if len(args) > len(fields):
        _fail("nki-object", f"{type(self).__name__}() takes {len(fields)} field values, got {len(args)}")
    names = [name for name, _ in fields]
    unknown = [k for k in kwargs if k not in names]
    if unknown:
        _fail("nki-object", f"{type(self).__name__}() has no field {unknown[0]!r}; fields: {', '.join(names)}")
    for k, (name, default) in enumerate(fields):
        value = args[k] if k < len(args) else kwargs[name] if name in kwargs else default()
        object.__setattr__(self, name, value)
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


DType = str  # NKI spells a dtype as a string (the 0.6 stub: `DType = str`)


def is_hbm(buffer) -> bool:
    """True for nl.hbm / nl.private_hbm / nl.shared_hbm."""
    return MemoryRegion(buffer).value in HBM


def is_on_chip(buffer) -> bool:
    """True for nl.sbuf and nl.psum."""
    return MemoryRegion(buffer).value in ("sbuf", "psum")


def is_psum(buffer) -> bool:
    return MemoryRegion(buffer) is MemoryRegion.psum


def is_sbuf(buffer) -> bool:
    return MemoryRegion(buffer) is MemoryRegion.sbuf


def _fail(rule: str, message: str):
    raise NkiValidationError(rule, message)


# ------------------------------------------------------------------------------------------------ creation
def ndarray(shape, dtype, buffer=sbuf, name="", address=None):
    """An uninitialised tensor (NaN-filled, integers 4, so reads of unwritten memory show)."""
    return allocate(shape, dtype, buffer, name)


def _filled(shape, value, dtype, buffer, name):
    t = allocate(shape, dtype, buffer, name)
    if t._s.buffer in HBM:
        values = np.full(t.shape, value, dtype=np.float64 if dtypes.is_float(t.dtype) else np.int64)
        _step(current(), lambda: t._write(values))
    else:
        isa.memset(t, value if dtypes.is_float(t.dtype) else int(value))
    return t


def zeros(shape, dtype, buffer=sbuf, name=""):
    return _filled(shape, 0.0 if dtypes.is_float(dtypes.dtype_name(dtype)) else 0, dtype, buffer, name)


def ones(shape, dtype, buffer=sbuf, name=""):
    return _filled(shape, 1.0 if dtypes.is_float(dtypes.dtype_name(dtype)) else 1, dtype, buffer, name)


def full(shape, fill_value, dtype, buffer=sbuf, name=""):
    return _filled(shape, fill_value, dtype, buffer, name)


def zeros_like(x, dtype=None, buffer=None, name=""):
    return zeros(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def empty_like(x, dtype=None, buffer=None, name=""):
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def rand(shape, dtype, buffer=sbuf, name=""):
    """Uniform [0, 1) random values (from the program instance's seeded generator)."""
    t = allocate(shape, dtype, buffer, name)
    t._write(current().rng.random(t.shape, dtype=np.float32))
    return t


def random_seed(seed):
    """Reseed the program instance's generator (`seed` a 1x1 tensor or an int)."""
    value = int(np.asarray(seed._read()).reshape(-1)[0]) if isinstance(seed, NkiTensor) else int(seed)
    current().rng = np.random.default_rng(value)


def shared_constant(constant, dtype=None):
    """A constant (NumPy array) placed in shared HBM."""
    array = np.asarray(constant)
    t = allocate(array.shape or (1,), dtype or array.dtype, shared_hbm, "constant", fill=0)
    values = np.array(array.reshape(t.shape))  # a copy: the constant is the one of this call
    _step(current(), lambda: t._write(values))
    return t


def shared_identity_matrix(n, dtype=uint8, dst=None):
    """An n x n identity matrix in SBUF (the moving operand of a TensorE transpose)."""
    t = dst if dst is not None else allocate((n, n), dtype, sbuf, "identity")
    diff = allocate((n, n), int32, sbuf, "identity_iota")
    isa.iota(diff, [[-1, n]], offset=0, channel_multiplier=1)  # partition - column
    isa.tensor_scalar(t, diff, op0=equal, operand0=0)
    return t


# ------------------------------------------------------------------------------------------------ indexing, loops
def ds(start, size):
    """`nl.ds(start, size)`: the slice start:start+size."""
    return slice(start, start + size)


def affine_range(start, stop=None, step=1):
    """Deprecated alias of `range` in NKI 0.6 (loops are unrolled); bounds may be registers."""
    return range(start, stop, step) if stop is not None else range(start)


sequential_range = affine_range
static_range = affine_range
dynamic_range = affine_range


def fori_loop(lower, upper, body_fun, step=1):
    """Runtime loop: calls `body_fun(i)` for i in range(lower, upper, step) (bounds may be registers)."""
    if isinstance(step, bool) or not isinstance(step, int) or step <= 0:
        _fail("fori-loop", f"nl.fori_loop: step must be a positive compile-time int, got {step!r}")
    for i in range(lower, upper, step):
        body_fun(i)


def while_loop(init, body_fun):
    """Runtime `while r != 0: r = body_fun(r)`; the body gets the condition register by value and returns the next."""
    r = init
    while int(r) != 0:
        r = body_fun(isa.VirtualRegister(int(r)))
        if not isinstance(r, isa.VirtualRegister):
            _fail("while-loop", "nl.while_loop: body_fun must return the next condition register (a VirtualRegister)")


def no_reorder():
    return contextlib.nullcontext()


def program_id(axis=0):
    if axis != 0:
        _fail("program-id", f"program_id({axis}): NKI 0.6 launches have one (LNC) axis; use axis 0")
    return current().program_id


def num_programs(axes=0):
    return current().launch.num_programs


def program_ndim():
    return 1


def device_print(prefix, tensor):
    """Print a tensor's values (the interpreter prints at once; the device prints at runtime)."""
    print(prefix, np.asarray(tensor._read()) if isinstance(tensor, NkiTensor) else tensor)


# ------------------------------------------------------------------------------------------------ data movement
def load(src, dtype=None):
    """HBM -> a new SBUF tile of the same shape (a dma_copy)."""
    if not isinstance(src, NkiTensor):
        _fail("operand", "nl.load: src must be an NKI tensor")
    t = allocate(src.shape, dtype or src.dtype, sbuf, "")
    isa.dma_copy(t, src)
    return t


def store(dst, value):
    """SBUF tile -> HBM (a dma_copy). PSUM values are rejected, as on hardware: copy them to SBUF first."""
    if isinstance(value, NkiTensor) and value._s.buffer == "psum":
        _fail("store-psum", "nl.store cannot store a PSUM tile; copy it to SBUF with nl.copy / nisa.tensor_copy first")
    isa.dma_copy(dst, value)


def load_transpose2d(src, dtype=None):
    """HBM [A, B] -> SBUF [B, A] (a DMA transpose)."""
    if not isinstance(src, NkiTensor) or src.ndim != 2:
        _fail("operand", "nl.load_transpose2d: src must be a 2-D NKI tensor")
    t = allocate((src.shape[1], src.shape[0]), src.dtype, sbuf, "")
    isa.dma_transpose(t, src)
    if dtype is not None and dtypes.dtype_name(dtype) != src.dtype:
        return copy(t, dtype)
    return t


def copy(x, dtype=None):
    """A copy of `x` in SBUF (VectorE tensor_copy; the usual PSUM -> SBUF eviction)."""
    t = allocate(x.shape, dtype or x.dtype, sbuf, "")
    isa.tensor_copy(t, x)
    return t


# ------------------------------------------------------------------------------------------------ element-wise math
def _nki_op(name):
    def mark(fn):
        fn._nki_op = name
        return fn

    return mark


def _out(shape, dtype):
    return allocate(shape, dtype, sbuf, "")


_PROMOTE_PAIRS = {
    frozenset(("float16", "bfloat16")): "float32",
    frozenset(("float8_e4m3", "float8_e5m2")): "bfloat16",
    frozenset(("int8", "uint8")): "int16",
    frozenset(("int32", "uint32")): "float32",
}


def _result_dtype(x, y, dtype):
    """The output dtype of a binary nl op: `dtype` if given, else NKI's promotion of the tile operands (a float
    beats an int, the listed mixed pairs promote as in nki.md §1.9, otherwise the wider type; scalars are weak)."""
    if dtype is not None:
        return dtypes.dtype_name(dtype)
    cands = [t.dtype for t in (x, y) if isinstance(t, NkiTensor)]
    if len(cands) < 2 or cands[0] == cands[1]:
        return cands[0]
    a, b = cands
    if dtypes.is_float(a) != dtypes.is_float(b):
        return a if dtypes.is_float(a) else b
    pair = _PROMOTE_PAIRS.get(frozenset((a, b)))
    if pair is not None:
        return pair
    return a if dtypes.itemsize(a) >= dtypes.itemsize(b) else b


def _binary(name, x, y, dtype):
    xt, yt = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
    if not (xt or yt):
        _fail("operand", f"nl.{name}: at least one operand must be a tile")
    out_dt = _result_dtype(x, y, dtype)
    if xt and yt:
        if x.shape != y.shape:
            _fail(
                "nl-broadcast",
                f"nl.{name}: operand shapes {x.shape} and {y.shape} differ; binary nl ops do not broadcast on "
                "hardware. Use nisa.tensor_scalar for a [P, 1] operand or nl.broadcast_to first",
            )
        out = _out(x.shape, out_dt)
        isa.tensor_tensor(out, x, y, op=_BINARY[name])
        return out
    tile, scalar, reverse = (x, y, False) if xt else (y, x, True)
    out = _out(tile.shape, out_dt)
    isa.tensor_scalar(out, tile, op0=_BINARY[name], operand0=scalar, reverse0=reverse)
    return out


def _make_binary(name):
    @_nki_op(name)
    def op(x, y, dtype=None):
        return _binary(name, x, y, dtype)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Element-wise {name} of two same-shape tiles (or a tile and a scalar), into a new SBUF tile."
    return op


_BINARY: dict = {}
for _name in ("add", "subtract", "multiply", "maximum", "minimum", "abs_max", "abs_min", "equal", "not_equal",
              "less", "less_equal", "greater", "greater_equal", "bitwise_and", "bitwise_or", "bitwise_xor",
              "left_shift", "right_shift", "logical_and", "logical_or", "logical_xor"):
    _BINARY[_name] = _make_binary(_name)
add = _BINARY["add"]
subtract = _BINARY["subtract"]
multiply = _BINARY["multiply"]
maximum = _BINARY["maximum"]
minimum = _BINARY["minimum"]
abs_max = _BINARY["abs_max"]
abs_min = _BINARY["abs_min"]
equal = _BINARY["equal"]
not_equal = _BINARY["not_equal"]
less = _BINARY["less"]
less_equal = _BINARY["less_equal"]
greater = _BINARY["greater"]
greater_equal = _BINARY["greater_equal"]
bitwise_and = _BINARY["bitwise_and"]
bitwise_or = _BINARY["bitwise_or"]
bitwise_xor = _BINARY["bitwise_xor"]
left_shift = _BINARY["left_shift"]
right_shift = _BINARY["right_shift"]
logical_and = _BINARY["logical_and"]
logical_or = _BINARY["logical_or"]
logical_xor = _BINARY["logical_xor"]


@_nki_op("divide")
def divide(x, y, dtype=None):
    """Rejected: division is not supported on hardware (it is usable as an ISA `op=` where the engine has it)."""
    _fail("nl-divide", "nl.divide is not supported on Trainium hardware; use nl.multiply(x, nl.reciprocal(y)) "
          "(or nisa.tensor_scalar with op0=nl.multiply and 1/y for a constant)")


@_nki_op("fmod")
def fmod(x, y, dtype=None):
    _fail("nl-mod", "nl.fmod runs in simulation but fails on Trainium hardware; compute x - y * floor(x / y) "
          "with supported ops")


@_nki_op("mod")
def mod(x, y, dtype=None):
    _fail("nl-mod", "nl.mod runs in simulation but fails on Trainium hardware; compute x - y * floor(x / y) "
          "with supported ops")


@_nki_op("power")
def power(x, y, dtype=None):
    """Element-wise x ** y of two same-shape tiles (GpSimd); a scalar exponent is rejected as on hardware."""
    if not (isinstance(x, NkiTensor) and isinstance(y, NkiTensor)):
        _fail("nl-power-scalar", "nl.power with a scalar operand is not supported on hardware; use nl.square / "
              "nl.multiply for small integer powers or pass two tiles")
    if x.shape != y.shape:
        _fail("nl-broadcast", f"nl.power: operand shapes {x.shape} and {y.shape} differ; binary nl ops do not "
              "broadcast")
    out = _out(x.shape, _result_dtype(x, y, dtype))
    isa.tensor_tensor(out, x, y, op=power)
    return out


def _unary_activation(name):
    @_nki_op(name)
    def op(x, dtype=None):
        _tile(name, x)
        out = _out(x.shape, dtype or x.dtype)
        isa.activation(out, op=op, data=x)
        return out

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Element-wise {name} (ScalarE activation) into a new SBUF tile."
    return op


def _tile(name, x):
    if not isinstance(x, NkiTensor):
        _fail("operand", f"nl.{name}: x must be an NKI tile, got {type(x).__name__}")


exp = _unary_activation("exp")
log = _unary_activation("log")
sqrt = _unary_activation("sqrt")
tanh = _unary_activation("tanh")
sigmoid = _unary_activation("sigmoid")
relu = _unary_activation("relu")
gelu = _unary_activation("gelu")
gelu_dx = _unary_activation("gelu_dx")
gelu_apprx_tanh = _unary_activation("gelu_apprx_tanh")
gelu_apprx_sigmoid = _unary_activation("gelu_apprx_sigmoid")
gelu_apprx_sigmoid_dx = _unary_activation("gelu_apprx_sigmoid_dx")
silu = _unary_activation("silu")
silu_dx = _unary_activation("silu_dx")
softplus = _unary_activation("softplus")
mish = _unary_activation("mish")
erf = _unary_activation("erf")
erf_dx = _unary_activation("erf_dx")
square = _unary_activation("square")
abs = _unary_activation("abs")  # noqa: A001 - NKI's name
sign = _unary_activation("sign")


def _range_reduced(name, shift):
    """nl.sin/nl.cos: unlike nisa.activation(op=nl.sin), these reduce the argument to [-pi, pi) first (two ALU
    instructions), as ScalarE's sine is only valid there."""

    @_nki_op(name)
    def op(x, dtype=None):
        _tile(name, x)
        reduced = _out(x.shape, "float32")
        isa.tensor_scalar(reduced, x, op0=add, operand0=math.pi + shift, op1=_MOD, operand1=2 * math.pi)
        isa.tensor_scalar(reduced, reduced, op0=subtract, operand0=math.pi)
        out = _out(x.shape, dtype or x.dtype)
        isa.activation(out, op=_SIN, data=reduced)
        return out

    op.__name__ = op.__qualname__ = name
    return op


_SIN = _unary_activation("sin")
_MOD = np.mod  # the ALU operator (nl.mod, the convenience op, is rejected on hardware)
sin = _range_reduced("sin", 0.0)
cos = _range_reduced("cos", math.pi / 2)
tan = _unary_activation("tan")
arctan = _unary_activation("arctan")
ceil = _unary_activation("ceil")
floor = _unary_activation("floor")
trunc = _unary_activation("trunc")
negative = _unary_activation("negative")
logical_not = _unary_activation("logical_not")
identity = _unary_activation("identity")


copy._nki_op = "copy"  # `op=nl.copy` in nisa.activation is the identity activation


def _operator(name: str, doc: str):
    """An operator that only names an instruction's `op=` (no convenience function of its own)."""

    def op(*args, **kwargs):
        _fail("operator-only", f"nl.{name} is an operator for ISA instructions (op=nl.{name}), not a function")

    op.__name__, op.__doc__, op._nki_op = name, doc, name
    return op


prelu = _operator("prelu", "Parametric ReLU activation (slope `relu_param` for negative inputs; nisa.activate2).")
bypass = _operator("bypass", "No-op stage of a tensor-scalar pipeline (op0/op1 of nisa.activate2, tensor_scalar).")
average = _operator("average", "Mean of the operands / reduced elements (ALU operator).")


@_nki_op("rsqrt")
def rsqrt(x, dtype=None):
    """1/sqrt(x) (GpSimd since NKI 0.5: PSUM inputs are rejected)."""
    _tile("rsqrt", x)
    if x._s.buffer == "psum":
        _fail("gpsimd-psum", "nl.rsqrt runs on GpSimd, which cannot read PSUM; copy the tile to SBUF first")
    out = _out(x.shape, dtype or x.dtype)
    isa.activation(out, op=rsqrt, data=x)
    return out


@_nki_op("reciprocal")
def reciprocal(x, dtype=None):
    """1/x (VectorE reciprocal) into a new SBUF tile."""
    _tile("reciprocal", x)
    out = _out(x.shape, dtype or x.dtype)
    isa.reciprocal(out, x)
    return out


@_nki_op("invert")
def invert(x, dtype=None):
    """Bitwise NOT of an integer tile."""
    _tile("invert", x)
    out = _out(x.shape, dtype or x.dtype)
    isa.tensor_scalar(out, x, op0=bitwise_xor, operand0=-1)
    return out


# ------------------------------------------------------------------------------------------------ reductions
def _norm_axis(name, x, axis):
    _tile(name, x)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(sorted(int(a) + x.ndim if int(a) < 0 else int(a) for a in axes))
    if not axes or axes[0] < 1 or axes != tuple(range(axes[0], x.ndim)):
        _fail("reduce-axis", f"nl.{name}: axis {axis} must be the trailing free dims of the {x.ndim}-D tile "
              "([1], [1, 2], ...); the partition dim cannot be reduced")
    return axes


def _reduced_shape(x, axes, keepdims):
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    shape = tuple(n for d, n in enumerate(x.shape) if d not in axes)
    return shape if len(shape) >= 2 else shape + (1,)


def _reduce(name, alu, x, axis, dtype, keepdims, negate=False):
    axes = _norm_axis(name, x, axis)
    out = _out(_reduced_shape(x, axes, keepdims), dtype or x.dtype)
    isa.tensor_reduce(out, op=alu, data=x, axis=axes, negate=negate, keepdims=keepdims)
    return out


@_nki_op("add")
def sum(x, axis, dtype=None, keepdims=False):  # noqa: A001
    return _reduce("sum", add, x, axis, dtype, keepdims)


@_nki_op("maximum")
def max(x, axis, dtype=None, keepdims=False):  # noqa: A001
    return _reduce("max", maximum, x, axis, dtype, keepdims)


@_nki_op("minimum")
def min(x, axis, dtype=None, keepdims=False):  # noqa: A001
    return _reduce("min", minimum, x, axis, dtype, keepdims)


@_nki_op("multiply")
def prod(x, axis, dtype=None, keepdims=False):
    return _reduce("prod", multiply, x, axis, dtype, keepdims)


@_nki_op("logical_and")
def all(x, axis, dtype=None):  # noqa: A001
    return _reduce("all", logical_and, x, axis, dtype, False)


def mean(x, axis, dtype=None, keepdims=False):
    axes = _norm_axis("mean", x, axis)
    n = math.prod(x.shape[a] for a in axes)
    total = _reduce("mean", add, x, axes, "float32", keepdims)
    out = _out(total.shape, dtype or x.dtype)
    isa.tensor_scalar(out, total, op0=multiply, operand0=1.0 / n)
    return out


def var(x, axis, dtype=None, keepdims=False):
    """Population variance over the trailing free axes (VectorE bn_stats + bn_aggr; keeps the reduced dims)."""
    axes = _norm_axis("var", x, axis)
    out = _out(_reduced_shape(x, axes, True), dtype or x.dtype)
    ctx = current()
    _step(ctx, lambda: out._write(dtypes.as_f32(np.asarray(x._read())).var(axis=axes, keepdims=True,
                                                                            dtype=np.float32)))
    p, f = x.shape[0], math.prod(x.shape[1:])
    _touch(ctx, (x, out))
    for chunk in range(0, f, tile_size.bn_stats_fmax):
        _record(ctx, "bn_stats", "vector", p, builtins.min(tile_size.bn_stats_fmax, f - chunk), (x,), out)
    _record(ctx, "bn_aggr", "vector", p, 3 * -(-f // tile_size.bn_stats_fmax), (x,), out)
    return out


# ------------------------------------------------------------------------------------------------ composites
def softmax(x, axis=-1, dtype=None):
    """exp(x - max) / sum(exp(x - max)) along the free axis of a 2-D tile."""
    _tile("softmax", x)
    if x.ndim != 2 or _norm_axis("softmax", x, axis) != (1,):
        _fail("reduce-axis", f"nl.softmax: takes a 2-D [P, F] tile and axis=1 (or -1), got {x.shape} axis={axis}")
    p = x.shape[0]
    neg_max = _reduce("softmax", maximum, x, (1,), "float32", True, negate=True)
    e = _out(x.shape, "float32")
    total = _out((p, 1), "float32")
    isa.activation(e, op=exp, data=x, bias=neg_max, reduce_op=add, reduce_res=total,
                   reduce_cmd=isa.reduce_cmd.reset_reduce)
    inv = _out((p, 1), "float32")
    isa.reciprocal(inv, total)
    out = _out(x.shape, dtype or x.dtype)
    isa.tensor_scalar(out, e, op0=multiply, operand0=inv)
    return out


def rms_norm(x, w, axis, n, epsilon=1e-6, dtype=None, compute_dtype=None):
    """x * rsqrt(sum(x^2) / n + epsilon) * w over all free axes; `w` broadcasts over partitions."""
    _tile("rms_norm", x)
    if _norm_axis("rms_norm", x, axis) != tuple(range(1, x.ndim)):
        _fail("reduce-axis", "nl.rms_norm: axis must cover every free dim of x")
    p = x.shape[0]
    sq = _out(x.shape, "float32")
    ss = _out((p, 1), "float32")
    isa.activation(sq, op=square, data=x, reduce_op=add, reduce_res=ss, reduce_cmd=isa.reduce_cmd.reset_reduce)
    rinv = _out((p, 1), "float32")
    isa.tensor_scalar(rinv, ss, op0=multiply, operand0=1.0 / n, op1=add, operand1=float(epsilon))
    isa.activation(rinv, op=rsqrt, data=rinv)
    normed = _out(x.shape, "float32")
    isa.tensor_scalar(normed, x, op0=multiply, operand0=rinv)
    weights = w if w.shape == x.shape else broadcast_to(w, x.shape)
    out = _out(x.shape, dtype or x.dtype)
    isa.tensor_tensor(out, normed, weights, op=multiply)
    return out


def where(condition, x, y, dtype=None):
    """`x` where condition (a 1.0/0.0 tile) is non-zero, else `y` (tiles of the condition's shape, or scalars)."""
    _tile("where", condition)
    for v in (x, y):
        if isinstance(v, NkiTensor) and v.shape != condition.shape:
            _fail("nl-broadcast", f"nl.where: operand {v.shape} must match condition {condition.shape}")
    ref = x if isinstance(x, NkiTensor) else y if isinstance(y, NkiTensor) else condition
    out = _out(condition.shape, dtype or ref.dtype)
    if isinstance(y, NkiTensor):  # out = y, then x copied where the condition holds
        isa.tensor_copy(out, y)
    else:
        isa.memset(out, y if dtypes.is_float(out.dtype) else int(y))
    mask = _out(condition.shape, "uint8")
    isa.tensor_scalar(mask, condition, op0=not_equal, operand0=0.0)
    src = x
    if isinstance(x, NkiTensor) and x.dtype != out.dtype:
        src = _out(x.shape, out.dtype)
        isa.tensor_copy(src, x)
    isa.tensor_copy_predicated(out, src, mask)
    return out


def dropout(x, rate, dtype=None):
    _tile("dropout", x)
    out = _out(x.shape, dtype or x.dtype)
    isa.dropout(out, x, rate)
    return out


def expand_dims(x, axis):
    """A view of `x` with a new size-1 dim at `axis` (never the partition dim of an on-chip tile)."""
    _tile("expand_dims", x)
    return x.expand_dim(axis)


def broadcast_to(x, shape, dtype=None):
    """A new SBUF tile of `shape` (same rank as x) with x's size-1 dims repeated.

    Repeating across partitions is a DMA (engines cannot move data between partitions); repeating along free dims
    is a tensor_copy from a stride-0 view.
    """
    _tile("broadcast_to", x)
    shape = tuple(shape)
    if len(shape) != x.ndim or any(a != b and a != 1 for a, b in zip(x.shape, shape, strict=True)):
        _fail("broadcast", f"nl.broadcast_to: cannot broadcast {x.shape} to {shape} (same rank, size-1 dims only)")
    src = x
    if x.shape[0] != shape[0]:
        staged = _out((shape[0],) + x.shape[1:], x.dtype)
        isa.dma_copy(staged, NkiTensor(np.broadcast_to(x._a, (shape[0],) + x.shape[1:]), x._s, x.dtype, life=x._life))
        src = staged
    elif x._s.buffer in HBM:
        src = load(x)
    out = _out(shape, dtype or x.dtype)
    if src.shape != shape:
        src = NkiTensor(np.broadcast_to(src._a, shape), src._s, src.dtype, life=src._life)
    isa.tensor_copy(out, src)
    return out


def gather_flattened(data, indices, axis=0, dtype=None):
    """out[p, k] = data[p, indices[p, k]] along the flattened free dims of each partition."""
    _tile("gather_flattened", data)
    _tile("gather_flattened", indices)
    p, f = data.shape[0], math.prod(data.shape[1:])
    idx = np.asarray(indices._read()).reshape(p, -1).astype(np.int64)
    if (idx < 0).any() or (idx >= f).any():
        _fail("index-out-of-bounds", f"nl.gather_flattened: indices must be in [0, {f})")
    out = _out(indices.shape, dtype or data.dtype)
    out._write(np.take_along_axis(np.asarray(data._read()).reshape(p, f), idx, axis=1))
    ctx = current()
    _touch(ctx, (data, indices, out))
    _record(ctx, "local_gather", "gpsimd", p, idx.shape[1], (data, indices), out)
    return out


# ------------------------------------------------------------------------------------------------ matmul, transpose
def matmul(x, y, transpose_x=False):
    """x.T @ y into a new fp32 PSUM tile; `transpose_x=True` is required (hardware limitation)."""
    if not transpose_x:
        _fail("nl-matmul-transpose", "nl.matmul without transpose_x=True is not supported on hardware; lay x out "
              "as [K, M] and pass transpose_x=True (or call nisa.nc_matmul)")
    _tile("matmul", x)
    _tile("matmul", y)
    out = allocate((x.shape[-1] if x.ndim == 2 else math.prod(x.shape[1:]), math.prod(y.shape[1:])), "float32",
                   psum, "")
    isa.nc_matmul(out, x, y, accumulate=False)
    return out


def transpose(x, dtype=None):
    """2-D partition <-> free transpose (TensorE, into PSUM)."""
    _tile("transpose", x)
    p, f = x.shape[0], math.prod(x.shape[1:])
    out = allocate((f, p), x.dtype, psum, "")
    isa.nc_transpose(out, x)
    if dtype is not None and dtypes.dtype_name(dtype) != x.dtype:
        return copy(out, dtype)
    return out


_INTERNAL = {"annotations", "builtins", "contextlib", "dataclasses", "math", "np", "dtypes", "isa", "current",
             "NkiValidationError", "HBM", "allocate"}
__all__ += [n for n in list(globals()) if not n.startswith("_") and n not in _INTERNAL]
