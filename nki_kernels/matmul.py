"""Matrix multiplication C = act(A @ B + bias) [+ residual] on TensorE, for any M, N, K, batched, either operand
transposed.

Layout contract (`matmul_kernel`):
  a     [M, K] or [B, M, K]; with transpose_a=True it is given as [K, M] / [B, K, M]
  b     [K, N] or [B, K, N] (or 2-D with a batched `a`: one weight shared by the batch);
        with transpose_b=True it is given as [N, K] / [B, N, K] (a torch Linear weight)
  bias  optional [N], added to every row before the activation
  activation  "none" | "relu" | "silu" | "gelu" | "gelu_tanh" | "sigmoid" | "tanh"
  residual  optional, of C's shape and dtype: added to act(A @ B + bias) after its cast to C's dtype (a residual
        stream, or another product), as eager adds two tensors of that dtype
  returns C [M, N] or [B, M, N] in a's dtype (fp32, bf16 or fp16; a and b share a dtype).
  No shape limits: ragged edges (not multiples of 128/512) are handled by partial tiles.

Tiling: nc_matmul contracts over partitions (dst[m, n] = stationaryᵀ @ moving), so both operands need K on
partitions. The kernel walks N in blocks of up to 2048 columns and K in chunks of up to 8 KiB per partition;
the B block of a (N-block, K-chunk) is loaded once and stays resident in SBUF while every 128-row strip of A
streams past it. A strips (and B for transpose_b) arrive K-major through DMA transposes for 2-byte dtypes
(TensorE keeps only the useful products), through a row-major DMA and TensorE transposes for fp32;
the next strip is loaded before the current one is multiplied (double buffering, so DMA hides behind
TensorE). Each 128 × 512 output tile accumulates over the K tiles in one PSUM bank (fp32); four banks hold
a 128 × 2048 output strip. The epilogue (bias, activation, cast, residual) runs on Vector/ScalarE on the way out
of PSUM and the strip is stored with one DMA. When K needs several chunks, partial sums go through an fp32
HBM scratch tensor and the epilogue runs after the last chunk.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .activations import ACTIVATIONS
from .contract import require, require_float, require_vector
from .tiling import FMAX, PMAX, broadcast_rows, cdiv, itemsize, load_transposed, transpose_rows

N_BLOCK = 4 * FMAX  # output columns per resident B block: four PSUM banks of accumulators
A_STRIP_BYTES = 8 * 1024  # per partition, for one A strip of a K chunk (there are four such buffers live)

@nki.jit
def matmul_kernel(a, b, bias=None, activation="none", transpose_a=False, transpose_b=False, residual=None):
    """C = activation(A @ B + bias); see the module docstring for the layout contract."""
    name = "matmul_kernel"
    require(activation in ACTIVATIONS, name, f"activation {activation!r} is not one of {sorted(ACTIVATIONS)}")
    require(len(a.shape) in (2, 3) and len(b.shape) in (2, len(a.shape)), name,
            f"a must be 2-D or 3-D and b 2-D or of a's rank, got {tuple(a.shape)} and {tuple(b.shape)} "
            "(flatten extra batch dims first)")
    require(len(a.shape) == 2 or len(b.shape) == 2 or a.shape[0] == b.shape[0], name,
            f"batch sizes differ: a {tuple(a.shape)}, b {tuple(b.shape)}")
    require_float(name, "a", a)
    require(a.dtype == b.dtype, name, f"a is {a.dtype} but b is {b.dtype}; cast both to one dtype")
    act = ACTIVATIONS[activation]
    batched = len(a.shape) == 3
    shared_b = batched and len(b.shape) == 2
    rows_a, cols_a = a.shape[-2], a.shape[-1]
    m_size = cols_a if transpose_a else rows_a
    n_size = b.shape[-2] if transpose_b else b.shape[-1]
    k_a = rows_a if transpose_a else cols_a
    k_b = b.shape[-1] if transpose_b else b.shape[-2]
    require(k_a == k_b, name, f"contraction sizes differ: a {tuple(a.shape)} (transpose_a={transpose_a}) and "
            f"b {tuple(b.shape)} (transpose_b={transpose_b}) give K = {k_a} vs {k_b}")
    if bias != None:  # noqa: E711
        require_vector(name, "bias", bias, n_size)
    out_shape = (a.shape[0], m_size, n_size) if batched else (m_size, n_size)
    if residual != None:  # noqa: E711
        require(tuple(residual.shape) == out_shape and residual.dtype == a.dtype, name,
                f"residual must be {a.dtype} {out_shape} (C's), got {residual.dtype} {tuple(residual.shape)}")
    c = nl.ndarray(out_shape, dtype=a.dtype, buffer=nl.shared_hbm)
    if batched:
        for bi in range(a.shape[0]):
            b2 = b if shared_b else b[bi]
            res = residual[bi] if residual != None else None  # noqa: E711
            _matmul_2d(a[bi], b2, bias, c[bi], act, transpose_a, transpose_b, res)
    else:
        _matmul_2d(a, b, bias, c, act, transpose_a, transpose_b, residual)
    return c


def _matmul_2d(a, b, bias, c, act, transpose_a, transpose_b, residual):
    """One 2-D product into the HBM view c; the tiling is described in the module docstring."""
    m_size, n_size = c.shape
    k_size = a.shape[0] if transpose_a else a.shape[1]
    k_chunk = max(PMAX, A_STRIP_BYTES // itemsize(a.dtype) // PMAX * PMAX)
    n_chunks = cdiv(k_size, k_chunk)
    scratch = None
    if n_chunks > 1:
        scratch = nl.ndarray((m_size, n_size), dtype=nl.float32, buffer=nl.hbm)
    for n0 in range(0, n_size, N_BLOCK):
        nb = min(N_BLOCK, n_size - n0)
        bias_rows = None
        if bias != None:  # noqa: E711 (NKI kernels may not use `is`)
            bias_rows = broadcast_rows(bias, n0, nb, nl.float32)
        for ci in range(n_chunks):
            k0 = ci * k_chunk
            kc = min(k_chunk, k_size - k0)
            b_tiles = _load_b_block(b, k0, kc, n0, nb, transpose_b)
            a_next = _load_a_strip(a, 0, min(PMAX, m_size), k0, kc, transpose_a)
            for m0 in range(0, m_size, PMAX):
                mt = min(PMAX, m_size - m0)
                a_tiles = a_next
                if m0 + PMAX < m_size:  # prefetch the next strip while this one is multiplied
                    a_next = _load_a_strip(a, m0 + PMAX, min(PMAX, m_size - m0 - PMAX), k0, kc, transpose_a)
                acc = _multiply_strip(a_tiles, b_tiles, mt, kc, nb)
                _epilogue(acc, _stage(ci, n_chunks), scratch, bias_rows, act, residual, c, m0, mt, n0, nb)


def _stage(ci, n_chunks):
    """Where K chunk ci stands: "only" (no partial sums), "first", "mid" or "last"."""
    if n_chunks == 1:
        return "only"
    if ci == 0:
        return "first"
    return "last" if ci == n_chunks - 1 else "mid"


def _load_a_strip(a, m0, mt, k0, kc, transpose_a):
    """A[m0:m0+mt, k0:k0+kc]ᵀ as K-major tiles: tile j holds K rows j*128.. on partitions, mt columns."""
    tiles = [nl.ndarray((PMAX, PMAX), dtype=a.dtype, buffer=nl.sbuf) for _ in range(cdiv(kc, PMAX))]
    if transpose_a:
        for j in range(len(tiles)):
            kt = min(PMAX, kc - j * PMAX)
            nisa.dma_copy(dst=tiles[j][0:kt, 0:mt], src=a[k0 + j * PMAX : k0 + j * PMAX + kt, m0 : m0 + mt])
    else:
        load_transposed(a, m0, mt, k0, kc, tiles, 0)
    return tiles


def _load_b_block(b, k0, kc, n0, nb, transpose_b):
    """B[k0:k0+kc, n0:n0+nb] as K-major tiles [≤128, nb], resident while the A strips stream past."""
    tiles = [nl.ndarray((PMAX, nb), dtype=b.dtype, buffer=nl.sbuf) for _ in range(cdiv(kc, PMAX))]
    if transpose_b:
        step = transpose_rows(b.dtype)
        for s0 in range(0, nb, step):
            load_transposed(b, n0 + s0, min(step, nb - s0), k0, kc, tiles, s0)
    else:
        for j in range(len(tiles)):
            kt = min(PMAX, kc - j * PMAX)
            nisa.dma_copy(dst=tiles[j][0:kt, 0:nb], src=b[k0 + j * PMAX : k0 + j * PMAX + kt, n0 : n0 + nb])
    return tiles


def _multiply_strip(a_tiles, b_tiles, mt, kc, nb):
    """PSUM accumulators [mt, ≤512] (one bank each) of the strip product, summed over the K tiles."""
    acc = [nl.ndarray((PMAX, min(FMAX, nb - s0)), dtype=nl.float32, buffer=nl.psum) for s0 in range(0, nb, FMAX)]
    for j in range(len(a_tiles)):
        kt = min(PMAX, kc - j * PMAX)
        for s in range(len(acc)):  # same stationary for every bank: TensorE loads it once
            ns = min(FMAX, nb - s * FMAX)
            nisa.nc_matmul(
                dst=acc[s][0:mt, 0:ns],
                stationary=a_tiles[j][0:kt, 0:mt],
                moving=b_tiles[j][0:kt, s * FMAX : s * FMAX + ns],
                accumulate=j > 0,
            )
    return acc


def _epilogue(acc, stage, scratch, bias_rows, act, residual, c, m0, mt, n0, nb):
    """Drain the PSUM accumulators of one strip: partial sums to scratch, or bias + activation + cast (+ residual)
    to C."""
    final = stage in ("only", "last")
    out = nl.ndarray((PMAX, nb), dtype=c.dtype if final else nl.float32, buffer=nl.sbuf)
    partial = None
    if stage in ("mid", "last"):
        partial = nl.ndarray((PMAX, nb), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=partial[0:mt, 0:nb], src=scratch[m0 : m0 + mt, n0 : n0 + nb])
    for s in range(len(acc)):
        cols = slice(s * FMAX, s * FMAX + min(FMAX, nb - s * FMAX))
        total = acc[s][0:mt, 0 : cols.stop - cols.start]
        if partial != None:  # noqa: E711
            summed = nl.ndarray((PMAX, cols.stop - cols.start), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=summed[0:mt, 0 : cols.stop - cols.start], data1=total, data2=partial[0:mt, cols],
                               op=nl.add)
            total = summed[0:mt, 0 : cols.stop - cols.start]
        if not final:
            nisa.tensor_copy(dst=out[0:mt, cols], src=total)
            continue
        if bias_rows != None:  # noqa: E711
            biased = nl.ndarray((PMAX, cols.stop - cols.start), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=biased[0:mt, 0 : cols.stop - cols.start], data1=total, data2=bias_rows[0:mt, cols],
                               op=nl.add)
            total = biased[0:mt, 0 : cols.stop - cols.start]
        nisa.activation(dst=out[0:mt, cols], op=act, data=total)
    if final and residual != None:  # noqa: E711
        res = nl.ndarray((PMAX, nb), dtype=c.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=res[0:mt, 0:nb], src=residual[m0 : m0 + mt, n0 : n0 + nb])
        nisa.tensor_tensor(dst=out[0:mt, 0:nb], data1=out[0:mt, 0:nb], data2=res[0:mt, 0:nb], op=nl.add)
    nisa.dma_copy(dst=(c if final else scratch)[m0 : m0 + mt, n0 : n0 + nb], src=out[0:mt, 0:nb])
