"""Tensor creation ops (full, zeros_like, arange, ...): the value each writes, and its NKI emitter.

On device these are memsets and iota patterns in SBUF. Their tensor arguments only lend a shape, so the code
generator takes `fill_value`'s constants as the step's arguments (`codegen.emits(step_args=...)`). The kernels
are registered with the element-wise ones (`elementwise.py`), whose refusals they share.
"""

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.codegen import TILE_SHAPE, Tile, emits

aten = torch.ops.aten

CREATION_OPS = (
    aten.full, aten.full_like, aten.zeros, aten.zeros_like, aten.ones, aten.ones_like, aten.empty, aten.empty_like,
    aten.new_zeros, aten.new_ones, aten.new_full, aten.new_empty, aten.scalar_tensor, aten.arange, aten.fill,
    aten.empty_permuted, aten.new_empty_strided,
)
# An empty tensor's values are undefined: its kernel writes zeros (no uninitialised device memory leaks out).
_EMPTY = (aten.empty, aten.empty_like, aten.new_empty, aten.empty_permuted, aten.new_empty_strided)


def fill_value(node_or_op, args, kwargs):
    """The value a creation op writes (its tensor arguments only give a shape), as step args."""
    op = getattr(node_or_op, "overloadpacket", node_or_op)
    if op in (aten.zeros, aten.zeros_like, aten.new_zeros) or op in _EMPTY:
        return (0,)
    if op in (aten.ones, aten.ones_like, aten.new_ones):
        return (1,)
    if op in (aten.full, aten.full_like, aten.fill):
        return (args[1],)
    if op is aten.new_full:
        return (args[2],)
    if op is aten.scalar_tensor:
        return (args[0],)
    if op is aten.arange:
        numbers = [a for a in args if not isinstance(a, fx.Node)]
        start, step = (0, 1) if len(numbers) == 1 else (numbers[0], numbers[2] if len(numbers) > 2 else 1)
        return (start, step)
    raise codegen.CodegenError(f"{op} is not a creation op")


# Creation ops: a memset of the tile (their tensor arguments only lend a shape; the group builder drops them).
@emits(*[op for op in CREATION_OPS if op is not aten.arange], step_args=fill_value)
def _fill(e, dt, value):
    if isinstance(value, Tile):  # fill.Tensor: a 0-d tensor broadcast over the tile
        return e.call("nl.copy", value, dtype=dt)
    return e.call("nl.full", TILE_SHAPE, codegen.typed_constant(value, dt), dtype=dt)


@emits(aten.arange, step_args=fill_value)
def _arange(e, dt, start, step):
    # element (r0 + p, c0 + c) of the [rows, cols] view is number (r0 + p)·cols + c0 + c of the range
    if not all(isinstance(v, (int, float)) for v in (start, step)):
        raise codegen.CodegenError(f"arange start and step must be numbers, got {start!r} and {step!r}")
    start, step = (int(v) if isinstance(v, bool) else v for v in (start, step))
    fractional = isinstance(start, float) or isinstance(step, float)
    index = e.alloc("int32")
    if fractional:  # start + step·i in fp32 (the index is exact: `refusal` keeps it below 2**24)
        e.raw("nisa.iota({}, [[1, cc]], offset=r0 * cols + c0, channel_multiplier=cols)", index)
        scaled = e.call("nl.multiply", e.call("nl.copy", index, dtype="float32"), float(step), dtype="float32")
        return e.call("nl.add", scaled, float(start), dtype=dt)
    e.raw("nisa.iota({}, [[{}, cc]], offset={} + (r0 * cols + c0) * {}, channel_multiplier=cols * {})",
          index, step, start, step, step)
    return e.call("nl.copy", index, dtype=dt)
