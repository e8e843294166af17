"""attention_backward_kernel against torch autograd of the reference attention (causal, masked, GQA)."""

import pytest
import torch
from kernel_checks import DTYPES, assert_close, randn
from neuron_dynamo.kernels.attention import attention_kernel
from neuron_dynamo.kernels.attention_bwd import attention_backward_kernel
from test_kernel_attention import qkv, reference


def torch_grads(q, k, v, dout, mask, causal, scale):
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    out, _ = reference(*leaves, mask, causal, scale)
    out.backward(dout.float())
    return [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "sq", "sk", "d", "causal", "masked"),
    [(2, 1, 256, 256, 64, True, False), (1, 1, 128, 256, 32, False, True), (2, 2, 128, 256, 128, True, False)],
)
def test_attention_backward(dtype, heads, kv_heads, sq, sk, d, causal, masked):
    q, k, v = qkv(1, heads, kv_heads, sq, sk, d, dtype)
    dout = randn(1, heads, sq, d, dtype=dtype, seed=7)
    mask = torch.where(randn(1, 1, sq, sk, seed=8) > 1.0, -1e9, 0.0) if masked else None
    scale = d**-0.5
    out, lse = attention_kernel(q, k, v, mask, causal, scale)
    grads = attention_backward_kernel(q, k, v, out, dout, lse, mask, causal, scale)
    for got, want in zip(grads, torch_grads(q, k, v, dout, mask, causal, scale), strict=True):
        assert_close(got, want.to(dtype), dtype, factor=2.0 if dtype == torch.bfloat16 else 10.0)
