"""Average and max pooling, fixed-window and adaptive, as separable window reductions.

A pooling window is a box, so it is reduced one spatial dim at a time (innermost first): along a dim every output
reads the same few "taps" (window positions), gathered by one indirect-DMA gather (`resample.gather_taps`) and
combined by one fused element-wise kernel. The tap positions and which of them lie inside the input are host
constants of the sizes and arguments; taps outside the input are masked, never read as a padding value.

- average: the masked taps are summed in fp32 and the sum divided by torch's divisor for each output
  (`count_include_pad`, `divisor_override`, ceil-mode windows clipped as `cpu_avg_pool` clips them).
- max with indices: torch scans a window in row-major order and takes a value when `v > max or isnan(v)`, so it
  returns the first maximum, or the last NaN. Reducing the innermost dim first with the same rule and carrying the
  flat index (`h · W + w` within the input plane) gives the same value and index: the first row holding the
  window's maximum holds its first occurrence, and the last row holding a NaN its last NaN. Each dim's first tap
  is the first in-bounds position, so an all -inf window returns its first element's index, as torch does.
  Indices are int32 on device, and their sums are formed in fp32: planes of 2**24 elements or more are refused.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.registry import lowers
from neuron_dynamo.lowering.resample import EXACT_OFFSETS, gather_taps

aten = torch.ops.aten

AVG = (aten.avg_pool2d.default, aten.avg_pool3d.default)
MAX = (aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
ADAPTIVE_AVG = (aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
ADAPTIVE_MAX = (aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
SPATIAL = {**dict.fromkeys((AVG[0], MAX[0], ADAPTIVE_AVG[0], ADAPTIVE_MAX[0]), 2),
           **dict.fromkeys((AVG[1], MAX[1], ADAPTIVE_AVG[1], ADAPTIVE_MAX[1]), 3)}


@lowers(*AVG, *MAX, *ADAPTIVE_AVG, *ADAPTIVE_MAX, family="pooling")
def pooling(op, *args, **kwargs):
    """Reference kernel: torch pools."""
    return op(*args, **kwargs)


# ------------------------------------------------------------------------------------------------ windows (host)
class Window:
    """One spatial dim of a pooling: tap positions [taps, out] (clipped into the input) and which are inside it."""

    def __init__(self, raw: np.ndarray, valid: np.ndarray, in_size: int) -> None:
        self.valid = valid
        self.positions = np.clip(raw, 0, in_size - 1)

    @property
    def taps(self) -> int:
        return self.positions.shape[0]

    def seeded(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions, inside) with each output's first in-bounds position as an extra leading tap: the max's
        seed, so that a window of -inf returns its first element's index."""
        first = self.positions[np.argmax(self.valid, axis=0), np.arange(self.valid.shape[1])]
        inside = np.concatenate([np.ones((1, self.valid.shape[1]), bool), self.valid])
        return np.concatenate([first[None], self.positions]), inside


def output_size(in_size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """torch's `pooling_output_shape`."""
    span = in_size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= in_size + pad:
        out -= 1
    return out


def fixed_window(in_size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> Window:
    out = output_size(in_size, kernel, stride, pad, dilation, ceil_mode)
    raw = np.arange(out)[None] * stride - pad + np.arange(kernel)[:, None] * dilation
    return Window(raw, (raw >= 0) & (raw < in_size), in_size)


def adaptive_window(in_size: int, out: int) -> Window:
    """Output o pools [floor(o · in / out), ceil((o + 1) · in / out)), as torch's start/end_index."""
    start = np.arange(out) * in_size // out
    end = ((np.arange(out) + 1) * in_size + out - 1) // out
    taps = int((end - start).max())
    offset = np.arange(taps)[:, None]
    return Window(start[None] + offset, offset < (end - start)[None], in_size)


def avg_divisor(in_size: int, kernel: int, stride: int, pad: int, ceil_mode: bool) -> tuple[np.ndarray, ...]:
    """Per output: (window length counting padding, in-bounds length), as `cpu_avg_pool` clips them."""
    out = output_size(in_size, kernel, stride, pad, 1, ceil_mode)
    start = np.arange(out) * stride - pad
    end = np.minimum(start + kernel, in_size + pad)
    return end - start, np.minimum(end, in_size) - np.maximum(start, 0)


def _outer(factors: Sequence[np.ndarray]) -> np.ndarray:
    return functools.reduce(np.multiply.outer, factors)


# ------------------------------------------------------------------------------------------------ traced code
def _column(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-output host vector shaped to broadcast over a gathered piece ([out, *rest])."""
    return values.reshape([values.shape[0]] + [1] * (like.dim() - 1))


def _window_sum(x: torch.Tensor, dim: int, positions: torch.Tensor, outside: torch.Tensor) -> torch.Tensor:
    pieces = gather_taps(x, dim, positions, outside.shape[0])
    total = pieces[0].masked_fill(_column(outside[0], pieces[0]), 0.0)
    for tap in range(1, len(pieces)):
        total = total + pieces[tap].masked_fill(_column(outside[tap], pieces[tap]), 0.0)
    return total.movedim(0, dim)


def _average(x: torch.Tensor, divisor: torch.Tensor, *windows: torch.Tensor) -> torch.Tensor:
    """x summed over its windows (pairs of positions and outside-masks, innermost dim first) / divisor."""
    total = x.float()
    for k in range(len(windows) // 2):
        total = _window_sum(total, x.dim() - 1 - k, windows[2 * k], windows[2 * k + 1])
    return (total / divisor).to(x.dtype)


def _window_max(values, index, dim, positions, inside, offsets):
    """The max of each window along `dim` and its flat index, taking `v > max or isnan(v)` in tap order."""
    taps = inside.shape[0]
    pieces = gather_taps(values, dim, positions, taps)
    carried = None if index is None else gather_taps(index, dim, positions, taps)
    best = pieces[0]
    where = _column(offsets[0], best) + (0 if carried is None else carried[0])
    where = where.expand(best.shape).clone()
    for tap in range(1, taps):
        value = pieces[tap]
        take = _column(inside[tap], value) & ((value > best) | (value != value))
        best = torch.where(take, value, best)
        where = torch.where(take, _column(offsets[tap], value) + (0 if carried is None else carried[tap]), where)
    return best.movedim(0, dim), where.movedim(0, dim)


def _maximum(x: torch.Tensor, *windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x's window maxima and their flat indices; `windows` holds triples (positions, inside, offsets)."""
    best, index = x, None
    for k in range(len(windows) // 3):
        best, index = _window_max(best, index, x.dim() - 1 - k, *windows[3 * k:3 * k + 3])
    return best, index


# ------------------------------------------------------------------------------------------------ kernels
def _pair(values: Sequence[int] | int, spatial: int, default: Sequence[int] | None = None) -> list[int]:
    values = [values] if isinstance(values, int) else list(values)
    if not values and default is not None:
        return list(default)
    return values * spatial if len(values) == 1 else values


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


def _windows(op, x: torch.Tensor, args: Sequence) -> list[Window]:
    """The windows of each spatial dim of x, innermost first."""
    spatial = SPATIAL[op]
    sizes = list(x.shape[-spatial:])
    if op in ADAPTIVE_AVG or op in ADAPTIVE_MAX:
        windows = [adaptive_window(i, o) for i, o in zip(sizes, _pair(args[0], spatial), strict=True)]
    else:
        kernel = _pair(args[0], spatial)
        stride = _pair(args[1] if len(args) > 1 else [], spatial, kernel)
        pad = _pair(args[2] if len(args) > 2 else 0, spatial)
        dilation = _pair(args[3] if op in MAX and len(args) > 3 else 1, spatial)
        ceil_mode = bool(args[4 if op in MAX else 3]) if len(args) > (4 if op in MAX else 3) else False
        windows = [fixed_window(*dims, ceil_mode) for dims in zip(sizes, kernel, stride, pad, dilation, strict=True)]
    return windows[::-1]


def _avg_divisor(op, x: torch.Tensor, args: Sequence, windows: list[Window]) -> np.ndarray:
    spatial = SPATIAL[op]
    if op in ADAPTIVE_AVG:
        return _outer([w.valid.sum(axis=0) for w in windows[::-1]]).astype(np.float32)
    kernel = _pair(args[0], spatial)
    stride = _pair(args[1] if len(args) > 1 else [], spatial, kernel)
    pad = _pair(args[2] if len(args) > 2 else 0, spatial)
    ceil_mode, count_include_pad, divisor_override = (list(args[3:]) + [False, True, None][len(args[3:]):])[:3]
    lengths = [avg_divisor(*dims, ceil_mode) for dims in zip(x.shape[-spatial:], kernel, stride, pad, strict=True)]
    inside = _outer([n for _, n in lengths])
    divisor = _outer([n for n, _ in lengths]) if count_include_pad else inside
    if divisor_override:
        divisor = np.full(divisor.shape, divisor_override)
    return np.where(inside > 0, divisor, 1).astype(np.float32)  # an empty window sums to 0, as torch returns


def _largest_intermediate(x_shape: Sequence[int], windows: list[Window]) -> int:
    sizes = list(x_shape)
    largest = math.prod(sizes)
    for k, window in enumerate(windows):
        sizes[len(sizes) - 1 - k] = window.positions.shape[1] * window.taps
        largest = max(largest, math.prod(sizes))
        sizes[len(sizes) - 1 - k] = window.positions.shape[1]
    return largest


def _refusal(node: fx.Node) -> str | None:
    x = node.args[0].meta["val"]
    if x.dtype not in codegen.FLOAT_DTYPES:
        return f"pooling of {x.dtype}"
    if x.dim() != SPATIAL[node.target] + 2 and x.dim() != SPATIAL[node.target] + 1:
        return f"pooling of a {x.dim()}-D input"
    if _empty_result(node.meta["val"]):
        return None  # nothing to compute: the kernel returns the empty result
    windows = _windows(node.target, x, node.args[1:])
    if _largest_intermediate(x.shape, windows) >= EXACT_OFFSETS:
        return "pooling over 2**24 gathered elements or more (gather offsets and indices would not be exact)"
    return None


def _empty_result(value) -> bool:
    return any(t.numel() == 0 for t in (value if isinstance(value, (tuple, list)) else [value]))


def _empty_output(op, x: torch.Tensor, args: Sequence):
    """The op's result if it has no elements (shapes and dtypes from torch's meta function, which raises where
    eager does: an empty input plane with a non-empty output), else None."""
    expected = op(x.to("meta"), *args)
    if not _empty_result(expected):
        return None
    if isinstance(expected, tuple):
        return tuple(torch.empty(t.shape, dtype=t.dtype) for t in expected)
    return torch.empty(expected.shape, dtype=expected.dtype)


@lowers(*AVG, *ADAPTIVE_AVG, family="pooling", target="simulator", accepts=_refusal, handles_empty=True)
def average_pool(op, x, *args):
    from neuron_dynamo.lowering.generated import run_traced

    empty = _empty_output(op, x, args)
    if empty is not None:
        return empty
    windows = _windows(op, x, args)
    inputs = [_tensor(_avg_divisor(op, x, args, windows))]
    for window in windows:
        inputs += [_tensor(window.positions.reshape(-1)), _tensor(~window.valid)]
    return run_traced("average_pool", _average, [x, *inputs])


@lowers(*MAX, *ADAPTIVE_MAX, family="pooling", target="simulator", accepts=_refusal, handles_empty=True)
def max_pool(op, x, *args):
    from neuron_dynamo.lowering.generated import run_traced

    empty = _empty_output(op, x, args)
    if empty is not None:
        return empty
    windows = _windows(op, x, args)
    inputs = []
    plane_stride = 1  # of the dim being reduced, within one input plane
    for k, window in enumerate(windows):
        positions, inside = window.seeded()
        inputs += [_tensor(positions.reshape(-1)), _tensor(inside), _tensor(positions * plane_stride)]
        plane_stride *= x.shape[-1 - k]
    return run_traced("max_pool", _maximum, [x, *inputs])
