"""A product plus a tensor of its shape (a residual stream after a projection, two products summed in a backward)
becomes one matmul kernel that adds on the product's way out of PSUM."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_dynamo.lowering import lower_region
from neuron_dynamo.lowering.artifact import dump_region, load_region
from neuron_dynamo.lowering.patterns import PATTERN_KERNELS, PatternKernel
from neuron_dynamo.toolchain.simulator import device_time


def _calls(lowered):
    return [n.target.__name__ for n in lowered.graph.nodes if isinstance(n.target, PatternKernel)]


def residual_projection(hidden, x, w):  # Hugging Face's decoder layer: hidden + o_proj(x), through 2-D mm
    return hidden + (x.reshape(-1, x.shape[-1]) @ w.t()).reshape(hidden.shape)


def two_products(g1, w1, g2, w2):  # the input gradient of x used by two projections
    return g1 @ w1 + g2 @ w2


def test_a_product_and_a_residual_become_one_launch_with_eager_values():
    for dtype in (torch.float32, torch.bfloat16):
        cases = [
            (residual_projection, (torch.randn(2, 64, 48), torch.randn(2, 64, 32), torch.randn(48, 32))),
            (two_products, (torch.randn(70, 16), torch.randn(16, 24), torch.randn(70, 8), torch.randn(8, 24))),
        ]
        for fn, args in cases:
            args = tuple(a.to(dtype) for a in args)
            lowered = lower_region(make_fx(fn)(*args), "simulator")
            assert _calls(lowered) == ["matmul_add_kernel"]
            with device_time() as spent:
                ours = lowered(*args)
            assert spent.kernels == (1 if fn is residual_projection else 2)
            expected = fn(*args)
            assert ours.dtype == dtype and ours.shape == expected.shape
            tolerance = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(ours, expected, rtol=tolerance, atol=tolerance)
            torch.testing.assert_close(load_region(dump_region(lowered))(*args), ours, rtol=0, atol=0)


def test_a_product_needed_elsewhere_or_a_broadcast_residual_stays_as_it_was():
    def product_also_returned(h, x, w):
        p = x @ w
        return h + p, p

    def broadcast_bias(x, w, b):
        return x @ w + b

    cases = [(product_also_returned, (torch.randn(6, 5), torch.randn(6, 4), torch.randn(4, 5))),
             (broadcast_bias, (torch.randn(6, 4), torch.randn(4, 5), torch.randn(5)))]
    for fn, args in cases:
        lowered = lower_region(make_fx(fn)(*args), "simulator")
        assert _calls(lowered) == []
        torch.testing.assert_close(lowered(*args), fn(*args), rtol=1e-5, atol=1e-5)


def test_a_compiled_decoder_layer_trains_as_eager(monkeypatch):
    """torch.compile with no options: the residual adds of a Llama layer's forward and the summed input gradients
    of its backward run in the matmul kernel, with eager's loss and gradients."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 64, (2, 24))

    def loss(model, ids):
        return model(input_ids=ids, labels=ids).loss

    expected = loss(model, ids)
    expected.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    kernel, calls = PATTERN_KERNELS["matmul_add_kernel"], []
    run = kernel.implementation
    monkeypatch.setattr(kernel, "implementation", lambda *args: calls.append(1) or run(*args))
    ours = torch.compile(loss, backend="neuron")(model, ids)
    ours.backward()
    assert len(calls) >= 3  # the forward's two residual adds, the backward's summed input gradients
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-3, atol=1e-5, msg=name)
