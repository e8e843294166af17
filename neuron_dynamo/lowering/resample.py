"""Upsampling (nearest, nearest-exact, linear, bilinear, bicubic, trilinear) as gathers and weighted sums.

torch's CPU kernels are separable: along each spatial dim (innermost first) every output reads a few input
positions ("taps") and, except for nearest, sums them times per-output weights. The positions and weights depend
only on the sizes and arguments, so they are computed here on the host with torch's own float32 index arithmetic
(the CPU kernel is built with FMA contraction: `scale * (i + 0.5) - 0.5` is rounded once), and passed to the
kernels as inputs. On device each dim is one indirect-DMA gather of the taps' rows (`aten.index` on the dim
moved to the front) and one fused kernel multiplying and summing them in fp32, so zero weights multiply as in
torch (0 · inf is NaN there too).

`F.interpolate` never reaches these ops under AOTAutograd: PyTorch decomposes its `.vec` overloads in Python at
dispatch (into arange, casts and `aten.index`), so only direct calls of the `.default` overloads come here.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten
f32 = np.float32
EXACT_OFFSETS = 2**24  # the gather forms element offsets in fp32 arithmetic: exact below this

NEAREST = (aten.upsample_nearest1d.default, aten.upsample_nearest2d.default, aten.upsample_nearest3d.default)
NEAREST_EXACT = (aten._upsample_nearest_exact1d.default, aten._upsample_nearest_exact2d.default,
                 aten._upsample_nearest_exact3d.default)
LINEAR = (aten.upsample_linear1d.default, aten.upsample_bilinear2d.default, aten.upsample_trilinear3d.default)
CUBIC = (aten.upsample_bicubic2d.default,)


@lowers(*NEAREST, *NEAREST_EXACT, *LINEAR, *CUBIC, family="resample")
def resample(op, *args, **kwargs):
    """Reference kernel: torch interpolates."""
    return op(*args, **kwargs)


# ------------------------------------------------------------------------------------------------ host index math
def _scale(in_size: int, out_size: int, align_corners: bool, scale: float | None) -> np.float32:
    """torch's `area_pixel_compute_scale` in float32 (`compute_scales_value` when not aligning corners)."""
    if align_corners:
        return f32(in_size - 1) / f32(out_size - 1) if out_size > 1 else f32(0)
    return f32(1.0 / scale) if scale is not None and scale > 0 else f32(in_size) / f32(out_size)


def _centre(scale: np.float32, out_size: int) -> np.ndarray:
    """`scale * (i + 0.5) - 0.5` rounded once to float32, as the FMA-contracted CPU kernel computes it."""
    return (np.float64(scale) * (np.arange(out_size) + 0.5) - 0.5).astype(f32)


def nearest_taps(in_size: int, out_size: int, scale: float | None, exact: bool) -> tuple[np.ndarray, None]:
    """The source of each output: floor(i · scale) (OpenCV's nearest), or floor of the pixel centre + 0.5."""
    s = _scale(in_size, out_size, False, scale)
    source = np.floor(_centre(s, out_size) + f32(0.5)) if exact else np.floor(np.arange(out_size).astype(f32) * s)
    return np.minimum(source.astype(np.int64), in_size - 1)[None], None


def linear_taps(in_size: int, out_size: int, scale: float | None, align_corners: bool) -> tuple[np.ndarray, ...]:
    """Two sources per output and their weights (`compute_source_index_and_lambda`)."""
    if in_size == out_size:
        same = np.arange(out_size)
        return np.stack([same, same]), np.stack([np.ones(out_size, f32), np.zeros(out_size, f32)])
    s = _scale(in_size, out_size, align_corners, scale)
    real = (np.arange(out_size).astype(f32) * s) if align_corners else np.maximum(_centre(s, out_size), f32(0))
    first = np.minimum(np.floor(real).astype(np.int64), in_size - 1)
    weight = np.clip(real - first.astype(f32), f32(0), f32(1)).astype(f32)
    second = first + (first < in_size - 1)
    return np.stack([first, second]), np.stack([f32(1) - weight, weight])


def _cubic_near(x: np.ndarray, a: np.float32) -> np.ndarray:
    return ((a + f32(2)) * x - (a + f32(3))) * x * x + f32(1)


def _cubic_far(x: np.ndarray, a: np.float32) -> np.ndarray:
    return ((a * x - f32(5) * a) * x + f32(8) * a) * x - f32(4) * a


def cubic_taps(in_size: int, out_size: int, scale: float | None, align_corners: bool) -> tuple[np.ndarray, ...]:
    """Four clamped sources per output and the cubic-convolution weights (A = -0.75) of `HelperInterpCubic`."""
    s = _scale(in_size, out_size, align_corners, scale)
    real = (np.arange(out_size).astype(f32) * s) if align_corners else _centre(s, out_size)
    first = np.minimum(np.floor(real).astype(np.int64), in_size - 1)
    t = np.clip(real - first.astype(f32), f32(0), f32(1)).astype(f32)
    a = f32(-0.75)
    weights = [_cubic_far(t + f32(1), a), _cubic_near(t, a), _cubic_near(f32(1) - t, a),
               _cubic_far(f32(1) - t + f32(1), a)]
    sources = [np.clip(first - 1 + j, 0, in_size - 1) for j in range(4)]
    return np.stack(sources), np.stack(weights).astype(f32)


# ------------------------------------------------------------------------------------------------ device side
def gather_taps(x: torch.Tensor, dim: int, sources: torch.Tensor, taps: int) -> list[torch.Tensor]:
    """For traced code: x read at `sources` ([taps · out] positions) along `dim`, as `taps` tensors with that dim
    first ([out, *rest]): one indirect-DMA gather of rows of x with `dim` moved to the front."""
    rows = x.movedim(dim, 0)[sources]
    pieces = rows.reshape(taps, rows.shape[0] // taps, *rows.shape[1:])
    return [pieces[t] for t in range(taps)]


def _interpolate(x: torch.Tensor, *plan: torch.Tensor, weighted: bool) -> torch.Tensor:
    """x resampled along its last dims: `plan` holds per dim (innermost first) the sources, then the weights if
    `weighted` (summed in fp32, rounded once to x's dtype)."""
    plan = list(plan)
    out = x
    dim = x.dim() - 1
    while plan:
        sources = plan.pop(0)
        weights = plan.pop(0) if weighted else None
        taps = 1 if weights is None else weights.shape[0]
        pieces = gather_taps(out, dim, sources, taps)
        if weights is None:
            moved = pieces[0]
        else:
            shape = [weights.shape[1]] + [1] * (out.dim() - 1)
            moved = pieces[0].float() * weights[0].reshape(shape)
            for t in range(1, taps):
                moved = moved + pieces[t].float() * weights[t].reshape(shape)
        out = moved.movedim(0, dim)
        dim -= 1
    return out.to(x.dtype)


def _arguments(op, args: Sequence) -> tuple[list[int], bool, list[float | None]]:
    """(output sizes, align_corners, per-dim scales) from any of the `.default` overloads' argument lists."""
    output_size = list(args[0])
    rest = list(args[1:])
    align_corners = False
    if op in LINEAR or op in CUBIC:
        align_corners = bool(rest.pop(0)) if rest else False
    scales = (rest + [None] * len(output_size))[:len(output_size)]
    return output_size, align_corners, scales


def _plan(op, in_sizes: Sequence[int], args: Sequence) -> list[np.ndarray]:
    out_sizes, align_corners, scales = _arguments(op, args)
    plan = []
    for in_size, out_size, scale in reversed(list(zip(in_sizes, out_sizes, scales, strict=True))):
        if op in LINEAR:
            sources, weights = linear_taps(in_size, out_size, scale, align_corners)
        elif op in CUBIC:
            sources, weights = cubic_taps(in_size, out_size, scale, align_corners)
        else:
            sources, weights = nearest_taps(in_size, out_size, scale, op in NEAREST_EXACT)
        plan.append(sources.reshape(-1))
        if weights is not None:
            plan.append(weights)
    return plan


def _refusal(node: fx.Node) -> str | None:
    x = node.args[0].meta["val"]
    interpolating = node.target not in NEAREST + NEAREST_EXACT
    allowed = codegen.FLOAT_DTYPES if interpolating else (*codegen.FLOAT_DTYPES, torch.uint8)
    if x.dtype not in allowed:
        return f"{'interpolation' if interpolating else 'nearest upsampling'} of {x.dtype}"
    sizes = [x.numel(), node.meta["val"].numel()]
    if max(sizes) * (4 if interpolating else 1) >= EXACT_OFFSETS:
        return "resampling a tensor of 2**24 elements or more (gather offsets would not be exact)"
    return None


@lowers(*NEAREST, *NEAREST_EXACT, *LINEAR, *CUBIC, family="resample", target="simulator", accepts=_refusal)
def resample_nki(op, x, *args):
    """x gathered and weighted one spatial dim at a time (see the module docstring)."""
    from neuron_dynamo.lowering.generated import run_traced

    spatial = len(args[0])
    plan = [torch.from_numpy(np.ascontiguousarray(p)) for p in _plan(op, x.shape[-spatial:], args)]
    weighted = op not in NEAREST + NEAREST_EXACT
    return run_traced(f"resample:{weighted}", functools.partial(_interpolate, weighted=weighted), [x, *plan])
