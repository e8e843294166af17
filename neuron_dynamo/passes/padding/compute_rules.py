"""Padding rules of the computing ops: matmul, reductions, scans, sorts, softmax, attention, norms, conv."""

from __future__ import annotations

import dataclasses
import math

import sympy
import torch
import torch.fx as fx

from neuron_dynamo.passes.padding.analysis import Analysis
from neuron_dynamo.passes.padding.state import (
    SAFE_IN_PRODUCTS,
    DimPad,
    Pad,
    TensorPad,
    _classify_scalar,
    _dtype,
    _exprs,
    _set_arg,
    rule,
)

aten = torch.ops.aten




@rule(aten.mm, aten.bmm, aten.addmm, aten.baddbmm, aten.mv, aten.dot, merge_aware=True)
def _matmul(self: Analysis, node: fx.Node):
    packet = node.target.overloadpacket
    lhs, rhs = (node.args[1], node.args[2]) if packet in (aten.addmm, aten.baddbmm) else (node.args[0], node.args[1])
    lhs_dims, rhs_dims = self.dims(lhs), self.dims(rhs)
    k_lhs = lhs_dims[-1] if lhs_dims else None
    k_rhs = rhs_dims[-2] if len(rhs_dims) >= 2 else (rhs_dims[0] if rhs_dims else None)
    if k_lhs is not None and k_rhs is not None and k_lhs.parts != k_rhs.parts:
        # one side merged (padding interleaved per outer row), the other padded at its tail: position i of the
        # contraction is not the same real element on both sides, and no mask can make it so
        self.refuse(node, "a contraction over a padded dim laid out differently by its operands")
    if k_lhs is not None or k_rhs is not None:
        ka = k_lhs.kind if k_lhs else Pad.UNKNOWN
        kb = k_rhs.kind if k_rhs else Pad.UNKNOWN
        safe = (ka == Pad.ZERO and kb in SAFE_IN_PRODUCTS) or (kb == Pad.ZERO and ka in SAFE_IN_PRODUCTS)
        if not safe:
            why = "contraction over a padded dim: padded terms zeroed"
            if ka in SAFE_IN_PRODUCTS:
                self.mask(node, rhs, [len(rhs_dims) - 2 if len(rhs_dims) >= 2 else 0], 0.0, why)
            elif kb in SAFE_IN_PRODUCTS:
                self.mask(node, lhs, [len(lhs_dims) - 1], 0.0, why)
            else:
                self.mask(node, lhs, [len(lhs_dims) - 1], 0.0, why)
                self.mask(node, rhs, [len(rhs_dims) - 2 if len(rhs_dims) >= 2 else 0], 0.0, why)
    exprs = _exprs(node)
    mapped: list[DimPad | None] = [None] * len(exprs)
    if len(exprs) >= 1 and len(rhs_dims) >= 2:
        mapped[-1] = rhs_dims[-1]
    if len(exprs) >= 2:
        mapped[-2] = lhs_dims[-2]
    elif len(exprs) == 1 and len(rhs_dims) == 1:
        mapped[0] = lhs_dims[0]
    if len(exprs) == 3:
        mapped[0] = lhs_dims[0]
    return self.shaped(exprs, mapped, Pad.UNKNOWN)


# ---- reductions ------------------------------------------------------------------------------------------------------

_NEUTRAL = {
    aten.sum: 0.0, aten.nansum: 0.0, aten.any: 0.0, aten.mean: 0.0, aten.linalg_vector_norm: 0.0,
    aten.amax: -math.inf, aten.max: -math.inf, aten.argmax: -math.inf, aten.logsumexp: -math.inf,
    aten.amin: math.inf, aten.min: math.inf, aten.argmin: math.inf,
    aten.prod: 1.0, aten.all: 1.0,
}  # fmt: skip


def _reduced_dims(args: dict, rank: int) -> list[int]:
    dim = args.get("dim")
    if dim is None or dim == [] or dim == ():
        return list(range(rank))
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return sorted({d % rank for d in dims}) if rank else []


@rule(*_NEUTRAL, merge_aware=True)
def _reduction(self: Analysis, node: fx.Node):
    if node.target in (aten.max.other, aten.min.other):  # binary element-wise, not reductions
        return self._elementwise(node)
    packet = node.target.overloadpacket
    source = node.args[0]
    state = self.tensor(source)
    if state is None or not state.padded:
        return self._unpadded_outputs(node)
    args = self.kwargs(node)
    rank = len(state.dims)
    reduced = _reduced_dims(args, rank)
    padded = [d for d in reduced if state.dims[d] is not None]
    if packet is aten.linalg_vector_norm and padded and not (args.get("ord", 2) > 0):
        self.refuse(node, "a norm of non-positive order over a padded dim")
    if packet in (aten.argmax, aten.argmin) or (packet in (aten.max, aten.min) and args.get("dim") is not None):
        _check_index_numbering(self, node, state, sorted(reduced), padded)
    neutral = _NEUTRAL[packet]
    neutral_kind = _classify_scalar(neutral)
    to_mask = [d for d in padded if state.dims[d].kind != neutral_kind or neutral_kind == Pad.FINITE]
    if neutral_kind == Pad.UNKNOWN:  # +inf is "unknown" to the lattice: always mask
        to_mask = padded
    if to_mask:
        self.mask(node, source, to_mask, neutral, f"{packet.__name__} over a padded dim: pad set to {neutral}")
    keep = args.get("keepdim", False)
    mapped = [None if d in reduced else p for d, p in enumerate(state.dims) if keep or d not in reduced]
    values = node.meta.get("val")
    results = [self._like_value(v, mapped, Pad.UNKNOWN) for v in (values if isinstance(values, tuple) else [values])]
    result = tuple(results) if isinstance(values, tuple) else results[0]
    if packet is aten.mean and padded:
        self.state[_mean_as_sum(self, node, args, reduced)] = result
    return result


def _check_index_numbering(self: Analysis, node: fx.Node, state, reduced: list[int], padded: list[int]) -> None:
    """An index result (argmax, max.dim's indices) numbers positions across the reduced dims, row-major: it is the
    real one only if padding sits after every real position, i.e. only the outermost reduced dim, or the outermost
    factor of a merged one, is padded."""
    for d in padded:
        dim = state.dims[d]
        outermost = d == reduced[0] and (dim.is_tail or not any(self.is_padded(part) for part in dim.parts[1:]))
        if not outermost:
            self.refuse(node, f"{node.target.overloadpacket.__name__} returns positions numbered across a padded "
                              "dim that is not the outermost: padded positions would shift the real ones")


def _mean_as_sum(self: Analysis, node: fx.Node, args: dict, reduced: list[int]) -> fx.Node:
    """mean = sum / (real element count): the masked pad contributes 0 to the sum and nothing to the count."""
    src = _exprs(node.args[0])
    count = sympy.Integer(1)
    for d in reduced:
        count *= src[d]
    keepdim = args.get("keepdim", False)
    with self.graph.inserting_after(node):
        total = self.graph.call_function(
            aten.sum.dim_IntList, (node.args[0], reduced, keepdim), {"dtype": args.get("dtype")}
        )
        with self.graph.inserting_after(total):
            quotient = self.graph.call_function(aten.div.Tensor, (total, self.real(count)))
    node.replace_all_uses_with(quotient)
    self.masks.append(f"{node.name}: mean over a padded dim divides by the real count")
    self.graph.erase_node(node)
    quotient.meta["val"] = node.meta.get("val")
    return quotient


@rule(aten.var, aten.std, aten.var_mean, aten.std_mean)
def _variance(self: Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    if state is not None and state.padded:
        args = self.kwargs(node)
        if any(state.dims[d] is not None for d in _reduced_dims(args, len(state.dims))):
            self.refuse(node, "variance over a padded dim")
    return self._unpadded_outputs(node)


@rule(aten.cumsum, aten.cumprod, aten.logcumsumexp, aten.cummax, aten.cummin, merge_aware=True)
def _scan(self: Analysis, node: fx.Node):
    dims = self.dims(node.args[0])
    if dims:
        scanned = dims[node.args[1] % len(dims)]
        if scanned is not None and not scanned.is_tail:
            self.refuse(node, "a scan along a merged padded dim would carry padding into later real positions")
    return self.like(node, node.args[0])  # right padding: prefix results at real positions see only real positions


@rule(aten.sort, aten.argsort, aten.topk, aten.kthvalue, aten.median, aten.nanmedian, aten.mode, aten.msort,
      merge_aware=True)
def _sort(self: Analysis, node: fx.Node):
    state = self.tensor(node.args[0])
    if state is not None and state.padded:
        args = self.kwargs(node)
        if node.target.overloadpacket is aten.msort:
            args["dim"] = 0
        dims = [args["dim"] % len(state.dims)] if args.get("dim") is not None else range(len(state.dims))
        if any(state.dims[d] is not None for d in dims):
            self.refuse(node, "sorting/selecting along a padded dim would move padding into real positions")
    return self.like(node, node.args[0])


@rule(aten.unique_dim, aten._unique2, aten.unique_consecutive, aten.nonzero, aten.masked_select, aten._unique)
def _data_dependent(self: Analysis, node: fx.Node):
    if self._touches_padding(node):
        self.refuse(node, "a data-dependent output size would count padded elements")
    return self._unpadded_outputs(node)


# ---- softmax and attention -------------------------------------------------------------------------------------------


@rule(aten._softmax, aten.softmax, aten._log_softmax, aten.log_softmax, merge_aware=True)
def _softmax(self: Analysis, node: fx.Node):
    source = node.args[0]
    state = self.tensor(source)
    if state is None or not state.padded:
        return self._unpadded_outputs(node)
    dim = node.args[1] % len(state.dims)
    log_space = node.target.overloadpacket in (aten._log_softmax, aten.log_softmax)
    result = self.like(node, source)
    if state.dims[dim] is not None:
        if state.dims[dim].kind != Pad.NEG_INF:
            self.mask(node, source, [dim], -math.inf, "softmax over a padded dim: pad set to -inf")
        dims = list(result.dims)
        dims[dim] = dataclasses.replace(dims[dim], kind=Pad.NEG_INF if log_space else Pad.ZERO)
        result = TensorPad(tuple(dims))
    return result


@rule(aten._softmax_backward_data, aten._log_softmax_backward_data, merge_aware=True)
def _softmax_backward(self: Analysis, node: fx.Node):
    grad, output = node.args[0], node.args[1]
    state = self.tensor(grad)
    if state is None or not state.padded:
        return self._unpadded_outputs(node)
    dim = node.args[2] % len(state.dims)
    if state.dims[dim] is not None:
        why = "softmax backward over a padded dim: pad set to 0"
        self.mask_padded(node, grad, 0.0, why, unless=(Pad.ZERO,))
        if node.target.overloadpacket is aten._softmax_backward_data:
            self.mask_padded(node, output, 0.0, why, unless=(Pad.ZERO,))
    return self.like(node, grad)


def _key_padding_mask(self: Analysis, node: fx.Node, key: fx.Node, attn_mask, query_dtype) -> fx.Node:
    """attn_mask with -inf (or False) at the padded keys."""
    with self.graph.inserting_before(node):
        key_pad = self.pad_mask(key, -2)  # [.., S, 1]
        rank = len(_exprs(key))
        last = self.graph.call_function(aten.transpose.int, (key_pad, rank - 2, rank - 1))  # [.., 1, S]
        if attn_mask is None:
            neg = self.graph.call_function(aten.scalar_tensor.default, (-math.inf,), {"dtype": query_dtype})
            zero = self.graph.call_function(aten.scalar_tensor.default, (0.0,), {"dtype": query_dtype})
            return self.graph.call_function(aten.where.self, (last, neg, zero))
        if _dtype(attn_mask) == torch.bool:
            keep = self.graph.call_function(aten.logical_not.default, (last,))
            return self.graph.call_function(aten.logical_and.default, (attn_mask, keep))
        return self.graph.call_function(aten.masked_fill.Scalar, (attn_mask, last, -math.inf))



@rule(aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_efficient_attention,
       aten.scaled_dot_product_attention, aten._scaled_dot_product_flash_attention)  # fmt: skip
def _attention(self: Analysis, node: fx.Node):
    args = self.kwargs(node)
    query, key, value = args["query"], args["key"], args["value"]
    mask_name = "attn_bias" if "attn_bias" in args else "attn_mask"
    attn_mask, causal = args.get(mask_name), bool(args.get("is_causal", False))
    if args.get("dropout_p", 0.0) and self._touches_padding(node):
        self.refuse(node, "attention dropout on padded shapes")
    key_dims, query_dims = self.dims(key), self.dims(query)
    _refuse_padded_head_dim(self, node, query_dims, key_dims)
    keys_padded = key_dims[-2] is not None
    if keys_padded:
        why = "attention over padded keys: padded keys/values zeroed"
        self.mask_padded(node, key, 0.0, why, unless=SAFE_IN_PRODUCTS)
        self.mask_padded(node, value, 0.0, why, unless=SAFE_IN_PRODUCTS)
        same_length = query_dims[-2] is not None and sympy.expand(query_dims[-2].expr - key_dims[-2].expr) == 0
        if not (causal and same_length and attn_mask is None):
            names = [a.name for a in node.target._schema.arguments]
            if causal:
                attn_mask = _explicit_causal(self, node, query, key, attn_mask, names.index("is_causal"))
            new_mask = _key_padding_mask(self, node, key, attn_mask, _dtype(query))
            _set_arg(node, names.index(mask_name), mask_name, new_mask)
            self.masks.append(f"{node.name}: padded keys masked with -inf")
    return self._unpadded_outputs(node)


def _explicit_causal(self: Analysis, node: fx.Node, query: fx.Node, key: fx.Node, attn_mask, causal_index: int):
    """`is_causal` of queries and keys of different (or unrelated) lengths as an explicit top-left mask, to which
    the key padding is then added: torch's causal mask lets query i see keys j <= i, which in a bucket may be
    padding when the real queries outnumber the real keys."""
    if attn_mask is not None:
        self.refuse(node, "causal attention with an explicit mask over padded keys")
    with self.graph.inserting_before(node):
        rows = self.graph.call_function(aten.arange.default, (self.sym(_exprs(query)[-2]),))
        cols = self.graph.call_function(aten.arange.default, (self.sym(_exprs(key)[-2]),))
        visible = self.graph.call_function(aten.ge.Tensor, (self.graph.call_function(aten.view.default, (
            rows, [-1, 1])), self.graph.call_function(aten.view.default, (cols, [1, -1]))))
        neg = self.graph.call_function(aten.scalar_tensor.default, (-math.inf,), {"dtype": _dtype(query)})
        zero = self.graph.call_function(aten.scalar_tensor.default, (0.0,), {"dtype": _dtype(query)})
        mask = self.graph.call_function(aten.where.self, (visible, zero, neg))
    _set_arg(node, causal_index, "is_causal", False)
    self.masks.append(f"{node.name}: causal attention over padded keys as an explicit mask")
    return mask


def _refuse_padded_head_dim(self: Analysis, node: fx.Node, query_dims, key_dims) -> None:
    """The default scale 1/sqrt(head dim) would be taken at the bucket's head dim, not the real one."""
    if (query_dims and query_dims[-1] is not None) or (key_dims and key_dims[-1] is not None):
        self.refuse(node, "attention over a padded head dim (its scale depends on the real size)")


@rule(aten._scaled_dot_product_flash_attention_for_cpu_backward)
def _attention_backward(self: Analysis, node: fx.Node):
    args = self.kwargs(node)
    if not self._touches_padding(node):
        return self._unpadded_outputs(node)
    if args.get("dropout_p", 0.0):
        self.refuse(node, "attention dropout on padded shapes")
    why = "attention backward: padded rows zeroed"
    query, key = args["query"], args["key"]
    for name in ("grad_out", "query", "out", "key", "value"):
        self.mask_padded(node, args[name], 0.0, why, unless=(Pad.ZERO,))
    self.mask_padded(node, args["logsumexp"], 0.0, why, unless=(Pad.ZERO,))
    key_dims, query_dims = self.dims(key), self.dims(query)
    _refuse_padded_head_dim(self, node, query_dims, key_dims)
    if key_dims[-2] is not None:
        same_length = query_dims[-2] is not None and sympy.expand(query_dims[-2].expr - key_dims[-2].expr) == 0
        attn_mask = args.get("attn_mask")
        if not (args["is_causal"] and same_length and attn_mask is None):
            if args["is_causal"]:
                attn_mask = _explicit_causal(self, node, query, key, attn_mask, 7)
            new_mask = _key_padding_mask(self, node, node.args[2] if len(node.args) > 2 else key, attn_mask,
                                         _dtype(query))
            _set_arg(node, 8, "attn_mask", new_mask)
            self.masks.append(f"{node.name}: padded keys masked with -inf")
    return self._unpadded_outputs(node)


# ---- normalisation, convolution, embedding, indexing, losses -------------------------------------------------------


@rule(aten.native_layer_norm, merge_aware=True)
def _layer_norm(self: Analysis, node: fx.Node):
    normalized = len(node.args[1])
    self.independent(node, node.args[0], list(range(-normalized, 0)), "layer norm")
    return self.like(node, node.args[0])


@rule(aten.native_layer_norm_backward, merge_aware=True)
def _layer_norm_backward(self: Analysis, node: fx.Node):
    normalized = len(node.args[2])
    self.independent(node, node.args[1], list(range(-normalized, 0)), "layer norm")
    why = "layer-norm backward sums over padded rows: operands zeroed"
    for index in (0, 1, 3, 4):
        self.mask_padded(node, node.args[index], 0.0, why, unless=(Pad.ZERO,))
    return self.like(node, node.args[1])


@rule(aten._native_batch_norm_legit_no_training)
def _batch_norm_eval(self: Analysis, node: fx.Node):
    return self.independent(node, node.args[0], [1], "batch norm")


def _conv_spatial(self: Analysis, node: fx.Node, source, stride, transposed, weight) -> list[int]:
    """The padded spatial dims of a convolution's input, refusing what the rule does not cover.

    With stride 1, output position t reads input positions t - p + j·d (kernel tap j, conv padding p, dilation d):
    a real output reads nothing beyond the real input plus the conv's own p zeros, which the padded input holds as
    long as its pad is 0. So right padding is safe for any kernel size (k = 1, a causal conv fed a left-padded
    input, 'same' padding) once the input's pad is zero."""
    dims = self.dims(source)
    if not dims:
        return []
    if dims[1] is not None or any(d is not None for d in self.dims(weight)):
        self.refuse(node, "a convolution mixing a padded channel dim")
    padded = [i for i in range(2, len(dims)) if dims[i] is not None]
    if padded and (transposed or any(s != 1 for s in stride)):
        self.refuse(node, "a strided or transposed convolution over a padded spatial dim")
    if any(d is not None and not d.is_tail for d in dims[2:]):
        self.refuse(node, "a convolution over a merged padded dim")
    return padded


@rule(aten.convolution)
def _convolution(self: Analysis, node: fx.Node):
    source, weight = node.args[0], node.args[1]
    padded = _conv_spatial(self, node, source, node.args[3], node.args[6], weight)
    if any(self.dims(source)[i].kind is not Pad.ZERO for i in padded):
        self.mask(node, source, padded, 0.0, "convolution over a padded dim: pad set to 0")
    return self.out(node)


@rule(aten.convolution_backward)
def _convolution_backward(self: Analysis, node: fx.Node):
    """grad_input reads grad_out within reach of each real position (its pad must be the 0 eager pads with);
    grad_weight and grad_bias sum over every position: grad_out's pad and the input's pad zeroed."""
    grad_out, source, weight = node.args[0], node.args[1], node.args[2]
    padded = _conv_spatial(self, node, source, node.args[4], node.args[7], weight)
    if self.dims(grad_out) and any(d is not None for d in self.dims(grad_out)[:2]):
        self.refuse(node, "a convolution backward with a padded batch or channel dim")
    if padded:
        why = "convolution backward over a padded dim: pads set to 0"
        self.mask_padded(node, grad_out, 0.0, why, unless=(Pad.ZERO,))
        self.mask_padded(node, source, 0.0, why, unless=(Pad.ZERO,))
    return self._unpadded_outputs(node)
