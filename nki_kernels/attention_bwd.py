"""Attention backward (dq, dk, dv) from the forward's saved row logsumexp, flash style.

Layout contract (`attention_backward_kernel`):
  q, out, dout  [B, Hq, Sq, D]; k, v [B, Hkv, Sk, D] (Hkv divides Hq, as in the forward); D ≤ 128;
                Sq and Sk multiples of 128; one dtype (fp32, bf16 or fp16)
  lse           fp32 [B, Hq, Sq] returned by `attention_kernel`
  mask, causal, scale  exactly as given to the forward
  returns       (dq [B, Hq, Sq, D], dk [B, Hkv, Sk, D], dv [B, Hkv, Sk, D]) in q's dtype; dk/dv sum over the
                query heads that share a kv head. Per (batch, kv head) the fp32 accumulators take
                (Sk + Sq/2) · D · 8 bytes per partition / 128, which bounds Sq, Sk to about 8192 at D = 128.

Tiling: P is recomputed block by block (128 queries × 128 keys) from the saved logsumexp, never stored.
The key tile is the outer loop: its dK and dV accumulate in PSUM over the query tiles (P and dS have queries
on partitions, which is exactly the stationary layout TensorE needs for Pᵀ·dO and dSᵀ·Q), then in fp32 SBUF
over the heads of the group. dQ needs dSᵀ: one TensorE transpose per block, and the products accumulate in
fp32 SBUF per query tile. Kᵀ, Vᵀ, Qᵀ and dOᵀ are transposed once per head (DMA transposes for 2-byte
dtypes, TensorE for fp32); D_i = rowsum(dO ∘ O) is computed once per query tile. Causal attention skips the
blocks above the diagonal and adds the mask of the diagonal blocks on TensorE (identityᵀ · mask into PSUM).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .attention import causal_tile, check_attention_args, load_key_tiles, load_keys_transposed
from .tiling import PMAX


@nki.jit
def attention_backward_kernel(q, k, v, out, dout, lse, mask=None, causal=False, scale=1.0):
    """Gradients of flash attention; see the module docstring for the layout contract."""
    check_attention_args("attention_backward_kernel", q, k, v, mask, False, causal)
    batch, heads, sq, d = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    group = heads // kv_heads
    dq = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    dk = nl.ndarray(k.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray(v.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    has_mask = mask != None  # noqa: E711 (NKI forbids `is`)
    identity = nl.shared_identity_matrix(PMAX, dtype=q.dtype)
    diagonal = (identity, causal_tile(q.dtype)) if causal else None
    n_q, n_k = sq // PMAX, sk // PMAX
    for b in range(batch):
        mb = (b if mask.shape[0] > 1 else 0) if has_mask else 0
        for kvh in range(kv_heads):
            k_t = load_keys_transposed(k[b, kvh], sk, d)
            v_t = load_keys_transposed(v[b, kvh], sk, d)
            k_tiles = load_key_tiles(k[b, kvh], sk, d)
            dk_acc = _zeros(n_k, d)
            dv_acc = _zeros(n_k, d)
            for g in range(group):
                h = kvh * group + g
                m_view = mask[mb, h if mask.shape[1] > 1 else 0] if has_mask else None
                q_t = load_keys_transposed(q[b, h], sq, d)
                do_t = load_keys_transposed(dout[b, h], sq, d)
                q_tiles = load_key_tiles(q[b, h], sq, d)
                do_tiles = load_key_tiles(dout[b, h], sq, d)
                neg_lse, delta = _row_terms(out[b, h], do_tiles, lse[b, h].reshape((sq, 1)), n_q, d)
                dq_acc = _zeros(n_q, d)
                for j in range(n_k):
                    k0 = j * PMAX
                    dv_ps = nl.ndarray((PMAX, PMAX), dtype=nl.float32, buffer=nl.psum)
                    dk_ps = nl.ndarray((PMAX, PMAX), dtype=nl.float32, buffer=nl.psum)
                    first = True
                    for i in range(n_q):
                        q0 = i * PMAX
                        if causal and k0 > q0 + sk - sq:  # the whole block lies above the diagonal
                            continue
                        probs = _probs(q_t, k_t, q0, k0, d, causal and k0 == q0 + sk - sq, diagonal, m_view, scale,
                                       neg_lse[i], q.dtype)
                        nisa.nc_matmul(dst=dv_ps[0:PMAX, 0:d], stationary=probs, moving=do_tiles[i][0:PMAX, 0:d],
                                       accumulate=not first)
                        dp = nl.ndarray((PMAX, PMAX), dtype=nl.float32, buffer=nl.psum)
                        nisa.nc_matmul(dst=dp, stationary=do_t[0:d, q0 : q0 + PMAX], moving=v_t[0:d, k0 : k0 + PMAX])
                        ds = nl.ndarray((PMAX, PMAX), dtype=q.dtype, buffer=nl.sbuf)
                        nisa.scalar_tensor_tensor(dst=ds, data=dp, op0=nl.subtract, operand0=delta[i][0:PMAX, 0:1],
                                                  op1=nl.multiply, operand1=probs)
                        nisa.nc_matmul(dst=dk_ps[0:PMAX, 0:d], stationary=ds, moving=q_tiles[i][0:PMAX, 0:d],
                                       accumulate=not first)
                        ds_t_ps = nl.ndarray((PMAX, PMAX), dtype=q.dtype, buffer=nl.psum)
                        nisa.nc_transpose(dst=ds_t_ps, data=ds)
                        ds_t = nl.ndarray((PMAX, PMAX), dtype=q.dtype, buffer=nl.sbuf)
                        nisa.activation(dst=ds_t, op=nl.copy, data=ds_t_ps)
                        dq_ps = nl.ndarray((PMAX, PMAX), dtype=nl.float32, buffer=nl.psum)
                        nisa.nc_matmul(dst=dq_ps[0:PMAX, 0:d], stationary=ds_t, moving=k_tiles[j][0:PMAX, 0:d])
                        nisa.tensor_tensor(dst=dq_acc[i], data1=dq_acc[i], data2=dq_ps[0:PMAX, 0:d], op=nl.add)
                        first = False
                    if not first:
                        nisa.tensor_tensor(dst=dv_acc[j], data1=dv_acc[j], data2=dv_ps[0:PMAX, 0:d], op=nl.add)
                        nisa.tensor_tensor(dst=dk_acc[j], data1=dk_acc[j], data2=dk_ps[0:PMAX, 0:d], op=nl.add)
                for i in range(n_q):
                    _store(dq[b, h, i * PMAX : (i + 1) * PMAX, 0:d], dq_acc[i], scale, d)
            for j in range(n_k):
                _store(dk[b, kvh, j * PMAX : (j + 1) * PMAX, 0:d], dk_acc[j], scale, d)
                _store(dv[b, kvh, j * PMAX : (j + 1) * PMAX, 0:d], dv_acc[j], 1.0, d)
    return dq, dk, dv


def _zeros(count, d):
    tiles = []
    for _ in range(count):
        tile = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=tile, value=0.0, engine=nisa.engine.gpsimd)
        tiles.append(tile)
    return tiles


def _row_terms(out_bh, do_tiles, lse_col, n_q, d):
    """Per query tile: -lse (the exp bias that recreates P) and D_i = rowsum(dO ∘ O), both fp32 [128, 1]."""
    neg_lse, delta = [], []
    for i in range(n_q):
        row = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=row, src=lse_col[i * PMAX : (i + 1) * PMAX, 0:1])
        nisa.tensor_scalar(dst=row, data=row, op0=nl.multiply, operand0=-1.0, engine=nisa.engine.gpsimd)
        neg_lse.append(row)
        o_tile = nl.ndarray((PMAX, d), dtype=out_bh.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=o_tile, src=out_bh[i * PMAX : (i + 1) * PMAX, 0:d])
        prod = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=prod, data1=o_tile, data2=do_tiles[i][0:PMAX, 0:d], op=nl.multiply)
        total = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=total, op=nl.add, data=prod, axis=(1,))
        delta.append(total)
    return neg_lse, delta


def _probs(q_t, k_t, q0, k0, d, on_diagonal, diagonal, m_view, scale, neg_lse, dtype):
    """P block [128 queries, 128 keys] = exp(scale · q kᵀ + mask - lse), recomputed from the saved lse."""
    scores = nl.ndarray((PMAX, PMAX), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=scores, stationary=q_t[0:d, q0 : q0 + PMAX], moving=k_t[0:d, k0 : k0 + PMAX])
    if on_diagonal:  # the causal mask, added on TensorE: identityᵀ @ mask accumulated into the scores
        nisa.nc_matmul(dst=scores, stationary=diagonal[0], moving=diagonal[1], accumulate=True)
    src, factor = scores, scale
    if m_view != None:  # noqa: E711
        block = nl.ndarray((PMAX, PMAX), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=block, src=m_view[q0 : q0 + PMAX, k0 : k0 + PMAX])
        src = nl.ndarray((PMAX, PMAX), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=src, data=scores, op0=nl.multiply, operand0=scale, op1=nl.add, operand1=block)
        factor = 1.0
    probs = nl.ndarray((PMAX, PMAX), dtype=dtype, buffer=nl.sbuf)
    nisa.activation(dst=probs, op=nl.exp, data=src, bias=neg_lse, scale=factor)
    return probs


def _store(dst, acc, scale, d):
    tile = nl.ndarray((PMAX, d), dtype=dst.dtype, buffer=nl.sbuf)
    nisa.activation(dst=tile, op=nl.copy, data=acc, scale=scale)
    nisa.dma_copy(dst=dst, src=tile)
