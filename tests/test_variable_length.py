"""Variable-length inputs end to end: one Dynamo graph, a few bucketed static programs, eager's answers.

Every test runs on the `reference` target. The causal-LM tests draw 100 lengths at random (fixed seeds) from 1..600.
The sequence dim is marked dynamic; `backed_size_oblivious` keeps Dynamo from specialising length 1, so every
length, 1 included, is served by the one symbolic graph.
"""

from __future__ import annotations

import random
import re

import pytest
import torch
from torch.fx.experimental import _config as fx_config

import neuron_dynamo
from neuron_dynamo.bucket_dispatch import forget_generalized_graphs
from neuron_dynamo.passes.bucketing import BucketingError

transformers = pytest.importorskip("transformers")

OPTIONS = {"target": "reference"}


def _tiny_llama():
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024,
    )
    return transformers.LlamaForCausalLM(config)


def _tiny_qwen3():
    config = transformers.Qwen3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
    )
    return transformers.Qwen3ForCausalLM(config)


def _tiny_gpt2():
    config = transformers.GPT2Config(
        vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=1024, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


def _tiny_bert():
    config = transformers.BertConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=1024,
    )
    return transformers.BertModel(config)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    neuron_dynamo.reset_stats()
    forget_generalized_graphs()
    yield
    torch._dynamo.reset()


def _compile(model, **options):
    return torch.compile(model, backend="neuron", dynamic=True, options={**OPTIONS, **options})


def _bucket_stats() -> dict:
    return {k: v for k, v in neuron_dynamo.stats().items() if k.startswith("bucketing.") and k.count(".") == 1}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("build", "count"),
    [(_tiny_llama, 100), (_tiny_qwen3, 100), (_tiny_gpt2, 100)],
    ids=["llama-100-lengths", "qwen3-100-lengths", "gpt2-100-lengths"],
)
def test_causal_lm_marked_dynamic_without_kv_cache_many_lengths_few_programs_one_graph(build, count):
    """About exactly `mark_dynamic` + `backed_size_oblivious` + `use_cache=False`: every length, 1 included, from one
    symbolic graph (tests/hf/test_architectures.py covers the default call)."""
    torch.manual_seed(0)
    model = build().eval()
    compiled = torch.compile(model, backend="neuron", options=OPTIONS)
    lengths = random.Random(count).choices(range(1, 601), k=count)
    with torch.no_grad(), fx_config.patch(backed_size_oblivious=True):
        for warm_up in (7, 300):
            ids = torch.randint(0, 128, (1, warm_up))
            torch._dynamo.mark_dynamic(ids, 1)
            compiled(input_ids=ids, use_cache=False)
        with torch._dynamo.config.patch(error_on_recompile=True):
            for length in lengths:
                ids = torch.randint(0, 128, (1, length))
                got = compiled(input_ids=ids, use_cache=False).logits
                want = model(input_ids=ids, use_cache=False).logits
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    stats = neuron_dynamo.stats()
    assert stats["dynamo_graphs"] == 1
    assert stats["bucketing.graphs"] == 1 and "bucketing.graphs_refused" not in stats
    assert stats["bucketing.programs"] <= 5  # 128, 256, 384, 512, 640


def test_bert_with_attention_mask_matches_eager():
    torch.manual_seed(0)
    model = _tiny_bert().eval()
    compiled = _compile(model, bucket_dims=("0=pow2",))
    with torch.no_grad():
        for length in (37, 5, 200, 128):
            ids = torch.randint(0, 128, (2, length))
            mask = torch.ones(2, length, dtype=torch.long)
            mask[1, length // 2 + 1:] = 0
            got = compiled(input_ids=ids, attention_mask=mask).last_hidden_state
            want = model(input_ids=ids, attention_mask=mask).last_hidden_state
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    stats = _bucket_stats()
    # batch 2 -> 2 (pow2, from the first call); the length runs exact at 37 (its only value so far), then 128, 256
    assert stats["bucketing.programs"] == 3
    assert "bucketing.graphs_refused" not in stats


class MeanPool(torch.nn.Module):
    """An encoder that means over the sequence: the mean must divide by the real length, not the bucket."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, ids):
        return torch.tanh(self.proj(self.embed(ids))).mean(dim=1)


def test_mean_over_sequence_matches_eager():
    torch.manual_seed(0)
    model = MeanPool()
    compiled = _compile(model, bucket_multiple=32)
    for length in (3, 17, 40, 64):
        ids = torch.randint(0, 50, (1, length))
        torch.testing.assert_close(compiled(ids), model(ids), atol=1e-6, rtol=1e-5)
    assert _bucket_stats()["bucketing.programs"] == 3  # exact at 3 (one length so far), then buckets 32 and 64
    assert "bucketing.graphs_refused" not in _bucket_stats()


def test_causal_lm_shifted_label_loss_and_training_step_match_eager():
    """The shifted-label cross-entropy (labels padded with -100 then shifted) and the gradients of a step."""
    torch.manual_seed(0)
    eager = _tiny_llama()
    model = _tiny_llama()
    model.load_state_dict(eager.state_dict())
    compiled = _compile(model)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for length in (37, 5, 200):
        ids = torch.randint(0, 128, (1, length))
        want = eager(input_ids=ids, labels=ids).loss
        got = compiled(input_ids=ids, labels=ids).loss
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        want.backward()
        got.backward()
        for (name, p_eager), p in zip(eager.named_parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(p.grad, p_eager.grad, atol=1e-5, rtol=1e-4, msg=name)
        eager_opt.step(), opt.step()
        eager_opt.zero_grad(), opt.zero_grad()
    stats = _bucket_stats()
    assert stats["bucketing.graphs"] == 2  # forward and backward, both bucketed
    assert "bucketing.graphs_refused" not in stats
    assert stats["bucketing.programs"] == 6  # forward and backward exact at 37 (one length so far), then 128, 256


def test_sort_over_sequence_is_refused_and_exact():
    def top_scores(x):
        return torch.sort(x * 2, dim=1).values[:, -3:] + 1

    compiled = _compile(top_scores)
    for length in (9, 20, 33):
        x = torch.randn(2, length)
        torch.testing.assert_close(compiled(x), top_scores(x))
    stats = neuron_dynamo.stats()
    assert stats["bucketing.graphs_refused"] == 1
    assert stats["bucketing.refusals.aten.sort"] == 1
    assert stats["bucketing.programs"] == 3  # one exact program per length


def test_batch_dim_bucketing_with_pow2():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    compiled = torch.compile(model, backend="neuron", options={**OPTIONS, "bucket_dims": ("0=pow2",)})
    # The first call compiles a static graph; the second size makes Dynamo mark dim 0 dynamic (automatic dynamic).
    for batch in (3, 5, 6, 7, 8, 9, 2):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(compiled(x), model(x))
    assert _program_calls() == {"bucket[s=2]": 1, "bucket[s=8]": 4, "bucket[s=16]": 1}


def _program_calls() -> dict[str, int]:
    """Calls per program of the bucketed graphs, symbol names normalised to `s`."""
    stats = neuron_dynamo.stats()
    return {re.sub(r"s\d+", "s", k.rsplit(".calls.", 1)[1]): v for k, v in stats.items() if ".calls." in k}


def test_size_beyond_max_bucket_errors_or_runs_exact():
    def double(x):
        return x * 2

    strict = _compile(double, max_bucket=64)
    strict(torch.randn(10))
    with pytest.raises(Exception, match="larger than the largest bucket") as caught:
        strict(torch.randn(65))
    assert isinstance(caught.value, BucketingError) or isinstance(caught.value.__cause__, BucketingError)
    torch._dynamo.reset()
    neuron_dynamo.reset_stats()
    lenient = _compile(double, max_bucket=64, beyond_max_bucket="exact")
    for length in (10, 64, 65, 100):
        x = torch.randn(length)
        torch.testing.assert_close(lenient(x), x * 2)
    # 10 runs exact (the only length so far), then the length varies and is bucketed up to max_bucket
    assert _program_calls() == {"exact[s=10]": 1, "bucket[s=64]": 1, "exact[s=65]": 1, "exact[s=100]": 1}


class ClassifyTokens(torch.nn.Module):
    """Shape-agnostic code: with dynamic=False its static graphs generalise to one symbolic graph."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)  # no weight dim equal to a test length

    def forward(self, ids, mask):
        scores = torch.softmax(self.embed(ids).sum(-1), dim=1)
        return (scores * mask).sum(1)


def test_static_graphs_of_new_lengths_reuse_the_bucket_programs():
    model = ClassifyTokens()
    compiled = torch.compile(model, backend="neuron", dynamic=False, options=OPTIONS)
    with torch.no_grad():
        for length in (7, 20, 100, 130):
            ids = torch.randint(0, 50, (2, length))
            mask = (torch.rand(2, length) > 0.5).long()
            torch.testing.assert_close(compiled(ids, mask), model(ids, mask))
    stats = neuron_dynamo.stats()
    assert stats["dynamo_graphs"] == 4  # dynamic=False: Dynamo recompiles per length ...
    assert stats["bucketing.programs"] == 2  # ... but the programs are shared: buckets 128 and 256
    assert stats["bucketing.static_graphs_reused"] == 3


def test_static_graph_that_bakes_its_length_runs_exact():
    torch.manual_seed(0)
    model = _tiny_llama().eval()
    compiled = torch.compile(model, backend="neuron", dynamic=False, options=OPTIONS)
    with torch.no_grad():
        ids = torch.randint(0, 128, (1, 9))
        got = compiled(input_ids=ids).logits
        torch.testing.assert_close(got, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    stats = neuron_dynamo.stats()
    assert stats["bucketing.static_graphs_exact"] == 1 and "bucketing.programs" not in stats


def test_explain_reports_buckets_waste_and_refusals():
    x = torch.randn(2, 37)
    torch._dynamo.mark_dynamic(x, 1)
    report = neuron_dynamo.explain(lambda t: torch.softmax(t, 1).sum(1), x, options=OPTIONS)
    (graph,) = report.graphs
    assert graph.bucket.startswith("bucket[") and graph.bucket.endswith("=128]")
    assert graph.bucket_stats.padding_waste == pytest.approx(1 - 37 / 128)
    text = str(report)
    assert "bucketing" in text and "71.1%" in text
    refused = neuron_dynamo.explain(lambda t: torch.sort(t, 1).values, x, options=OPTIONS)
    assert "sorting/selecting along a padded dim" in str(refused)


@pytest.mark.slow
def test_bucketed_llama_on_the_simulator_target_matches_eager():
    """The same bucket programs, lowered to NKI kernels and run by the CPU interpreter."""
    torch.manual_seed(0)
    model = _tiny_llama().eval()
    compiled = torch.compile(model, backend="neuron", options={"target": "simulator"})
    with torch.no_grad():
        for index, length in enumerate((37, 5, 200, 129)):
            ids = torch.randint(0, 128, (1, length))
            if index == 0:
                torch._dynamo.mark_dynamic(ids, 1)
            got = compiled(input_ids=ids).logits
            torch.testing.assert_close(got, model(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
    stats = _bucket_stats()
    assert stats["bucketing.programs"] == 2 and "bucketing.graphs_refused" not in stats


def test_static_graph_whose_float_input_shares_the_length_runs_exact():
    """ids [3, 7] index values [3, 7, 8]: only the ids would be generalised, so the graph keeps exact shapes."""

    def accumulate(table, ids, values):
        return torch.ops.aten.index_put(table, [ids], values, True)

    compiled = torch.compile(accumulate, backend="neuron", dynamic=False, options=OPTIONS)
    table, ids, values = torch.zeros(50, 8), torch.randint(0, 50, (3, 7)), torch.randn(3, 7, 8)
    torch.testing.assert_close(compiled(table, ids, values), accumulate(table, ids, values))
    assert neuron_dynamo.stats()["bucketing.static_graphs_exact"] == 1
