"""Tiny Hugging Face models (random weights, built from configs, offline) under the backend match eager."""

import copy

import pytest
import torch
import transformers
from tiny_models import VOCAB, encoder_loss, tiny_bert, tiny_gpt2, tiny_llama

import neuron_dynamo


def causal_lm_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


MODELS = {
    "llama": (tiny_llama, causal_lm_loss),
    "gpt2": (tiny_gpt2, causal_lm_loss),
    "bert": (tiny_bert, encoder_loss),
}


@pytest.fixture(params=sorted(MODELS))
def model_case(request):
    torch.manual_seed(0)
    build, loss_fn = MODELS[request.param]
    return request.param, build(), loss_fn


def test_forward_matches_eager(model_case):
    name, model, loss_fn = model_case
    model.eval()
    ids = torch.randint(0, VOCAB, (2, 12))
    neuron_dynamo.reset_stats()
    with torch.no_grad():
        expected = loss_fn(model, ids)
        report = neuron_dynamo.explain(loss_fn, model, ids, options={"target": "reference"})
    torch.testing.assert_close(report.output, expected, atol=1e-5, rtol=1e-5)
    (graph,) = report.graphs
    assert graph.kind == "inference"
    assert graph.flops_lowered == graph.flops_total > 0  # every matmul and attention op ran in a region
    assert graph.ops_lowered == graph.ops_total, report


def test_training_step_matches_eager(model_case):
    name, model, loss_fn = model_case
    model.train()
    twin = copy.deepcopy(model)
    ids = torch.randint(0, VOCAB, (2, 12))
    compiled_loss = torch.compile(loss_fn, backend="neuron")
    neuron_dynamo.reset_stats()
    losses = []
    for net, run in ((model, compiled_loss), (twin, loss_fn)):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
        loss = run(net, ids)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    counters = neuron_dynamo.stats()
    assert counters["graphs_compiled.forward"] == counters["graphs_compiled.backward"] == 1
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    for (param_name, ours), theirs in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5, msg=lambda m, n=param_name: f"{n}: {m}")


def test_generate_with_static_cache_and_compile_config():
    """Transformers' own path: generate() compiles the decode step with CompileConfig (mode="reduce-overhead")."""
    torch.manual_seed(0)
    model = tiny_llama().eval()
    prompt = torch.randint(0, VOCAB, (1, 6))
    expected = model.generate(prompt, max_new_tokens=4, do_sample=False, cache_implementation="static")
    config = transformers.CompileConfig(backend="neuron")
    config._compile_all_devices = True  # CPU tensors: Transformers only auto-compiles on allow-listed devices
    neuron_dynamo.reset_stats()
    generated = model.generate(prompt, max_new_tokens=4, do_sample=False, cache_implementation="static",
                               compile_config=config)
    assert torch.equal(generated, expected)
    assert neuron_dynamo.stats()["calls"] >= 3  # the decode steps ran through the backend
