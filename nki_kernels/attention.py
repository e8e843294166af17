"""Attention forward, flash style: softmax(scale · q kᵀ + mask) v without materialising the score matrix.

Layout contract (`attention_kernel`):
  q        [B, Hq, Sq, D]; k, v [B, Hkv, Sk, D] with Hkv dividing Hq (grouped-query: query head h reads kv head
           h // (Hq / Hkv), as HF's repeat_kv); D ≤ 128; one dtype for q, k, v (fp32, bf16 or fp16)
  Sq, Sk   multiples of 128 (prefill/training), or Sq == 1 (decode against a static KV cache of any length)
  mask     optional additive mask [B or 1, Hq or 1, Sq, Sk] (-inf or a large negative value for masked keys)
  causal   query i sees keys j ≤ i + (Sk - Sq) (bottom-right aligned, as HF with a KV prefix)
  scale    python float (usually D ** -0.5)
  kv_len   optional int32 [B]: only keys j < kv_len[b] are valid (a static cache's filled length); a runtime
           input, so one compiled kernel serves every decode step
  returns  (out [B, Hq, Sq, D] in q's dtype, lse [B, Hq, Sq] fp32: the row logsumexp of the scaled, masked
           scores, which the backward kernel needs)

Tiling: for each (batch, kv head) Kᵀ [D, Sk] (DMA transposes for 16-bit dtypes, TensorE for fp32) and V stay
in SBUF while the query heads of its group stream past, 128 query rows at a time (in decode, the group's heads
are the rows). V is laid out per key block with consecutive keys on each partition (long DMA runs) unless the
attention is causal, where the blocks differ between query tiles and V keeps 128-key tiles.
Scores of a 128 × 2048 key block land in four PSUM banks (Qᵀ stationary, Kᵀ moving); VectorE takes the
row max, ScalarE exponentiates with the running max as bias and sums the row in the same pass (online
softmax); the probabilities are transposed in 128 × 128 blocks (for 16-bit dtypes partly by DMA transposes,
the rest by TensorE) and multiplied with V into one PSUM bank; the running output is rescaled and accumulated
in fp32 by one VectorE instruction, the per-row bookkeeping runs on GpSimd. Causal attention only visits
key blocks up to the diagonal and masks the diagonal 128 × 128 square by accumulating identityᵀ · mask into
its PSUM scores (TensorE has room to spare; VectorE does not); additive and valid-length masks go the same
way, scaled and clamped to a finite value on GpSimd. Limits: Kᵀ, V and the valid-length mask stay resident,
which fits Sk up to about 32k keys at D = 128 in bf16.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .contract import require, require_float
from .tiling import FMAX, PMAX, broadcast_rows, cdiv, itemsize, load_transposed, transpose_rows

KEY_BLOCK = 4 * FMAX  # keys per online-softmax step: four PSUM banks of scores
NEG = -1.0e30  # additive value of a masked (raw, unscaled) score
NEG_FP16 = -60000.0  # the same in fp16, whose range ends at 65504: masks go through TensorE in the input dtype
# How each 128-key block of probabilities gets transposed (see _probs_times_v): "d" DMA, "s" TensorE + ScalarE
# copy, "v" TensorE + VectorE copy. Tuned with benchmarks/kernel_library.py so that VectorE (row max), ScalarE (exp),
# DMA and TensorE finish close together on causal 4096 x 128 bf16 attention.
TRANSPOSE_ROUTE = "ddddsvsvdddsvsvs"


@nki.jit
def attention_kernel(q, k, v, mask=None, causal=False, scale=1.0, kv_len=None):
    """Flash-attention forward; see the module docstring for the layout contract."""
    check_attention_args("attention_kernel", q, k, v, mask, True, causal)
    batch, heads, sq, d = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    group = heads // kv_heads
    decode = sq == 1
    if kv_len != None:  # noqa: E711
        require(str(kv_len.dtype) == "int32" and tuple(kv_len.shape) == (batch,), "attention_kernel",
                f"kv_len must be int32 [{batch}], got {tuple(kv_len.shape)} {kv_len.dtype}")
    out = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((batch, heads, sq), dtype=nl.float32, buffer=nl.shared_hbm)
    has_mask, has_len = mask != None, kv_len != None  # noqa: E711 (NKI forbids `is`)
    identity = nl.shared_identity_matrix(PMAX, dtype=q.dtype)
    diagonal = causal_tile(q.dtype) if causal and not decode else None
    rows = group if decode else PMAX
    # every query tile sees the same key blocks unless causal: then V can be laid out per block with each
    # partition holding consecutive keys (long DMA runs), see load_value_blocks
    interleaved = (decode or not causal) and sk % PMAX == 0
    for b in range(batch):
        invalid = length_mask(kv_len, b, rows, sk, q.dtype) if has_len else None
        mb = (b if mask.shape[0] > 1 else 0) if has_mask else 0
        for kvh in range(kv_heads):
            k_t = load_keys_transposed(k[b, kvh], sk, d)
            if interleaved:
                v_tiles = load_value_blocks(v[b, kvh], sk, d)
            else:
                v_tiles = load_key_tiles(v[b, kvh], sk, d)
            if decode:  # the group's query heads are the rows of one tile
                h0 = kvh * group
                q_t = nl.ndarray((PMAX, PMAX), dtype=q.dtype, buffer=nl.sbuf)
                load_transposed(q[b, h0 : h0 + group, 0, 0:d], 0, group, 0, d, [q_t], 0)
                m_view, m_r0, m_bcast = None, 0, False
                if has_mask:
                    m_bcast = mask.shape[1] == 1
                    m_view = mask[mb, 0:1, 0, 0:sk] if m_bcast else mask[mb, h0 : h0 + group, 0, 0:sk]
                masks = (m_view, m_r0, m_bcast, invalid, identity)
                _attend(q_t, group, k_t, (v_tiles, interleaved), sk, -1, None, masks, scale, d,
                        out[b, h0 : h0 + group, 0, 0:d], lse[b, h0 : h0 + group, 0:1])
                continue
            for g in range(group):
                h = kvh * group + g
                m_view = mask[mb, h if mask.shape[1] > 1 else 0] if has_mask else None
                lse_bh = lse[b, h].reshape((sq, 1))
                for q0 in range(0, sq, PMAX):
                    q_t = nl.ndarray((PMAX, PMAX), dtype=q.dtype, buffer=nl.sbuf)
                    load_transposed(q[b, h], q0, PMAX, 0, d, [q_t], 0)
                    k_end, diag_at = sk, -1
                    if causal:
                        diag_at = q0 + sk - sq
                        k_end = diag_at + PMAX
                    masks = (m_view, q0, False, invalid, identity)
                    _attend(q_t, PMAX, k_t, (v_tiles, interleaved), k_end, diag_at, diagonal, masks, scale, d,
                            out[b, h, q0 : q0 + PMAX, 0:d], lse_bh[q0 : q0 + PMAX, 0:1])
    return out, lse


def check_attention_args(name, q, k, v, mask, allow_decode, causal=False):
    """The layout contract shared by the forward and backward kernels (see the module docstring)."""
    require(len(q.shape) == 4 and len(k.shape) == 4 and tuple(k.shape) == tuple(v.shape), name,
            f"q must be [B, Hq, Sq, D] and k, v [B, Hkv, Sk, D], got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}")
    batch, heads, sq, d = q.shape
    require(k.shape[0] == batch and k.shape[3] == d, name, f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree "
            "on batch or head_dim")
    require(d <= PMAX, name, f"head_dim {d} > {PMAX}: split the heads or use another attention path")
    require(heads % k.shape[1] == 0, name, f"kv heads {k.shape[1]} must divide query heads {heads}")
    require_float(name, "q", q)
    require(q.dtype == k.dtype == v.dtype, name, f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    long_ok = sq % PMAX == 0 and k.shape[2] % PMAX == 0
    decode_ok = allow_decode and sq == 1 and heads // k.shape[1] <= PMAX
    require(long_ok or decode_ok, name, f"Sq={sq}, Sk={k.shape[2]}: need both multiples of {PMAX}"
            + (" (or Sq == 1 for decode)" if allow_decode else "") + "; pad to a multiple of 128 and mask the padding")
    require(not causal or sq <= k.shape[2], name, f"causal attention with Sq={sq} > Sk={k.shape[2]} leaves the first "
            "queries without keys; give at least as many keys as queries")
    if mask != None:  # noqa: E711
        require(len(mask.shape) == 4 and mask.shape[0] in (1, batch) and mask.shape[1] in (1, heads)
                and tuple(mask.shape[2:]) == (sq, k.shape[2]), name,
                f"mask must be [B or 1, Hq or 1, Sq, Sk] = [{batch}|1, {heads}|1, {sq}, {k.shape[2]}], "
                f"got {tuple(mask.shape)}")


def masked_value(dtype):
    """The additive value of a masked score in a mask tile of `dtype` (finite: it goes through a matmul)."""
    return NEG_FP16 if dtype == nl.float16 else NEG


def causal_tile(dtype=nl.float32):
    """[128, 128]: 0 where key j ≤ query i, masked above the diagonal (iota of j - i, then a compare)."""
    offsets = nl.ndarray((PMAX, PMAX), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=offsets, pattern=[[1, PMAX]], offset=0, channel_multiplier=-1)
    tile = nl.ndarray((PMAX, PMAX), dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=tile, data=offsets, op0=nl.greater, operand0=0.0, op1=nl.multiply,
                       operand1=masked_value(dtype))
    return tile


def load_key_tiles(src, sk, d):
    """src [Sk, D] (HBM) as SBUF tiles [128 keys, D]: the moving operand of P·V."""
    tiles = []
    for s0 in range(0, sk, PMAX):
        kt = min(PMAX, sk - s0)
        tile = nl.ndarray((PMAX, d), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile[0:kt, 0:d], src=src[s0 : s0 + kt, 0:d])
        tiles.append(tile)
    return tiles


def load_value_blocks(src, sk, d):
    """src [Sk, D] (HBM, Sk a multiple of 128) as one SBUF tile [128, T, D] per key block of T·128 keys, where
    partition p holds the block's keys p·T … p·T + T - 1: one DMA per block whose rows are T·D contiguous
    elements (4 KiB for bf16, D = 128) instead of 128 rows of D. Slice [:, t, :] is the moving operand for the
    keys t, T + t, 2T + t, … of the block; the matching probabilities are the columns t::T."""
    blocks = []
    for k0 in range(0, sk, KEY_BLOCK):
        per = min(KEY_BLOCK, sk - k0) // PMAX
        tile = nl.ndarray((PMAX, per, d), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile[:, 0:per, 0:d], src=src[k0 : k0 + per * PMAX, 0:d].reshape((PMAX, per, d)))
        blocks.append(tile)
    return blocks


def load_keys_transposed(src, sk, d):
    """src [Sk, D] (HBM) as Kᵀ [D, Sk] in SBUF, `transpose_rows` keys at a time."""
    k_t = nl.ndarray((PMAX, sk), dtype=src.dtype, buffer=nl.sbuf)
    step = transpose_rows(src.dtype)
    for s0 in range(0, sk, step):
        load_transposed(src, s0, min(step, sk - s0), 0, d, [k_t], s0)
    return k_t


def length_mask(kv_len, b, rows, sk, dtype):
    """[rows, Sk] additive mask of batch b: masked where key j ≥ kv_len[b] (iota and compare on GpSimd).

    kv_len[b] reaches every partition through a K=1 matmul broadcast; the mask is built once per batch entry
    and shared by all heads.
    """
    lengths = broadcast_rows(kv_len, b, 1, nl.float32)
    invalid = nl.ndarray((PMAX, sk), dtype=dtype, buffer=nl.sbuf)
    for k0 in range(0, sk, KEY_BLOCK):
        kb = min(KEY_BLOCK, sk - k0)
        positions = nl.ndarray((PMAX, kb), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=positions[0:rows, 0:kb], pattern=[[1, kb]], offset=k0, channel_multiplier=0)
        nisa.tensor_scalar(dst=invalid[0:rows, k0 : k0 + kb], data=positions[0:rows, 0:kb], op0=nl.greater_equal,
                           operand0=lengths[0:rows, 0:1], op1=nl.multiply, operand1=masked_value(dtype),
                           engine=nisa.engine.gpsimd)
    return invalid


def extra_mask(masks, rows, k0, kb, scale, dtype):
    """The additive mask block [rows, kb] divided by `scale` (it is added to the raw scores, which ScalarE
    scales later), in `dtype` SBUF, built on GpSimd; or None without a mask or valid length."""
    m_view, m_r0, m_bcast, invalid, _ = masks
    if m_view == None:  # noqa: E711
        return invalid[0:rows, k0 : k0 + kb] if invalid != None else None  # noqa: E711 (masked/scale: still masked)
    raw = nl.ndarray((PMAX, kb), dtype=m_view.dtype, buffer=nl.sbuf)
    if m_bcast:  # one mask row for every query head of the group
        for r in range(rows):
            nisa.dma_copy(dst=raw[r : r + 1, 0:kb], src=m_view[0:1, k0 : k0 + kb])
    else:
        nisa.dma_copy(dst=raw[0:rows, 0:kb], src=m_view[m_r0 : m_r0 + rows, k0 : k0 + kb])
    gp = nisa.engine.gpsimd
    floor = masked_value(dtype)  # no -inf and no overflow in `dtype`: the block goes through a matmul (0·-inf = NaN)
    block = nl.ndarray((PMAX, kb), dtype=dtype, buffer=nl.sbuf)
    if invalid == None:  # noqa: E711
        nisa.tensor_scalar(dst=block[0:rows, 0:kb], data=raw[0:rows, 0:kb], op0=nl.multiply, operand0=1.0 / scale,
                           op1=nl.maximum, operand1=floor, engine=gp)
    else:  # add the valid-length mask in fp32, then clamp on the way to `dtype`
        summed = nl.ndarray((PMAX, kb), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=summed[0:rows, 0:kb], data=raw[0:rows, 0:kb], op0=nl.multiply, operand0=1.0 / scale,
                           op1=nl.maximum, operand1=floor, engine=gp)
        nisa.tensor_tensor(dst=summed[0:rows, 0:kb], data1=summed[0:rows, 0:kb], data2=invalid[0:rows, k0 : k0 + kb],
                           op=nl.add, engine=gp)
        nisa.tensor_scalar(dst=block[0:rows, 0:kb], data=summed[0:rows, 0:kb], op0=nl.maximum, operand0=floor,
                           engine=gp)
    return block[0:rows, 0:kb]


def _attend(q_t, rows, k_t, values, k_end, diag_at, diagonal, masks, scale, d, out_view, lse_view):
    """Online softmax over keys [0, k_end) for one tile of query rows; stores the output rows and their lse.

    Engine budget per key block (the row max on VectorE is the floor): the [P, 1] bookkeeping runs on
    GpSimd, the running output is rescaled and accumulated by one VectorE instruction, ScalarE does the exp.
    """
    gp = nisa.engine.gpsimd
    neg_max = None
    total = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    acc = None  # fp32 running output in SBUF, needed only when there are several key blocks
    single = k_end <= KEY_BLOCK
    for bi, k0 in enumerate(range(0, k_end, KEY_BLOCK)):
        kb = min(KEY_BLOCK, k_end - k0)
        scores = nl.ndarray((PMAX, kb), dtype=nl.float32, buffer=nl.psum)
        for c0 in range(0, kb, FMAX):
            cs = min(FMAX, kb - c0)
            nisa.nc_matmul(dst=scores[0:rows, c0 : c0 + cs], stationary=q_t[0:d, 0:rows],
                           moving=k_t[0:d, k0 + c0 : k0 + c0 + cs])
        # masks are added on TensorE (idle enough; VectorE is not): identityᵀ @ mask, accumulated into PSUM
        identity = masks[4]
        if k0 <= diag_at < k0 + kb:
            nisa.nc_matmul(dst=scores[0:rows, diag_at - k0 : diag_at - k0 + PMAX], stationary=identity,
                           moving=diagonal, accumulate=True)
        added = extra_mask(masks, rows, k0, kb, scale, q_t.dtype)
        if added != None:  # noqa: E711
            for c0 in range(0, kb, FMAX):
                cs = min(FMAX, kb - c0)
                nisa.nc_matmul(dst=scores[0:rows, c0 : c0 + cs], stationary=identity[0:rows, 0:rows],
                               moving=added[0:rows, c0 : c0 + cs], accumulate=True)
        block_max = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=block_max[0:rows, 0:1], op=nl.maximum, data=scores[0:rows, 0:kb], axis=(1,),
                           negate=True)
        nisa.tensor_scalar(dst=block_max[0:rows, 0:1], data=block_max[0:rows, 0:1], op0=nl.multiply, operand0=scale,
                           engine=gp)
        shrink = None
        if bi > 0:  # the new running max, and exp(old max - new max) to rescale what was accumulated
            nisa.tensor_tensor(dst=block_max[0:rows, 0:1], data1=block_max[0:rows, 0:1], data2=neg_max[0:rows, 0:1],
                               op=nl.minimum, engine=gp)
            shrink = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=shrink[0:rows, 0:1], op=nl.exp, data=neg_max[0:rows, 0:1], scale=-1.0,
                            bias=block_max[0:rows, 0:1])
        neg_max = block_max
        probs = nl.ndarray((PMAX, kb), dtype=q_t.dtype, buffer=nl.sbuf)
        block_sum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=probs[0:rows, 0:kb], op=nl.exp, data=scores[0:rows, 0:kb], reduce_op=nl.add,
                               reduce_res=block_sum[0:rows, 0:1], bias=neg_max[0:rows, 0:1], scale=scale)
        pv = _probs_times_v(probs, rows, kb, values, k0, d)
        if single:
            acc = pv
            nisa.tensor_copy(dst=total[0:rows, 0:1], src=block_sum[0:rows, 0:1], engine=gp)
        elif bi == 0:
            acc = nl.ndarray((PMAX, d), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=acc[0:rows, 0:d], op=nl.copy, data=pv[0:rows, 0:d])
            nisa.tensor_copy(dst=total[0:rows, 0:1], src=block_sum[0:rows, 0:1], engine=gp)
        else:
            nisa.scalar_tensor_tensor(dst=acc[0:rows, 0:d], data=acc[0:rows, 0:d], op0=nl.multiply,
                                      operand0=shrink[0:rows, 0:1], op1=nl.add, operand1=pv[0:rows, 0:d])
            nisa.tensor_scalar(dst=total[0:rows, 0:1], data=total[0:rows, 0:1], op0=nl.multiply,
                               operand0=shrink[0:rows, 0:1], engine=gp)
            nisa.tensor_tensor(dst=total[0:rows, 0:1], data1=total[0:rows, 0:1], data2=block_sum[0:rows, 0:1],
                               op=nl.add, engine=gp)
    inv_total = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv_total[0:rows, 0:1], data=total[0:rows, 0:1])
    result = nl.ndarray((PMAX, d), dtype=out_view.dtype, buffer=nl.sbuf)
    nisa.activation(dst=result[0:rows, 0:d], op=nl.copy, data=acc[0:rows, 0:d], scale=inv_total[0:rows, 0:1])
    nisa.dma_copy(dst=out_view, src=result[0:rows, 0:d])
    row_lse = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=row_lse[0:rows, 0:1], op=nl.log, data=total[0:rows, 0:1])
    nisa.tensor_tensor(dst=row_lse[0:rows, 0:1], data1=row_lse[0:rows, 0:1], data2=neg_max[0:rows, 0:1],
                       op=nl.subtract, engine=gp)
    nisa.dma_copy(dst=lse_view, src=row_lse[0:rows, 0:1])


def _probs_times_v(probs, rows, kb, values, k0, d):
    """PSUM [rows, D] = probs[rows, kb] @ V[k0 : k0 + kb], contracting 128 keys at a time.

    `values` is (V tiles, interleaved): the [128 keys, D] tiles of load_key_tiles, key sub-block j being the
    keys k0 + 128·j …, or (interleaved) the per-block tiles of load_value_blocks, sub-block j being the keys
    k0 + j, k0 + T + j, … (T = kb / 128), whose probabilities are the columns j::T.

    TensorE needs probsᵀ (keys on partitions). Each 128-key block is transposed by one of three routes,
    chosen by `TRANSPOSE_ROUTE` so that no engine outgrows the row max that VectorE must do anyway: "d" a
    DMA transpose SBUF→SBUF (2-byte dtypes and full 128-row tiles, otherwise "s" or "v"; consecutive blocks
    go four at a time through one 3-D transpose, which writes 1 KiB runs per partition), "s" a TensorE
    transpose copied out of PSUM by ScalarE, "v" the same copied by VectorE (TensorE transposes are grouped
    four to a PSUM bank, one copy per group).
    """
    v_tiles, interleaved = values
    first_tile = k0 // PMAX
    n_tiles = cdiv(kb, PMAX)
    per = n_tiles  # interleaved: keys per partition in this block
    placed = [None] * n_tiles  # per key block: (SBUF tile, first column) of its transpose
    by_engine = ([], [])  # key blocks copied out of PSUM by ScalarE, by VectorE
    by_dma = []  # runs of consecutive key blocks for one 3-D DMA transpose each
    for j in range(n_tiles):
        route = TRANSPOSE_ROUTE[(first_tile + j) % len(TRANSPOSE_ROUTE)]
        full = rows == PMAX and kb - j * PMAX >= PMAX and not interleaved
        if route == "d" and (itemsize(probs.dtype) != 2 or not full):  # few rows (decode): TensorE is cheaper
            route = "sv"[j % 2]
        if route == "d":
            if by_dma and by_dma[-1][-1] == j - 1 and len(by_dma[-1]) < 4:
                by_dma[-1].append(j)
            else:
                by_dma.append([j])
        else:
            by_engine[1 if route == "v" else 0].append(j)
    for run in by_dma:  # [128 q, n, 128 k] → [128 k, n, 128 q]: 1 KiB of each partition per 4-block run
        n, j0 = len(run), run[0]
        tile = nl.ndarray((PMAX, n, PMAX), dtype=probs.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=tile[:, 0:n, :],
                           src=probs[:, j0 * PMAX : (j0 + n) * PMAX].reshape((PMAX, n, PMAX)))
        for i, j in enumerate(run):
            placed[j] = (tile[:, i, :], 0)
    for e, blocks in enumerate(by_engine):
        for g0 in range(0, len(blocks), 4):
            group = blocks[g0 : g0 + 4]
            flipped = nl.ndarray((PMAX, len(group) * PMAX), dtype=probs.dtype, buffer=nl.psum)
            for i, j in enumerate(group):
                kt = min(PMAX, kb - j * PMAX)
                columns = slice(j, kb, per) if interleaved else slice(j * PMAX, j * PMAX + kt)
                nisa.nc_transpose(dst=flipped[0:kt, i * PMAX : i * PMAX + rows], data=probs[0:rows, columns])
            tile = nl.ndarray((PMAX, len(group) * PMAX), dtype=probs.dtype, buffer=nl.sbuf)
            width = (len(group) - 1) * PMAX + rows
            if e == 0:
                nisa.activation(dst=tile[:, 0:width], op=nl.copy, data=flipped[:, 0:width])
            else:
                nisa.tensor_copy(dst=tile[:, 0:width], src=flipped[:, 0:width], engine=nisa.engine.vector)
            for i, j in enumerate(group):
                placed[j] = (tile, i * PMAX)
    pv = nl.ndarray((PMAX, PMAX), dtype=nl.float32, buffer=nl.psum)
    for j in range(n_tiles):
        kt = min(PMAX, kb - j * PMAX)
        tile, col = placed[j]
        if interleaved:
            moving = v_tiles[k0 // KEY_BLOCK][0:PMAX, j, 0:d]
        else:
            moving = v_tiles[first_tile + j][0:kt, 0:d]
        nisa.nc_matmul(dst=pv[0:rows, 0:d], stationary=tile[0:kt, col : col + rows], moving=moving,
                       accumulate=j > 0)
    return pv
