"""Float masks whose rows the flash kernel cannot read as eager does: every allowed value huge (finfo.min, -1e9),
as Hugging Face's eager masks are for a padding row. The lowering hands those rows to torch, forward and backward
(`lowering/attention.py`); eager SDPA, its backward and the explicit eager-attention chain are the oracles."""

import pytest
import torch
import transformers
from compiled import compile_static
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_dynamo import counters
from neuron_dynamo.lowering import lower_region
from neuron_dynamo.lowering.attention import attend, attend_backward
from neuron_dynamo.lowering.patterns import PatternKernel

aten = torch.ops.aten
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}  # relative to the tensor's largest

# One mask row per kind (dtype, key count, generator). Torch computes the rows whose every value is huge: "min",
# "-1e9" (-inf in fp16: a row that sees no key), "-5e4", "-1e4", "two huge", "-inf and huge", "above the floor".
ROW_KINDS = {
    "soft": lambda dt, sk, g: torch.randn(sk, generator=g),
    "min": lambda dt, sk, g: torch.full((sk,), torch.finfo(dt).min),
    "-1e9": lambda dt, sk, g: torch.full((sk,), -1e9),
    "-5e4": lambda dt, sk, g: torch.full((sk,), -5e4),
    "-1e4": lambda dt, sk, g: torch.full((sk,), -1e4),
    "two huge": lambda dt, sk, g: torch.where(torch.arange(sk) % 3 == 0, -1e4, torch.finfo(dt).min),
    "some huge": lambda dt, sk, g: torch.randn(sk, generator=g).masked_fill(torch.arange(sk) % 2 == 1,
                                                                             torch.finfo(dt).min),
    "-inf": lambda dt, sk, g: torch.full((sk,), float("-inf")),
    "-inf and huge": lambda dt, sk, g: torch.full((sk,), float("-inf")).index_fill(0, torch.tensor([0]),
                                                                                   torch.finfo(dt).min),
    "above the floor": lambda dt, sk, g: torch.full((sk,), torch.finfo(dt).min).index_fill(0, torch.tensor([0]),
                                                                                           -29990.0),
}


def _mask(kinds, shape, sk, dtype, seed):
    """A mask of `shape` + [len(kinds), sk]: row i of every slice of kind kinds[i]."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.stack([ROW_KINDS[kind](dtype, sk, g) for kind in kinds])
    return rows.expand(*shape, len(kinds), sk).to(dtype).clone()


def _operands(batch, heads, kv_heads, sq, sk, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q, grad = (torch.randn(batch, heads, sq, 16, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(batch, kv_heads, sk, 16, generator=g).to(dtype) for _ in range(2))
    return q, k, v, grad


def _check(q, k, v, grad, mask, causal, scale=None):
    """The lowering's forward and backward against eager's (torch's CPU kernels, same dtype): out, lse, grads."""
    out, lse = attend(q, k, v, causal, mask, scale)
    grads = attend_backward(grad, q, k, v, out, lse, causal, mask, scale)
    eager_mask = mask if mask.dim() != 3 else mask[None]  # (torch's CPU kernel takes 2-D or 4-D masks)
    e_out, e_lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=eager_mask,
                                                                    scale=scale)
    e_grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, e_out, e_lse, 0.0, causal, attn_mask=eager_mask, scale=scale)
    tol = TOLERANCE[q.dtype]
    torch.testing.assert_close(lse, e_lse, atol=tol, rtol=1e-6)  # log-space: an absolute error
    for ours, theirs in zip((out, *grads), (e_out, *e_grads), strict=True):
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=tol,
                                   atol=tol * max(1.0, theirs.abs().max().item()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("batch", "heads", "kv_heads", "sq", "causal"), [
    (2, 4, 2, 10, False),  # packed: several slices to a tile, grouped-query heads
    (1, 2, 1, 130, False),  # padded to 256 rows and keys
    (2, 2, 2, 10, True),  # causal and a mask together (torch's CPU kernel takes both)
])
def test_rows_masked_everywhere_by_a_huge_value_match_eager(dtype, batch, heads, kv_heads, sq, causal):
    kinds = list(ROW_KINDS) + ["soft"] * (sq - len(ROW_KINDS))
    q, k, v, grad = _operands(batch, heads, kv_heads, sq, sq, dtype, seed=sq)
    mask = _mask(kinds, (batch, 1), sq, dtype, seed=sq)
    before = counters.stats().get("attention.rows_by_torch", 0)
    _check(q, k, v, grad, mask, causal)
    assert counters.stats().get("attention.rows_by_torch", 0) > before


def test_a_mask_without_such_rows_costs_no_torch_rows():
    q, k, v, grad = _operands(2, 2, 2, 10, 10, torch.float32, seed=0)
    mask = _mask(["soft", "some huge", "-inf", "soft"] * 2 + ["soft"] * 2, (2, 1), 10, torch.float32, seed=0)
    before = counters.stats().get("attention.rows_by_torch", 0)
    _check(q, k, v, grad, mask, causal=False)
    assert counters.stats().get("attention.rows_by_torch", 0) == before


@settings(max_examples=25, deadline=None)
@given(kinds=st.lists(st.sampled_from(sorted(ROW_KINDS)), min_size=1, max_size=12),
       sk=st.integers(1, 70), mask_shape=st.sampled_from(["2d", "batch", "full"]), group=st.sampled_from([1, 2]),
       causal=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 99))
def test_mask_patterns_match_eager(kinds, sk, mask_shape, group, causal, dtype, seed):
    sq = len(kinds)
    if causal:
        sk = sq  # torch's is_causal is top-left aligned, the lowering accepts causal with Sq == Sk only
    q, k, v, grad = _operands(2, 2 * group, 2, sq, sk, dtype, seed)
    shape = {"2d": (), "batch": (2, 1), "full": (2, 2 * group)}[mask_shape]
    _check(q, k, v, grad, _mask(kinds, shape, sk, dtype, seed), causal, scale=0.3 if seed % 2 else None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_explicit_eager_attention_chain_with_huge_rows_matches_eager(dtype):
    def eager_attention(q, k, v, mask):
        scores = torch.bmm(q, k.transpose(1, 2)) * 0.25 + mask
        return torch.bmm(torch.softmax(scores, dim=-1), v)

    q, k, v, _ = (t[0] for t in _operands(1, 6, 6, 12, 20, dtype, seed=3))
    mask = _mask(["min", "soft", "-1e9", "two huge", "some huge", "-1e4"] * 2, (6,), 20, dtype, seed=3)
    lowered = lower_region(make_fx(eager_attention)(q, k, v, mask), "simulator")
    assert [n.target.__name__ for n in lowered.graph.nodes if isinstance(n.target, PatternKernel)] == [
        "attention_kernel"]
    expected = eager_attention(q, k, v, mask)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(lowered(q, k, v, mask).float(), expected.float(), rtol=tol, atol=tol)


def test_the_efficient_form_with_huge_rows_matches_eager():
    q, k, v, grad = _operands(2, 3, 3, 12, 12, torch.float32, seed=5)
    bias = _mask(["min", "soft", "two huge", "-1e9"] * 3, (2, 1), 12, torch.float32, seed=5)

    def efficient(q, k, v, bias, grad):
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, False)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            grad, q, k, v, bias, out, lse, seed, offset, 0.0, [True, True, True, False], False)
        return out, lse, dq, dk, dv

    args = (q, k, v, bias, grad)
    out, lse, *grads = lower_region(make_fx(efficient, tracing_mode="fake")(*args), "simulator")(*args)
    e_out, e_lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias)
    e_grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(grad, q, k, v, e_out, e_lse, 0.0, False,
                                                                        attn_mask=bias)
    torch.testing.assert_close(lse[..., :12], e_lse, atol=1e-4, rtol=1e-5)
    for ours, theirs in zip((out, *grads), (e_out, *e_grads), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_a_tiny_llama_with_a_left_padded_finfo_min_mask_matches_eager():
    """Hugging Face's SDPA attention given a 4-D float mask (as a caller builds it, finfo.min where masked): the
    left-padded row's first queries see no real key, and every logit (padded positions included) is eager's."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 10))
    real = torch.ones(2, 10, dtype=torch.bool)
    real[1, :4] = False
    allowed = torch.ones(10, 10, dtype=torch.bool).tril() & real[:, None, None, :]
    mask = torch.zeros(2, 1, 10, 10).masked_fill(~allowed, torch.finfo(torch.float32).min)
    before = counters.stats().get("attention.rows_by_torch", 0)
    with torch.no_grad():
        logits = compile_static(model)(input_ids=ids, attention_mask=mask).logits
        expected = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert counters.stats().get("attention.rows_by_torch", 0) - before == 4 * 4  # 4 padded queries, 4 heads
