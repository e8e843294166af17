"""A differential fuzzer for bucketing: random small programs, compiled with `backend="neuron"`, against eager.

Each example is a tiny program over a sequence `x: [B, L, H]` (and, lined up with it, `y: [B, L, H]`, token ids
`ids: [B, L]` in [0, V), divisors `divs: [B, L]` in [1, 4] and a bool `mask: [B, L]` whose first column is True),
built as a random sequence of at most 6 steps, each drawn from an op family of the padding proof's rules table
(`neuron_dynamo/passes/padding`) that applies to the current tensor: element-wise (float, integer, comparisons,
where/masked_fill, casts), views that merge and split the padded dim, permutes, reductions with and without dim,
scans, contractions over the padded dim and over others, softmax, attention (SDPA, hand-written), slicing and
indexing by sizes and by ids, scatters and accumulating index_put, cat/stack/unbind, norms and losses. The program
is Python source (printed with every failure: it is the repro), run at 3 lengths chosen across bucket boundaries
(1, 2, 127, 128, 129, 255, 256, 257, or anything up to 300), the batch sometimes dynamic too, in fp32, bf16 or fp16,
forward and backward (gradients of x, y and of the parameters, under random output gradients), through
`torch.compile(fn, backend="neuron", dynamic=None | True)`; the target is `reference` for most examples (the padding
proof does not depend on it) and the default NKI simulator for some.

Each example records whether its graphs were bucketed (calls served padded) or refused (exact shapes, with the
refusal counted per op), and fails on:

- a wrong answer (fp32: 1e-4, bf16/fp16: 2e-2, relative + absolute scaled by the output's magnitude; integers and
  bools exactly). A low-precision mismatch with eager is rounding (counted as `precision`, not a failure) when the
  same program compiled *without* bucketing gives what the bucketed one gave; in fp32 every mismatch fails, unless
  the program rounds through bf16 itself (`cast_half`: then bf16's tolerance applies);
- the compiled program raising where eager does not (unless `backend="aot_eager"` raises the same: PyTorch's
  own bug, counted apart);
- any backend failure that fell back to eager (`graphs_failed`, a Dynamo graph run eagerly, a bucketing setup that
  failed) and any bucket program that failed to compile or run (a refusal after the fact): they hide bugs.

Bugs it found are pinned, minimised, in `tests/passes/test_padding_fuzz_found.py` (strict xfails). Nothing is left
out of the generator to keep this file green: a failure here is a new bug, to be minimised and pinned there.

Default mode: a fixed, derandomized set of examples (part of `make test`). Long mode, with a summary at the end
(examples, graphs tried, padded vs refused, refusal reasons by op, failures with their programs):

    .venv/bin/python -m pytest -q tests/passes/test_padding_fuzz.py -k match_eager --fuzz-long -p no:logging

`NEURON_FUZZ_EXAMPLES` (default 2000) sets the number of long-mode examples, `NEURON_FUZZ_SECONDS` (default 1800)
a wall-time budget after which the remaining examples are skipped, and `NEURON_FUZZ_REPORT=path.json` writes the
summary and every failing program to a file as well. The summary is printed even without `-s`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import textwrap
import time
import traceback

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the programs' own spelling)
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

import neuron_dynamo
from neuron_dynamo.bucket_dispatch import forget_generalized_graphs

V = 24  # rows of the id tables (ids are in [0, V))
MAX_LEN = 300  # longest input length
POS_ROWS = 640  # rows of the position table: more than any length a program reaches (its bucket may be larger)
BOUNDARIES = (1, 2, 127, 128, 129, 255, 256, 257)
DEFAULT_EXAMPLES = 32
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}
DTYPE_NAMES = {torch.float32: "torch.float32", torch.bfloat16: "torch.bfloat16", torch.float16: "torch.float16"}


# ------------------------------------------------------------------------------------------------ the programs
@dataclasses.dataclass
class State:
    """What the generator knows about the current tensor `h`: [B, L*, H], its length at each call."""

    H: int
    lens: list[int]
    aligned: bool = True  # L* is the input length: y, ids, mask and divs line up with h
    float_out: bool = True

    @property
    def shortest(self) -> int:
        return min(self.lens)

    @property
    def longest(self) -> int:
        return max(self.lens)


@dataclasses.dataclass
class Program:
    H0: int
    lines: list[str] = dataclasses.field(default_factory=list)
    params: dict[str, tuple[tuple[int, ...], float]] = dataclasses.field(default_factory=dict)
    steps: list[str] = dataclasses.field(default_factory=list)

    def param(self, *shape: int, scale: float | None = None) -> str:
        name = f"p{len(self.params)}"
        self.params[name] = (shape, scale if scale is not None else 1 / math.sqrt(shape[0]))
        return f"P['{name}']"

    @property
    def source(self) -> str:
        body = "\n".join(f"    {line}" for line in ["outs = []", "h = x", *self.lines, "return (h, *outs)"])
        return f"def fn(x, y, ids, divs, mask):\n{body}\n"

    def function(self, params: dict[str, torch.Tensor]):
        namespace = {"torch": torch, "F": F, "P": params, "math": math}
        exec(compile(self.source, f"<fuzz program {abs(hash(self.source)) % 10**8}>", "exec"), namespace)  # noqa: S102
        return namespace["fn"]

    def make_params(self, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        return {name: torch.nn.Parameter((torch.randn(shape, generator=gen) * scale).to(dtype))
                for name, (shape, scale) in self.params.items()}


@dataclasses.dataclass(frozen=True)
class Op:
    family: str
    name: str
    emit: object  # (program, state, draw) -> None
    ok: object  # (state) -> bool
    weight: int = 1


OPS: list[Op] = []


def op(family: str, ok=lambda s: True, weight: int = 1):
    def register(emit):
        OPS.append(Op(family, emit.__name__.strip("_"), emit, ok, weight))
        return emit

    return register


def simple(family: str, name: str, code: str, ok=lambda s: True, weight: int = 1, lens=None, H=None,
           aligned: bool | None = None):
    """An op that is one line of code, with `{H}` the current feature size; `lens`/`H` map the state."""

    def emit(prog: Program, s: State, draw) -> None:
        prog.lines.append(code.format(H=s.H, H2=s.H // 2, V=V))
        if lens is not None:
            s.lens = [lens(n) for n in s.lens]
            s.aligned = False
        if H is not None:
            s.H = H(s.H)
        if aligned is not None:
            s.aligned = aligned

    emit.__name__ = name
    OPS.append(Op(family, name, emit, ok, weight))


def aligned(s: State) -> bool:
    return s.aligned


def even(s: State) -> bool:
    return s.H % 2 == 0


def at_least(n: int):
    return lambda s: s.shortest >= n


def grows(s: State) -> bool:
    return s.longest <= MAX_LEN + 4


# element-wise: float
for _name, _code in {
    "tanh": "h = torch.tanh(h)", "sigmoid": "h = torch.sigmoid(h)", "relu": "h = torch.relu(h)",
    "gelu": "h = F.gelu(h)", "sin": "h = torch.sin(h)", "neg_abs": "h = -h.abs() + 0.5",
    "exp": "h = torch.exp(h.clamp(max=3.0))", "rsqrt": "h = torch.rsqrt(h.abs() + 1.0)",
    "square": "h = h * h - 0.5", "log1p": "h = torch.log1p(h.abs())", "affine": "h = h * 0.5 + 0.25",
    "clamp": "h = h.clamp(-1.0, 1.0)", "reciprocal": "h = 1.0 / (h.abs() + 1.0)",
}.items():
    simple("elementwise", _name, _code)


@op("elementwise")
def _scale_shift(prog: Program, s: State, draw) -> None:
    prog.lines.append(f"h = h * {prog.param(s.H, scale=1.0)} + {prog.param(s.H, scale=0.5)}")


simple("elementwise", "add_y", "h = h + y[..., :1] * 0.5", ok=aligned)
simple("elementwise", "gate_y", "h = h * torch.sigmoid(y[..., :1])", ok=aligned)

# comparisons, where, masked_fill
simple("compare", "leaky_where", "h = torch.where(h > 0, h, 0.1 * h)")
simple("compare", "where_y", "h = torch.where(h > 0.3, h, y[..., :1])", ok=aligned)
simple("compare", "fill_large", "h = h.masked_fill(h.abs() > 1.5, 0.0)")
simple("compare", "fill_mask", "h = h.masked_fill(~mask[..., None], 0.0)", ok=aligned)
simple("compare", "fill_mask_value", "h = h.masked_fill(~mask[..., None], -2.0)", ok=aligned)
simple("compare", "step", "h = h * (h > 0).to(h.dtype)")
simple("compare", "maximum", "h = torch.maximum(h, torch.zeros_like(h) + 0.1)")
simple("compare", "eq_zero_ids", "h = h + (ids == 0).to(h.dtype)[..., None]", ok=aligned)
simple("compare", "ids_gt", "h = h * (ids > 5).to(h.dtype)[..., None]", ok=aligned)

# integer element-wise (ids, divisors) and casts
simple("integer", "ids_floordiv_mod", "h = h * ((ids // 3) % 5 - 2).to(h.dtype)[..., None]", ok=aligned)
simple("integer", "ids_div_floor", "h = h + (torch.div(ids * 7 + 1, divs, rounding_mode='floor') % 4)"
       ".to(h.dtype)[..., None]", ok=aligned)
simple("integer", "ids_fmod", "h = h + torch.fmod(ids, divs).to(h.dtype)[..., None]", ok=aligned)
simple("integer", "ids_remainder", "h = h - (ids % divs).to(h.dtype)[..., None] * 0.5", ok=aligned)
simple("integer", "ids_floordiv", "h = h + (ids // divs).to(h.dtype)[..., None] * 0.1", ok=aligned)
simple("integer", "int_out", "outs.append(((ids * 5 + 3) // divs) % 7)", ok=aligned)
simple("integer", "int_of_h_sum", "outs.append((h * 3).to(torch.int64).sum(1))")
simple("integer", "int_of_h_max", "outs.append((h * 3).to(torch.int64).amax(1))")
simple("integer", "bool_out_any", "outs.append((h > 1.0).any(1))")
simple("cast", "cast_trunc", "h = h + (h * 2).to(torch.int64).to(h.dtype)")
simple("cast", "cast_roundtrip", "h = h.to(torch.float32).tanh().to(h.dtype)")
simple("cast", "cast_half", "h = h.to(torch.bfloat16).to(h.dtype)")

# views: merge / split, permute, transpose, unsqueeze
@op("view")
def _merge_linear(prog: Program, s: State, draw) -> None:
    out = draw(st.sampled_from([8, 16]))
    weight = prog.param(s.H, out)
    prog.lines.append(f"h = (h.reshape(-1, {s.H}) @ {weight}).reshape(h.shape[0], -1, {out})")
    s.H = out


@op("view")
def _merge_functional_linear(prog: Program, s: State, draw) -> None:
    out = draw(st.sampled_from([8, 16]))
    weight, bias = prog.param(out, s.H, scale=1 / math.sqrt(s.H)), prog.param(out, scale=0.5)
    prog.lines.append(f"h = F.linear(h.reshape(h.shape[0] * h.shape[1], {s.H}), {weight}, {bias})"
                      f".view(h.shape[0], h.shape[1], {out})")
    s.H = out


simple("view", "merge_tanh", "h = torch.tanh(h.reshape(h.shape[0] * h.shape[1], -1)).reshape(h.shape)")
simple("view", "merge_softmax_LH", "h = torch.softmax(h.reshape(h.shape[0], -1), -1).reshape(h.shape)")
simple("view", "merge_sum_LH", "outs.append(h.reshape(h.shape[0], -1).sum(-1))")
simple("view", "flatten_out", "outs.append(h.flatten() * 2)")
simple("view", "merge_cumsum_LH", "h = h.reshape(h.shape[0], -1).cumsum(-1).reshape(h.shape) * 0.1")
simple("view", "split_features", "h = h.reshape(h.shape[0], h.shape[1], 2, {H2}).flip(2).reshape(h.shape)",
       ok=even)
@op("view")
def _transpose_linear(prog: Program, s: State, draw) -> None:
    weight = prog.param(s.H, s.H)
    prog.lines.append(f"h = ({weight} @ h.transpose(1, 2)).transpose(1, 2)")


simple("view", "permute_cumsum", "h = h.permute(1, 2, 0).cumsum(0).permute(2, 0, 1) * 0.1")
simple("view", "permute_softmax", "h = torch.softmax(h.permute(0, 2, 1), -1).permute(0, 2, 1)")
simple("view", "unsqueeze_expand_sum", "h = h.unsqueeze(1).expand(-1, 2, -1, -1).sum(1) * 0.5")
simple("view", "unsqueeze_squeeze", "h = (h.unsqueeze(-1) * 1.5).squeeze(-1)")
simple("view", "merge_batch_cols", "h = h.transpose(0, 1).reshape(h.shape[1], -1).relu().reshape("
       "h.shape[1], h.shape[0], -1).transpose(0, 1)")

# reductions, kept and broadcast back, or as outputs (with and without dim)
for _name, _code in {
    "center_mean": "h = h - h.mean(1, keepdim=True)",
    "sub_amax": "h = h - h.amax(1, keepdim=True)",
    "sub_lse": "h = h - torch.logsumexp(h, 1, keepdim=True)",
    "add_sum": "h = h + h.sum(1, keepdim=True) * 0.01",
    "div_var": "h = h / (h.var(1, keepdim=True, unbiased=False) + 1.0)",
    "max_values": "h = h - h.max(1, keepdim=True).values",
    "min_values": "h = h + h.min(1, keepdim=True).values",
    "sum_features": "h = h - h.sum(-1, keepdim=True) / {H}",
    "mean_all": "h = h - h.mean()",
    "amax_all": "h = h / (h.abs().amax() + 1.0)",
}.items():
    simple("reduction", _name, _code)
for _name, _code in {
    "out_sum": "outs.append(h.sum(1))", "out_mean": "outs.append(h.mean(1))", "out_amax": "outs.append(h.amax(1))",
    "out_argmax": "outs.append(h.argmax(1))", "out_lse": "outs.append(torch.logsumexp(h, 1))",
    "out_sum_all": "outs.append(h.sum())", "out_mean_all": "outs.append(h.mean())",
    "out_argmax_all": "outs.append(h.argmax())", "out_amax_all": "outs.append(h.amax())",
    "out_prod": "outs.append((torch.tanh(h) * 0.01 + 1.0).prod(1))",
    "out_argmax_features": "outs.append(h.argmax(-1))", "out_sum_features": "outs.append(h.sum(-1))",
    "out_argmin": "outs.append(h.argmin(1))",
    "out_argmax_merged_T": "outs.append(h.transpose(1, 2).reshape(h.shape[0], -1).argmax(-1))",
    "out_norm": "outs.append(h.norm(dim=1))",
}.items():
    simple("reduction", _name, _code)
simple("reduction", "out_var", "outs.append(h.var(1))", ok=at_least(2))
simple("reduction", "out_std", "outs.append(h.std(1))", ok=at_least(2))
simple("reduction", "gather_argmax", "h = h + h.gather(-1, h.argmax(-1, keepdim=True))")

# scans
simple("scan", "cumsum", "h = h.cumsum(1) * 0.1")
simple("scan", "cumsum_features", "h = h.cumsum(-1)")
simple("scan", "cummax", "h = torch.cummax(h, 1).values")
simple("scan", "cumprod", "h = (torch.tanh(h) * 0.01 + 1.0).cumprod(1)")
simple("scan", "cumsum_mask", "h = h * (mask.cumsum(1) > 1).to(h.dtype)[..., None]", ok=aligned)

# contractions
simple("contraction", "gram_over_L", "h = h @ (h.transpose(1, 2) @ h) * 0.01")
simple("contraction", "gram_y", "h = h + y[..., :1] @ (y[..., :1].transpose(1, 2) @ h) * 0.01", ok=aligned)
simple("contraction", "out_gram", "outs.append(torch.einsum('blh,blk->bhk', h, h))")
simple("contraction", "bmm_weight_expand", "h = torch.bmm(h, torch.eye({H}, dtype=h.dtype).expand(h.shape[0], -1, "
       "-1) * 0.5)")
simple("contraction", "bmm_over_L", "outs.append(torch.bmm(h.transpose(1, 2), torch.tanh(h)))")
simple("contraction", "matvec_L", "outs.append(torch.matmul(h.transpose(1, 2), h[..., :1]).squeeze(-1))")


@op("contraction")
def _linear_3d(prog: Program, s: State, draw) -> None:
    out = draw(st.sampled_from([8, 16]))
    weight, bias = prog.param(out, s.H, scale=1 / math.sqrt(s.H)), prog.param(out, scale=0.5)
    prog.lines.append(f"h = F.linear(h, {weight}, {bias})")
    s.H = out


@op("contraction")
def _matmul_3d(prog: Program, s: State, draw) -> None:
    prog.lines.append(f"h = torch.relu(h @ {prog.param(s.H, s.H)})")


# softmax and hand-written attention
simple("softmax", "softmax_L", "h = torch.softmax(h, 1)")
simple("softmax", "log_softmax_L", "h = torch.log_softmax(h, 1)")
simple("softmax", "softmax_H", "h = torch.softmax(h, -1)")
simple("softmax", "log_softmax_H", "h = F.log_softmax(h, -1)")
simple("softmax", "masked_softmax_L", "h = torch.softmax(h.masked_fill(~mask[..., None], float('-inf')), 1)",
       ok=aligned)
simple("softmax", "self_attention", "h = torch.softmax(h @ h.transpose(1, 2) / 4.0, -1) @ h")
simple("softmax", "causal_attention", "h = torch.softmax((h @ h.transpose(1, 2) / 4.0).masked_fill(torch.ones("
       "h.shape[1], h.shape[1], dtype=torch.bool).triu(1), float('-inf')), -1) @ h")
simple("softmax", "keymask_attention", "h = torch.softmax((h @ h.transpose(1, 2) / 4.0).masked_fill("
       "~mask[:, None, :], float('-inf')), -1) @ h", ok=aligned)


@op("attention", ok=even, weight=3)
def _sdpa(prog: Program, s: State, draw) -> None:
    kind = draw(st.sampled_from(["plain", "causal", "bool_mask", "additive_mask", "cross"]))
    if kind in ("bool_mask", "additive_mask") and not s.aligned:
        kind = "causal"
    heads = f"h.reshape(h.shape[0], h.shape[1], 2, {s.H // 2}).transpose(1, 2)"
    prog.lines.append(f"q = {heads}")
    if draw(st.booleans()):
        prog.lines.append(f"k = (h @ {prog.param(s.H, s.H)}).reshape(h.shape[0], h.shape[1], 2, {s.H // 2})"
                          ".transpose(1, 2)")
    else:
        prog.lines.append("k = q")
    extra = {
        "plain": "", "causal": ", is_causal=True", "bool_mask": ", attn_mask=mask[:, None, None, :]",
        "additive_mask": ", attn_mask=torch.zeros(mask.shape, dtype=h.dtype).masked_fill(~mask, float('-inf'))"
                         "[:, None, None, :]",
        "cross": "",
    }[kind]
    if kind == "cross":  # queries from a prefix of the sequence (same symbol, shorter)
        prog.lines.append("q = q[:, :, : (q.shape[2] + 1) // 2]")
        prog.lines.append("h = F.scaled_dot_product_attention(q, k, torch.tanh(k)).transpose(1, 2)"
                          ".reshape(h.shape[0], -1, h.shape[2])")
        s.lens = [(n + 1) // 2 for n in s.lens]
        s.aligned = False
    else:
        prog.lines.append(f"h = F.scaled_dot_product_attention(q, k, torch.tanh(k){extra}).transpose(1, 2)"
                          ".reshape(h.shape)")


# indexing with sizes
simple("size_index", "pos_slice", "h = h + P_POS[: h.shape[1], :{H}]")
simple("size_index", "pos_arange", "h = h + P_POS[torch.arange(h.shape[1]), :{H}]")
simple("size_index", "pos_embedding", "h = h + F.embedding(torch.arange(h.shape[1]), P_POS[:, :{H}])")
simple("size_index", "pos_index_select", "h = h + P_POS[:, :{H}].index_select(0, torch.arange(h.shape[1]))")
simple("size_index", "length_as_data", "h = h * (torch.arange(h.shape[1]) / h.shape[1]).to(h.dtype)[:, None]")
simple("size_index", "drop_first", "h = h[:, 1:]", ok=at_least(2), lens=lambda n: n - 1)
simple("size_index", "drop_last", "h = h[:, :-1]", ok=at_least(2), lens=lambda n: n - 1)
simple("size_index", "first_half", "h = h[:, : (h.shape[1] + 1) // 2]", lens=lambda n: (n + 1) // 2)
simple("size_index", "narrow_head", "h = h.narrow(1, 0, h.shape[1] - 1)", ok=at_least(2), lens=lambda n: n - 1)
simple("size_index", "stride_two", "h = h[:, ::2]", lens=lambda n: (n + 1) // 2)
simple("size_index", "out_first", "outs.append(h[:, 0])")
simple("size_index", "out_last", "outs.append(h[:, -1])")
simple("size_index", "out_middle", "outs.append(h[:, h.shape[1] // 2])")
simple("size_index", "gather_half_positions", "h = h.gather(1, (torch.arange(h.shape[1]) // 2)[None, :, None]"
       ".expand(h.shape[0], -1, h.shape[2]))")
simple("size_index", "index_half_positions", "h = h[:, torch.arange(h.shape[1]) // 2]")
simple("size_index", "flip_L", "h = h.flip(1)")
simple("size_index", "roll_L", "h = torch.roll(h, 1, 1)")

# indexing with ids
simple("id_index", "embedding", "h = h + F.embedding(ids, P_EMB[:, :{H}])", ok=aligned)
simple("id_index", "table_ids", "h = h + P_EMB[ids, :{H}]", ok=aligned)
simple("id_index", "index_select_ids", "h = h + P_EMB[:, :{H}].index_select(0, ids.reshape(-1))"
       ".view(h.shape)", ok=aligned)
simple("id_index", "gather_features", "h = h.gather(-1, (ids % {H})[..., None].expand(-1, -1, {H}))", ok=aligned)
simple("id_index", "gather_table", "h = h + torch.gather(P_EMB[:, :{H}].expand(h.shape[0], -1, -1), 1, "
       "ids[..., None].expand(-1, -1, {H}))", ok=aligned)
simple("id_index", "gather_L_by_ids", "h = h.gather(1, (ids % h.shape[1])[..., None].expand(-1, -1, {H}))",
       ok=aligned)

# scatters and accumulating index_put
simple("scatter", "scatter_add_gather", "t = torch.zeros(h.shape[0], {V}, {H}, dtype=h.dtype).scatter_add(1, "
       "ids[..., None].expand(-1, -1, {H}), h)\n    h = h + t.gather(1, ids[..., None].expand(-1, -1, {H}))",
       ok=aligned)
simple("scatter", "index_put_acc", "outs.append(torch.zeros({V}, {H}, dtype=h.dtype).index_put_("
       "(ids.reshape(-1),), h.reshape(-1, {H}), accumulate=True))", ok=aligned)
simple("scatter", "index_add", "outs.append(torch.zeros({V}, {H}, dtype=h.dtype).index_add(0, ids.reshape(-1), "
       "h.reshape(-1, {H})))", ok=aligned)
simple("scatter", "histogram", "outs.append(torch.zeros(ids.shape[0], {V}, dtype=h.dtype).scatter_add(1, ids, "
       "torch.ones_like(ids, dtype=h.dtype)))", ok=aligned)
simple("scatter", "scatter_features", "h = h.scatter(-1, (ids % {H})[..., None], 0.0)", ok=aligned)
simple("scatter", "index_put_overwrite", "outs.append(torch.zeros(h.shape[1] + 1, {H}, dtype=h.dtype).index_put("
       "(torch.arange(h.shape[1]),), h[0]))")
simple("scatter", "index_put_acc_positions", "outs.append(torch.zeros(h.shape[0], {V}, {H}, dtype=h.dtype)"
       ".index_put_((torch.arange(h.shape[0])[:, None], ids), h, accumulate=True))", ok=aligned)

# cat / stack / unbind / split
simple("cat", "cat_features", "h = torch.cat([h, torch.tanh(h)], -1)", ok=lambda s: s.H <= 8, H=lambda n: 2 * n)
simple("cat", "cat_prefix", "h = torch.cat([P_CLS[:, :, :{H}].expand(h.shape[0], 1, -1), h], 1)", ok=grows,
       lens=lambda n: n + 1)
simple("cat", "cat_suffix", "h = torch.cat([h, P_CLS[:, :, :{H}].expand(h.shape[0], 1, -1)], 1)", ok=grows,
       lens=lambda n: n + 1)
simple("cat", "cat_twice", "h = torch.cat([h, h * 0.5], 1)", ok=lambda s: s.longest <= 160, lens=lambda n: 2 * n)
simple("cat", "stack_sum", "h = torch.stack([h, torch.relu(h)], 0).sum(0)")
simple("cat", "stack_amax", "h = torch.stack([h, torch.sin(h)], -1).amax(-1)")
simple("cat", "stack_L_mean", "h = torch.stack([h, h * 2.0], 1).mean(1)")
simple("cat", "unbind_features", "a, b = h.unflatten(-1, (2, -1)).unbind(-2)\n    h = torch.cat([b, a * 0.5], -1)",
       ok=even)
simple("cat", "unbind_batch", "h = torch.stack([t * (i + 1) for i, t in enumerate(h.unbind(0))], 0)")
simple("cat", "unbind_L_prefix", "a, b = h[:, :2].unbind(1)\n    outs.append(a * b)", ok=at_least(2))
simple("cat", "split_L", "a, b = h.split([1, h.shape[1] - 1], 1)\n    outs.append(b.sum(1) + a[:, 0])",
       ok=at_least(2))
simple("cat", "chunk_features", "a, b = h.chunk(2, -1)\n    h = torch.cat([a * b, b], -1)", ok=even)

# norms, padding, losses
simple("norm", "layer_norm", "h = F.layer_norm(h, ({H},))")
simple("norm", "layer_norm_L", "h = F.layer_norm(h.transpose(1, 2), (h.shape[1],)).transpose(1, 2)")
simple("norm", "normalize_L", "h = F.normalize(h, dim=1)")
simple("norm", "pad_L", "h = F.pad(h, (0, 0, 0, 1), value=1.0)", ok=grows, lens=lambda n: n + 1)
simple("norm", "pad_L_front", "h = F.pad(h, (0, 0, 1, 0), value=1.0)", ok=grows, lens=lambda n: n + 1)
simple("loss", "cross_entropy", "outs.append(F.cross_entropy(h.reshape(-1, {H}), (ids % {H}).reshape(-1)))",
       ok=aligned)
simple("loss", "cross_entropy_ignore", "outs.append(F.cross_entropy(h.reshape(-1, {H}), torch.where(mask, ids % "
       "{H}, -100).reshape(-1), ignore_index=-100))", ok=aligned)
simple("loss", "nll_sum", "outs.append(F.nll_loss(F.log_softmax(h, -1).transpose(1, 2), ids % {H}, "
       "reduction='sum'))", ok=aligned)
simple("loss", "mse", "outs.append(F.mse_loss(h[..., :1], y[..., :1]))", ok=aligned)

FAMILIES = sorted({o.family for o in OPS})


def _global_tables(prog: Program) -> None:
    """The shared tables named P_POS / P_EMB / P_CLS in the op templates become parameters of the program."""
    tables = {"P_POS": (POS_ROWS, 32), "P_EMB": (V, 32), "P_CLS": (1, 1, 32)}
    for token, shape in tables.items():
        if any(token in line for line in prog.lines):
            name = prog.param(*shape, scale=0.5)
            prog.lines = [line.replace(token, name) for line in prog.lines]


@dataclasses.dataclass
class Example:
    program: Program
    dtype: torch.dtype
    dynamic: bool | None
    target: str
    calls: list[tuple[int, int]]  # (batch, length) per call
    seed: int

    @property
    def precision(self) -> torch.dtype:
        """The dtype whose rounding bounds the program's accuracy: a round trip through bf16 inside an fp32 program
        turns a last-bit difference before it (a kernel's tanh against torch's) into one bf16 ulp."""
        return torch.bfloat16 if "cast_half" in self.program.steps else self.dtype

    def describe(self) -> str:
        return (f"# dtype={DTYPE_NAMES[self.dtype]} dynamic={self.dynamic} target={self.target!r} H={self.program.H0} "
                f"calls (batch, length)={self.calls} seed={self.seed}\n# params: "
                f"{ {k: v[0] for k, v in self.program.params.items()} }\n{self.program.source}")


@dataclasses.dataclass(frozen=True)
class KnownBug:
    """A bug the fuzzer found, pinned (minimised) by a strict xfail in test_padding_fuzz_found.py.

    A failure matching it is counted under the test's name in the summary instead of failing this file; the
    match is narrow (the failure's kind, a pattern of its message, steps the program contains) so that another
    bug with the same symptom still fails. Remove the entry with the xfail once the bug is fixed.
    """

    test: str
    kind: str
    detail: str  # a regex searched in the failure's message
    steps: tuple[str, ...] = ()  # every one of these steps is in the program

    def matches(self, example: Example, kind: str, detail: str) -> bool:
        return (kind == self.kind and re.search(self.detail, detail) is not None
                and all(step in example.program.steps for step in self.steps))


KNOWN_BUGS: list[KnownBug] = []  # none open

LENGTH = st.one_of(st.sampled_from(BOUNDARIES), st.integers(1, MAX_LEN))


@st.composite
def examples(draw, simulator_share: float = 0.2) -> Example:
    n_calls = 3
    lengths = draw(st.lists(LENGTH, min_size=n_calls, max_size=n_calls))
    if draw(st.integers(0, 3)) == 0:  # a dynamic batch too
        batches = draw(st.lists(st.integers(1, 3), min_size=n_calls, max_size=n_calls))
    else:
        batches = [draw(st.sampled_from([2, 1, 3]))] * n_calls
    H0 = draw(st.sampled_from([8, 16]))
    prog = Program(H0)
    s = State(H0, list(lengths))
    for _ in range(draw(st.integers(1, 6))):
        family = draw(st.sampled_from([f for f in FAMILIES if any(o.family == f and o.ok(s) for o in OPS)]))
        choices = [o for o in OPS if o.family == family and o.ok(s) for _ in range(o.weight)]
        chosen = draw(st.sampled_from(choices))
        chosen.emit(prog, s, draw)
        prog.steps.append(chosen.name)
    _global_tables(prog)
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16, torch.float16]))
    dynamic = draw(st.sampled_from([None, True]))
    target = "auto" if draw(st.floats(0, 1)) < simulator_share else "reference"
    seed = draw(st.integers(0, 2**16))
    return Example(prog, dtype, dynamic, target, list(zip(batches, lengths, strict=True)), seed)


# ------------------------------------------------------------------------------------------------ running one
@dataclasses.dataclass
class Outcome:
    graphs: int = 0  # BucketedGraphs built (symbolic graphs and generalised static ones)
    refused: int = 0  # of those, refused by the padding proof
    padded_calls: int = 0
    exact_calls: int = 0  # bucketing calls at exact shapes
    refusals: dict[str, int] = dataclasses.field(default_factory=dict)
    failures: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (kind, detail)
    precision: int = 0
    known: list[str] = dataclasses.field(default_factory=list)  # failures matching a pinned bug (KNOWN_BUGS)
    reasons: list[str] = dataclasses.field(default_factory=list)  # refusal reasons, as logged
    pytorch: int = 0  # calls that raised under backend="aot_eager" as well (a PyTorch bug, not the backend's)
    lowering: int = 0  # regions whose lowering failed (they run eagerly: the target's business, not padding's)
    static_exact: int = 0  # static graphs (dynamic=None, first call) that kept their exact shapes
    stats: dict = dataclasses.field(default_factory=dict)


class _Log(logging.Handler):
    """The backend's refusal and failure messages during one example."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.INFO:
            self.messages.append(record.getMessage())


@contextlib.contextmanager
def _backend_log():
    logger = logging.getLogger("neuron_dynamo")
    handler, level = _Log(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _inputs(H: int, batch: int, length: int, dtype: torch.dtype, gen: torch.Generator):
    x = torch.randn(batch, length, H, generator=gen).to(dtype)
    y = torch.randn(batch, length, H, generator=gen).to(dtype)
    ids = torch.randint(0, V, (batch, length), generator=gen)
    divs = torch.randint(1, 5, (batch, length), generator=gen)
    mask = torch.rand(batch, length, generator=gen) < 0.7
    mask[:, 0] = True
    return x, y, ids, divs, mask


def _run(fn, inputs, params: dict[str, torch.Tensor], seed: int):
    """Outputs and gradients (of x, y and the parameters, under seeded random output gradients) of `fn`."""
    x, y, ids, divs, mask = (t.detach().clone() for t in inputs)
    x.requires_grad_()
    y.requires_grad_()
    leaves = [x, y, *params.values()]
    outs = fn(x, y, ids, divs, mask)
    differentiable = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    grads: list = []
    if differentiable:
        gen = torch.Generator().manual_seed(seed)
        cotangents = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in differentiable]
        grads = list(torch.autograd.grad(differentiable, leaves, cotangents, allow_unused=True))
        grads = [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves, strict=True)]
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs], grads


def _mismatch(got, want, dtype: torch.dtype) -> str | None:
    """Why `got` differs from `want` (None when they agree at the dtype's tolerance)."""
    if len(got) != len(want):
        return f"{len(got)} results, eager has {len(want)}"
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(w, torch.Tensor):
            if g != w:
                return f"result {index}: {g!r} != {w!r}"
            continue
        if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
            return (f"result {index}: {getattr(g, 'dtype', type(g))}{list(getattr(g, 'shape', []))} vs eager "
                    f"{w.dtype}{list(w.shape)}")
        if not w.is_floating_point():
            if not torch.equal(g, w):
                wrong = (g != w).nonzero()[:4].tolist()
                return f"result {index}: integers differ at {wrong} (of {(g != w).sum().item()})"
            continue
        tol = TOLERANCE[dtype] if dtype != torch.float32 or w.dtype == torch.float32 else TOLERANCE[w.dtype]
        finite = w[torch.isfinite(w)].float()
        scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
        try:
            torch.testing.assert_close(g.float(), w.float(), rtol=tol, atol=tol * scale, equal_nan=True)
        except AssertionError as error:
            return f"result {index}: " + " ".join(str(error).split())[:400]
    return None


def _compile(fn, dynamic, target: str, bucketing: bool = True):
    options = {"target": target, "cache": "off", "bucketing": bucketing}
    return torch.compile(fn, backend="neuron", dynamic=dynamic, options=options)


def _fresh() -> None:
    torch._dynamo.reset()
    forget_generalized_graphs()
    neuron_dynamo.reset_stats()


def run_example(example: Example) -> Outcome:
    with _backend_log() as messages:
        outcome = _run_example(example)
    refused = [m.split("running at exact shapes: ", 1)[1] for m in messages if "padding refused, running at" in m]
    outcome.reasons = [" ".join(r.split())[:300] for r in refused]
    late = [r for r in outcome.reasons if r.startswith("bucket ")]
    if late:
        outcome.failures.append(("late_refusal", "; ".join(late)))
    fallbacks = [" ".join(m.split())[:400] for m in messages if any(p in m for p in FALLBACK_MESSAGES)]
    if fallbacks:  # the same failures as the counters, with their reasons
        outcome.failures = [f for f in outcome.failures if f[0] != "fallback"] + [("fallback", m) for m in fallbacks]
    outcome.lowering = sum("failed, running it eagerly" in m and "lowering" in m for m in messages)
    for kind, detail in list(outcome.failures):
        pinned = [bug.test for bug in KNOWN_BUGS if bug.matches(example, kind, detail)]
        if pinned:
            outcome.failures.remove((kind, detail))
            outcome.known.append(pinned[0])
    return outcome


# How the backend logs a graph it gave up on (EagerFallback, the Dynamo backend, the bucketing setup).
FALLBACK_MESSAGES = ("the backend failed, running this graph eagerly", "compiling the Dynamo graph failed",
                     "bucketing failed, running at exact shapes")


def _run_example(example: Example) -> Outcome:
    prog = example.program
    params = prog.make_params(example.dtype, example.seed)
    eager_fn = prog.function(params)
    outcome = Outcome()
    _fresh()
    compiled = _compile(prog.function(params), example.dynamic, example.target)
    gen = torch.Generator().manual_seed(example.seed)
    calls, raised = [], None
    for batch, length in example.calls:
        inputs = _inputs(prog.H0, batch, length, example.dtype, gen)
        try:
            want = _run(eager_fn, inputs, params, example.seed)
        except Exception:  # noqa: BLE001 (the program is invalid at this size: not the backend's business)
            continue
        try:
            got = _run(compiled, inputs, params, example.seed)
        except Exception as error:  # noqa: BLE001
            raised = (error, [c[0] for c in calls] + [inputs])
            outcome.failures.append(("raised", f"length {length} batch {batch}: {type(error).__name__}: "
                                     + " ".join(str(error).split())[:300]))
            break
        calls.append((inputs, got))
        dtype = example.precision
        why = _mismatch(got[0], want[0], dtype) or _mismatch(got[1], want[1], dtype)
        if why is not None:
            outcome.failures.append(("wrong", f"length {length} batch {batch}: {why}"))
            break
    stats = neuron_dynamo.stats()
    outcome.stats = stats
    outcome.graphs = int(stats.get("bucketing.graphs", 0))
    late = int(stats.get("bucketing.refusals.bucket", 0))  # a bucket program that failed to compile/run
    outcome.refused = int(stats.get("bucketing.graphs_refused", 0)) - late
    for key, value in stats.items():
        if key.startswith("bucketing.refusals.") and key != "bucketing.refusals.bucket":
            outcome.refusals[key.removeprefix("bucketing.refusals.")] = int(value)
        elif re.match(r"bucketing\.graph_\d+\.\w+\.calls\.bucket\[", key):
            outcome.padded_calls += int(value)
        elif re.match(r"bucketing\.graph_\d+\.\w+\.calls\.exact\[", key):
            outcome.exact_calls += int(value)
    outcome.static_exact = int(stats.get("bucketing.static_graphs_exact", 0))
    for counter in ("graphs_failed", "dynamo_graphs_eager", "bucketing.setup_failed"):
        if stats.get(counter, 0):  # the log (read by the caller) says which graph and why
            outcome.failures.append(("fallback", f"{counter}={stats[counter]}"))
    if raised is not None and _pytorch_raises(example, params, raised[1], raised[0]):
        outcome.failures = [f for f in outcome.failures if f[0] != "raised"]
        outcome.pytorch += 1
    if any(kind == "wrong" for kind, _ in outcome.failures) and example.precision != torch.float32:
        if _noise(example, calls, params):
            outcome.failures = [f for f in outcome.failures if f[0] != "wrong"]
            outcome.precision += 1
    return outcome


def _pytorch_raises(example: Example, params, calls, error: Exception) -> bool:
    """Whether PyTorch's own compile path (`backend="aot_eager"`: Dynamo and AOTAutograd without this backend)
    raises the same kind of error (type and first words) on the same calls: then the raise is PyTorch's, counted
    apart, not the backend's."""
    _fresh()
    reference = torch.compile(example.program.function(params), backend="aot_eager", dynamic=example.dynamic)
    try:
        for inputs in calls:
            _run(reference, inputs, params, example.seed)
    except Exception as other:  # noqa: BLE001
        return type(other) is type(error) and str(other).split()[:3] == str(error).split()[:3]
    return False


def _noise(example: Example, calls, params) -> bool:
    """Whether a low-precision mismatch with eager is rounding: the same program compiled without bucketing, called
    the same way, gives what the bucketed one gave (at the dtype's tolerance) at the call that mismatched."""
    torch._dynamo.reset()
    plain = _compile(example.program.function(params), example.dynamic, example.target, bucketing=False)
    for inputs, _ in calls:
        try:
            unpadded = _run(plain, inputs, params, example.seed)
        except Exception:  # noqa: BLE001
            return False
    bucketed = calls[-1][1]
    dtype = example.precision
    return (_mismatch(bucketed[0], unpadded[0], dtype) or _mismatch(bucketed[1], unpadded[1], dtype)) is None


# ------------------------------------------------------------------------------------------------ the summary
class Summary:
    def __init__(self) -> None:
        self.examples = 0
        self.skipped = 0
        self.graphs = 0
        self.refused = 0
        self.padded_calls = 0
        self.exact_calls = 0
        self.examples_padded = 0
        self.examples_refused = 0
        self.precision = 0
        self.lowering = 0
        self.pytorch = 0
        self.static_exact = 0
        self.known: collections.Counter[str] = collections.Counter()
        self.reasons: collections.Counter[str] = collections.Counter()
        self.refusals: collections.Counter[str] = collections.Counter()
        self.failures: list[dict] = []
        self.by_family: collections.Counter[str] = collections.Counter()
        self.seconds = 0.0

    def add(self, example: Example, outcome: Outcome, seconds: float) -> None:
        self.examples += 1
        self.seconds += seconds
        self.graphs += outcome.graphs
        self.refused += outcome.refused
        self.padded_calls += outcome.padded_calls
        self.exact_calls += outcome.exact_calls
        self.examples_padded += outcome.padded_calls > 0
        self.examples_refused += outcome.refused > 0
        self.precision += outcome.precision
        self.lowering += outcome.lowering
        self.pytorch += outcome.pytorch
        self.static_exact += outcome.static_exact
        self.known.update(outcome.known)
        self.reasons.update(re.sub(r"\(\w+\)|\b(s\d+|\d+)\b", "_", r) for r in outcome.reasons)
        self.refusals.update(outcome.refusals)
        self.by_family.update(example.program.steps)
        for kind, detail in outcome.failures:
            self.failures.append({"kind": kind, "detail": detail, "program": example.describe()})

    def text(self) -> str:
        lines = [
            f"padding fuzzer: {self.examples} examples in {self.seconds:.0f} s ({self.skipped} skipped: time budget)",
            f"  graphs tried (bucketed graphs built): {self.graphs}; padded: {self.graphs - self.refused}, "
            f"refused by the proof: {self.refused}",
            f"  calls served padded: {self.padded_calls}, at exact shapes under bucketing: {self.exact_calls}",
            f"  examples with a padded call: {self.examples_padded}, with a refused graph: {self.examples_refused}",
            f"  static graphs (first call under dynamic=None) kept exact: {self.static_exact}",
            f"  low-precision mismatches also seen without bucketing (noise, not failures): {self.precision}",
            f"  regions whose lowering failed (ran eagerly, not a padding matter): {self.lowering}",
            f"  raised under backend='aot_eager' too (PyTorch's, not the backend's): {self.pytorch}",
            "  refusals by op: " + (", ".join(f"{op} {n}" for op, n in self.refusals.most_common()) or "none"),
            "  top refusal reasons:",
            *(f"    {n:5d}  {reason[:160]}" for reason, n in self.reasons.most_common(12)),
            "  known bugs hit (pinned in test_padding_fuzz_found.py): "
            + (", ".join(f"{test} {n}" for test, n in self.known.most_common()) or "none"),
            f"  failures: {len(self.failures)} "
            + str(dict(collections.Counter(f["kind"] for f in self.failures))),
        ]
        seen = set()
        for failure in self.failures:
            key = (failure["kind"], failure["detail"][:60], failure["program"].split("\n", 2)[-1])
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"  --- {failure['kind']}: {failure['detail']}")
            lines.append(textwrap.indent(failure["program"], "      "))
            if len(seen) >= 20:
                lines.append("  ... (more in NEURON_FUZZ_REPORT)")
                break
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"examples": self.examples, "skipped": self.skipped, "seconds": self.seconds, "graphs": self.graphs,
                "refused": self.refused, "padded_calls": self.padded_calls, "exact_calls": self.exact_calls,
                "examples_padded": self.examples_padded, "examples_refused": self.examples_refused,
                "precision": self.precision, "lowering": self.lowering, "pytorch": self.pytorch,
                "static_exact": self.static_exact,
                "known": dict(self.known), "reasons": dict(self.reasons.most_common()),
                "refusals": dict(self.refusals.most_common()),
                "steps": dict(self.by_family.most_common()), "failures": self.failures}


@pytest.fixture(scope="module")
def summary(request):
    result = Summary()
    yield result
    if result.examples == 0:
        return
    text = result.text()
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + text, flush=True)
    path = os.environ.get("NEURON_FUZZ_REPORT")
    if path:
        with open(path, "w") as handle:
            json.dump(result.to_dict(), handle, indent=1)


def _long(config) -> bool:
    return bool(config.getoption("--fuzz-long", default=False))


# ------------------------------------------------------------------------------------------------ the tests
def test_every_family_is_generated():
    """The generator reaches every op family of the table (a family nothing can draw would be skipped silently)."""
    assert {"elementwise", "integer", "compare", "cast", "view", "reduction", "scan", "contraction", "softmax",
            "attention", "size_index", "id_index", "scatter", "cat", "norm", "loss"} <= set(FAMILIES)
    for o in OPS:
        s = State(8, [5])
        if not o.ok(s):
            continue
        prog = Program(8)
        o.emit(prog, s, _first)
        _global_tables(prog)
        fn = prog.function(prog.make_params(torch.float32, 0))
        gen = torch.Generator().manual_seed(0)
        try:
            fn(*_inputs(8, 2, 5, torch.float32, gen))  # every op template is valid torch code
        except Exception as error:
            raise AssertionError(f"{o.name}: {error}\n{prog.source}") from error


def _first(strategy):
    """The simplest value of a sampled_from strategy (the test above draws no data)."""
    elements = getattr(strategy, "elements", None)
    return elements[0] if elements is not None else False


def _settings(config):
    if _long(config):
        return settings(max_examples=int(os.environ.get("NEURON_FUZZ_EXAMPLES", "2000")), derandomize=False,
                        deadline=None, database=None, print_blob=True,
                        suppress_health_check=list(HealthCheck))
    # No shrinking: one example compiles several graphs, and shrinking one takes minutes; the failing program is
    # printed whole (at most 6 steps), and minimised by hand into test_padding_fuzz_found.py.
    return settings(max_examples=DEFAULT_EXAMPLES, derandomize=True, deadline=None, database=None,
                    phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))


def test_bucketed_programs_match_eager(request, summary):
    long = _long(request.config)
    budget = float(os.environ.get("NEURON_FUZZ_SECONDS", "1800")) if long else math.inf
    start = time.monotonic()

    @_settings(request.config)
    @given(example=examples(simulator_share=0.2))
    def check(example: Example) -> None:
        if time.monotonic() - start > budget:
            summary.skipped += 1
            return
        note(example.describe())
        began = time.monotonic()
        try:
            outcome = run_example(example)
        except Exception:  # noqa: BLE001 (the harness itself: report, with the program)
            outcome = Outcome(failures=[("harness", traceback.format_exc()[-800:])])
        summary.add(example, outcome, time.monotonic() - began)
        if outcome.failures and not long:
            raise AssertionError("\n".join(f"{kind}: {detail}" for kind, detail in outcome.failures))

    check()
    if long:
        assert not summary.failures, f"{len(summary.failures)} failing examples: see the summary"


def test_the_harness_notices_a_wrong_answer():
    """A program whose compiled run cannot agree with eager (a random draw) fails, also in bf16."""
    for dtype in (torch.float32, torch.bfloat16):
        program = Program(8, ["h = h + torch.rand_like(h)"], steps=["rand"])
        outcome = run_example(Example(program, dtype, True, "reference", [(2, 5), (2, 7)], 0))
        assert [kind for kind, _ in outcome.failures] == ["wrong"], outcome.failures
