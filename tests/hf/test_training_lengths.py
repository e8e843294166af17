"""Training at lengths across buckets, the way users call it: bucketed forward *and* backward, eager's gradients.

The full figure (40 random lengths in 1..600 per model) is `benchmarks/training_lengths.py`.
"""

import pytest
import torch
from hf_checks import training_gradients, training_model

import neuron_dynamo

LENGTHS = (37, 300, 5, 200, 129)


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "bert"])
def test_training_across_buckets_matches_eager_with_few_programs(model_type):
    model = training_model(model_type, 512, seed=0)
    compiled = torch.compile(model, backend="neuron")
    neuron_dynamo.reset_stats()
    for length in LENGTHS:
        ids = torch.randint(0, min(model.config.vocab_size, 200), (2, length))
        for name, got, want in training_gradients(model, compiled, ids):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"{name} at {length}")
    stats = neuron_dynamo.stats()
    for kind in ("forward", "backward"):
        per_graph = [v for k, v in stats.items() if k.startswith("bucketing.graph") and k.endswith(f".{kind}.programs")]
        assert per_graph and max(per_graph) <= 3, (kind, stats)  # buckets 128, 256, 384
    assert stats.get("graphs_failed", 0) == 0 and not stats.get("bucketing.graphs_refused"), stats
