"""Chains the library kernels compute (SwiGLU, RMSNorm, RoPE, attention, cross-entropy) over empty tensors.

An MLP 0 wide (`int(dim * 8 / 3) // 128 * 128` is 0 below 48: NucleusMoEImage's tiny config) or a sequence of no
tokens is an ordinary input to eager PyTorch. The library kernels need at least one element per dim, so such a chain
is left to the per-op lowerings, which give eager's answer without a launch: on the default target, nothing runs
eagerly and no graph fails.
"""

import logging

import pytest
import torch
import torch.nn.functional as F
from compiled import run_compiled

import neuron_dynamo


def _zero_wide_swiglu(x, up, down_weight, down_bias):
    gate, value = F.linear(x, up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * value, down_weight, down_bias)


def _rms_norm(x, weight):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def _rope(x, cos, sin):
    rotated = torch.cat([-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]], dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


def _attention(q, k, v):
    return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.25, dim=-1), v)


CASES = {
    "linear_out_features_0": (lambda x, w: F.linear(x, w), (torch.randn(3, 8), torch.randn(0, 8))),
    "swiglu_0_wide": (_zero_wide_swiglu, (torch.randn(1, 5, 8), torch.randn(0, 8), torch.randn(8, 0),
                                           torch.randn(8))),
    "silu_mul_0_wide": (lambda a, b: F.silu(a) * b, (torch.randn(1, 128, 0), torch.randn(1, 128, 0))),
    "rms_norm_0_features": (_rms_norm, (torch.randn(3, 0), torch.randn(0))),
    "rms_norm_0_rows": (_rms_norm, (torch.randn(0, 16), torch.randn(16))),
    "rope_0_tokens": (_rope, (torch.randn(1, 2, 0, 8), torch.randn(1, 0, 8), torch.randn(1, 0, 8))),
    "attention_0_keys": (_attention, (torch.randn(2, 4, 8), torch.randn(2, 0, 8), torch.randn(2, 0, 8))),
    "cross_entropy_0_rows": (lambda logits, labels: F.cross_entropy(logits, labels),
                             (torch.randn(0, 5), torch.zeros(0, dtype=torch.long))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_chain_over_an_empty_tensor_matches_eager_and_stays_lowered(name, caplog):
    fn, inputs = CASES[name]
    neuron_dynamo.reset_stats()
    with caplog.at_level(logging.WARNING):
        result, fallbacks = run_compiled(fn, *inputs)
    expected = fn(*inputs)
    torch.testing.assert_close(result, expected, equal_nan=True, rtol=1e-5, atol=1e-5)
    assert result.shape == expected.shape
    assert neuron_dynamo.stats().get("graphs_failed", 0) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
    assert all("empty tensor" in reason for reason in fallbacks.values()), fallbacks
