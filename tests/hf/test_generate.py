"""Transformers `generate()` under the backend, called as users call it, against eager's greedy tokens.

Two paths: the default dynamic cache with `model.forward = torch.compile(model.forward, backend="neuron")`, and
the static cache with `CompileConfig(backend="neuron")`. After warm-up (two prompt lengths: Dynamo makes the cache
length symbolic at its second value), a prompt of another length in the same bucket of 128 compiles nothing: every
decode step runs the one bucket program, whatever its position. Batch 2 runs in a fresh Dynamo state (a batch that
changes makes the batch dim dynamic, bucketed like a length: see the README's Generation section).

Each test compiles several Dynamo graphs, so the model x path x batch grid is covered in part: the static path on
tiny Llama at prompt lengths 5, 17, 40 is also `examples/generate_static_cache.py` (run by tests/test_examples.py).
"""

import copy

import pytest
import torch
import transformers
from tiny_models import VOCAB, tiny_gpt2, tiny_llama

import neuron_dynamo

MODELS = {"llama": tiny_llama, "gpt2": tiny_gpt2}
NEW_TOKENS = 4
WARM_UP = (5, 17)  # two lengths: the second makes Dynamo's graphs dynamic in the lengths
AFTER_WARM_UP = 40


def _prompt(batch: int, length: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(length))


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS[name]().eval()


def _static_config() -> transformers.CompileConfig:
    config = transformers.CompileConfig(backend="neuron")
    config._compile_all_devices = True  # CPU tensors: Transformers only auto-compiles on allow-listed devices
    return config


def _dynamic(model):
    """The default dynamic cache, the model's forward compiled (on a copy: the same weights as eager's)."""
    compiled = copy.deepcopy(model)
    compiled.forward = torch.compile(compiled.forward, backend="neuron")
    return lambda prompt: compiled.generate(prompt, max_new_tokens=NEW_TOKENS)


def _static(model):
    """A static cache; Transformers compiles the decode step with the CompileConfig. (A copy of the model taken
    before eager runs: Transformers keeps the longest static cache length a model has used.)"""
    config = _static_config()
    model = copy.deepcopy(model)
    return lambda prompt: model.generate(prompt, max_new_tokens=NEW_TOKENS, cache_implementation="static",
                                         compile_config=config)


def _eager(model, prompt, path):
    extra = {"cache_implementation": "static"} if path == "static" else {}
    return model.generate(prompt, max_new_tokens=NEW_TOKENS, **extra)


def _counts() -> dict[str, float]:
    stats = neuron_dynamo.stats()
    return {key: stats.get(key, 0) for key in ("dynamo_graphs", "programs_compiled", "calls", "graphs_failed",
                                               "bucketing.graphs_refused")}


def _decode_calls() -> dict[str, int]:
    """Calls per bucket program (the decode step's and the prefill's)."""
    return {key: value for key, value in neuron_dynamo.stats().items() if ".calls.bucket[" in key}


@pytest.mark.slow
@pytest.mark.parametrize(("name", "path"), [("llama", "dynamic"), ("gpt2", "dynamic"), ("gpt2", "static")])
def test_generate_matches_eager_and_reuses_one_decode_program(name, path):
    model = _model(name)
    generate = (_dynamic if path == "dynamic" else _static)(model)
    expected = {length: _eager(model, _prompt(1, length), path) for length in (*WARM_UP, AFTER_WARM_UP)}
    neuron_dynamo.reset_stats()
    for length in WARM_UP:
        assert torch.equal(generate(_prompt(1, length)), expected[length]), length
    before, calls_before = _counts(), _decode_calls()
    assert torch.equal(generate(_prompt(1, AFTER_WARM_UP)), expected[AFTER_WARM_UP])
    after, calls_after = _counts(), _decode_calls()
    assert after["dynamo_graphs"] == before["dynamo_graphs"]  # no recompile for the new length
    assert after["programs_compiled"] == before["programs_compiled"]  # no new static program either
    assert after["graphs_failed"] == 0 and after["bucketing.graphs_refused"] == 0
    # every decode step ran through the backend, all of them in one bucket program
    decode_steps = NEW_TOKENS - 1
    grown = {key: calls_after[key] - calls_before.get(key, 0) for key in calls_after}
    assert decode_steps in grown.values(), grown
    assert after["calls"] - before["calls"] == decode_steps + (path == "dynamic")  # + the compiled prefill


@pytest.mark.slow
@pytest.mark.parametrize(("name", "path"), [("llama", "static"), ("gpt2", "dynamic")])
def test_generate_batch_of_two_matches_eager(name, path):
    model = _model(name)
    prompt = _prompt(2, WARM_UP[1])
    generate = (_dynamic if path == "dynamic" else _static)(model)
    expected = _eager(model, prompt, path)
    neuron_dynamo.reset_stats()
    assert torch.equal(generate(prompt), expected)
    assert neuron_dynamo.stats().get("graphs_failed", 0) == 0
