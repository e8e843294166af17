"""The padding proof: accepted graphs give eager's real outputs at every length and bucket; the rest is refused.

Graphs are traced once (make_fx with chosen symbolic dims); hypothesis then draws lengths, bucket steps and data.
`BucketedGraph` with its default (reference) compile step runs them: pick bucket, pad with zeros, run, slice.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_dynamo.bucket_dispatch import BucketedGraph
from neuron_dynamo.passes.bucketing import BucketConfig
from neuron_dynamo.passes.padding import Pad, prove_padding

from .symbolic import dynamo_graph, symbolic_graph

H = 8
WEIGHT = torch.randn(H, H, generator=torch.Generator().manual_seed(0))


def _softmax_mean(x):
    return torch.softmax(x @ WEIGHT, dim=1).mean(1)


def _reductions(x):
    return x.sum(1), x.amax(1), x.argmax(1), torch.logsumexp(x, 1), x.cumsum(1), torch.log_softmax(x, 1), x.mean(1)


def _attention(q, k, v):
    plain = F.scaled_dot_product_attention(q, k, v)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return plain, causal


def _merged_rows(x):
    """[B, S, H] -> [B*S, H] -> mm -> back: padding interleaved with real rows, then a reduction over S."""
    y = (x.reshape(-1, H) @ WEIGHT).relu()
    return y.reshape(x.shape[0], -1, H).sum(1), torch.softmax(y.reshape(-1), 0).reshape(x.shape[0], -1, H)


def _gram(x):
    """A contraction over the padded dim: x^T @ x sums over the sequence."""
    normed = F.layer_norm(x, (H,))
    return normed.transpose(-1, -2) @ normed


def _masked_mean(x, mask):
    weights = mask.unsqueeze(-1).to(x.dtype)
    return (x * weights).sum(1) / weights.sum(1).clamp(min=1)


def _shifted_loss(labels, logits):
    labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def _prefix_token(x):
    cls = torch.ones(x.shape[0], 1, H)
    return torch.softmax(torch.cat([cls, x], dim=1), dim=1)


def _length_as_data(x):
    return x.sum(1) / x.shape[1], torch.arange(x.shape[1]) * 2


def _positions(ids, table):
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
    return table[positions] + table.index_select(0, positions[0]).unsqueeze(0)


def _decode_step(past, new, query):
    """One step of a growing KV cache: the new token's keys appended behind the past ones, attended over."""
    keys = torch.cat([past, new], dim=2)
    return F.scaled_dot_product_attention(query, keys, keys), keys


def _last_position(x):
    return x.cumsum(1)[:, -1:] * 2


def _cache_write(cache, position, value):
    """A static KV cache written at a position given as data (negative: counted from the end)."""
    return torch.ops.aten.index_put(cache, [None, position], value) * 2


def _seq(batch=2, features=True, dtype=torch.float32):
    def make(n, gen):
        shape = (batch, n, H) if features else (batch, n)
        return torch.randn(shape, generator=gen, dtype=dtype)

    return make


ACCEPTED = {
    "softmax_mean": (_softmax_mean, [_seq()], {0: [1]}),
    "reductions": (_reductions, [_seq(features=False)], {0: [1]}),
    "attention": (_attention, [lambda n, g: torch.randn(2, 2, n, H, generator=g)] * 3, {0: [2], 1: [2], 2: [2]}),
    "merged_rows": (_merged_rows, [_seq()], {0: [1]}),
    "gram": (_gram, [_seq()], {0: [1]}),
    "masked_mean": (
        _masked_mean,
        [_seq(), lambda n, g: (torch.rand(2, n, generator=g) > 0.3).long()],
        {0: [1], 1: [1]},
    ),
    "shifted_loss": (
        _shifted_loss,
        [lambda n, g: torch.randint(0, 11, (1, n), generator=g), lambda n, g: torch.randn(1, n, 11, generator=g)],
        {0: [1], 1: [1]},
    ),
    "prefix_token": (_prefix_token, [_seq()], {0: [1]}),
    "decode_step": (_decode_step, [lambda n, g: torch.randn(1, 2, n, H, generator=g),
                                   lambda n, g: torch.randn(1, 2, 1, H, generator=g),
                                   lambda n, g: torch.randn(1, 2, 1, H, generator=g)], {0: [2]}),
    "last_position": (_last_position, [_seq()], {0: [1]}),
    "cache_write": (_cache_write, [_seq(), lambda n, g: torch.randint(-n, n, (1,), generator=g),
                                   lambda n, g: torch.randn(2, 1, H, generator=g)], {0: [1]}),
    "length_as_data": (_length_as_data, [_seq()], {0: [1]}),
    "positions": (
        _positions,
        [lambda n, g: torch.zeros(2, n, dtype=torch.long), lambda n, g: torch.randn(64, H, generator=g)],
        {0: [1]},
    ),
}


# Graphs whose ops make_fx would specialise away (F.pad) are captured through Dynamo, like the backend sees them.
THROUGH_DYNAMO = {"shifted_loss"}


@functools.cache
def _graph(name: str):
    fn, makers, dynamic = ACCEPTED[name]
    gen = torch.Generator().manual_seed(1)
    trace = dynamo_graph if name in THROUGH_DYNAMO else symbolic_graph
    return trace(fn, [make(5, gen) for make in makers], dynamic)


@functools.cache
def _bucketed(name: str, multiple: int) -> BucketedGraph:
    return BucketedGraph(_graph(name), BucketConfig.from_options(multiple=multiple))


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_graph_is_accepted(name):
    proof = prove_padding(_graph(name), _bucketed(name, 16).plan.symbols)
    assert proof.safe, proof.reason


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ACCEPTED))
@settings(max_examples=12, deadline=None)
@given(length=st.integers(2, 60), multiple=st.sampled_from([16, 32]), seed=st.integers(0, 2**16))
def test_padded_and_sliced_equals_unpadded(name, length, multiple, seed):
    fn, makers, _ = ACCEPTED[name]
    gen = torch.Generator().manual_seed(seed)
    inputs = [make(length, gen) for make in makers]
    want = fn(*inputs)
    want = list(want) if isinstance(want, tuple) else [want]
    got = _bucketed(name, multiple).run(*inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


REFUSED = {
    "sort": (lambda x: torch.sort(x, 1).values, "sort"),
    "topk": (lambda x: torch.topk(x, 2, dim=1).values, "topk"),
    "last_position": (lambda x: x[:, -1] * 2, "end of a padded dim"),
    "strided_tail_slice": (lambda x: x[:, -3::2] * 2, "from the end of a padded dim"),
    "variance": (lambda x: x.var(1), "variance"),
    "cat_along_length": (lambda x: torch.cat([x, x], 1).sum(1), "concatenation along a padded dim"),
    "scan_over_merged": (lambda x: x.reshape(-1).cumsum(0), "scan along a merged padded dim"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsafe_graphs_are_refused_with_a_reason(name):
    fn, fragment = REFUSED[name]
    gm = symbolic_graph(fn, [torch.randn(2, 5)], {0: [1]})
    symbol = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"].shape[1].node.expr
    proof = prove_padding(gm, [symbol])
    assert not proof.safe and fragment in proof.reason, proof.reason


def test_refused_graph_still_runs_correctly_at_exact_shapes():
    fn = REFUSED["sort"][0]
    bucketed = BucketedGraph(symbolic_graph(fn, [torch.randn(2, 5)], {0: [1]}))
    for length in (3, 9, 9):
        x = torch.randn(2, length)
        torch.testing.assert_close(bucketed.run(x)[0], fn(x))
    assert sorted(bucketed.stats.programs) == ["exact[s0=3]", "exact[s0=9]"] or len(bucketed.stats.programs) == 2
    assert "sort" in bucketed.stats.refusals[0]


def test_input_mutation_and_random_ops_are_refused():
    def update(cache, x):
        cache.add_(x)
        return cache * 2

    mutation = symbolic_graph(update, [torch.zeros(2, 5), torch.randn(2, 5)], {0: [1], 1: [1]})
    symbol = next(n for n in mutation.graph.nodes if n.op == "placeholder").meta["val"].shape[1].node.expr
    proof = prove_padding(mutation, [symbol])
    assert not proof.safe and "writes into a buffer" in proof.reason

    dropout = symbolic_graph(lambda x: F.dropout(x, 0.5, training=True), [torch.randn(2, 5)], {0: [1]})
    symbol = next(n for n in dropout.graph.nodes if n.op == "placeholder").meta["val"].shape[1].node.expr
    proof = prove_padding(dropout, [symbol])
    assert not proof.safe and "random" in proof.reason


def _proof(fn, inputs, dynamic, dim=1):
    gm = symbolic_graph(fn, inputs, dynamic)
    symbol = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"].shape[dim].node.expr
    return prove_padding(gm, [symbol])


def test_contraction_masks_only_operands_not_proven_zero():
    x = torch.randn(2, 5, H)
    zero_padded = _proof(lambda x: x.transpose(-1, -2) @ x, [x], {0: [1]})  # inputs are padded with 0
    assert zero_padded.safe and not zero_padded.masks
    garbage = _proof(lambda x: x.exp().transpose(-1, -2) @ x.exp(), [x], {0: [1]})  # exp(0) = 1 in the pad
    assert garbage.safe and any("contraction" in m for m in garbage.masks)


def test_softmax_and_reductions_insert_masks_only_where_the_pad_is_not_neutral():
    x = torch.randn(2, 5)
    assert not _proof(lambda x: x.sum(1), [x], {0: [1]}).masks  # zero pad is neutral for sum
    assert any("amax" in m for m in _proof(lambda x: x.amax(1), [x], {0: [1]}).masks)
    softmax_then_sum = _proof(lambda x: torch.softmax(x, 1).sum(1), [x], {0: [1]})
    assert [m.split(": ", 1)[1] for m in softmax_then_sum.masks] == ["softmax over a padded dim: pad set to -inf"]


def test_causal_self_attention_needs_no_key_mask_but_plain_attention_does():
    def causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def plain(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    inputs = [torch.randn(1, 2, 5, H)] * 3
    for fn, keys_masked in ((causal, False), (plain, True)):
        gm = symbolic_graph(fn, inputs, {0: [2], 1: [2], 2: [2]})
        symbol = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"].shape[2].node.expr
        proof = prove_padding(gm, [symbol])
        assert proof.safe
        assert any("padded keys masked" in m for m in proof.masks) == keys_masked


def test_pad_kinds_are_computed_exactly_for_constant_pads():
    from neuron_dynamo.passes.padding import Analysis

    gm = symbolic_graph(lambda x: (torch.exp(x - float("inf")), x + 1, x * 0.5), [torch.randn(5)], {0: [0]})
    symbol = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"].shape[0].node.expr
    analysis = Analysis(gm, (symbol,))
    analysis.run()
    kinds = {
        n.name: analysis.state[n].dims[0].kind
        for n in gm.graph.nodes
        if n.op == "call_function" and analysis.tensor(n) is not None and analysis.tensor(n).padded
        and str(n.target).startswith("aten.")
        and n.target.overloadpacket in (torch.ops.aten.exp, torch.ops.aten.add, torch.ops.aten.mul)
    }
    assert sorted(kinds.values(), key=lambda k: k.value) == sorted(
        [Pad.ZERO, Pad.FINITE, Pad.ZERO], key=lambda k: k.value
    )


def test_contraction_over_a_merged_dim_pads_a_product_sized_input_merged():
    """[2, L, 4] merged to [2L, 4] (padding interleaved per row) against a [2L, 4] input: padded at its tail, the
    contraction would pair real rows with padding (the wrong nn.Linear weight gradient of training with batch > 1);
    the proof pads that input as [2, L] instead, so both operands lay the padding out alike."""
    fn = lambda x, y: x.reshape(-1, 4).T @ y  # noqa: E731
    bucketed = BucketedGraph(symbolic_graph(fn, [torch.randn(2, 5, 4), torch.randn(10, 4)], {0: [1], 1: [0]}))
    assert bucketed.proof.safe
    (parts,) = [layout[0] for layout in bucketed.proof.input_factors if layout and layout[0]]
    assert parts[0] == 2
    for length in (7, 1, 128, 129):
        x, y = torch.randn(2, length, 4), torch.randn(2 * length, 4)
        torch.testing.assert_close(bucketed.run(x, y)[0], fn(x, y))


def test_linear_weight_gradient_with_batch_of_two_matches_eager():
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8)
    loss = lambda x: torch.tanh(linear(x)).mean()  # noqa: E731
    compiled = torch.compile(loss, backend="neuron", options={"target": "reference"})
    for length in (3, 5, 37):
        x = torch.randn(2, length, 8)
        grads = []
        for run in (loss, compiled):
            linear.zero_grad()
            run(x).backward()
            grads.append(linear.weight.grad.clone())
        torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)


def test_attention_with_a_dynamic_head_dim_keeps_its_real_scale():
    """dynamic=True makes the head dim symbolic too: SDPA's default scale must be 1/sqrt(real head dim)."""
    attend = lambda q, k, v: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    compiled = torch.compile(attend, backend="neuron", dynamic=True, options={"target": "reference"})
    for length, head_dim in ((5, 8), (7, 8), (9, 16)):
        q, k, v = (torch.randn(2, 3, length, head_dim) for _ in range(3))
        torch.testing.assert_close(compiled(q, k, v), attend(q, k, v), atol=1e-5, rtol=1e-5)


def test_the_rules_table_and_the_registered_rules_agree():
    """The module docstring's table is the audit of the rules: every rule is in it, and it names only real rules."""
    import re

    import neuron_dynamo.passes.padding as padding
    from neuron_dynamo.passes.padding.state import _RULES

    table = [line for line in padding.__doc__.splitlines() if line.startswith("|")]
    families = " ".join(line.split("|")[1] for line in table)
    documented = " ".join(table)
    registered = {str(op).removeprefix("aten.") for op in _RULES}
    generic = {"graph", "inputs", "element", "wise", "tag", "pointwise", "casts", "fwd", "bwd", "attention", "sdpa",
               "backward", "mutations", "add_", "copy_", "random", "dropout", "rand", "bernoulli", "creation",
               "a", "size", "used", "as", "data", "x", "s0", "anything", "else", "touching", "padding", "layer",
               "norm", "batch", "eval", "conv", "un", "op", "family"}
    named = {word for word in re.findall(r"[a-z_0-9]+", families.lower()) if word not in generic}
    unknown = {word for word in named if not any(name.lstrip("_").startswith(word) for name in registered)}
    assert unknown == set(), "the table names ops without a rule"
    for fn in set(_RULES.values()):
        ops = [re.sub(r"(_dense)?(_backward.*|_forward|_copy)$", "", str(op).split(".")[-1].strip("_"))
               for op, rule in _RULES.items() if rule is fn]
        described_by_family = fn.__name__ in ("_elementwise_untagged", "_attention", "_attention_backward",
                                              "_layer_norm", "_layer_norm_backward", "_batch_norm_eval",
                                              "_convolution", "_creation")
        assert described_by_family or any(re.search(rf"\b{re.escape(op)}\b", documented) for op in ops), fn.__name__
