"""The four kernels of AWS's NKI matrix-multiplication tutorial, written here in NKI 0.6 from its prose.

Source: AWS Neuron SDK, NKI tutorial "Matrix multiplication" (`nki/guides/tutorials/matrix_multiplication.rst`;
the Neuron 2.23 version, `general/nki/tutorials/matrix_multiplication.rst`, publishes the Trn1 latencies these
kernels are calibrated against). Each kernel computes ``result[M, N] = lhsT[K, M].T @ rhs[K, N]`` in bf16 with
fp32 PSUM accumulation; they differ only in how often they load each input tile from HBM:

* `tiled`: every (m, n, k) step loads its [128, 128] lhsT tile and its [128, 512] rhs tile.
* `hoisted`: the K column of lhsT tiles of one m is loaded once per m ("Optimization 1: removing redundant loads").
* `block_free`: M and N are blocked by 2 tiles each; the tiles of a block are loaded once per block
  ("Optimization 2: blocking the free dimensions").
* `fully_optimized`: M, N and K are blocked (2048, 1024, 1024); each block is loaded with one [128, BLOCK] DMA per
  K tile (large per-partition payloads), partial sums over K blocks accumulate in SBUF result tiles that leave
  with one [128, BLOCK_N] DMA each ("Optimization 3: blocking M, N and K").

The caller runs `neuron_dynamo.nki.make_importable()` first.
"""

import nki
import nki.isa as nisa
import nki.language as nl

TILE_K = 128  # nl.tile_size.pmax
TILE_M = 128  # nl.tile_size.gemm_stationary_fmax
TILE_N = 512  # nl.tile_size.gemm_moving_fmax


def _shapes(lhs_t, rhs, block_m=TILE_M, block_n=TILE_N, block_k=TILE_K):
    k_size, m_size = lhs_t.shape
    k_rhs, n_size = rhs.shape
    assert k_size == k_rhs, f"contraction dims differ: lhsT {lhs_t.shape}, rhs {rhs.shape}"
    assert m_size % block_m == 0 and n_size % block_n == 0 and k_size % block_k == 0, (
        f"shapes lhsT {lhs_t.shape}, rhs {rhs.shape} must be multiples of the blocks ({block_k}, {block_m}, {block_n})"
    )
    return k_size, m_size, n_size


def _load(src, p, f, dtype):
    tile = nl.ndarray((p, f), dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src)
    return tile


def _evacuate(acc, dst_hbm, dtype):
    """PSUM -> SBUF (with the cast to the output dtype), then SBUF -> HBM."""
    res = nl.ndarray(acc.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=dst_hbm, src=res)


def _accumulate(lhs_tiles, rhs_tiles):
    """One [128, 512] output tile: sum over k of lhs_tiles[k].T @ rhs_tiles[k] in one PSUM bank."""
    acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
    for k, (lhs_tile, rhs_tile) in enumerate(zip(lhs_tiles, rhs_tiles, strict=True)):
        nisa.nc_matmul(dst=acc, stationary=lhs_tile, moving=rhs_tile, accumulate=k > 0)
    return acc


@nki.jit
def tiled(lhs_t, rhs):
    """Tiled: both input tiles are loaded again for every matmul."""
    k_size, m_size, n_size = _shapes(lhs_t, rhs)
    result = nl.ndarray((m_size, n_size), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for m in range(0, m_size, TILE_M):
        for n in range(0, n_size, TILE_N):
            lhs_tiles, rhs_tiles = [], []
            for k in range(0, k_size, TILE_K):
                lhs_tiles.append(_load(lhs_t[k:k + TILE_K, m:m + TILE_M], TILE_K, TILE_M, lhs_t.dtype))
                rhs_tiles.append(_load(rhs[k:k + TILE_K, n:n + TILE_N], TILE_K, TILE_N, rhs.dtype))
            acc = _accumulate(lhs_tiles, rhs_tiles)
            _evacuate(acc, result[m:m + TILE_M, n:n + TILE_N], result.dtype)
    return result


@nki.jit
def hoisted(lhs_t, rhs):
    """Optimization 1: the lhsT tiles of one m are loaded once and reused for every n."""
    k_size, m_size, n_size = _shapes(lhs_t, rhs)
    result = nl.ndarray((m_size, n_size), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for m in range(0, m_size, TILE_M):
        lhs_tiles = [_load(lhs_t[k:k + TILE_K, m:m + TILE_M], TILE_K, TILE_M, lhs_t.dtype)
                     for k in range(0, k_size, TILE_K)]
        for n in range(0, n_size, TILE_N):
            rhs_tiles = [_load(rhs[k:k + TILE_K, n:n + TILE_N], TILE_K, TILE_N, rhs.dtype)
                         for k in range(0, k_size, TILE_K)]
            acc = _accumulate(lhs_tiles, rhs_tiles)
            _evacuate(acc, result[m:m + TILE_M, n:n + TILE_N], result.dtype)
    return result


@nki.jit
def block_free(lhs_t, rhs, tiles_in_block_m=2, tiles_in_block_n=2):
    """Optimization 2: M and N blocked; the tiles of an M block are reused for every N block and vice versa."""
    block_m, block_n = TILE_M * tiles_in_block_m, TILE_N * tiles_in_block_n
    k_size, m_size, n_size = _shapes(lhs_t, rhs, block_m, block_n)
    result = nl.ndarray((m_size, n_size), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for mb in range(0, m_size, block_m):
        lhs_block = [[_load(lhs_t[k:k + TILE_K, m:m + TILE_M], TILE_K, TILE_M, lhs_t.dtype)
                      for k in range(0, k_size, TILE_K)] for m in range(mb, mb + block_m, TILE_M)]
        for nb in range(0, n_size, block_n):
            rhs_block = [[_load(rhs[k:k + TILE_K, n:n + TILE_N], TILE_K, TILE_N, rhs.dtype)
                          for k in range(0, k_size, TILE_K)] for n in range(nb, nb + block_n, TILE_N)]
            for i, lhs_tiles in enumerate(lhs_block):
                for j, rhs_tiles in enumerate(rhs_block):
                    acc = _accumulate(lhs_tiles, rhs_tiles)
                    m, n = mb + i * TILE_M, nb + j * TILE_N
                    _evacuate(acc, result[m:m + TILE_M, n:n + TILE_N], result.dtype)
    return result


@nki.jit
def fully_optimized(lhs_t, rhs, tiles_in_block_m=16, tiles_in_block_n=2, tiles_in_block_k=8):
    """Optimization 3: M, N and K blocked; large-payload block loads; partial sums accumulate in SBUF."""
    block_m, block_n, block_k = TILE_M * tiles_in_block_m, TILE_N * tiles_in_block_n, TILE_K * tiles_in_block_k
    k_size, m_size, n_size = _shapes(lhs_t, rhs, block_m, block_n, block_k)
    result = nl.ndarray((m_size, n_size), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for nb in range(0, n_size, block_n):
        out_rows = []  # one [128, BLOCK_N] SBUF accumulator per 128-row M tile
        for _ in range(m_size // TILE_M):
            row = nl.ndarray((TILE_M, block_n), dtype=result.dtype, buffer=nl.sbuf)
            nisa.memset(dst=row, value=0.0)
            out_rows.append(row)
        for kb in range(0, k_size, block_k):
            rhs_block = [_load(rhs[k:k + TILE_K, nb:nb + block_n], TILE_K, block_n, rhs.dtype)
                         for k in range(kb, kb + block_k, TILE_K)]
            for mb in range(0, m_size, block_m):
                lhs_block = [_load(lhs_t[k:k + TILE_K, mb:mb + block_m], TILE_K, block_m, lhs_t.dtype)
                             for k in range(kb, kb + block_k, TILE_K)]
                for j in range(tiles_in_block_n):
                    for i in range(tiles_in_block_m):
                        acc = _accumulate([t[:, i * TILE_M:(i + 1) * TILE_M] for t in lhs_block],
                                          [t[:, j * TILE_N:(j + 1) * TILE_N] for t in rhs_block])
                        part = out_rows[mb // TILE_M + i][:, j * TILE_N:(j + 1) * TILE_N]
                        nisa.tensor_tensor(dst=part, data1=part, data2=acc, op=nl.add)
        for m, row in enumerate(out_rows):
            nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, nb:nb + block_n], src=row)
    return result
