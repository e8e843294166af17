"""Padding rules of the collectives (`_c10d_functional`): what a rank's pad region holds after communication.

A collective combines the same tensor of every rank, so its pad region is known only if every rank pads alike.
They do, for every dim a collective reads: torch.distributed needs that tensor's shape equal on every rank, so each
padded size, when it is `a·s + b` of ONE bucketed symbol `s`, says `s` is equal on every rank, and `s` picks the
same bucket there, given the same graph, options and sizes seen before (bucketing is adaptive: a rank that saw
other sizes of another symbol may decide otherwise; see the README's *Distributed*). A size of two symbols
(`s0 + s1`) can be equal across ranks without its symbols being so: padded, it could differ between ranks where
eager's did not, and the collective would fail. That is refused, as is any padded dim of an op without a rule
here (all_to_all, send/recv: the default refusal).

| collective | rule |
|---|---|
| all_reduce, broadcast, wait_tensor | element-wise across ranks: the pad region keeps its place; its kind is the |
|   | reduction of equal values (0 stays 0; -inf stays -inf under sum, avg, min, max; finite stays finite under |
|   | min, max, and for integers); else unknown |
| all_gather_into_tensor | gathered dim 0 padded: rank blocks laid end to end, a merged dim `[ranks, s]` |
|   | (padding interleaved, followed by the merge-aware rules); other dims keep their pad |
| reduce_scatter_tensor | dim 0 padded: only a merged `[ranks, ...]` dim (each rank's chunk is one block with its |
|   | own tail pad; a gathered one), or one rank; other dims as all_reduce |
"""

from __future__ import annotations

import dataclasses

import sympy
import torch
import torch.fx as fx

from neuron_dynamo.passes.padding.analysis import Analysis
from neuron_dynamo.passes.padding.state import Pad, TensorPad, _dtype, rule

functional = torch.ops._c10d_functional
functional_autograd = torch.ops._c10d_functional_autograd

_SAME_UNDER = {  # pad kinds that reducing equal values keeps, per reduce op
    Pad.ZERO: {"sum", "avg", "product", "min", "max", "band", "bor", "bxor"},
    Pad.NEG_INF: {"sum", "avg", "min", "max"},
    Pad.FINITE: {"min", "max"},
}


def _arg(node: fx.Node, index: int, name: str):
    return node.args[index] if len(node.args) > index else node.kwargs[name]


def _reduced_kind(kind: Pad, reduce_op: str, dtype: torch.dtype | None) -> Pad:
    """The pad kind after reducing the same pad of every rank with `reduce_op`."""
    if reduce_op in _SAME_UNDER.get(kind, ()):
        return kind
    integer = dtype is not None and not dtype.is_floating_point and not dtype.is_complex
    return Pad.FINITE if integer and kind != Pad.UNKNOWN else Pad.UNKNOWN


def _check_rank_invariant(self: Analysis, node: fx.Node, state: TensorPad) -> None:
    """Refuse a padded dim whose bucketed size (or, merged, whose layout) could differ between ranks whose real
    sizes agree: a size of more than one symbol (`s0 + s1`, `s0*s1`), or not linear in its symbol."""
    for dim in state.dims:
        if dim is None:
            continue
        symbols = sympy.sympify(dim.expr).free_symbols
        if len(symbols) != 1 or not _linear(dim.expr, next(iter(symbols))):
            self.refuse(node, f"a collective over a padded dim of size {dim.expr}: ranks with equal real sizes "
                              "could pad it differently")


def _linear(expr: sympy.Expr, symbol: sympy.Symbol) -> bool:
    try:
        return sympy.Poly(expr, symbol).degree() == 1
    except sympy.PolynomialError:
        return False


def _reduced_state(state: TensorPad, reduce_op: str, dtype) -> TensorPad:
    return TensorPad(tuple(dataclasses.replace(d, kind=_reduced_kind(d.kind, reduce_op, dtype)) if d else None
                           for d in state.dims))


@rule(functional.all_reduce, functional.broadcast, functional.wait_tensor, merge_aware=True)
def _elementwise_across_ranks(self: Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    if state is None or not state.padded:
        return self._unpadded_outputs(node)
    _check_rank_invariant(self, node, state)
    if node.target.overloadpacket is functional.all_reduce:
        return _reduced_state(state, _arg(node, 1, "reduce_op"), _dtype(node))
    return state  # broadcast: the source rank's pad, laid out as ours; wait_tensor: the tensor itself


@rule(functional.all_gather_into_tensor, functional_autograd.all_gather_into_tensor, merge_aware=True)
def _all_gather(self: Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    if state is None or not state.padded:
        return self._unpadded_outputs(node)
    _check_rank_invariant(self, node, state)
    ranks = sympy.Integer(_arg(node, 1, "group_size"))
    first, *rest = state.dims
    if first is not None:  # rank blocks end to end: [ranks, d0] merged, the pad of each block inside it
        first = self._merged(first.expr * ranks, (ranks, *first.factors), first.kind)
    return TensorPad((first, *rest))


@rule(functional.reduce_scatter_tensor, functional_autograd.reduce_scatter_tensor, merge_aware=True)
def _reduce_scatter(self: Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    if state is None or not state.padded:
        return self._unpadded_outputs(node)
    _check_rank_invariant(self, node, state)
    ranks = sympy.Integer(_arg(node, 2, "group_size"))
    state = _reduced_state(state, _arg(node, 1, "reduce_op"), _dtype(node))
    first, *rest = state.dims
    if first is not None and ranks != 1:
        if first.is_tail or first.factors[0] != ranks:
            self.refuse(node, f"reduce_scatter cuts padded dim 0 (size {first.expr}) into {ranks} rank chunks that "
                              "do not line up with the real data")
        first = self._merged(first.expr / ranks, first.factors[1:], first.kind)
    return TensorPad((first, *rest))

