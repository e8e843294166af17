"""Graphs written to break padding, called the way a user calls them: `torch.compile` with the defaults and with
`dynamic=True`, lengths across bucket boundaries, compared with eager. Each was accepted by the padding proof (or
crashed) before its rule was fixed; the proof must now make it right or refuse it (exact shapes)."""

import pytest
import torch

import neuron_dynamo

H = 8
TABLE = torch.randn(300, H, generator=torch.Generator().manual_seed(1))
LENGTHS = (1, 5, 37, 127, 128, 129, 200, 37, 150)


def _select_by_size(x):
    return x.sum(1) + TABLE[x.shape[1] - 1]


def _slice_by_size(x):
    n = x.shape[1]
    return x.sum(1) + TABLE[n - 2:n].sum(0) if n >= 2 else x.sum(1)


def _narrow_by_size(x):
    return x.sum(1) + TABLE.narrow(0, x.shape[1], 1)[0]


POSITIONS = torch.nn.Embedding(200, H)


def _positions_into_a_small_table(x):
    return x + POSITIONS(torch.arange(x.shape[1]))  # a bucket of 256 > 200 rows: the pad ids must stay in range


def _positions_by_index(x):
    return x + POSITIONS.weight[torch.arange(x.shape[1])]


def _flatten_trailing(x):
    return x.reshape(x.shape[0], -1)  # an output that is a view of a padded input


def _accumulate_by_ids(x):
    ids = (x[..., 0].abs() * 7).long() % 10
    return torch.zeros(10).index_put_((ids.reshape(-1),), torch.ones(ids.numel()), accumulate=True)


def _size_reciprocal(x):
    return x.sum(1) * (1 / x.shape[1])  # a SymFloat used as data: the real size, not the bucket's


def _size_square_root(x):
    return x.sum(1) / x.shape[1] ** 0.5


def _filled_with_the_size(x):
    return x.sum(1) + torch.full((x.shape[0], x.shape[2]), x.shape[1])


BUFFER = torch.randn(200, H)


def _buffer_sliced_by_the_length(x):
    return x + BUFFER[: x.shape[1]]  # BERT's token_type_ids: the 256 bucket is clamped to the buffer's 200


CASES = [_select_by_size, _slice_by_size, _narrow_by_size, _positions_into_a_small_table, _positions_by_index,
         _flatten_trailing, _size_reciprocal, _size_square_root, _filled_with_the_size, _buffer_sliced_by_the_length]
# Cases that must stay bucketed, by `dynamic` mode (with dynamic=True the full-buffer length 200 recompiles into a
# graph whose slice size has its own symbol: its 256 bucket cannot be traced and runs exact, which is right too).
BUCKETED = {_size_reciprocal: (None, True), _size_square_root: (None, True), _filled_with_the_size: (None, True),
            _positions_into_a_small_table: (None, True), _buffer_sliced_by_the_length: (None,)}


@pytest.mark.parametrize("dynamic", [None, True, False], ids=["default", "dynamic", "static"])
@pytest.mark.parametrize("fn", [*CASES, _accumulate_by_ids], ids=[f.__name__.strip("_") for f in CASES] + [
    "accumulate_by_ids"])
def test_adversarial_graph_matches_eager_at_every_length(fn, dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron", dynamic=dynamic)
    neuron_dynamo.reset_stats()
    for length in LENGTHS if dynamic is not False else LENGTHS[:4]:
        x = torch.randn(2, length, H)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-4, msg=f"length {length}")
    stats = neuron_dynamo.stats()
    assert stats.get("graphs_failed", 0) == 0  # right without falling back to eager
    if dynamic in BUCKETED.get(fn, ()):
        assert stats.get("bucketing.programs", 0) >= 1 and not stats.get("bucketing.graphs_refused"), stats


def test_gpt2_with_fewer_positions_than_the_bucket():
    """GPT-2 with n_positions=200: lengths 129..200 run in the 256 bucket, whose padded position ids reach 255."""
    import sys
    from pathlib import Path

    import transformers

    sys.path.insert(0, str(Path(__file__).parents[1] / "hf"))
    from tiny_models import tiny_causal_lm_config

    config = tiny_causal_lm_config("gpt2")
    config.n_positions = 200
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    compiled = torch.compile(model, backend="neuron")
    neuron_dynamo.reset_stats()
    with torch.no_grad():
        for length in (5, 129, 200, 150):
            ids = torch.randint(0, config.vocab_size, (1, length))
            torch.testing.assert_close(compiled(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    stats = neuron_dynamo.stats()
    assert stats.get("graphs_failed", 0) == 0 and stats.get("bucketing.programs", 0) >= 1, stats


# ------------------------------------------------------------------------------------------------------ training
def _layer_norm_unbind():
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(H)

    def loss(x):
        a, b = norm(x).unbind(-1)[:2]  # the backward stacks the pieces: `aten.stack` has a rule
        return (a * b).sum()

    return norm, loss


def _linear_batch_two():
    torch.manual_seed(0)
    linear = torch.nn.Linear(H, H)
    return linear, lambda x: torch.tanh(linear(x)).mean()  # weight grad contracts the merged [2·L] dim


TRAINING = [_layer_norm_unbind, _linear_batch_two]


@pytest.mark.parametrize("dynamic", [None, True], ids=["default", "dynamic"])
@pytest.mark.parametrize("build", TRAINING, ids=[f.__name__.strip("_") for f in TRAINING])
def test_adversarial_training_gradients_match_eager(build, dynamic):
    module, loss = build()
    torch._dynamo.reset()
    compiled = torch.compile(loss, backend="neuron", dynamic=dynamic)
    neuron_dynamo.reset_stats()
    for length in (5, 37, 129):
        x = torch.randn(2, length, H)
        module.zero_grad()
        loss(x).backward()
        expected = [p.grad.clone() for p in module.parameters()]
        module.zero_grad()
        compiled(x).backward()
        for got, want in zip((p.grad for p in module.parameters()), expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"length {length}")
    stats = neuron_dynamo.stats()
    assert stats.get("graphs_failed", 0) == 0 and stats.get("bucketing.graphs_refused", 0) == 0, stats


@pytest.mark.parametrize("dynamic", [None, True], ids=["default", "dynamic"])
def test_causal_attention_of_separately_sized_queries_and_keys(dynamic):
    """Distinct length symbols: torch's top-left causal mask becomes explicit, and the padded keys are masked."""
    attention = torch.nn.functional.scaled_dot_product_attention
    fn = lambda q, k, v: attention(q, k, v, is_causal=True)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron", dynamic=dynamic)
    neuron_dynamo.reset_stats()
    for lq, lk in ((5, 5), (37, 37), (7, 9), (9, 7), (130, 5), (3, 140)):
        q = torch.randn(1, 2, lq, H, requires_grad=True)
        k, v = (torch.randn(1, 2, lk, H, requires_grad=True) for _ in range(2))
        expected = fn(q, k, v)
        grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
        got = compiled(q, k, v)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=f"{lq}x{lk}")
        for g, e in zip(torch.autograd.grad(got.square().sum(), (q, k, v)), grads, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4, msg=f"grad {lq}x{lk}")
    stats = neuron_dynamo.stats()
    assert stats.get("graphs_failed", 0) == 0 and not stats.get("bucketing.graphs_refused"), stats


def _conv_model(kind):
    torch.manual_seed(0)
    if kind == "k1":
        conv = torch.nn.Conv1d(H, H, 1)
        return conv, lambda x: conv(x.transpose(1, 2)).transpose(1, 2)
    if kind == "same":
        conv = torch.nn.Conv1d(H, H, 3, padding=1)
        return conv, lambda x: conv(x.transpose(1, 2)).transpose(1, 2)
    conv = torch.nn.Conv1d(H, H, 4, groups=H)  # Mamba's causal depthwise conv: left-pad by k - 1
    return conv, lambda x: conv(torch.nn.functional.pad(x.transpose(1, 2), (3, 0))).transpose(1, 2)


@pytest.mark.parametrize("kind", ["k1", "same", "causal"])
def test_convolutions_over_the_length_are_bucketed_forward_and_backward(kind):
    conv, fn = _conv_model(kind)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron")
    neuron_dynamo.reset_stats()
    for length in (5, 37, 130, 9):
        x = torch.randn(2, length, H, requires_grad=True)
        expected = fn(x)
        grads = torch.autograd.grad(expected.tanh().sum(), (x, *conv.parameters()))
        got = compiled(x)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=f"length {length}")
        for g, e in zip(torch.autograd.grad(got.tanh().sum(), (x, *conv.parameters())), grads, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4, msg=f"grad at {length}")
    stats = neuron_dynamo.stats()
    assert stats.get("graphs_failed", 0) == 0 and not stats.get("bucketing.graphs_refused"), stats
