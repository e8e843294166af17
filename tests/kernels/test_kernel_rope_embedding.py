"""rope_kernel and embedding_kernel against torch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DTYPES, randn
from neuron_dynamo.kernels.embedding import embedding_kernel
from neuron_dynamo.kernels.rope import rope_kernel

ROPE_DTYPES = (*DTYPES, torch.float16)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_rope(x, cos, sin):
    """Hugging Face's eager `apply_rotary_pos_emb`: every product and sum rounds to x's dtype, as the kernel's do."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


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
    dtype=st.sampled_from(ROPE_DTYPES),
    shared=st.booleans(),
)
def test_rope_matches_hf_rotate_half(batch, heads, seq, d, dtype, shared):
    x = randn(batch, heads, seq, d, dtype=dtype, seed=seq)
    cos, sin = hf_cos_sin(batch, seq, d, dtype, shared)
    assert torch.equal(rope_kernel(x, cos, sin), hf_rope(x, cos, sin))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_long_sequence_packs_tokens_per_partition(dtype):
    """S a multiple of 128: each partition holds S/128 = 37 consecutive tokens, in steps of 32 and 5."""
    x = randn(1, 1, 128 * 37, 128, dtype=dtype, seed=3)
    cos, sin = hf_cos_sin(1, 128 * 37, 128, dtype, shared=False)
    assert torch.equal(rope_kernel(x, cos, sin), hf_rope(x, cos, sin))


@pytest.mark.parametrize("dtype", ROPE_DTYPES)
@pytest.mark.parametrize("shape", [
    (2, 4, 64, 16),  # S < 128: both batches' tokens on the partitions, the heads on the free axis
    (3, 2, 96, 32),  # S does not divide 128: three tokens per partition, three batches per tile
    (2, 3, 5, 8),  # 128 does not divide B·H·S
    (1, 2, 131, 64),  # S > 128 and prime: a block of 128 tokens and one of 3
    (2, 3, 200, 64),  # S > 128, not a multiple of 128: four tokens per partition, two batches per tile
    (4, 2, 256, 16),  # S a multiple of 128, several batches per tile
    (1, 40, 8, 128),  # more heads than one tile holds: tiles of 32 and 8 heads share one cos/sin load
])
def test_rope_tilings_round_like_hf_eager(shape, dtype):
    batch, heads, seq, d = shape
    x = randn(*shape, dtype=dtype, seed=seq)
    for shared in (False, True):
        cos, sin = hf_cos_sin(batch, seq, d, dtype, shared)
        assert torch.equal(rope_kernel(x, cos, sin), hf_rope(x, cos, sin)), f"shared cos/sin: {shared}"


def test_rope_short_sequence_is_one_tile():
    """The tiny Llama's queries (4 heads) and keys (2): one tile each, one DMA for each of x, cos, sin, result."""
    for heads in (4, 2):
        x = randn(2, heads, 64, 16, seed=heads)
        cos, sin = hf_cos_sin(2, 64, 16, torch.float32, shared=False)
        out, profile = rope_kernel.profile(x, cos, sin)
        assert torch.equal(out, hf_rope(x, cos, sin))
        assert profile.instructions["dma_copy"] == 4, profile.instructions


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ids_shape", [(5,), (2, 150), (1, 1)])
def test_embedding_gathers_rows_exactly(dtype, ids_shape):
    table = randn(1000, 96, dtype=dtype, seed=1)
    ids = torch.randint(0, 1000, ids_shape, generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    ids.view(-1)[0] = 999  # the last row is reachable
    out = embedding_kernel(ids, table)
    assert torch.equal(out, torch.nn.functional.embedding(ids.long(), table))
