"""The backward of an RMSNorm as AOTAutograd writes it, recognised for `patterns.rewrite`, and its kernel call.

For y = weight · x̂ with x̂ = x · rstd and rstd = rsqrt(mean(x²) + eps) (Hugging Face's RMSNorm; the training
forward is `rmsnorm_saved_kernel`, which saves x, x̂ and rstd) the backward graph of the gradient g of y is

    a = g · weight                                   grad_w = view(sum(g · x̂, leading dims, keepdim), [D])
    grad_x = a · rstd + (expand((sum(a · x, -1, keepdim) · -0.5) · pow(rstd', 3)) / D) · (pow(x, 1.0) · 2.0)

where rstd' is a detached copy of rstd saved separately (equal to it, but a separate input of the region), and
the residual stream's gradient r joins as (r + a · rstd) + …. Models run in half precision keep x and rstd in
fp32 and convert a to fp32 first; Gemma's weight is the saved (1 + weight): any [D] tensor stands for it. As fused
code the chain takes seven launches (two row reductions, a transposed sum for grad_w); `rmsnorm_backward_kernel`
computes it, in the graph's op order, in one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.matching import is_call, private, val
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten
MAX_D = 128 * 512  # the kernel's grad_w sums D / 128 columns in one PSUM bank


@dataclass
class Chain:
    """A matched backward: the kernel's operands, the node its grad_w replaces (None: no weight gradient in the
    graph), and the chain's nodes, each listed after its users (the order to erase them in)."""

    operands: tuple
    grad_w: fx.Node | None
    nodes: list


def run(grad: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor, xhat: torch.Tensor | None,
        residual: torch.Tensor | None, rstd_cubed: torch.Tensor | None) -> Any:
    """(grad_x, grad_w), or grad_x alone without x̂: the library kernel on contiguous operands."""
    from neuron_dynamo.kernels.norms import rmsnorm_backward_kernel

    operands = (grad, x, rstd, weight, xhat, residual, rstd_cubed)
    return launch(rmsnorm_backward_kernel, *(None if t is None else t.contiguous() for t in operands))


def _with_number(node: Any, packet: Any, value: float) -> fx.Node | None:
    """t when `node` is packet(t, value) (value a number), else None."""
    if not (is_call(node, packet) and len(node.args) == 2 and not node.kwargs):
        return None
    number = node.args[1]
    return node.args[0] if isinstance(number, (int, float)) and number == value else None


def _other(node: Any, packet: Any, known: Any) -> fx.Node | None:
    """The operand of the binary `node` (a packet call of two tensors, no kwargs) that is not `known`."""
    if not (is_call(node, packet) and len(node.args) == 2 and not node.kwargs and known in node.args):
        return None
    other = node.args[1] if node.args[0] is known else node.args[0]
    return other if isinstance(other, fx.Node) else None


def _correction(corr: fx.Node) -> tuple | None:
    """(a, x, rstd', nodes) when corr = (expand((sum(a · x, -1) · -0.5) · pow(rstd', 3)) / D) · (pow(x, 1.0) · 2)."""
    if not (is_call(corr, aten.mul) and len(corr.args) == 2 and not corr.kwargs):
        return None
    for div, doubled in (corr.args, corr.args[::-1]):
        x = _with_number(_with_number(doubled, aten.mul, 2.0), aten.pow, 1.0)
        xv = val(x)
        if xv is None or xv.dim() < 2:
            continue
        expand = _with_number(div, aten.div, xv.shape[-1])
        if not (is_call(expand, aten.expand) and list(expand.args[1]) == list(xv.shape)):
            continue
        scaled = expand.args[0]
        for half, cube in ((scaled.args, scaled.args[::-1]) if is_call(scaled, aten.mul) else ()):
            s, cubed = _with_number(half, aten.mul, -0.5), _with_number(cube, aten.pow, 3)
            if not (is_call(s, aten.sum) and len(s.args) == 3 and list(s.args[1]) in ([-1], [xv.dim() - 1])
                    and s.args[2] is True and cubed is not None):
                continue
            a = _other(s.args[0], aten.mul, x)
            nodes = [corr, div, doubled, doubled.args[0], expand, scaled, half, cube, s, s.args[0]]
            if a is not None and private(*nodes):
                return a, x, cubed, nodes
    return None


def _weight_product(a: fx.Node, x: fx.Node) -> tuple | None:
    """(g, weight, nodes) when a = g · weight, or its fp32 copy when x is fp32 and g half precision."""
    nodes, product = [], a
    if is_call(a, aten._to_copy) and len(a.args) == 1 and set(a.kwargs) <= {"dtype", "layout", "device"}:
        nodes, product = [a], a.args[0]
        if not (private(product) and val(a).dtype == val(x).dtype == torch.float32 != val(product).dtype):
            return None
    elif val(a).dtype != val(x).dtype:
        return None
    if not (is_call(product, aten.mul) and len(product.args) == 2 and not product.kwargs):
        return None
    d, shape = val(x).shape[-1], val(x).shape
    for g, weight in (product.args, product.args[::-1]):
        gv, wv = val(g), val(weight)
        if (isinstance(gv, torch.Tensor) and isinstance(wv, torch.Tensor) and gv.shape == shape
                and tuple(wv.shape) == (d,) and gv.dtype == wv.dtype == val(product).dtype
                and gv.dtype in codegen.FLOAT_DTYPES):
            return g, weight, [*nodes, product]
    return None


def _weight_gradient(g: fx.Node, product: fx.Node) -> tuple | None:
    """(x̂, view, nodes) when a reader of g other than `product` is view(sum(g · x̂, leading dims, keepdim), [D])."""
    gv = val(g)
    for mul in g.users:
        xv = val(_other(mul, aten.mul, g)) if mul is not product else None
        if not (isinstance(xv, torch.Tensor) and xv.shape == gv.shape and xv.dtype == gv.dtype and private(mul)):
            continue
        total = next(iter(mul.users))
        if not (is_call(total, aten.sum) and len(total.args) == 3 and list(total.args[1]) == list(range(gv.dim() - 1))
                and total.args[2] is True and private(total)):
            continue
        view = next(iter(total.users))
        if is_call(view, aten.view) and list(view.args[1]) == [gv.shape[-1]] and gv.shape[-1] <= MAX_D:
            return _other(mul, aten.mul, g), view, [view, total, mul]
    return None


def _like(node: Any, shape: tuple, dtype: torch.dtype) -> bool:
    """Whether `node` holds a tensor of this shape and dtype."""
    v = val(node)
    return isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(shape) and v.dtype == dtype


def _undetached(node: fx.Node) -> fx.Node:
    while is_call(node, aten.detach):
        node = node.args[0]
    return node


def match(last: fx.Node) -> Chain | None:
    """The chain ending in `last` (the add giving grad_x) when it is an RMSNorm backward the kernel computes."""
    if not (len(last.args) == 2 and not last.kwargs):
        return None
    pairs = ((first, _correction(corr)) for first, corr in (last.args, last.args[::-1]))
    first, found = next(((first, found) for first, found in pairs if found is not None), (None, None))
    if found is None:
        return None
    a, x, cubed, nodes = found
    direct, residual = first, None
    if is_call(first, aten.add) and len(first.args) == 2 and not first.kwargs and private(first):
        direct = next((arg for arg in first.args if is_call(arg, aten.mul) and a in arg.args), None)
        residual = _other(first, aten.add, direct)
        nodes = [first, *nodes]
    rstd = _other(direct, aten.mul, a)
    weighted = _weight_product(a, x)
    if rstd is None or weighted is None or not private(direct) or len(a.users) != 2:
        return None
    g, weight, product_nodes = weighted
    shape, dtype = tuple(val(x).shape), val(x).dtype
    stat = (*shape[:-1], 1)
    if not (_like(rstd, stat, dtype) and _like(cubed, stat, dtype) and _like(last, shape, dtype)
            and (residual is None or _like(residual, shape, dtype))):
        return None
    xhat, grad_w, dw_nodes = _weight_gradient(g, product_nodes[-1]) or (None, None, [])
    cubed = None if _undetached(cubed) is _undetached(rstd) else _undetached(cubed)
    nodes = [*dw_nodes, last, *nodes, direct, *product_nodes]
    operands = (g, x, rstd, weight, xhat, residual, cubed)
    if any(operand in nodes for operand in operands if operand is not None):
        return None
    return Chain(operands, grad_w, nodes)
