"""Short attention packed several (batch, head) slices to a 128-row tile (`lowering/attention_packing.py`): the
simulator lowering's forward and backward against eager `scaled_dot_product_attention` and autograd."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_dynamo.lowering.attention import attend, attend_backward
from neuron_dynamo.lowering.attention_packing import plan

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1.6e-2}  # bf16: a few ulps, of the tensor's largest element


def _operands(batch, kv_heads, group, sq, sk, dtype, mask_kind, mask_shape, seed, d=16):
    generator = torch.Generator().manual_seed(seed)
    heads = kv_heads * group
    q = torch.randn(batch, heads, sq, d, generator=generator).to(dtype)
    k, v = (torch.randn(batch, kv_heads, sk, d, generator=generator).to(dtype) for _ in range(2))
    shape = {"2d": (sq, sk), "batch": (batch, 1, sq, sk), "full": (batch, heads, sq, sk)}[mask_shape]
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(shape, generator=generator) > 0.4
        mask[..., -1, :] = False  # a query that sees no key: torch gives 0, and no gradient flows from it
    elif mask_kind == "float":
        mask = torch.randn(shape, generator=generator)
        mask = mask.masked_fill(torch.rand(shape, generator=generator) > 0.6, float("-inf"))
        mask[..., 0, :] = float("-inf")
    return q, k, v, mask


def _check(q, k, v, mask, causal, scale=None):
    """Our forward and backward (the lowering's functions) against eager SDPA in fp32 on the same values."""
    out, lse = attend(q, k, v, causal, mask, scale)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(q.dtype)
    dq, dk, dv = attend_backward(grad, q, k, v, out, lse, causal, mask, scale)
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=causal, scale=scale,
                                              enable_gqa=True)
    expected_grads = torch.autograd.grad(expected, leaves, grad.float())
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == q.shape[:3]
    for ours, theirs, leaf in zip((out, dq, dk, dv), (expected.detach(), *expected_grads), (q, q, k, v), strict=True):
        assert ours.shape == leaf.shape and ours.dtype == leaf.dtype
        tol = TOLERANCE[q.dtype]
        atol = tol * max(1.0, theirs.abs().max().item()) if q.dtype == torch.bfloat16 else tol
        torch.testing.assert_close(ours.float(), theirs, atol=atol, rtol=tol)


@pytest.mark.parametrize(
    ("batch", "kv_heads", "group", "sq", "sk", "causal", "mask_kind", "stacked", "per_tile", "tiles"), [
        (2, 2, 2, 64, 64, True, None, 2, 1, 4),  # the tiny Llama: two query heads stacked against their K/V
        (3, 1, 1, 20, 30, False, "bool", 1, 4, 1),  # 3 slices in a tile of 4 (one padded unit)
        (5, 1, 1, 33, 33, True, "float", 1, 3, 2),  # B·H not divisible by the slices per tile
        (1, 2, 4, 64, 64, True, None, 2, 1, 4),  # a group too tall for one tile: two units per kv head
        (2, 2, 2, 1, 40, False, "bool", 2, 3, 2),  # decode: one query row per head
        (1, 2, 2, 48, 200, False, "float", 2, 1, 2),  # long keys: only the query heads are stacked
    ])
def test_packed_attention_matches_eager(batch, kv_heads, group, sq, sk, causal, mask_kind, stacked, per_tile,
                                        tiles):
    q, k, v, mask = _operands(batch, kv_heads, group, sq, sk, torch.float32, mask_kind, "full", seed=sq)
    packing = plan(q.shape, k.shape)
    assert (packing.stacked, packing.per_tile, packing.tiles) == (stacked, per_tile, tiles)
    _check(q, k, v, mask, causal)


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 3), kv_heads=st.integers(1, 3), group=st.sampled_from([1, 2, 4]),
       sq=st.integers(1, 64), sk=st.integers(1, 70), causal=st.booleans(),
       mask_kind=st.sampled_from([None, "bool", "float"]), mask_shape=st.sampled_from(["2d", "batch", "full"]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 99))
def test_packed_attention_properties(batch, kv_heads, group, sq, sk, causal, mask_kind, mask_shape, dtype, seed):
    if causal:
        sk = sq  # torch's is_causal is top-left aligned, the lowering accepts causal with Sq == Sk only
    q, k, v, mask = _operands(batch, kv_heads, group, sq, sk, dtype, mask_kind, mask_shape, seed)
    _check(q, k, v, mask, causal, scale=0.3 if seed % 2 else None)


def test_a_shape_only_mask_is_built_once_and_long_or_lone_slices_are_not_packed():
    packing = plan((2, 4, 64, 16), (2, 2, 64, 16))
    causal = packing.mask(None, True, torch.float32)
    assert causal.shape == (1, 1, 128, 128) and packing.mask(None, True, torch.float32) is causal
    assert plan((1, 1, 64, 16), (1, 1, 64, 16)) is None  # one slice: one tile either way
    assert plan((2, 4, 96, 16), (2, 4, 96, 16)) is None  # 96 rows: one slice per tile
    assert plan((2, 4, 256, 16), (2, 2, 256, 16)) is None
