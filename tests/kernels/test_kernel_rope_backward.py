"""rope_backward_kernel against the gradient autograd computes for Hugging Face's rotary embedding."""

import pytest
import torch
import transformers
from kernel_checks import randn
from neuron_dynamo.kernels.contract import KernelContractError
from neuron_dynamo.kernels.rope import rope_backward_kernel

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def heads_view(table):
    """A [B, S, D] or [S, D] table as the [B or 1, 1, S, D] that multiplies every head."""
    return table[:, None] if table.dim() == 3 else table[None, None]


def graph_formula(g, cos, sin):
    """Autograd's graph of the gradient, op by op: Rᵀ(g·sin) + g·cos, each product and sum rounded to g's dtype."""
    rotated = g * heads_view(sin)
    half = g.shape[-1] // 2
    padded = (torch.nn.functional.pad(-rotated[..., :half], [half, 0])
              + torch.nn.functional.pad(rotated[..., half:], [0, half]))
    return padded + g * heads_view(cos)


def hf_gradient(g, cos, sin):
    """x's gradient through `transformers`' own apply_rotary_pos_emb (cos/sin [B, S, D]), by eager autograd."""
    x = torch.zeros_like(g, requires_grad=True)
    rotated, _ = transformers.models.llama.modeling_llama.apply_rotary_pos_emb(x, x, cos, sin)
    (grad,) = torch.autograd.grad(rotated, x, g)
    return grad


def tables(batch, seq, d, dtype, shared, seed):
    """Random cos/sin whose halves differ (the kernel must not assume HF's repeated halves)."""
    shape = (seq, d) if shared else (batch, seq, d)
    return randn(*shape, dtype=dtype, seed=seed), randn(*shape, dtype=dtype, seed=seed + 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [
    (2, 4, 64, 16),  # the tiny Llama's queries: one tile
    (2, 3, 5, 8),  # 128 does not divide B·H·S
    (1, 2, 131, 64),  # S > 128 and prime: a block of 128 tokens and one of 3
    (3, 2, 96, 32),  # three tokens per partition, three batches per tile
])
def test_rope_backward_rounds_like_the_graph_it_replaces(shape, dtype):
    batch, heads, seq, d = shape
    g = randn(*shape, dtype=dtype, seed=seq)
    for shared in (False, True):
        cos, sin = tables(batch, seq, d, dtype, shared, seed=d)
        assert torch.equal(rope_backward_kernel(g, cos, sin), graph_formula(g, cos, sin)), f"shared: {shared}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_backward_is_autograd_of_hf_apply_rotary_pos_emb(dtype):
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, max_position_embeddings=256)
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    g = randn(2, 2, 40, 32, dtype=dtype, seed=5)
    positions = torch.stack([torch.arange(40), torch.arange(40) + 7])  # two batches at different offsets
    cos, sin = (t.to(dtype) for t in rotary(g, positions))
    assert torch.equal(rope_backward_kernel(g, cos, sin), hf_gradient(g, cos, sin))
    cos, sin = tables(2, 40, 32, dtype, shared=False, seed=9)  # halves that differ
    assert torch.equal(rope_backward_kernel(g, cos, sin), hf_gradient(g, cos, sin))


def test_rope_backward_of_the_tiny_llama_is_one_tile():
    """One DMA for each of g, cos, sin, result and four element-wise instructions."""
    g = randn(2, 4, 64, 16, seed=1)
    cos, sin = tables(2, 64, 16, torch.float32, shared=True, seed=2)
    out, profile = rope_backward_kernel.profile(g, cos, sin)
    assert torch.equal(out, graph_formula(g, cos, sin))
    assert profile.instructions == {"dma_copy": 4, "tensor_tensor": 4}, profile.instructions


def test_rope_backward_refuses_tables_of_another_shape():
    g = randn(2, 4, 8, 16)
    with pytest.raises(KernelContractError, match="rope_backward_kernel: cos must be"):
        rope_backward_kernel(g, randn(2, 1, 8, 16), randn(8, 16))
