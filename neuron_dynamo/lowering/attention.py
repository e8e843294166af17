"""Scaled dot-product attention, forward and backward: the flash-attention library kernels.

The library kernels tile queries and keys by 128 (`kernels.attention`), so on the NKI targets a sequence that is
not a multiple of 128 is padded on the way in: padded keys are masked out with a large negative additive mask,
padded query rows are zero and are sliced off (in the backward they carry a zero gradient, so they add nothing
to dk and dv). torch's `is_causal` is top-left aligned and the kernel's bottom-right aligned: the two agree when
Sq == Sk, the only causal form accepted.

`_scaled_dot_product_efficient_attention` (the memory-efficient form a graph traced for a GPU contains; CPU torch
has no kernel for it) runs the same kernels: its `attn_bias` is the additive mask, its lse is padded to a multiple
of 32 rows, and its backward returns no bias gradient (a bias that needs one is refused).

Short sequences (at most 64, or grouped-query heads that fit 128 rows together) are packed several (batch, head)
slices to a tile instead (`attention_packing`).

The kernels read the caller's float mask clamped to a finite floor (`MASKED`, -30000). Where a row allows some key
with a value of magnitude below `LARGE` (1000), that changes nothing: what was clamped still lies 29000 below the
row's best key and weighs 0. The other rows would change: a row masked everywhere by finfo.min or -1e9 (a padding
row of Hugging Face's masks) becomes -30000 everywhere, which cancels out of the softmax, whereas eager's fp32
`scores + mask` absorbs the scores and the row comes out uniform (a huge value rounds the scores to its ulp).
Such rows, found by one `amax` over the mask, are computed with torch in the glue as eager computes them, forward
and backward (`_far_rows`). Rows that allow no key at all (-inf or False everywhere) give 0 and an lse of 0, as
torch's.
"""

import torch
import torch.fx as fx
import torch.nn.functional as F

from neuron_dynamo import counters
from neuron_dynamo.lowering.attention_packing import MASKED, TILE, additive, grow, plan
from neuron_dynamo.lowering.registry import lowers
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten
LARGE = 1000.0  # a row whose largest allowed mask value is this far from 0 is computed by torch (module docstring)


@lowers(
    aten.scaled_dot_product_attention,
    aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_efficient_attention_backward,
    family="attention",
)
def attention(op, *args, **kwargs):
    """Reference kernel: torch attends; the NKI kernel streams key/value blocks with an online softmax."""
    return op(*args, **kwargs)


def _refusal(node: fx.Node) -> str | None:
    backward = "backward" in str(node.target)
    q, k, v = (a.meta["val"] for a in (node.args[1:4] if backward else node.args[0:3]))
    args = dict(zip(("dropout_p", "is_causal"), node.args[6:8] if backward else node.args[3:5], strict=False))
    args.update(node.kwargs)
    return _operands_refusal(q, k, v, args.get("dropout_p", 0.0), args.get("is_causal"), args.get("attn_mask"))


def _operands_refusal(q, k, v, dropout_p, is_causal, mask) -> str | None:
    if dropout_p:
        return "attention with dropout"
    if q.dim() != 4 or q.shape[-1] > TILE:
        return "attention that is not [B, H, S, D] with D ≤ 128"
    if len({q.dtype, k.dtype, v.dtype}) != 1 or q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return "attention operands of different or non-float dtypes"
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        return "attention whose kv heads do not divide the query heads"
    if is_causal and q.shape[2] != k.shape[2]:
        return "causal attention with Sq != Sk (torch aligns top-left, the kernel bottom-right)"
    if isinstance(mask, fx.Node) and mask.meta["val"].dim() not in (2, 3, 4):
        return "an attention mask that is not 2-D to 4-D"
    return None


def _efficient_refusal(node: fx.Node) -> str | None:
    """The memory-efficient form: (q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal) forward,
    (grad, q, k, v, attn_bias, out, lse, seed, offset, dropout_p, grad_input_mask, is_causal) backward."""
    backward = "backward" in str(node.target)
    names = (("grad_out", "query", "key", "value", "attn_bias", "out", "logsumexp", "philox_seed", "philox_offset",
              "dropout_p", "grad_input_mask", "is_causal") if backward else
             ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal"))
    args = {"dropout_p": 0.0, "is_causal": False, **dict(zip(names, node.args, strict=False)), **node.kwargs}
    if backward and args["attn_bias"] is not None and args["grad_input_mask"][3]:
        return "the gradient of an attention bias (the backward kernel computes dq, dk, dv only)"
    q, k, v = (args[name].meta["val"] for name in ("query", "key", "value"))
    return _operands_refusal(q, k, v, args["dropout_p"], args["is_causal"], args["attn_bias"])


def _padded(size: int) -> int:
    return -(-size // TILE) * TILE


def _pad_seq(x: torch.Tensor, to: int) -> torch.Tensor:
    """x with zero rows appended along the sequence dim (-2) up to `to`."""
    return grow(x, x.dim() - 2, to)


def _mask(mask, q, sq, sk, sqp, skp):
    """The additive mask the kernel reads: the user's mask (bool or float) plus the padded keys masked out."""
    if mask is None and skp == sk:
        return None
    full = torch.zeros((1, 1, sqp, skp), dtype=q.dtype)
    if mask is not None:
        mask = additive(mask, q.dtype)
        full = full.expand(mask.shape[0], mask.shape[1], sqp, skp).clone()
        full[:, :, :sq, :sk] = mask.expand(mask.shape[0], mask.shape[1], sq, sk)
    full[..., sk:] = MASKED
    return full.contiguous()


def attend(q, k, v, is_causal, mask, scale, lse_len=None, exact=None):
    """(out, lse) of the flash kernel for [B, H, S, D] operands of any sequence length (padded to 128, or packed
    several slices to a tile when short); the lse keeps `lse_len` rows (default: the query length) where a caller's
    layout pads it. `exact(q_rows, k, v, mask_rows, scale)` → (out, lse or None) computes the rows the kernel
    cannot (see the module docstring) as the caller's eager form does (default: torch's SDPA, `eager_rows`)."""
    from neuron_dynamo.kernels.attention import attention_kernel

    sq, sk = q.shape[2], k.shape[2]
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    lse_len = sq if lse_len is None else lse_len
    exact = eager_rows if exact is None else exact
    packing = plan(q.shape, k.shape)
    if packing is None:
        sqp, skp = _padded(sq), _padded(sk)
        out, lse = launch(attention_kernel, _pad_seq(q, sqp).contiguous(), _pad_seq(k, skp).contiguous(),
                          _pad_seq(v, skp).contiguous(), _mask(mask, q, sq, sk, sqp, skp), bool(is_causal), scale)
        out, lse = out[:, :, :sq], lse[:, :, :lse_len]
    else:
        out, lse = launch(attention_kernel, packing.queries(q), packing.keys(k), packing.keys(v),
                          packing.mask(mask, is_causal, q.dtype), False, scale)
        out, lse = packing.unpack_queries(out), packing.unpack_queries(lse)
        if lse_len < sq:
            lse = lse[:, :, :lse_len]
        elif lse_len > sq:  # the layout's padding rows (read by nobody)
            lse = F.pad(lse, (0, lse_len - sq))
    if mask is None:
        return out, lse
    dead, far = _special_rows(mask, is_causal, sq, sk)
    out = out.masked_fill(dead, 0.0)  # torch's SDPA gives 0 (and an lse of 0) for a query that sees no key
    if lse.shape[2] >= sq:  # (the efficient form's lse is empty unless asked for)
        lse = torch.cat((lse[:, :, :sq].masked_fill(dead[..., 0], 0.0), lse[:, :, sq:]), 2)
    if far is not None:
        rows, which, q_rows, m_rows = _far_rows(q, sk, mask, is_causal, far)
        exact_out, exact_lse = exact(q_rows, k, v, m_rows, scale)
        out = out.index_copy(2, rows, torch.where(which, exact_out, out[:, :, rows]))
        if exact_lse is not None and lse.shape[2] >= sq:
            lse = lse.index_copy(2, rows, torch.where(which[..., 0], exact_lse.to(lse.dtype), lse[:, :, rows]))
    return out, lse


def eager_rows(q, k, v, mask, scale):
    """(out, lse) of torch's own CPU SDPA kernel (grouped-query heads included): eager's answer."""
    return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask, scale=scale)


def _special_rows(mask: torch.Tensor, is_causal: bool, sq: int, sk: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dead, far), both [..., Sq, 1] (the mask's leading dims), the causal rule included: the query rows that
    allow no key (False or -inf everywhere), and the rows of a float mask whose largest allowed value is finite
    and at least `LARGE` from 0 (None when there is none: the common case costs one `amax`)."""
    causal = torch.ones(sq, sk, dtype=torch.bool).tril() if is_causal else None
    if mask.dtype == torch.bool:
        return ~(mask if causal is None else mask & causal).any(-1, keepdim=True), None
    if causal is not None:
        mask = mask.masked_fill(~causal, float("-inf"))
    top = mask.amax(-1, keepdim=True)
    dead = top == float("-inf")
    far = ~(top.abs() < LARGE) & ~dead  # NaN and +inf rows too: torch gives eager's NaN
    return dead, (far if bool(far.any()) else None)


def _far_rows(q: torch.Tensor, sk: int, mask: torch.Tensor, is_causal: bool, far: torch.Tensor):
    """What torch needs to compute the `far` rows: (rows, the query positions far in some (batch, head) slice;
    which [B, H, rows, 1], where they are far; q's rows; the mask's rows, 4-D, the causal rule folded in as -inf).
    Whole query positions are taken (not single rows) so that K and V are read as they are, not gathered; the
    rows are counted (`attention.rows_by_torch`, forward and backward each)."""
    b, h, sq, _ = q.shape
    which = far[..., 0].expand(b, h, sq)
    rows = which.any(0).any(0).nonzero()[:, 0]
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    mask = mask[:, :, rows] if mask.shape[2] == sq else mask
    mask = mask.expand(*mask.shape[:3], sk)  # (a mask may broadcast over the keys)
    if is_causal:  # top-left: query i sees the keys j ≤ i
        mask = mask.masked_fill(torch.arange(sk) > rows[:, None], float("-inf"))
    which = which[:, :, rows, None]
    counters.bump("attention.rows_by_torch", int(which.sum()))
    return rows, which, q[:, :, rows], mask


@lowers(aten._scaled_dot_product_flash_attention_for_cpu, family="attention", target="simulator", accepts=_refusal)
def flash_attention(op, query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    return attend(query, key, value, is_causal, attn_mask, scale)


@lowers(aten.scaled_dot_product_attention, family="attention", target="simulator", accepts=_refusal)
def sdpa(op, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return attend(query, key, value, is_causal, attn_mask, scale)[0]


@lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward, family="attention", target="simulator",
        accepts=_refusal)
def flash_attention_backward(op, grad_out, query, key, value, out, logsumexp, dropout_p=0.0, is_causal=False,
                             attn_mask=None, scale=None):
    return attend_backward(grad_out, query, key, value, out, logsumexp, is_causal, attn_mask, scale)


@lowers(aten._scaled_dot_product_efficient_attention, family="attention", target="simulator",
        accepts=_efficient_refusal)
def efficient_attention(op, query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                        scale=None):
    """The memory-efficient form: its lse is padded to a multiple of 32 rows (empty unless asked for), and the
    philox seed and offset are placeholders (no dropout is accepted)."""
    lse_len = -(-query.shape[2] // 32) * 32 if compute_log_sumexp else 0
    out, lse = attend(query, key, value, is_causal, attn_bias, scale, lse_len)
    no_rng = torch.zeros((), dtype=torch.int64)
    return out, lse.float(), no_rng, no_rng.clone()


@lowers(aten._scaled_dot_product_efficient_attention_backward, family="attention", target="simulator",
        accepts=_efficient_refusal)
def efficient_attention_backward(op, grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed,
                                 philox_offset, dropout_p, grad_input_mask, is_causal=False, scale=None):
    dq, dk, dv = attend_backward(grad_out, query, key, value, out, logsumexp[:, :, :query.shape[2]], is_causal,
                                 attn_bias, scale)
    return dq, dk, dv, None


def attend_backward(grad_out, query, key, value, out, logsumexp, is_causal, mask, scale):
    """(dq, dk, dv) of the flash backward kernel for [B, H, S, D] operands of any sequence length; the rows the
    forward computed with torch get torch's own backward (their dk, dv added in fp32)."""
    sq, sk = query.shape[2], key.shape[2]
    scale = float(query.shape[-1] ** -0.5 if scale is None else scale)
    if mask is None:
        return _kernel_backward(grad_out, query, key, value, out, logsumexp, is_causal, mask, scale)
    # a query with no key to attend has a constant output (0): nothing flows back from it; a far row's gradient
    # comes from torch, and its lse (eager's: about the mask's value) would overflow the kernel's exp
    dead, far = _special_rows(mask, is_causal, sq, sk)
    skipped = dead if far is None else dead | far
    if far is not None:
        logsumexp = logsumexp.masked_fill(far[..., 0], 0.0)
    dq, dk, dv = _kernel_backward(grad_out.masked_fill(skipped, 0.0), query, key, value, out, logsumexp, is_causal,
                                  mask, scale)
    if far is None:
        return dq, dk, dv
    rows, which, q_rows, m_rows = _far_rows(query, sk, mask, is_causal, far)
    exact_out, exact_lse = eager_rows(q_rows, key, value, m_rows, scale)
    g_q, g_k, g_v = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out[:, :, rows].masked_fill(~which, 0.0), q_rows, key, value, exact_out, exact_lse, 0.0, False,
        attn_mask=m_rows, scale=scale)
    dq = dq.index_copy(2, rows, torch.where(which, g_q, dq[:, :, rows]))
    return dq, (dk.float() + g_k.float()).to(dk.dtype), (dv.float() + g_v.float()).to(dv.dtype)


def _kernel_backward(grad_out, query, key, value, out, logsumexp, is_causal, mask, scale):
    """(dq, dk, dv) of the library kernel, packed or padded to 128 like the forward."""
    from neuron_dynamo.kernels.attention_bwd import attention_backward_kernel

    sq, sk = query.shape[2], key.shape[2]
    packing = plan(query.shape, key.shape)
    if packing is not None:
        rows = packing.queries
        dq, dk, dv = launch(
            attention_backward_kernel, rows(query), packing.keys(key), packing.keys(value), rows(out), rows(grad_out),
            rows(logsumexp.float()), packing.mask(mask, is_causal, query.dtype), False, scale)
        return packing.unpack_queries(dq), packing.unpack_keys(dk), packing.unpack_keys(dv)
    sqp, skp = _padded(sq), _padded(sk)
    lse = logsumexp if sqp == sq else F.pad(logsumexp, (0, sqp - sq))
    dq, dk, dv = launch(
        attention_backward_kernel, _pad_seq(query, sqp).contiguous(), _pad_seq(key, skp).contiguous(),
        _pad_seq(value, skp).contiguous(), _pad_seq(out, sqp).contiguous(), _pad_seq(grad_out, sqp).contiguous(),
        lse.float().contiguous(), _mask(mask, query, sq, sk, sqp, skp), bool(is_causal), scale,
    )
    return dq[:, :, :sq], dk[:, :, :sk], dv[:, :, :sk]
