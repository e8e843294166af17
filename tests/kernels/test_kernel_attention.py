"""attention_kernel (flash forward) against a torch reference: causal, masks, GQA, decode with a valid length."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DTYPES, assert_close, randn
from neuron_dynamo.kernels.attention import attention_kernel


def reference(q, k, v, mask=None, causal=False, scale=1.0, kv_len=None):
    """(out, lse) in fp32 math, with HF's repeat_kv for grouped-query heads."""
    group = q.shape[1] // k.shape[1]
    k32, v32 = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    scores = q.float() @ k32.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores + mask.float()
    sq, sk = q.shape[2], k.shape[2]
    keys = torch.arange(sk)
    if causal:
        scores = scores.masked_fill(keys[None, :] > torch.arange(sq)[:, None] + (sk - sq), float("-inf"))
    if kv_len is not None:
        scores = scores.masked_fill(keys[None, None, None, :] >= kv_len.long()[:, None, None, None], float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return (torch.softmax(scores, -1) @ v32).to(q.dtype), lse


def qkv(batch, heads, kv_heads, sq, sk, d, dtype):
    return (
        randn(batch, heads, sq, d, dtype=dtype, seed=1),
        randn(batch, kv_heads, sk, d, dtype=dtype, seed=2),
        randn(batch, kv_heads, sk, d, dtype=dtype, seed=3),
    )


def check(got, want, dtype):
    assert_close(got[0], want[0], dtype)
    assert got[1].dtype == torch.float32
    torch.testing.assert_close(got[1], want[1], rtol=1e-2 if dtype == torch.bfloat16 else 1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "sq", "sk", "d"), [(2, 1, 256, 256, 64), (2, 2, 128, 384, 128)])
def test_causal_prefill(dtype, heads, kv_heads, sq, sk, d):
    q, k, v = qkv(1, heads, kv_heads, sq, sk, d, dtype)
    scale = d**-0.5
    check(attention_kernel(q, k, v, None, True, scale), reference(q, k, v, None, True, scale), dtype)


def test_long_keys_span_several_blocks():
    """More keys than one 2048-key block: the running max and sums are rescaled between blocks."""
    q, k, v = qkv(1, 1, 1, 128, 2304, 32, torch.float32)
    k[0, 0, 2200] *= 8.0  # a late block holds the row maxima
    check(attention_kernel(q, k, v, None, False, 0.5), reference(q, k, v, None, False, 0.5), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_additive_mask_broadcast_over_heads(dtype):
    q, k, v = qkv(2, 2, 1, 128, 256, 32, dtype)
    mask = torch.where(randn(2, 1, 128, 256, seed=4) > 1.0, float("-inf"), 0.0).to(dtype)
    check(attention_kernel(q, k, v, mask, False, 0.2), reference(q, k, v, mask, False, 0.2), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_against_static_cache_with_valid_length(dtype):
    q, k, v = qkv(2, 4, 2, 1, 300, 64, dtype)
    kv_len = torch.tensor([200, 37], dtype=torch.int32)
    scale = 64**-0.5
    got = attention_kernel(q, k, v, None, False, scale, kv_len)
    check(got, reference(q, k, v, None, False, scale, kv_len), dtype)


def test_decode_with_per_head_mask():
    q, k, v = qkv(1, 4, 1, 1, 256, 32, torch.float32)
    mask = torch.where(randn(1, 4, 1, 256, seed=5) > 0.8, -1e9, 0.0)
    check(attention_kernel(q, k, v, mask, False, 0.3), reference(q, k, v, mask, False, 0.3), torch.float32)


@settings(max_examples=8, deadline=None)
@given(
    kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 2]),
    sq=st.sampled_from([128, 256]),
    extra_keys=st.sampled_from([0, 128]),
    d=st.sampled_from([16, 64, 128]),
    causal=st.booleans(),
    padded=st.booleans(),
    dtype=st.sampled_from(DTYPES),
)
def test_forward_shapes(kv_heads, group, sq, extra_keys, d, causal, padded, dtype):
    """Prefill shapes; `padded` adds a valid length per batch entry, as for right-padded bucketed inputs."""
    sk = sq + extra_keys
    q, k, v = qkv(2, kv_heads * group, kv_heads, sq, sk, d, dtype)
    kv_len = torch.tensor([sk, sk - 37], dtype=torch.int32) if padded else None
    scale = d**-0.5
    got = attention_kernel(q, k, v, None, causal, scale, kv_len)
    check(got, reference(q, k, v, None, causal, scale, kv_len), dtype)


@settings(max_examples=6, deadline=None)
@given(group=st.sampled_from([1, 3, 8]), sk=st.integers(1, 600), d=st.sampled_from([32, 128]),
       dtype=st.sampled_from(DTYPES))
def test_decode_shapes(group, sk, d, dtype):
    q, k, v = qkv(1, 2 * group, 2, 1, sk, d, dtype)
    kv_len = torch.tensor([max(1, sk // 2)], dtype=torch.int32)
    check(attention_kernel(q, k, v, None, True, 0.1, kv_len), reference(q, k, v, None, True, 0.1, kv_len), dtype)


def test_causal_prefill_at_benchmark_tiling():
    """A sequence of 2560 keys: full 2048-key blocks, a partial one, DMA and TensorE transposes of P."""
    q, k, v = qkv(1, 2, 1, 2560, 2560, 128, torch.bfloat16)
    scale = 128**-0.5
    check(attention_kernel(q, k, v, None, True, scale), reference(q, k, v, None, True, scale), torch.bfloat16)


def test_fp16_masks_stay_finite():
    """fp16 masks go through TensorE in fp16: masked scores use a finite fp16 value (0 · -inf would be NaN)."""
    q, k, v = qkv(1, 2, 1, 128, 256, 64, torch.float16)
    mask = torch.where(randn(1, 1, 128, 256, seed=6) > 1.0, float("-inf"), 0.0).to(torch.float16)
    kv_len = torch.tensor([200], dtype=torch.int32)
    got = attention_kernel(q, k, v, mask, True, 0.125, kv_len)
    assert_close(got[0], reference(q, k, v, mask, True, 0.125, kv_len)[0], torch.float16)
