"""Transformers causal LMs called the way users call them: `torch.compile(model, backend="neuron")`, nothing else.

No options, no patched Dynamo settings, no `mark_dynamic`, no `use_cache=False`: the model's default arguments, at
a first length and then a second one (where Dynamo's automatic dynamic makes the graph symbolic), compared with
eager. Every model is the architecture's DEFAULT config shrunk generically (`tiny_models.tiny_causal_lm`), on the
default target (the NKI simulator). `benchmarks/hf_coverage.py` runs the same check over every architecture.
"""

import pytest
import torch
from hf_checks import LENGTHS, assert_logits_match, token_ids
from tiny_models import tiny_causal_lm

import neuron_dynamo

ARCHITECTURES = (
    "bart", "bert", "biogpt", "bloom", "codegen", "cohere", "deepseek_v3", "falcon", "gemma", "gemma2",
    "gemma3_text", "glm4", "gpt2", "gpt_bigcode", "gpt_neox", "gpt_oss", "gptj", "granite", "jamba", "llama",
    "llama4_text", "mamba", "mamba2", "mistral", "mixtral", "mpt", "olmo2", "opt", "phi", "phi3", "qwen2", "qwen3",
    "qwen3_moe", "qwen3_next", "recurrent_gemma", "roberta", "rwkv", "smollm3", "stablelm", "starcoder2",
    "falcon_mamba", "olmo", "persimmon", "xglm",
)

@pytest.mark.slow
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_default_compile_at_two_lengths_matches_eager(architecture):
    model = tiny_causal_lm(architecture)
    compiled = torch.compile(model, backend="neuron")
    neuron_dynamo.reset_stats()
    calls = [{"input_ids": token_ids(1, length, seed)} for seed, length in enumerate(LENGTHS)]
    assert_logits_match(model, compiled, calls, atol=1e-4, rtol=1e-4)
