"""The ALU operators and activation functions that ISA instructions accept as `op=`, with their fp32 semantics.

Kernels name an operator with an `nl.*` function (`op=nl.add`, `op=nl.exp`) or, as many NKI examples do, with the
NumPy function of the same meaning (`np.add`, `np.exp`, `np.max`). Both resolve here to one `AluOp` / activation.
Arithmetic ALU ops compute in fp32 (comparisons give 1.0/0.0); bit-vector ops work on the integer bit patterns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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


def _erf(x: np.ndarray) -> np.ndarray:
    import torch

    return torch.special.erf(torch.from_numpy(np.ascontiguousarray(x))).numpy()


def _sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x))).astype(_F32, copy=False)


def _gelu(x):
    return (0.5 * x * (1.0 + _erf(x * _F32(0.7071067811865476)))).astype(_F32, copy=False)


def _gelu_dx(x):
    pdf = np.exp(-0.5 * x * x) * _F32(0.3989422804014327)
    return (0.5 * (1.0 + _erf(x * _F32(0.7071067811865476))) + x * pdf).astype(_F32, copy=False)


def _gelu_tanh(x):
    return (0.5 * x * (1.0 + np.tanh(_F32(0.7978845608028654) * (x + _F32(0.044715) * x * x * x)))).astype(_F32)


def _gelu_sigmoid_dx(x):
    s = _sigmoid(_F32(1.702) * x)
    return (s + _F32(1.702) * x * s * (1.0 - s)).astype(_F32, copy=False)


def _silu_dx(x):
    s = _sigmoid(x)
    return (s * (1.0 + x * (1.0 - s))).astype(_F32, copy=False)


def _softplus(x):
    return np.logaddexp(_F32(0), x).astype(_F32, copy=False)


ACTIVATIONS: dict[str, object] = {
    "copy": lambda x: x,
    "identity": lambda x: x,
    "square": np.square,
    "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, _F32(0)),
    "prelu": lambda x: np.maximum(x, _F32(0)),  # slope 0 unless nisa.activate2 passes relu_param
    "gelu": _gelu,
    "gelu_dx": _gelu_dx,
    "gelu_apprx_tanh": _gelu_tanh,
    "gelu_apprx_sigmoid": lambda x: x * _sigmoid(_F32(1.702) * x),
    "gelu_apprx_sigmoid_dx": _gelu_sigmoid_dx,
    "silu": lambda x: x * _sigmoid(x),
    "silu_dx": _silu_dx,
    "tanh": np.tanh,
    "softplus": _softplus,
    "mish": lambda x: x * np.tanh(_softplus(x)),
    "erf": _erf,
    "erf_dx": lambda x: (_F32(1.1283791670955126) * np.exp(-x * x)).astype(_F32, copy=False),
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: (_F32(1) / np.sqrt(x)).astype(_F32, copy=False),
    "reciprocal": lambda x: (_F32(1) / x).astype(_F32, copy=False),
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
