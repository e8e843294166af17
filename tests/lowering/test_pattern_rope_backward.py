"""The gradient of a rotary embedding, Rᵀ(g·sin) + g·cos as autograd traces it, becomes one rope_backward_kernel."""

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_dynamo.lowering import lower_region
from neuron_dynamo.lowering.artifact import dump_region, load_region
from neuron_dynamo.lowering.patterns import PATTERN_KERNELS, PatternKernel
from neuron_dynamo.passes.decompositions import decomposition_table


def rope_gradients(q, k, cos, sin, grad_q, grad_k):
    """q's and k's gradients through Hugging Face's apply_rotary_pos_emb, by autograd."""
    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    rotated = transformers.models.llama.modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    return torch.autograd.grad(rotated, (q, k), (grad_q, grad_k))


def lowered_calls(fn, *args):
    """fn traced as the backend's AOTAutograd graphs are (its decompositions, dead code gone), lowered."""
    traced = make_fx(fn, decomposition_table=decomposition_table())(*args)
    traced.graph.eliminate_dead_code()
    traced.recompile()
    lowered = lower_region(traced, "simulator")
    return lowered, [n.target.__name__ for n in lowered.graph.nodes if isinstance(n.target, PatternKernel)]


def chain_parts(g, cos, sin):
    """The gradient chain written out: (g·sin)'s halves swapped, one negated, padded and summed, plus g·cos."""
    half = g.shape[-1] // 2
    product = sin[:, None] * g
    swapped = F.pad(product[..., half:], [0, half]) + F.pad(-product[..., :half], [half, 0])
    direct = g * cos[:, None]
    return {"product": product, "swapped": swapped, "direct": direct, "out": direct + swapped}


def hand_chain(g, cos, sin):
    return chain_parts(g, cos, sin)["out"]


@pytest.mark.parametrize("table_batch", [1, 2])
def test_traced_rope_gradients_are_one_kernel_each_and_match_eager(table_batch):
    args = (torch.randn(2, 4, 12, 16), torch.randn(2, 2, 12, 16), torch.randn(table_batch, 12, 16),
            torch.randn(table_batch, 12, 16), torch.randn(2, 4, 12, 16), torch.randn(2, 2, 12, 16))
    lowered, names = lowered_calls(rope_gradients, *args)
    assert names == ["rope_backward_kernel"] * 2
    for ours, theirs in zip(lowered(*args), rope_gradients(*args), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    torch.testing.assert_close(load_region(dump_region(lowered))(*args), lowered(*args), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_chain_in_either_argument_order_is_the_kernel(dtype):
    args = (torch.randn(2, 3, 10, 8, dtype=dtype), torch.randn(2, 10, 8, dtype=dtype), torch.randn(2, 10, 8,
                                                                                                  dtype=dtype))
    lowered, names = lowered_calls(hand_chain, *args)
    assert names == ["rope_backward_kernel"]
    assert torch.equal(lowered(*args), hand_chain(*args))


@pytest.mark.parametrize("leak", ["product", "swapped", "direct"])
def test_a_chain_whose_intermediate_is_needed_elsewhere_stays_as_it_is(leak):
    def leaky(g, cos, sin):  # the intermediate `leak` is an output too
        parts = chain_parts(g, cos, sin)
        return parts["out"], parts[leak]

    args = (torch.randn(2, 3, 10, 8), torch.randn(2, 10, 8), torch.randn(2, 10, 8))
    lowered, names = lowered_calls(leaky, *args)
    assert names == []
    for ours, theirs in zip(lowered(*args), leaky(*args), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


def test_tables_in_another_dtype_or_no_tokens_stay_as_they_are():
    for args in ((torch.randn(2, 3, 10, 8, dtype=torch.bfloat16), torch.randn(2, 10, 8), torch.randn(2, 10, 8)),
                 (torch.randn(2, 3, 0, 8), torch.randn(2, 0, 8), torch.randn(2, 0, 8))):
        lowered, names = lowered_calls(hand_chain, *args)
        assert names == []
        torch.testing.assert_close(lowered(*args), hand_chain(*args), rtol=1e-6, atol=1e-6)


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


def test_a_compiled_llama_training_step_runs_the_kernel_and_gives_eager_gradients(monkeypatch):
    kernel = PATTERN_KERNELS["rope_backward_kernel"]
    calls = []
    monkeypatch.setattr(kernel, "implementation", lambda *a, run=kernel.implementation: calls.append(1) or run(*a))
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))

    def gradients(run):
        model = tiny_llama()
        run(model, ids).backward()
        return {name: p.grad for name, p in model.named_parameters()}

    def loss(model, ids):
        return model(input_ids=ids, labels=ids).loss

    ours, theirs = gradients(torch.compile(loss, backend="neuron")), gradients(loss)
    assert len(calls) == 2  # the queries' and the keys' gradients
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
