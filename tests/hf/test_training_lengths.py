"""Training at lengths across buckets, the way users call it: bucketed forward *and* backward, eager's gradients.

The full figure (40 random lengths in 1..600 per model) is `benchmarks/training_lengths.py`.
"""

import pytest
import torch
import transformers

import neuron_dynamo

from .tiny_models import tiny_causal_lm_config

LENGTHS = (37, 300, 5, 200, 129)


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "bert"])
def test_training_across_buckets_matches_eager_with_few_programs(model_type):
    config = tiny_causal_lm_config(model_type)
    for name in ("n_positions", "max_position_embeddings"):
        if getattr(config, name, None) is not None:
            setattr(config, name, max(getattr(config, name), 512))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()
    compiled = torch.compile(model, backend="neuron")
    neuron_dynamo.reset_stats()
    for length in LENGTHS:
        ids = torch.randint(0, min(config.vocab_size, 200), (2, length))
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        compiled(input_ids=ids, labels=ids).loss.backward()
        for name, p in model.named_parameters():
            if name in expected:
                torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-5, msg=f"{name} at {length}")
    stats = neuron_dynamo.stats()
    for kind in ("forward", "backward"):
        per_graph = [v for k, v in stats.items() if k.startswith("bucketing.graph") and k.endswith(f".{kind}.programs")]
        assert per_graph and max(per_graph) <= 3, (kind, stats)  # buckets 128, 256, 384
    assert stats.get("graphs_failed", 0) == 0 and not stats.get("bucketing.graphs_refused"), stats
