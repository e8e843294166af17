"""Tile arithmetic and on-chip helpers shared by the kernels (plain sub-functions, no `@nki.jit`).

Every kernel tiles its data by the two hardware numbers that matter most: 128 partitions (`PMAX`) and the
512-element moving free size / PSUM bank of the matmul (`FMAX`). The helpers here are the pieces several
kernels need: ceiling division, element sizes, transposed loads, row views and partition broadcasts.
"""

import nki.isa as nisa
import nki.language as nl

PMAX = 128  # nl.tile_size.pmax: partitions of SBUF/PSUM, max contraction of one nc_matmul
FMAX = 512  # nl.tile_size.gemm_moving_fmax: max moving free size, one PSUM bank of fp32


def cdiv(n, d):
    """Ceiling division: how many tiles of size d cover n."""
    return (n + d - 1) // d


def itemsize(dtype):
    """Bytes per element of the floating dtypes the kernels accept (fp32, bf16, fp16)."""
    return 4 if dtype == nl.float32 else 2


def transpose_rows(dtype):
    """Most rows `load_transposed` takes at once: 512 through the DMA transpose (2-byte dtypes: 1 KiB
    rows land on each partition, longer DMA descriptors), 128 through TensorE (fp32)."""
    return FMAX if itemsize(dtype) == 2 else PMAX


def load_transposed(src, r0, rows, c0, cols, dst_tiles, dst_col):
    """Write src[r0:r0+rows, c0:c0+cols]ᵀ (src in HBM, rows ≤ transpose_rows(dtype)) into SBUF tiles, 128
    columns at a time.

    TensorE contracts over the partition dim, so an operand stored row-major with the contraction dim last
    has to be transposed on its way in: `dst_tiles[j][0:ct, dst_col:dst_col+rows]` (ct ≤ 128) receives the
    transpose of the j-th 128-column slice. 2-byte dtypes use the DMA engines' transpose straight from HBM
    (TensorE and the PSUM-evacuating engines stay free for the real work); fp32, which DMA cannot transpose,
    is loaded row-major with one DMA and flipped by TensorE (nc_transpose into PSUM, then a copy to SBUF).
    """
    if itemsize(src.dtype) == 2:
        for j in range(cdiv(cols, PMAX)):
            ct = min(PMAX, cols - j * PMAX)
            nisa.dma_transpose(dst=dst_tiles[j][0:ct, dst_col : dst_col + rows],
                               src=src[r0 : r0 + rows, c0 + j * PMAX : c0 + j * PMAX + ct])
        return
    block = nl.ndarray((PMAX, cols), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=block[0:rows, 0:cols], src=src[r0 : r0 + rows, c0 : c0 + cols])
    for j in range(cdiv(cols, PMAX)):
        ct = min(PMAX, cols - j * PMAX)
        flipped = nl.ndarray((PMAX, PMAX), dtype=src.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=flipped[0:ct, 0:rows], data=block[0:rows, j * PMAX : j * PMAX + ct])
        nisa.tensor_copy(dst=dst_tiles[j][0:ct, dst_col : dst_col + rows], src=flipped[0:ct, 0:rows])


def as_rows(t):
    """A [..., D] HBM tensor viewed as [rows, D] (rows = product of the leading dims)."""
    if len(t.shape) == 2:
        return t
    rows = 1
    for size in t.shape[:-1]:
        rows *= size
    return t.reshape((rows, t.shape[-1]))


def broadcast_rows(vec, n0, n, dtype):
    """vec[n0:n0+n] (a 1-D HBM tensor, float or int) copied to all 128 partitions as an SBUF tile [128, n].

    A K=1 matmul of a row of ones with the vector row (DMA-cast to fp32 on the way in) does the partition
    broadcast on TensorE, exactly, one PSUM bank at a time; the result is cast to `dtype`.
    """
    row = nl.ndarray((1, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=row[0:1, 0:n], src=vec.reshape((1, vec.shape[0]))[0:1, n0 : n0 + n])
    ones = nl.ndarray((1, PMAX), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    rows = nl.ndarray((PMAX, n), dtype=dtype, buffer=nl.sbuf)
    for s0 in range(0, n, FMAX):
        ns = min(FMAX, n - s0)
        spread = nl.ndarray((PMAX, ns), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=spread[0:PMAX, 0:ns], stationary=ones, moving=row[0:1, s0 : s0 + ns])
        nisa.tensor_copy(dst=rows[0:PMAX, s0 : s0 + ns], src=spread[0:PMAX, 0:ns])
    return rows
