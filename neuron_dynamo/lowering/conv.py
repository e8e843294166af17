"""Convolution and its backward on TensorE: im2col by access patterns, one matmul per group.

A convolution is a matmul once every kernel offset's strided slice of the (zero-padded) input is stacked on the
contraction dim ("im2col"): the slices are views, the stack is one DMA kernel (`cat`), and the weight
[out, in/groups · kernel] multiplies it on the library's matmul kernel, groups as the batch of a bmm. Products
are the ones torch forms: padding zeros meet every weight, as in torch (0 · inf is NaN there too).

A transposed convolution scatters instead of gathering: each input position times the weight lands on
`i · stride + k · dilation - padding`. Here one matmul gives every (offset, input position) product, then each
offset's products are spread out with zeros between them (stride) and shifted into place (a constant pad or a
crop), and the offsets summed. Adding placed zeros is exact and never multiplies one, matching torch's col2im,
which multiplies only real products.

`convolution_backward` is made of the same two pieces: the input gradient of a convolution is a transposed
convolution of the output gradient (and vice versa), and the weight gradient is the gradient matmul'd with the
im2col of the input (of the output gradient for a transposed convolution).

Everything is computed in fp32 and rounded once to the operands' dtype (torch's CPU kernels accumulate bf16 and
fp16 in fp32 too).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten


@lowers(aten.convolution, aten.convolution_backward, family="convolution")
def convolution_reference(op, *args, **kwargs):
    """Reference kernel: torch convolves."""
    return op(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The spatial arguments of one convolution, one entry per spatial dim."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    @classmethod
    def of(cls, spatial: int, stride, padding, dilation, groups) -> Geometry:
        def per_dim(values) -> tuple[int, ...]:
            values = [values] if isinstance(values, int) else list(values)
            return tuple(values * spatial if len(values) == 1 else values)

        return cls(per_dim(stride), per_dim(padding), per_dim(dilation), int(groups))


# ------------------------------------------------------------------------------------------------ traced code
def im2col(x: torch.Tensor, kernel: tuple[int, ...], geometry: Geometry, out_sizes: tuple[int, ...]) -> torch.Tensor:
    """[groups, in/groups · prod(kernel), batch · prod(out)] from x [batch, in, *spatial]: row (c, k) holds the
    input channel c at kernel offset k for every output position (padding zeros included)."""
    batch, channels = x.shape[:2]
    pads = [p for pad in reversed(geometry.padding) for p in (pad, pad)]
    if any(pads):
        x = torch.constant_pad_nd(x, pads, 0.0)
    x = x.transpose(0, 1)  # [in, batch, *spatial]: the im2col rows come out channel-major
    slices = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        piece = x
        for d, (o, s, dil, n) in enumerate(zip(offset, geometry.stride, geometry.dilation, out_sizes, strict=True)):
            piece = piece.narrow(2 + d, o * dil, (n - 1) * s + 1)[(slice(None),) * (2 + d) + (slice(None, None, s),)]
        slices.append(piece.unsqueeze(1))
    columns = slices[0] if len(slices) == 1 else torch.cat(slices, 1)  # [in, prod(kernel), batch, *out]
    return columns.reshape(geometry.groups, -1, batch * math.prod(out_sizes))


def _grouped_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [groups, m, k] @ b [groups, k, n]: a plain mm for one group."""
    if a.shape[0] == 1:
        return torch.mm(a[0], b[0]).unsqueeze(0)
    return torch.bmm(a, b)


def convolve(x, weight, geometry: Geometry, out_sizes: tuple[int, ...]) -> torch.Tensor:
    """[batch, out, *out_sizes] = x ⋆ weight (weight [out, in/groups, *kernel])."""
    kernel = tuple(weight.shape[2:])
    columns = im2col(x, kernel, geometry, out_sizes)
    out = _grouped_matmul(weight.reshape(geometry.groups, weight.shape[0] // geometry.groups, -1), columns)
    return out.reshape(weight.shape[0], x.shape[0], *out_sizes).transpose(0, 1)


def _spread(y: torch.Tensor, axis: int, stride: int) -> torch.Tensor:
    """y with stride - 1 zeros between consecutive entries along `axis` (length (n - 1) · stride + 1)."""
    if stride == 1:
        return y
    zeros_shape = list(y.shape)
    zeros_shape.insert(axis + 1, stride - 1)
    spread = torch.cat([y.unsqueeze(axis + 1), torch.zeros(zeros_shape, dtype=y.dtype)], axis + 1)
    spread = spread.reshape(*y.shape[:axis], y.shape[axis] * stride, *y.shape[axis + 1:])
    return spread.narrow(axis, 0, (y.shape[axis] - 1) * stride + 1)


def convolve_transposed(x, weight, geometry: Geometry, out_sizes: tuple[int, ...]) -> torch.Tensor:
    """[batch, out, *out_sizes] = x ⋆ᵀ weight (weight [in, out/groups, *kernel]), products placed and summed."""
    groups, batch = geometry.groups, x.shape[0]
    kernel, in_sizes = tuple(weight.shape[2:]), tuple(x.shape[2:])
    taps, out_per_group = math.prod(kernel), weight.shape[1]
    inputs = x.transpose(0, 1).reshape(groups, x.shape[1] // groups, batch * math.prod(in_sizes))
    weights = weight.reshape(groups, weight.shape[0] // groups, out_per_group * taps).transpose(1, 2)
    products = _grouped_matmul(weights, inputs)  # [groups, out/groups · taps, batch · prod(in)]
    products = products.reshape(groups * out_per_group, taps, batch, *in_sizes)
    for d, s in enumerate(geometry.stride):
        products = _spread(products, 3 + d, s)
    total = None
    for tap, offset in enumerate(itertools.product(*(range(k) for k in kernel))):
        befores = [o * dil - p for o, dil, p in zip(offset, geometry.dilation, geometry.padding, strict=True)]
        spans = products.shape[3:]
        if any(b >= n or b + span <= 0 for b, n, span in zip(befores, out_sizes, spans, strict=True)):
            continue  # every product of this offset lands outside the output
        pads = []
        for before, n, span in reversed(list(zip(befores, out_sizes, spans, strict=True))):
            pads += [before, n - before - span]
        placed = torch.constant_pad_nd(products[:, tap], pads, 0.0)
        total = placed if total is None else total + placed
    if total is None:
        total = torch.zeros(groups * out_per_group, batch, *out_sizes, dtype=x.dtype)
    return total.transpose(0, 1)


def _forward(x, weight, *bias, geometry: Geometry, transposed: bool, out_sizes: tuple[int, ...]):
    dtype = x.dtype
    x, weight = x.float(), weight.float()
    out = (convolve_transposed if transposed else convolve)(x, weight, geometry, out_sizes)
    if bias:
        out = out + bias[0].float().reshape(-1, *[1] * len(out_sizes))
    return out.to(dtype)


def _weight_gradient(grad, x, weight_shape, geometry: Geometry, transposed: bool) -> torch.Tensor:
    """dL/dweight: the (image-side) gradient matmul'd with the im2col of the other side."""
    groups = geometry.groups
    kernel = tuple(weight_shape[2:])
    if transposed:  # out[o] += x[i] w[k] at o = i s + k d - p: the roles of x and grad swap
        grad, x = x, grad
    out_sizes = tuple(grad.shape[2:])
    columns = im2col(x, kernel, geometry, out_sizes)  # [groups, c · taps, batch · prod(out)]
    rows = grad.transpose(0, 1).reshape(groups, grad.shape[1] // groups, -1)
    return _grouped_matmul(rows, columns.transpose(1, 2)).reshape(weight_shape)


def _backward(grad, x, weight, *, geometry: Geometry, transposed: bool, mask: tuple[bool, bool, bool]):
    dtype = x.dtype
    grad, x, weight = grad.float(), x.float(), weight.float()
    in_sizes = tuple(x.shape[2:])
    results = []
    if mask[0]:
        flip = convolve if transposed else convolve_transposed
        results.append(flip(grad, weight, geometry, in_sizes).to(dtype))
    if mask[1]:
        results.append(_weight_gradient(grad, x, tuple(weight.shape), geometry, transposed).to(dtype))
    if mask[2]:
        results.append(grad.sum([0, *range(2, grad.dim())]).to(dtype))
    return tuple(results)


# ------------------------------------------------------------------------------------------------ kernels
def _operands_refusal(tensors: list[torch.Tensor]) -> str | None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or not dtypes <= set(codegen.FLOAT_DTYPES):
        return f"a convolution of dtypes {sorted(str(d) for d in dtypes)} (one float dtype is lowered)"
    x, weight = tensors[:2]
    if x.dim() != weight.dim() or x.dim() not in (3, 4, 5):
        return f"a convolution of a {x.dim()}-D input and a {weight.dim()}-D weight"
    return None


def _forward_refusal(node: fx.Node) -> str | None:
    return _operands_refusal([arg.meta["val"] for arg in node.all_input_nodes])


def _backward_refusal(node: fx.Node) -> str | None:
    return _operands_refusal([node.args[1].meta["val"], node.args[2].meta["val"], node.args[0].meta["val"]])


@lowers(aten.convolution, family="convolution", target="simulator", accepts=_forward_refusal)
def convolution(op, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    from neuron_dynamo.lowering.generated import run_traced

    spatial = x.dim() - 2
    geometry = Geometry.of(spatial, stride, padding, dilation, groups)
    out_sizes = tuple(op(x.to("meta"), weight.to("meta"), None if bias is None else bias.to("meta"), stride,
                         padding, dilation, transposed, output_padding, groups).shape[2:])
    fn = functools.partial(_forward, geometry=geometry, transposed=bool(transposed), out_sizes=out_sizes)
    tensors = [x, weight] + ([] if bias is None else [bias])
    return run_traced(f"convolution:{geometry}:{transposed}:{out_sizes}", fn, tensors)


@lowers(aten.convolution_backward, family="convolution", target="simulator", accepts=_backward_refusal)
def convolution_backward(op, grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                         groups, output_mask):
    from neuron_dynamo.lowering.generated import run_traced

    geometry = Geometry.of(x.dim() - 2, stride, padding, dilation, groups)
    mask = tuple(bool(m) for m in output_mask)
    fn = functools.partial(_backward, geometry=geometry, transposed=bool(transposed), mask=mask)
    results = iter(run_traced(f"convolution_backward:{geometry}:{transposed}:{mask}", fn, [grad, x, weight]))
    return tuple(next(results) if wanted else None for wanted in mask)
