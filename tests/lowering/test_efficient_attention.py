"""`_scaled_dot_product_efficient_attention` and its backward on target="simulator", against eager math attention.

CPU torch has no kernel for the memory-efficient form (it appears in graphs traced for a GPU), so the region is
traced with fake tensors and lowered directly; eager `scaled_dot_product_attention` (math on CPU) is the reference.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_dynamo.lowering import kernel_for, lower_region

aten = torch.ops.aten


def efficient_forward_and_backward(q, k, v, bias, grad, causal, scale):
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, causal,
                                                                           scale=scale)
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        grad, q, k, v, bias, out, lse, seed, offset, 0.0, [True, True, True, False], causal, scale=scale)
    return out, lse, dq, dk, dv


@pytest.mark.parametrize(("causal", "biased", "seq"), [(True, False, 12), (False, True, 130), (False, False, 5)])
def test_efficient_attention_forward_and_backward_match_eager(causal, biased, seq):
    torch.manual_seed(seq)
    q, k, v, grad = (torch.randn(2, 3, seq, 16) for _ in range(4))
    bias = torch.randn(2, 1, seq, seq) if biased else None
    args = (q, k, v, bias, grad)
    region = make_fx(lambda *a: efficient_forward_and_backward(*a, causal, 0.3), tracing_mode="fake")(*args)
    lowered = lower_region(region, "simulator")
    assert not any(getattr(node.target, "overloadpacket", None) for node in lowered.graph.nodes)  # all NKI calls
    out, lse, *grads = lowered(*args)

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*leaves, attn_mask=bias, is_causal=causal, scale=0.3)
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    torch.testing.assert_close(out, expected.detach(), atol=1e-4, rtol=1e-4)
    for ours, theirs in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert lse.shape == (2, 3, -(-seq // 32) * 32) and lse.dtype == torch.float32
    scores = q @ k.transpose(-1, -2) * 0.3 + (0 if bias is None else bias)
    if causal:
        scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse[..., :seq], scores.logsumexp(-1), atol=1e-4, rtol=1e-4)


def test_efficient_attention_refuses_dropout_and_a_bias_gradient():
    q = torch.randn(1, 2, 8, 16)

    def fn(q, bias):
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, q, q, bias, True, 0.1)
        return aten._scaled_dot_product_efficient_attention_backward(
            out, q, q, q, bias, out, lse, seed, offset, 0.0, [True, True, True, True])

    region = make_fx(fn, tracing_mode="fake")(q, torch.randn(1, 2, 8, 8))
    forward, backward = (n for n in region.graph.nodes if "efficient" in str(n.target))
    assert kernel_for(forward.target, "simulator").refusal(forward) == "attention with dropout"
    assert "bias" in kernel_for(backward.target, "simulator").refusal(backward)
