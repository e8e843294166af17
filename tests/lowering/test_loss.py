"""Cross-entropy on target="simulator": the library cross-entropy kernels, forward and backward, against eager.

`fallback="error"` proves every op ran inside an NKI region; a counting wrapper around the pattern kernels proves
the library kernels (not the decomposed gather/mask chain) computed the loss and its gradient.
"""

import contextlib
import copy
import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

import neuron_dynamo
from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.patterns import PATTERN_KERNELS

STRICT = {"target": "simulator", "fallback": "error", "cache": "off"}
CROSS_ENTROPY = ("cross_entropy_kernel", "cross_entropy_backward_kernel")


@contextlib.contextmanager
def counting_calls(monkeypatch):
    """How often each cross-entropy pattern kernel ran inside the block."""
    calls = dict.fromkeys(CROSS_ENTROPY, 0)
    for name in CROSS_ENTROPY:
        kernel = PATTERN_KERNELS[name]

        def counted(*args, _run=kernel.implementation, _name=name):
            calls[_name] += 1
            return _run(*args)

        monkeypatch.setattr(kernel, "implementation", counted)
    yield calls


def loss_and_grad(fn, logits, labels):
    logits = logits.detach().requires_grad_()
    loss = fn(logits, labels)
    (grad,) = torch.autograd.grad(loss, logits)
    return loss.detach(), grad


@settings(max_examples=6, deadline=None)
@given(rows=st.integers(1, 140), classes=st.integers(2, 300), ignored=st.floats(0.0, 0.6),
       reduction=st.sampled_from(["mean", "sum"]))
def test_cross_entropy_forward_and_backward_match_eager(rows, classes, ignored, reduction):
    torch.manual_seed(rows * classes)
    logits = torch.randn(rows, classes) * 3
    labels = torch.randint(0, classes, (rows,))
    labels[torch.rand(rows) < ignored] = -100
    labels[0] = 0  # at least one counted row (the all-ignored mean is its own test)

    def fn(x, y):
        return F.cross_entropy(x, y, reduction=reduction)

    torch._dynamo.reset()
    ours = loss_and_grad(torch.compile(fn, backend="neuron", options=STRICT), logits, labels)
    theirs = loss_and_grad(fn, logits, labels)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_the_library_kernels_compute_loss_and_gradient_with_an_ignore_index(monkeypatch):
    logits, labels = torch.randn(24, 130), torch.randint(0, 130, (24,))
    labels[::3] = 7

    def fn(x, y):
        return F.cross_entropy(x, y, ignore_index=7)

    torch._dynamo.reset()
    with counting_calls(monkeypatch) as calls:
        ours = loss_and_grad(torch.compile(fn, backend="neuron", options=STRICT), logits, labels)
    assert calls == {"cross_entropy_kernel": 1, "cross_entropy_backward_kernel": 1}
    for a, b in zip(ours, loss_and_grad(fn, logits, labels), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_a_mean_over_only_ignored_labels_is_nan_with_a_zero_gradient_as_in_eager():
    logits, labels = torch.randn(5, 9), torch.full((5,), -100)
    torch._dynamo.reset()
    loss, grad = loss_and_grad(torch.compile(F.cross_entropy, backend="neuron", options=STRICT), logits, labels)
    assert math.isnan(loss.item()) and math.isnan(F.cross_entropy(logits, labels).item())
    torch.testing.assert_close(grad, loss_and_grad(F.cross_entropy, logits, labels)[1])


def test_a_label_out_of_range_is_an_error_not_a_read_of_another_row():
    torch._dynamo.reset()
    compiled = torch.compile(F.cross_entropy, backend="neuron", options=STRICT)
    with pytest.raises(codegen.CodegenError, match=r"outside \[0, 9\)"):
        compiled(torch.randn(4, 9), torch.tensor([1, 2, 9, 3]))


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


def test_causal_lm_loss_with_ignored_labels_forward_and_training_step_match_eager(monkeypatch):
    model = tiny_llama()
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 96, (2, 10))
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt that is not trained on
    labels[1, 7:] = -100  # padding

    def lm_loss(net, ids, labels):
        return net(input_ids=ids, labels=labels).loss

    torch._dynamo.reset()
    compiled = torch.compile(lm_loss, backend="neuron", options={"target": "simulator", "cache": "off"})
    with counting_calls(monkeypatch) as calls:
        with torch.no_grad():
            torch.testing.assert_close(compiled(model, ids, labels), lm_loss(model, ids, labels), atol=1e-4, rtol=1e-4)
        losses = []
        for net, run in ((model, compiled), (twin, lm_loss)):
            loss = run(net, ids, labels)
            loss.backward()
            torch.optim.SGD(net.parameters(), lr=0.5).step()
            losses.append(loss.detach())
    assert calls["cross_entropy_kernel"] == 2 and calls["cross_entropy_backward_kernel"] == 1
    torch.testing.assert_close(losses[0], losses[1], atol=1e-4, rtol=1e-4)
    for (name, ours), theirs in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    assert neuron_dynamo.stats().get("estimated_device_ns", 0) > 0


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_nll_loss_of_given_log_probabilities_runs_as_generated_kernels(reduction, monkeypatch):
    """No log-softmax before it: the loss and its gradient are the generated kernels of the decomposition."""
    log_probs, labels = torch.randn(9, 20).log_softmax(-1), torch.randint(0, 20, (9,))
    labels[2] = -100

    def fn(x, y):
        return F.nll_loss(x, y, reduction=reduction).sum()

    torch._dynamo.reset()
    with counting_calls(monkeypatch) as calls:
        ours = loss_and_grad(torch.compile(fn, backend="neuron", options=STRICT), log_probs, labels)
    assert calls == dict.fromkeys(CROSS_ENTROPY, 0)
    for a, b in zip(ours, loss_and_grad(fn, log_probs, labels), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_a_vocabulary_wider_than_one_kernel_chunk(monkeypatch):
    """The kernels tile the vocabulary in 8192-column chunks (running max and rescaled sum across chunks), so the
    backward chain is lowered although the generated softmax-backward row kernel could not hold such rows."""
    logits, labels = torch.randn(3, 8300) * 4, torch.tensor([8299, -100, 5])
    torch._dynamo.reset()
    with counting_calls(monkeypatch) as calls:
        ours = loss_and_grad(torch.compile(F.cross_entropy, backend="neuron", options=STRICT), logits, labels)
    assert calls == {"cross_entropy_kernel": 1, "cross_entropy_backward_kernel": 1}
    for a, b in zip(ours, loss_and_grad(F.cross_entropy, logits, labels), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
