"""RoPE through complex numbers under bucketing: `view_as_complex(x.reshape(..., -1, 2)) * freqs`, `view_as_real`.

Z-Image (and other Diffusers models) rotate queries and keys this way. The padding proof carries a padded dim through
the complex views and products, so one bucket program serves every length of its bucket; splitting a padded dim
into real/imaginary pairs, or a complex op that mixes positions (an FFT along the length), is still refused.
"""

from __future__ import annotations

import functools

import pytest
import torch

import neuron_dynamo
from neuron_dynamo.bucket_dispatch import BucketedGraph
from neuron_dynamo.passes.bucketing import BucketConfig
from neuron_dynamo.passes.padding import Analysis, Pad, prove_padding
from neuron_dynamo.passes.padding.state import _classify

from .symbolic import dynamo_graph, symbolic_graph


def rope(x, freqs):
    """Z-Image's `apply_rotary_emb`: x [batch, seq, heads, head_dim], freqs [batch, seq, head_dim / 2] complex."""
    rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(rotated * freqs.unsqueeze(2)).flatten(3).type_as(x)


def _rope_inverse(x, freqs):
    """The inverse rotation (a conjugate), its parts stacked back: `_conj`, `real`/`imag` views, `stack`."""
    rotated = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * freqs.conj().unsqueeze(2)
    return torch.stack([rotated.real, rotated.imag], -1).flatten(3)


LINEAR = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))


def _rope_after_linear(x, freqs):
    """`x @ w` of a [b, s, heads, d] input: mm over [b*s*heads, d], viewed back to [b, s, heads, d] (the padded s
    is the outermost factor of the merged rows)."""
    return rope(x @ LINEAR, freqs)


WEIGHTS = torch.tensor([1 + 1j, 3 - 1j, 2j, -1], dtype=torch.complex64)


def _broadcast_weights(x, y):
    """Complex weights broadcast into the pad (real data: they may be inf, and inf * 0 is nan), then a zero-padded
    factor and a sum over the length: the product's pad is not proven zero, so the sum masks it."""
    weighted = torch.view_as_real(torch.view_as_complex(x) * WEIGHTS).flatten(-2)
    return (weighted * y).sum(1)


def _complex_reductions(x):
    """exp(0) = 1 in the pad: the sum masks it; the plain product's zero pad needs no mask."""
    numbers = torch.view_as_complex(x)
    return torch.view_as_real(torch.exp(numbers).sum(1)), torch.view_as_real((numbers * numbers).sum(1))


def _construct(magnitude, angle):
    return torch.view_as_real(torch.polar(magnitude, angle) + torch.complex(magnitude, angle)).sum(1)


def _pairs_of_last_dims(x):
    """Real/imaginary pairs cut from the flattened dims after the batch: from the length itself when it is last."""
    return torch.view_as_real(torch.view_as_complex(x.reshape(x.shape[0], -1, 2)) * 2)


def _seq(*tail, batch=1):
    return lambda n, g: torch.randn(batch, n, *tail, generator=g)


def _freqs(n, g):
    return torch.polar(torch.ones(1, n, 4), torch.randn(1, n, 4, generator=g))


ACCEPTED = {
    "rope": (rope, [_seq(2, 8), _freqs], {0: [1], 1: [1]}),
    "rope_after_linear": (_rope_after_linear, [_seq(2, 8), _freqs], {0: [1], 1: [1]}),
    "rope_inverse": (_rope_inverse, [_seq(2, 8), _freqs], {0: [1], 1: [1]}),
    "broadcast_weights": (_broadcast_weights, [_seq(4, 2, batch=2), lambda n, g: torch.rand(2, n, 8, generator=g)],
                          {0: [1], 1: [1]}),
    "complex_reductions": (_complex_reductions, [_seq(3, 2, batch=2)], {0: [1]}),
    "pairs_behind_length": (_pairs_of_last_dims, [_seq(6, batch=2)], {0: [1]}),
    "construct": (_construct, [lambda n, g: torch.rand(2, n, generator=g), _seq(batch=2)], {0: [1], 1: [1]}),
}


# make_fx specialises the length of `polar` and `complex`; Dynamo, as the backend sees them, keeps it symbolic.
THROUGH_DYNAMO = {"construct"}


@functools.cache
def _bucketed(name: str) -> BucketedGraph:
    fn, makers, dynamic = ACCEPTED[name]
    gen = torch.Generator().manual_seed(1)
    trace = dynamo_graph if name in THROUGH_DYNAMO else symbolic_graph
    graph = trace(fn, [make(6, gen) for make in makers], dynamic)
    return BucketedGraph(graph, BucketConfig.from_options(multiple=16))


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_padded_complex_graph_equals_unpadded_and_a_bucket_shares_one_program(name):
    fn, makers, _ = ACCEPTED[name]
    bucketed = _bucketed(name)
    assert bucketed.proof.safe, bucketed.proof.reason
    for length in (3, 17, 30, 5):
        inputs = [make(length, torch.Generator().manual_seed(length)) for make in makers]
        want = fn(*inputs)
        want = list(want) if isinstance(want, tuple) else [want]
        for got, expected in zip(bucketed.run(*inputs), want, strict=True):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(bucketed.stats.programs) == 2  # lengths 3 and 5 in the bucket of 16, 17 and 30 in the bucket of 32


def test_a_product_with_broadcast_complex_weights_is_not_assumed_finite():
    masks = _bucketed("broadcast_weights").proof.masks
    assert any("sum over a padded dim" in m for m in masks), masks


def test_complex_pad_kinds():
    """A complex kind is the number `kind + 0j`: casts between real and complex keep it; tanh is not bounded on
    complex numbers (it has poles), so a finite pad does not stay finite through it."""
    assert _classify(torch.tensor(0j)) == Pad.ZERO
    assert _classify(torch.tensor(complex(float("-inf"), 0))) == Pad.NEG_INF
    assert _classify(torch.tensor(1 + 2j)) == Pad.FINITE
    assert _classify(torch.tensor(complex(0, float("inf")))) == Pad.UNKNOWN
    assert _classify(torch.tensor(complex(float("nan"), 0))) == Pad.UNKNOWN

    def fn(x):
        finite = torch.view_as_complex(x) + (1 + 1j)
        return torch.tanh(finite), torch.tanh(x + 1), finite.conj().resolve_conj()

    gm = symbolic_graph(fn, [torch.randn(5, 2)], {0: [0]})
    symbol = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"].shape[0].node.expr
    analysis = Analysis(gm, (symbol,))
    analysis.run()
    out = [analysis.tensor(node) for node in next(n for n in gm.graph.nodes if n.op == "output").args[0]]
    assert [state.dims[0].kind for state in out] == [Pad.UNKNOWN, Pad.FINITE, Pad.FINITE]


@pytest.mark.parametrize("shape", [(2, 6), (2, 3, 6)])
def test_pairs_cut_from_the_padded_dim_are_refused(shape):
    """[2, s] -> [2, s/2, 2] and [2, 3, s] -> [2, 3s/2, 2]: padding would sit inside pairs and among real ones
    (`pairs_behind_length`, [2, s, 6] -> [2, 3s, 2], cuts them from the static 6 and is accepted)."""
    gm = symbolic_graph(_pairs_of_last_dims, [torch.randn(*shape)], {0: [len(shape) - 1]})
    symbol = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"].shape[-1].node.expr
    proof = prove_padding(gm, [symbol])
    assert not proof.safe and "cannot relate the view" in proof.reason, proof.reason


def _compiled_lengths(fn, make, lengths, tolerance=1e-5):
    """`fn` compiled the way a user does, run at `lengths` against eager; the programs compiled after each call."""
    torch._dynamo.reset()
    neuron_dynamo.reset_stats()
    compiled = torch.compile(fn, backend="neuron")
    programs = []
    for length in lengths:
        inputs = make(length)
        torch.testing.assert_close(compiled(*inputs), fn(*inputs), atol=tolerance, rtol=tolerance)
        programs.append(neuron_dynamo.stats().get("programs_compiled", 0))
    return programs, neuron_dynamo.stats()


def _rope_inputs(length):
    gen = torch.Generator().manual_seed(length)
    return _seq(2, 8)(length, gen), _freqs(length, gen)


def test_compiled_rope_equals_eager_and_lengths_in_one_bucket_share_a_program():
    programs, stats = _compiled_lengths(rope, _rope_inputs, (5, 37, 130, 100))
    assert programs[3] == programs[2], "length 100, in the bucket of 37, compiled a program"
    assert not [k for k in stats if k.startswith("bucketing.refusals")]
    bucket_calls = {k.rsplit(".", 1)[1]: v for k, v in stats.items() if ".calls.bucket[" in k}
    assert sorted(bucket_calls.values()) == [1, 2], bucket_calls


def test_compiled_rope_training_equals_eager_in_buckets():
    """The backward graph's conjugate products and the [b, s, 2, 8] @ w view are proven too."""
    torch.manual_seed(0)
    weight = torch.randn(8, 8, requires_grad=True)

    def loss(x, freqs):
        return (rope(x @ weight, freqs) ** 2).mean()

    torch._dynamo.reset()
    neuron_dynamo.reset_stats()
    compiled = torch.compile(loss, backend="neuron")
    for length in (5, 37, 100):
        inputs = _rope_inputs(length)
        results = []
        for run in (loss, compiled):
            weight.grad = None
            value = run(*inputs)
            value.backward()
            results.append((value.detach(), weight.grad.clone()))
        torch.testing.assert_close(results[1], results[0], atol=1e-5, rtol=1e-5)
    stats = neuron_dynamo.stats()
    assert not [k for k in stats if k.startswith("bucketing.refusals")]
    assert {k.split(".")[2] for k in stats if ".calls.bucket[" in k} == {"forward", "backward"}


@pytest.mark.parametrize("fn, make, refusal", [
    (_pairs_of_last_dims, lambda n: (torch.randn(2, 2 * n),), "bucketing.refusals.aten.view"),
    (lambda x: torch.view_as_real(torch.fft.fft(torch.view_as_complex(x), dim=1)), lambda n: (torch.randn(2, n, 2),),
     "bucketing.refusals.aten._fft_c2c"),
])
def test_compiled_refusals_run_exact_and_are_counted(fn, make, refusal):
    _, stats = _compiled_lengths(fn, make, (3, 19, 65), tolerance=1e-4)
    assert stats.get(refusal) == 1, {k: v for k, v in stats.items() if "refusals" in k}


def test_a_tail_padded_product_is_viewed_back_only_with_the_length_outermost():
    """[1, s, 2, 8] -> [2s, 8] keeps the padding at the tail: [s, 2, 8] is its layout (accepted, `rope_after_linear`),
    [2, s, 8] would put padding between real rows."""
    rows = lambda x: (x.reshape(-1, 8) @ LINEAR).reshape(2, x.shape[1], 8) * 2  # noqa: E731
    gm = symbolic_graph(rows, [torch.randn(1, 6, 2, 8)], {0: [1]})
    symbol = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"].shape[1].node.expr
    proof = prove_padding(gm, [symbol])
    assert not proof.safe and "view" in proof.reason, proof.reason
