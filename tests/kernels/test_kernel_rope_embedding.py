"""rope_kernel and embedding_kernel against torch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DTYPES, assert_close, randn
from neuron_dynamo.kernels.embedding import embedding_kernel
from neuron_dynamo.kernels.rope import rope_kernel


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_reference(x, cos, sin):
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    x32 = x.float()
    return (x32 * cos.float() + rotate_half(x32) * sin.float()).to(x.dtype)


def hf_cos_sin(batch, seq, d, dtype, shared):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    positions = torch.arange(seq).float()[:, None] + 3.0
    emb = torch.cat((positions * inv_freq, positions * inv_freq), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    if shared:
        return cos, sin
    return cos.expand(batch, seq, d).contiguous(), sin.expand(batch, seq, d).contiguous()


@settings(max_examples=8, deadline=None)
@given(
    batch=st.integers(1, 2),
    heads=st.integers(1, 3),
    seq=st.integers(1, 200),
    d=st.sampled_from([8, 64, 128]),
    dtype=st.sampled_from(DTYPES),
    shared=st.booleans(),
)
def test_rope_matches_hf_rotate_half(batch, heads, seq, d, dtype, shared):
    x = randn(batch, heads, seq, d, dtype=dtype, seed=seq)
    cos, sin = hf_cos_sin(batch, seq, d, dtype, shared)
    assert_close(rope_kernel(x, cos, sin), rope_reference(x, cos, sin), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_long_sequence_packs_tokens_per_partition(dtype):
    """S a multiple of 128: each partition holds S/128 consecutive tokens (and several 32-token steps)."""
    x = randn(1, 2, 128 * 40, 64, dtype=dtype, seed=3)
    cos, sin = hf_cos_sin(1, 128 * 40, 64, dtype, shared=False)
    assert_close(rope_kernel(x, cos, sin), rope_reference(x, cos, sin), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ids_shape", [(5,), (2, 150), (1, 1)])
def test_embedding_gathers_rows_exactly(dtype, ids_shape):
    table = randn(1000, 96, dtype=dtype, seed=1)
    ids = torch.randint(0, 1000, ids_shape, generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    ids.view(-1)[0] = 999  # the last row is reachable
    out = embedding_kernel(ids, table)
    assert torch.equal(out, torch.nn.functional.embedding(ids.long(), table))
