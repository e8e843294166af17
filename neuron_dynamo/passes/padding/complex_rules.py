"""Padding rules of complex numbers: RoPE through `view_as_complex(x.reshape(..., -1, 2)) * freqs`, `view_as_real`.

A complex pad kind is the value `kind + 0j` (see `state._classify`). The real/imaginary pair dim (size 2) is never
padded: it is a static size, and a padded dim split into pairs is refused by the view rule before it gets here.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from neuron_dynamo.passes.padding.analysis import Analysis
from neuron_dynamo.passes.padding.state import SAFE_IN_PRODUCTS, DimPad, Pad, TensorPad, rule

aten = torch.ops.aten


def _per_part(dim: DimPad | None) -> DimPad | None:
    """The kind of each real and imaginary part (or each part's complex number): -inf+0j and a pair (-inf, -inf)
    have no common kind."""
    if dim is None or dim.kind in SAFE_IN_PRODUCTS:
        return dim
    return DimPad(dim.expr, Pad.UNKNOWN, dim.parts)


@rule(aten.view_as_complex, merge_aware=True)
def _view_as_complex(self: Analysis, node: fx.Node):
    """[..., n, 2] -> [..., n]: every dim but the pair dim keeps its padding and layout."""
    state = self.tensor(node.args[0])
    if state is None:
        return self.out(node)
    if state.dims[-1] is not None:
        self.refuse(node, "the real/imaginary pair dim is padded: padding would pair real parts with padding")
    return TensorPad(tuple(_per_part(d) for d in state.dims[:-1]), None)


@rule(aten.view_as_real, merge_aware=True)
def _view_as_real(self: Analysis, node: fx.Node):
    """[..., n] -> [..., n, 2]: a new, unpadded pair dim."""
    state = self.tensor(node.args[0])
    if state is None:
        return self.out(node)
    return TensorPad(tuple(_per_part(d) for d in state.dims) + (None,), None)


@rule(aten._conj, aten.resolve_conj, aten.resolve_neg, aten._neg_view, aten.real, aten.imag, aten.complex,
      aten.polar, merge_aware=True)  # fmt: skip
def _complex_elementwise(self: Analysis, node: fx.Node):
    """Element-wise, though not tagged pointwise (conjugate and negative views, parts, construction)."""
    return self._elementwise(node)
