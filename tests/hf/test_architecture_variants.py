"""Batch sizes, left padding, `dynamic=` modes, bf16 and generate() on a few architectures that between them cover
rotary, ALiBi and learned positions, sliding windows, MoE and parallel blocks: default `torch.compile` otherwise."""

import pytest
import torch
from hf_checks import LENGTHS, assert_logits_match, left_padded_mask, token_ids
from tiny_models import tiny_causal_lm

import neuron_dynamo

ARCHITECTURES = ("llama", "gpt2", "mistral", "bloom", "qwen3_moe", "gemma2")


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [None, True, False], ids=["dynamic-default", "dynamic-true", "dynamic-false"])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_batch_of_three_with_left_padding_matches_eager(architecture, dynamic):
    model = tiny_causal_lm(architecture)
    compiled = torch.compile(model, backend="neuron", dynamic=dynamic)
    neuron_dynamo.reset_stats()
    calls = [{"input_ids": token_ids(3, length, seed), "attention_mask": left_padded_mask(3, length)}
             for seed, length in enumerate(LENGTHS)]
    assert_logits_match(model, compiled, calls, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_bf16_matches_a_bf16_eager_run(architecture):
    """bf16 against eager in bf16: both round every op's result to 8 mantissa bits, in different places, so the
    tolerance is a few bf16 ulps of the logits (|logits| < 1 for these models: ulp ≤ 2^-8)."""
    model = tiny_causal_lm(architecture).to(torch.bfloat16)
    compiled = torch.compile(model, backend="neuron")
    neuron_dynamo.reset_stats()
    calls = [{"input_ids": token_ids(1, length, seed), "attention_mask": left_padded_mask(1, length)}
             for seed, length in enumerate(LENGTHS)]
    assert_logits_match(model, compiled, calls, atol=3e-2, rtol=3e-2)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["llama", "gpt2", "mistral"])
def test_greedy_generate_with_compiled_forward_gives_eager_tokens(architecture):
    model = tiny_causal_lm(architecture)
    prompt = token_ids(1, 12, 0)
    want = model.generate(prompt, max_new_tokens=8, do_sample=False)
    model.forward = torch.compile(model.forward, backend="neuron")
    neuron_dynamo.reset_stats()
    got = model.generate(prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, want)
    assert neuron_dynamo.stats().get("graphs_failed", 0) == 0
