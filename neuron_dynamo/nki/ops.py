"""The ALU operators and activation functions that ISA instructions accept as `op=`, with their fp32 semantics.

Kernels name an operator with an `nl.*` function (`op=nl.add`, `op=nl.exp`) or, as many NKI examples do, with the
NumPy function of the same meaning (`np.add`, `np.exp`, `np.max`). Both resolve here to one `AluOp` / activation.
Arithmetic ALU ops compute in fp32 (comparisons give 1.0/0.0); bit-vector ops work on the integer bit patterns.
Replayed steps compute them into arrays bound at record time: `alu_into` and `TORCH_ACTIVATIONS` (one vectorised
torch kernel where NumPy would make several passes or temporaries).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from neuron_dynamo.nki.context import current
from neuron_dynamo.nki.errors import NkiValidationError

_F32 = np.float32


def _cmp(fn):
    def compare(a, b):
        return fn(a, b).astype(_F32)

    compare.into = fn  # the ufunc giving the same 1.0/0.0 straight into an fp32 `out=` (a step's dst)
    return compare


def out_ufunc(fn):
    """The NumPy ufunc that computes the ALU function `fn` straight into an fp32 array (`out=`), or None."""
    return fn if isinstance(fn, np.ufunc) else getattr(fn, "into", None)


def alu_into(alu: AluOp, a, b, out: np.ndarray):
    """A step computing `alu.fn(a, b)` into the fp32 array `out` (a or b may be `out` itself); `a`, `b`: arrays of
    out's shape or broadcastable columns and scalars bound now, or functions giving one per call. None when the
    operator has no `out=` form.

    Torch's kernel runs where it is one vectorised pass and NumPy's is not (rows with gaps, which NumPy iterates one
    by one; a [P, 1] column broadcast; maximum/minimum, which have no SIMD loop for a scalar operand), else NumPy's
    ufunc: the same IEEE fp32 operation either way.
    """
    ufunc = out_ufunc(alu.fn)
    if ufunc is None:
        return None
    twin = _TORCH_ALU.get(alu.name)
    if twin is not None and _torch_pays(alu.name, (a, b), out):
        ta, tb = (torch_view(np.asarray(x)) for x in (a, b))
        return functools.partial(twin, ta, tb, out=torch.from_numpy(out))
    if not (callable(a) or callable(b)):
        return functools.partial(ufunc, a, b, out=out)
    read_a = a if callable(a) else (lambda: a)
    read_b = b if callable(b) else (lambda: b)
    return lambda: ufunc(read_a(), read_b(), out=out)


_TORCH_ALU = {"add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "divide": torch.div,
              "maximum": torch.maximum, "minimum": torch.minimum}  # NaN-propagating, like np.maximum
_TORCH_MIN_ELEMENTS = 2048  # below this, torch's per-call overhead outweighs NumPy's slower loops


def _torch_pays(name: str, operands, out: np.ndarray) -> bool:
    """Whether torch computes `out = operands[0] op operands[1]` faster than NumPy (see `alu_into`) and can: every
    operand an fp32 scalar or an fp32 array torch can view (`torch_view`), none overlapping `out` other than
    exactly."""
    if out.size < _TORCH_MIN_ELEMENTS or not torch_viewable(out):
        return False
    pays = name in ("maximum", "minimum") or not out.flags.c_contiguous
    for x in operands:
        if isinstance(x, np.float32):
            continue
        if not isinstance(x, np.ndarray) or torch_view(x) is None or partial_overlap(x, out):
            return False
        pays = pays or not x.flags.c_contiguous or x.shape[-1] == 1 < out.shape[-1]
    return pays


def torch_viewable(a: np.ndarray) -> bool:
    """An fp32 array torch.from_numpy shares without copying or warning (writable, no negative strides)."""
    return a.dtype == _F32 and a.flags.writeable and min(a.strides, default=0) >= 0


def torch_view(a: np.ndarray) -> torch.Tensor | None:
    """A torch tensor sharing the memory of the fp32 array `a` (strides not negative), or None. A read-only view
    (a broadcast: stride 0) is built on the writable array it views, for reading only."""
    if a.dtype != _F32 or min(a.strides, default=0) < 0:
        return None
    if a.flags.writeable:
        return torch.from_numpy(a)
    base = a
    while isinstance(base.base, np.ndarray):
        base = base.base
    offset = a.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    if not (base.flags.writeable and base.flags.c_contiguous) or (offset | base.nbytes) % 4 or any(
            st % 4 for st in a.strides):
        return None
    whole = torch.from_numpy(base.reshape(-1).view(np.uint8)).view(torch.float32)
    return whole.as_strided(a.shape, [st // 4 for st in a.strides], offset // 4)


def partial_overlap(x: np.ndarray, out: np.ndarray) -> bool:
    """x shares memory with out other than as the very same view (which an element-wise kernel may update in
    place; torch refuses partial overlaps)."""
    same = (x.__array_interface__["data"][0] == out.__array_interface__["data"][0] and x.shape == out.shape
            and x.strides == out.strides)
    return not same and np.may_share_memory(x, out)


def _logical(fn):
    return lambda a, b: fn(a != 0, b != 0).astype(_F32)


def _sub_reduce(x, axis):
    """a0 - a1 - a2 - ... over the trailing axes `axis` (tensor_reduce only reduces trailing free axes)."""
    flat = x.reshape(x.shape[: axis[0]] + (-1,))
    return flat[..., 0] - flat[..., 1:].sum(axis=-1, dtype=_F32)


@dataclass(frozen=True)
class AluOp:
    """One ALU operator: its NKI name, kind ("arith" | "bitvec"), element-wise function and reduction.

    Unary operators of the operator table (abs, square, relu, rsqrt, reciprocal, invert) take the ALU's two-operand
    form and ignore the second operand; `min_nc_version` marks operators only newer NeuronCores have.
    """

    name: str
    kind: str
    fn: object
    reduce: object = None  # reduce(x, axis_tuple) -> array, for the legal reduction operators
    min_nc_version: int = 2


def _unary(fn):
    return lambda a, b: fn(a)


def _by_magnitude(pick):
    """abs_max/abs_min: the signed operand of larger/smaller magnitude; a tie gives the second operand (nl docs)."""
    return lambda a, b: np.where(pick(np.abs(a), np.abs(b)), a, b).astype(_F32)


def _bit_reduce(ufunc):
    def reduce(x, axis):
        out = x
        for ax in sorted(axis, reverse=True):
            out = ufunc.reduce(out, axis=ax)
        return out

    return reduce


ALU: dict[str, AluOp] = {
    op.name: op
    for op in (
        AluOp("add", "arith", np.add, lambda x, ax: np.sum(x, axis=ax, dtype=_F32)),
        AluOp("subtract", "arith", np.subtract, _sub_reduce),
        AluOp("multiply", "arith", np.multiply, lambda x, ax: np.prod(x, axis=ax, dtype=_F32)),
        AluOp("divide", "arith", np.divide),
        AluOp("maximum", "arith", np.maximum, lambda x, ax: np.max(x, axis=ax)),
        AluOp("minimum", "arith", np.minimum, lambda x, ax: np.min(x, axis=ax)),
        AluOp("equal", "arith", _cmp(np.equal)),
        AluOp("not_equal", "arith", _cmp(np.not_equal)),
        AluOp("greater", "arith", _cmp(np.greater)),
        AluOp("greater_equal", "arith", _cmp(np.greater_equal)),
        AluOp("less", "arith", _cmp(np.less)),
        AluOp("less_equal", "arith", _cmp(np.less_equal)),
        AluOp("logical_and", "arith", _logical(np.logical_and),
              lambda x, ax: np.all(x != 0, axis=ax).astype(_F32)),
        AluOp("logical_or", "arith", _logical(np.logical_or), lambda x, ax: np.any(x != 0, axis=ax).astype(_F32)),
        AluOp("logical_xor", "arith", _logical(np.logical_xor),
              lambda x, ax: (np.sum(x != 0, axis=ax) % 2).astype(_F32)),
        AluOp("power", "arith", np.power),
        AluOp("abs_max", "arith", _by_magnitude(np.greater), min_nc_version=4),
        AluOp("abs_min", "arith", _by_magnitude(np.less), min_nc_version=4),
        AluOp("average", "arith", lambda a, b: (a + b) * _F32(0.5), lambda x, ax: np.mean(x, axis=ax, dtype=_F32)),
        AluOp("bypass", "arith", lambda a, b: a),
        AluOp("abs", "arith", _unary(np.abs)),
        AluOp("square", "arith", _unary(np.square)),
        AluOp("relu", "arith", _unary(lambda x: np.maximum(x, _F32(0)))),
        AluOp("rsqrt", "arith", _unary(lambda x: (_F32(1) / np.sqrt(x)).astype(_F32, copy=False))),
        AluOp("reciprocal", "arith", _unary(lambda x: (_F32(1) / x).astype(_F32, copy=False))),
        AluOp("invert", "bitvec", _unary(np.invert)),
        AluOp("fmod", "arith", np.fmod),
        AluOp("mod", "arith", np.mod),
        AluOp("bitwise_and", "bitvec", np.bitwise_and, _bit_reduce(np.bitwise_and)),
        AluOp("bitwise_or", "bitvec", np.bitwise_or, _bit_reduce(np.bitwise_or)),
        AluOp("bitwise_xor", "bitvec", np.bitwise_xor, _bit_reduce(np.bitwise_xor)),
        AluOp("left_shift", "bitvec", np.left_shift),
        AluOp("right_shift", "bitvec", np.right_shift),  # logical: operands are unsigned bit patterns
    )
}

_NUMPY_ALU = {
    np.add: "add", np.subtract: "subtract", np.multiply: "multiply", np.divide: "divide",
    np.maximum: "maximum", np.minimum: "minimum", np.max: "maximum", np.min: "minimum", np.amax: "maximum",
    np.amin: "minimum", np.sum: "add", np.prod: "multiply", np.equal: "equal", np.not_equal: "not_equal",
    np.greater: "greater", np.greater_equal: "greater_equal", np.less: "less", np.less_equal: "less_equal",
    np.logical_and: "logical_and", np.logical_or: "logical_or", np.logical_xor: "logical_xor", np.power: "power",
    np.bitwise_and: "bitwise_and", np.bitwise_or: "bitwise_or", np.bitwise_xor: "bitwise_xor",
    np.left_shift: "left_shift", np.right_shift: "right_shift", np.fmod: "fmod", np.mod: "mod",
    np.abs: "abs", np.square: "square", np.reciprocal: "reciprocal", np.invert: "invert",
}
# nl reductions passed as ALU ops (op=nl.max in tensor_reduce) name the element-wise operator they reduce with
_REDUCTION_ALIASES = {"sum": "add", "max": "maximum", "min": "minimum", "prod": "multiply", "all": "logical_and"}


def resolve_alu(op, what: str = "op") -> AluOp:
    name = getattr(op, "_nki_op", None)
    if name is None:
        try:
            name = _NUMPY_ALU.get(op)
        except TypeError:
            name = None
    name = _REDUCTION_ALIASES.get(name, name)
    if name in ALU:
        alu = ALU[name]
        if alu.min_nc_version > 2:
            _check_generation(alu)
        return alu
    raise NkiValidationError(
        "alu-op", f"{what}={getattr(op, '__name__', op)!r} is not an NKI ALU operator; use nl.add, nl.multiply, "
        f"nl.maximum, ... (one of {', '.join(ALU)})"
    )


def _check_generation(alu: AluOp) -> None:


    limits = current().limits
    if limits.nc_version < alu.min_nc_version:
        raise NkiValidationError(
            "alu-op", f"{alu.name} is available only on NeuronCore-v{alu.min_nc_version} (trn3) and newer; the target "
            f"is {limits.name}. Compare magnitudes with nl.abs and nl.maximum / nl.minimum instead"
        )


_aten = torch.ops.aten


def _ones(x: torch.Tensor) -> torch.Tensor:
    return torch.ones((), dtype=torch.float32).expand(x.shape)


# Activations torch evaluates in one vectorised kernel (eager PyTorch's own formulas): name -> bind(x, out), giving a
# function that computes the activation of the fp32 tensor x into out (x may be out). A derivative is the backward
# kernel with a gradient of ones.
TORCH_ACTIVATIONS = {
    "sigmoid": lambda x, o: functools.partial(torch.sigmoid, x, out=o),
    "silu": lambda x, o: functools.partial(_aten.silu.out, x, out=o),
    "silu_dx": lambda x, o: functools.partial(_aten.silu_backward.grad_input, _ones(x), x, grad_input=o),
    "gelu": lambda x, o: functools.partial(_aten.gelu.out, x, out=o),
    "gelu_dx": lambda x, o: functools.partial(_aten.gelu_backward.grad_input, _ones(x), x, grad_input=o),
    "softplus": lambda x, o: functools.partial(_aten.softplus.out, x, 1, 20, out=o),  # = x above 20, in fp32 too
    "mish": lambda x, o: functools.partial(_aten.mish.out, x, out=o),
    "erf": lambda x, o: functools.partial(torch.erf, x, out=o),
    "rsqrt": lambda x, o: functools.partial(torch.rsqrt, x, out=o),  # 1 / sqrt(x), rounded as NumPy's
    "reciprocal": lambda x, o: functools.partial(torch.reciprocal, x, out=o),
}


def _by_torch(name: str):
    """ACTIVATIONS' function for a TORCH_ACTIVATIONS kernel: fp32 values in, a new fp32 array out."""
    bind = TORCH_ACTIVATIONS[name]

    def fn(x):
        x = np.require(x, _F32, ("C", "W"))
        out = np.empty_like(x)
        bind(torch.from_numpy(x), torch.from_numpy(out))()
        return out

    return fn


_erf, _sigmoid = _by_torch("erf"), _by_torch("sigmoid")


def _gelu_tanh(x):
    return (0.5 * x * (1.0 + np.tanh(_F32(0.7978845608028654) * (x + _F32(0.044715) * x * x * x)))).astype(_F32)


def _gelu_sigmoid_dx(x):
    s = _sigmoid(_F32(1.702) * x)
    return (s + _F32(1.702) * x * s * (1.0 - s)).astype(_F32, copy=False)


ACTIVATIONS: dict[str, object] = {
    "copy": lambda x: x,
    "identity": lambda x: x,
    "square": np.square,
    "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, _F32(0)),
    "prelu": lambda x: np.maximum(x, _F32(0)),  # slope 0 unless nisa.activate2 passes relu_param
    "gelu": _by_torch("gelu"),
    "gelu_dx": _by_torch("gelu_dx"),
    "gelu_apprx_tanh": _gelu_tanh,
    "gelu_apprx_sigmoid": lambda x: x * _sigmoid(_F32(1.702) * x),
    "gelu_apprx_sigmoid_dx": _gelu_sigmoid_dx,
    "silu": _by_torch("silu"),
    "silu_dx": _by_torch("silu_dx"),
    "tanh": np.tanh,
    "softplus": _by_torch("softplus"),
    "mish": _by_torch("mish"),
    "erf": _erf,
    "erf_dx": lambda x: (_F32(1.1283791670955126) * np.exp(-x * x)).astype(_F32, copy=False),
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": _by_torch("rsqrt"),
    "reciprocal": _by_torch("reciprocal"),
    "sin": np.sin,  # ScalarE does no range reduction; inputs outside [-pi, pi] are invalid on hardware
    "cos": np.cos,
    "tan": np.tan,
    "arctan": np.arctan,
    "sign": np.sign,
    "abs": np.abs,
    "negative": np.negative,
    "ceil": np.ceil,
    "floor": np.floor,
    "trunc": np.trunc,
    "logical_not": lambda x: (x == 0).astype(_F32),
}
_NUMPY_ACT = {
    np.exp: "exp", np.log: "log", np.sqrt: "sqrt", np.tanh: "tanh", np.square: "square", np.abs: "abs",
    np.sin: "sin", np.cos: "cos", np.tan: "tan", np.arctan: "arctan", np.sign: "sign", np.negative: "negative",
    np.reciprocal: "reciprocal", np.ceil: "ceil", np.floor: "floor", np.trunc: "trunc", np.copy: "copy",
}


def resolve_activation(op) -> tuple[str, object]:
    name = getattr(op, "_nki_op", None)
    if name is None:
        try:
            name = _NUMPY_ACT.get(op)
        except TypeError:
            name = None
    if name in ACTIVATIONS:
        return name, ACTIVATIONS[name]
    raise NkiValidationError(
        "activation-op", f"op={getattr(op, '__name__', op)!r} is not an activation function; use nl.exp, nl.copy, "
        f"nl.gelu, ... (one of {', '.join(ACTIVATIONS)})"
    )
