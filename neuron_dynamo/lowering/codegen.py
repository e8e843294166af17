"""The NKI code generator: fused element-wise chains and reductions as NKI 0.6 kernel source.

Library kernels cover the heavy, structured ops; everything between them (residual adds, scalings, masks, casts,
activation derivatives, statistics) becomes generated kernels. A *fused group* is a DAG of element-wise aten ops
over one output shape: its inputs are loaded into SBUF once per tile, every op of the chain runs on the tile, and
only the values the rest of the graph needs are stored, so data stays in SBUF between the fused ops.

The generator writes real NKI source (`import nki`, `nki.language as nl`), which the interpreter runs and the
real toolchain compiles. A kernel's source depends on the ops, constants and dtypes only, never on shapes or
values: shapes are runtime arguments, so one generated kernel serves every shape, and kernels are cached by source.

Layout (the planner for element-wise work): element-wise ops ignore the logical shape, so a group whose size is a
multiple of 128 is walked as [128, size/128] (every partition busy, long DMA rows), anything else as
[rows, last dim] with a ragged last row tile. Reductions put the kept dims on partitions and the reduced dims
along the free axis (`plan_reduction`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import linecache
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor

from neuron_dynamo.errors import NeuronDynamoError

PMAX = 128
COLS = 512  # free-dim chunk of a tile: small enough that long chains keep every temporary in SBUF at once

# torch dtype → the NKI dtype that stores it on device (int64 indices narrow to int32, bool is a 0/1 byte)
NKI_DTYPES = {
    torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.int32: "int32",
    torch.int64: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "uint8",
}
# The dtypes the device stores as another dtype (`to_device` narrows them): the only inputs to convert.
STORED_AS_OTHER = frozenset(dtype for dtype, name in NKI_DTYPES.items() if str(dtype) != f"torch.{name}")
INT32_RANGE = (-(2**31), 2**31 - 1)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the engines compute in


class CodegenError(NeuronDynamoError):
    """An op or dtype the NKI code generator cannot express."""


def nki_dtype(dtype: torch.dtype) -> str:
    try:
        return NKI_DTYPES[dtype]
    except KeyError:
        raise CodegenError(f"dtype {dtype} has no NKI storage type; cast it to float32 first") from None


def check_within(least: torch.Tensor, most: torch.Tensor, low: float, high: float, error: Exception) -> None:
    """Raise `error` unless low <= least and most <= high (0-dim tensors: a data check on the host, before a kernel
    that would read out of bounds). While a region is traced for TorchNeuron's compiler the values are unknown, so
    the check becomes an assertion inside the graph, run on the device."""
    if isinstance(least, FakeTensor):
        torch._assert_async((least >= low) & (most <= high), str(error))
    elif least.item() < low or most.item() > high:
        raise error


def to_device(t: torch.Tensor) -> torch.Tensor:
    """The tensor as the device stores it: int64 narrowed to int32 (checked), bool as 0/1 bytes."""
    if t.dtype == torch.int64:
        if t.numel():
            low, high = torch.aminmax(t)
            check_within(low, high, *INT32_RANGE,
                         CodegenError("an int64 tensor holds values outside int32, which NKI cannot store"))
        return t.to(torch.int32)
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    return t


def from_device(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Back from device storage to the dtype the graph expects (a kernel called without tensors returns NumPy)."""
    if not isinstance(t, torch.Tensor):
        t = torch.from_numpy(t.view(np.int16)).view(torch.bfloat16) if t.dtype.type.__name__ == "bfloat16" else (
            torch.from_numpy(t))
    return t if t.dtype == dtype else t.to(dtype)


# ------------------------------------------------------------------------------------------------ the fused-group IR
@dataclasses.dataclass(frozen=True)
class Ref:
    """An operand of a step: group input `index` (kind "in") or the result of step `index` (kind "step")."""

    kind: str
    index: int


@dataclasses.dataclass(frozen=True)
class Step:
    """One element-wise aten op of a group; args hold `Ref`s and Python constants."""

    op: Any
    args: tuple
    kwargs: tuple  # sorted (name, value) pairs
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """A fused group: input dtypes, steps in order, the step results it returns."""

    inputs: tuple[torch.dtype, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]


class Code:
    """A fragment of NKI source the generator itself writes (`(pr, cc)`): the one kind of text `_literal` pastes.

    Step constants come from FX graphs and from cache entries read back from disk, so a plain `str` among them is
    data, never code: `_literal` refuses it, and emitters only ever compare such strings (`rounding_mode="floor"`).
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Code({self.text!r})"


TILE_SHAPE = Code("(pr, cc)")  # the shape of the tile being generated (the loop's partition and free sizes)
_NKI_CALLABLE = re.compile(r"(nl|nisa)\.[a-z_][a-z0-9_]*\Z")
_NKI_DTYPE_NAMES = frozenset({*NKI_DTYPES.values(), "float32"})


def check_dtype_name(dtype: str) -> str:
    """`dtype` if it is an NKI dtype name the generator may write (`nl.<dtype>`), else CodegenError."""
    if dtype not in _NKI_DTYPE_NAMES:
        raise CodegenError(f"{dtype!r} is not an NKI dtype the code generator writes")
    return dtype


class Tile:
    """A value in SBUF during code generation: its variable name and NKI dtype."""

    def __init__(self, name: str, dtype: str) -> None:
        self.name = name
        self.dtype = dtype

    def __repr__(self) -> str:
        return self.name


class Emitter:
    """Collects the body lines of one tile iteration; `call` adds `vN = fn(args)` and returns the new tile.

    Every tile is assigned once and never written again, so a call written before (the same function of the same
    tiles and constants) gives the tile it gave then instead of a second instruction, and a call that returns its
    operand unchanged (a copy to the operand's own float dtype, a product with 1.0) gives the operand: each
    instruction saved is one less on the engines (and in the interpreter's replay)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._count = 0
        self._known: dict[Any, Tile] = {}

    def call(self, fn: str, *args: Any, dtype: str, **kwargs: Any) -> Tile:
        if not _NKI_CALLABLE.match(fn) or not all(k.isidentifier() for k in kwargs):
            raise CodegenError(f"{fn!r} is not an NKI function the code generator calls")
        if _returns_operand(fn, args, dtype, kwargs):
            return args[0]
        rendered = [_literal(a) for a in args] + [f"{k}={_literal(v)}" for k, v in kwargs.items()]
        expression = f"{fn}({', '.join(rendered)}, dtype=nl.{check_dtype_name(dtype)})"
        return self.once(expression, lambda name: self.lines.append(f"{name} = {expression}"), dtype)

    def once(self, key: Any, write: Callable[[str], None], dtype: str) -> Tile:
        """The tile computed under `key` before, or a new one that `write(name)` computes (its lines appended)."""
        tile = self._known.get(key)
        if tile is None:
            tile = self._known[key] = Tile(f"v{self._count}", dtype)
            self._count += 1
            write(tile.name)
        return tile

    def alloc(self, dtype: str) -> Tile:
        """A fresh SBUF tile of the current tile's shape, for ISA calls that write a `dst`."""
        name = f"v{self._count}"
        self._count += 1
        self.lines.append(f"{name} = nl.ndarray((pr, cc), dtype=nl.{check_dtype_name(dtype)}, buffer=nl.sbuf)")
        return Tile(name, dtype)

    def view(self, tile: Tile, dtype: str) -> Tile:
        """`tile`'s bits reinterpreted as `dtype` of the same size (`NkiTensor.view`): sign and exponent bits."""
        if not isinstance(tile, Tile):
            raise CodegenError(f"only a tile has bits to view, got {type(tile).__name__}")
        name = f"v{self._count}"
        self._count += 1
        self.lines.append(f"{name} = {tile.name}.view(nl.{check_dtype_name(dtype)})")
        return Tile(name, dtype)

    def raw(self, template: str, *values: Any) -> None:
        """A line of the generator's own `template`, its `{}` fields filled with `_literal(value)` (never text)."""
        self.lines.append(template.format(*(_literal(v) for v in values)))


def _returns_operand(fn: str, args: tuple, dtype: str, kwargs: dict) -> bool:
    """`fn(*args)` is its float operand itself: a copy to its own dtype, or a product with 1.0 (exact in IEEE
    arithmetic, -0, infinities and NaN included)."""
    if kwargs or not args or not isinstance(args[0], Tile) or args[0].dtype != dtype or dtype not in _FLOATS:
        return False
    if fn == "nl.copy":
        return len(args) == 1
    return fn == "nl.multiply" and len(args) == 2 and type(args[1]) is float and args[1] == 1.0


_FLOATS = frozenset({"float32", "bfloat16", "float16"})


def typed_constant(value: Any, dtype: str) -> float | int:
    """A Python constant of the kind a memset of `dtype` takes (floats for float tiles, ints otherwise)."""
    if not _is_number(value):
        raise CodegenError(f"a fill value must be a number, got {type(value).__name__}")
    return float(value) if dtype.startswith(("float", "bfloat")) else int(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.integer, np.floating))


def _literal(value: Any) -> str:
    """`value` as NKI source: a tile's name, a `Code` fragment, or an exactly written number. Nothing else: a `str`
    constant (which may come from a cache entry on disk) is data and is never pasted into source."""
    if isinstance(value, Tile):
        return value.name
    if isinstance(value, Code):
        return value.text
    if isinstance(value, (bool, np.bool_)):
        return "1.0" if value else "0.0"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        # Exact, infinities and NaN included: -inf masks must stay -inf (a finite stand-in changes softmax and
        # SDPA over fully masked rows, and 0 · -inf).
        return repr(value) if math.isfinite(value) else f'float("{value}")'
    if isinstance(value, (int, np.integer)):
        return repr(int(value))
    raise CodegenError(f"cannot embed {type(value).__name__} {value!r} in NKI source (only tiles, numbers and the "
                       "generator's own code fragments are written into a kernel)")


# An element-wise op's emitter: (emitter, out dtype, *operands, **kwargs) -> Tile (operands: Tiles or constants).
ElementwiseEmitter = Callable[..., Tile]
STEP_ARGS: dict[Any, Callable[..., tuple]] = {}
EMITTERS: dict[Any, ElementwiseEmitter] = {}


def emits(
    *ops: Any, step_args: Callable[..., tuple] | None = None,
) -> Callable[[ElementwiseEmitter], ElementwiseEmitter]:
    """Register the NKI emitter of the element-wise ops `ops` (packets).

    `step_args(op, args, kwargs) -> args` turns a call's arguments into the emitter's, for ops whose tensor
    arguments only lend a shape (`zeros_like(x)` writes a constant: x must not become a kernel input)."""

    def register(fn: ElementwiseEmitter) -> ElementwiseEmitter:
        for op in ops:
            EMITTERS[op] = fn
            if step_args is not None:
                STEP_ARGS[op] = step_args
        return fn

    return register


def emitter_for(op: Any) -> ElementwiseEmitter | None:
    packet = getattr(op, "overloadpacket", op)
    return EMITTERS.get(packet)


def step_args(op: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments of `op`'s emitter for one call (`emits(step_args=...)`; by default the call's own)."""
    convert = STEP_ARGS.get(getattr(op, "overloadpacket", op))
    return (convert(op, args, kwargs), {}) if convert is not None else (args, kwargs)


# ------------------------------------------------------------------------------------------------ source generation
HEADER = "import nki\nimport nki.isa as nisa\nimport nki.language as nl\n\n"


def elementwise_source(spec: GroupSpec, name: str) -> str:
    """The NKI source of a fused group: `kernel(in0, ..., shape, rows, cols) -> out0, ...`, inputs of the group's
    shape and outputs of `shape`, walked as [rows, cols] views (HBM reshapes inside the kernel: no data moves, and
    the caller hands tensors over and back as they are)."""
    _check_names(name)
    params = [f"in{i}" for i in range(len(spec.inputs))]
    out_dtypes = [nki_dtype(spec.steps[i].dtype) for i in spec.outputs]
    emitter = Emitter()
    values: dict[int, Tile] = {}
    loads: list[str] = []
    inputs: dict[int, Tile] = {}

    def operand(arg: Any) -> Any:
        if isinstance(arg, Ref):
            if arg.kind == "in":
                if arg.index not in inputs:
                    tile = Tile(f"t{arg.index}", nki_dtype(spec.inputs[arg.index]))
                    loads.append(f"t{arg.index} = nl.load(in{arg.index}[r0:r0 + pr, c0:c0 + cc])")
                    inputs[arg.index] = tile
                return inputs[arg.index]
            return values[arg.index]
        if isinstance(arg, (list, tuple)):
            return type(arg)(operand(a) for a in arg)
        return arg

    for index, step in enumerate(spec.steps):
        emit = emitter_for(step.op)
        if emit is None:
            raise CodegenError(f"no NKI emitter for {step.op}")
        args = [operand(a) for a in step.args]
        kwargs = {k: operand(v) for k, v in step.kwargs}
        result = emit(emitter, nki_dtype(step.dtype), *args, **kwargs)
        values[index] = _as_tile(emitter, result, nki_dtype(step.dtype))

    lines = [HEADER, "@nki.jit", f"def {name}({', '.join([*params, 'shape', 'rows', 'cols'])}):"]
    lines += [f"    {param} = {param}.reshape((rows, cols))" for param in params]
    outs = [f"out{k}" for k in range(len(spec.outputs))]
    for k, (out, dtype) in enumerate(zip(outs, out_dtypes, strict=True)):
        lines.append(f"    result{k} = nl.ndarray(shape, dtype=nl.{dtype}, buffer=nl.shared_hbm)")
        lines.append(f"    {out} = result{k}.reshape((rows, cols))")
    lines += [
        f"    for r0 in range(0, rows, {PMAX}):",
        f"        pr = min({PMAX}, rows - r0)",
        f"        for c0 in range(0, cols, {COLS}):",
        f"            cc = min({COLS}, cols - c0)",
    ]
    body = loads + emitter.lines
    for out, index in zip(outs, spec.outputs, strict=True):
        tile = values[index]
        body.append(f"nl.store({out}[r0:r0 + pr, c0:c0 + cc], value={tile.name})")
    lines += [f"            {line}" for line in body]
    results = [f"result{k}" for k in range(len(outs))]
    lines.append(f"    return {', '.join(results)}{',' if len(results) == 1 else ''}")
    return "\n".join(lines) + "\n"


def _check_names(name: str, *dtypes: str) -> None:
    if not name.isidentifier():
        raise CodegenError(f"{name!r} is not a kernel name")
    for dtype in dtypes:
        check_dtype_name(dtype)


def _as_tile(emitter: Emitter, value: Any, dtype: str) -> Tile:
    """A step result as a tile of its dtype (an emitter may return an operand or a constant unchanged)."""
    if isinstance(value, Tile):
        return value if value.dtype == dtype else emitter.call("nl.copy", value, dtype=dtype)
    raise CodegenError("an element-wise step produced no tile (all of its operands are constants)")


@functools.cache
def compile_source(source: str, name: str) -> Any:
    """Execute generated NKI source once and return its kernel (kept in linecache so errors show the line)."""
    from neuron_dynamo.nki import make_importable

    make_importable()
    filename = f"<nki-generated {name} {hashlib.sha1(source.encode()).hexdigest()[:10]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": f"neuron_dynamo.generated.{name}"}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated kernel source
    return namespace[name]


def source_name(prefix: str, key: str) -> str:
    return f"{prefix}_{hashlib.sha1(key.encode()).hexdigest()[:10]}"


# ------------------------------------------------------------------------------------------------ layout planning
def plan_elementwise(shape: Sequence[int]) -> tuple[int, int]:
    """The [rows, cols] view of a group: [128, n/128] when n divides, else [n/last, last]."""
    numel = math.prod(shape)
    if numel % PMAX == 0 and numel >= PMAX:
        return PMAX, numel // PMAX
    last = shape[-1] if len(shape) and shape[-1] > 0 else 1
    return numel // last, last


def plan_reduction(shape: Sequence[int], dims: Sequence[int]) -> tuple[list[int], int, int]:
    """A permutation putting the kept dims first (on partitions) and the reduced dims last, and [rows, cols]."""
    rank = len(shape)
    reduced = sorted({d % rank for d in dims}) if rank else []
    kept = [d for d in range(rank) if d not in reduced]
    rows = math.prod(shape[d] for d in kept)
    cols = math.prod(shape[d] for d in reduced)
    return kept + reduced, rows, cols


# ------------------------------------------------------------------------------------------------ reductions
REDUCE_OPS = {"sum": ("nl.sum", "nl.add"), "mean": ("nl.sum", "nl.add"), "amax": ("nl.max", "nl.maximum"),
              "amin": ("nl.min", "nl.minimum")}


def reduction_source(kind: str, in_dtype: str, out_dtype: str, name: str) -> str:
    """`kernel(x, shape, rows, cols) -> out of shape`: x (rows · cols elements, viewed as [rows, cols]) reduced
    along the free axis chunk by chunk in fp32 into the [rows, 1] view of out."""
    reduce_fn, combine = REDUCE_OPS[kind]
    _check_names(name, in_dtype, out_dtype)
    acc = "float32" if in_dtype.startswith(("float", "bfloat")) or kind in ("sum", "mean") else in_dtype
    finish = "            acc = nl.multiply(acc, 1.0 / cols, dtype=nl.float32)\n" if kind == "mean" else ""
    return (
        f"{HEADER}@nki.jit\ndef {name}(x, shape, rows, cols):\n"
        f"    x = x.reshape((rows, cols))\n"
        f"    result = nl.ndarray(shape, dtype=nl.{out_dtype}, buffer=nl.shared_hbm)\n"
        f"    out = result.reshape((rows, 1))\n"
        f"    for r0 in range(0, rows, {PMAX}):\n"
        f"        pr = min({PMAX}, rows - r0)\n"
        f"        acc = None\n"
        f"        for c0 in range(0, cols, {COLS}):\n"
        f"            cc = min({COLS}, cols - c0)\n"
        f"            t = nl.load(x[r0:r0 + pr, c0:c0 + cc])\n"
        f"            part = {reduce_fn}(t, axis=1, dtype=nl.{acc}, keepdims=True)\n"
        f"            acc = part if c0 == 0 else {combine}(acc, part, dtype=nl.{acc})\n"
        f"        if cols > 0:\n{finish}"
        f"            nl.store(out[r0:r0 + pr, 0:1], value=nl.copy(acc, dtype=nl.{out_dtype}))\n"
        f"    return result\n"
    )


# ------------------------------------------------------------------------------------------------ row kernels
ROW_COLS = 8192  # a row kernel holds whole rows in SBUF: [128, 8192] fp32 is 32 KiB per partition


def row_source(kind: str, dtype: str, name: str) -> str:
    """Kernels that need a whole row at once (a row statistic broadcast back over the row), rows on partitions.

    `softmax_backward(grad, y)`:      y · (grad - Σ grad·y)
    `log_softmax_backward(grad, y)`:  grad - exp(y) · Σ grad
    `row_moments(x)`:                 (mean, 1/sqrt(var + eps)) per row, fp32 [rows, 1] each
    """
    if kind not in ("row_moments", "softmax_backward", "log_softmax_backward"):
        raise CodegenError(f"no row kernel {kind!r}")
    _check_names(name, dtype)
    f32 = "nl.float32"
    head = [HEADER, "@nki.jit"]
    if kind == "row_moments":
        head.append(f"def {name}(x, rows, cols, eps):")
        head.append(f"    mean_out = nl.ndarray((rows, 1), dtype={f32}, buffer=nl.shared_hbm)")
        head.append(f"    rstd_out = nl.ndarray((rows, 1), dtype={f32}, buffer=nl.shared_hbm)")
    else:
        head.append(f"def {name}(grad, y, rows, cols):")
        head.append(f"    out = nl.ndarray((rows, cols), dtype=nl.{dtype}, buffer=nl.shared_hbm)")
    head += [f"    for r0 in range(0, rows, {PMAX}):", f"        pr = min({PMAX}, rows - r0)"]
    if kind == "row_moments":
        body = [
            "t = nl.load(x[r0:r0 + pr, 0:cols], dtype=nl.float32)",
            f"mean = nl.multiply(nl.sum(t, axis=1, keepdims=True, dtype={f32}), 1.0 / cols, dtype={f32})",
            f"centred = nl.ndarray((pr, cols), dtype={f32}, buffer=nl.sbuf)",
            "nisa.tensor_scalar(dst=centred, data=t, op0=nl.subtract, operand0=mean)",
            f"var = nl.multiply(nl.sum(nl.square(centred, dtype={f32}), axis=1, keepdims=True, dtype={f32}), "
            f"1.0 / cols, dtype={f32})",
            f"rstd = nl.rsqrt(nl.add(var, eps, dtype={f32}), dtype={f32})",
            "nl.store(mean_out[r0:r0 + pr, 0:1], value=mean)",
            "nl.store(rstd_out[r0:r0 + pr, 0:1], value=rstd)",
        ]
        tail = ["    return mean_out, rstd_out"]
    else:
        body = [
            "g = nl.load(grad[r0:r0 + pr, 0:cols], dtype=nl.float32)",
            "yt = nl.load(y[r0:r0 + pr, 0:cols], dtype=nl.float32)",
            f"res = nl.ndarray((pr, cols), dtype={f32}, buffer=nl.sbuf)",
        ]
        if kind == "softmax_backward":
            body += [
                f"s = nl.sum(nl.multiply(g, yt, dtype={f32}), axis=1, keepdims=True, dtype={f32})",
                "nisa.tensor_scalar(dst=res, data=g, op0=nl.subtract, operand0=s)",
                f"res = nl.multiply(res, yt, dtype={f32})",
            ]
        else:
            body += [
                f"s = nl.sum(g, axis=1, keepdims=True, dtype={f32})",
                f"nisa.tensor_scalar(dst=res, data=nl.exp(yt, dtype={f32}), op0=nl.multiply, operand0=s)",
                f"res = nl.subtract(g, res, dtype={f32})",
            ]
        body.append(f"nl.store(out[r0:r0 + pr, 0:cols], value=nl.copy(res, dtype=nl.{dtype}))")
        tail = ["    return out"]
    return "\n".join(head + [f"        {line}" for line in body] + tail) + "\n"


def run_row_kernel(kind: str, *tensors: torch.Tensor, extra: tuple = ()) -> Any:
    """Run a row kernel on [rows, last dim] views of `tensors` (the dim it works on must be the last)."""
    from neuron_dynamo.toolchain.simulator import launch

    first = tensors[0]
    cols = first.shape[-1] if first.dim() else 1
    rows = first.numel() // max(cols, 1)
    dtype = nki_dtype(first.dtype)
    name = source_name(kind, dtype)
    kernel = compile_source(row_source(kind, dtype, name), name)
    views = [t.contiguous().reshape(rows, cols) for t in tensors]
    return launch(kernel, *views, rows, cols, *extra)
