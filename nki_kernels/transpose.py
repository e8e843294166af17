"""Transpose of the last two dimensions: [R, C] → [C, R] and [B, R, C] → [B, C, R].

Layout contract (`transpose_kernel`): x is 2-D or 3-D, any R and C, any dtype TensorE can transpose
(fp32, bf16, fp16); returns the transposed tensor in x's dtype, bit-exact.

Tiling: the matrix is walked in 1024 × 1024 squares. Eight row tiles [128, 1024] of a square are loaded with
one DMA each; TensorE transposes their 128 × 128 blocks (nc_transpose, an identity matmul that is exact on
trn2) so that eight blocks land side by side in PSUM, giving an output tile [128, 1024] that one copy
moves to SBUF and one DMA stores. Partition dim in: input rows; out: input columns.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .contract import require, require_float
from .tiling import FMAX, PMAX

SQUARE = 2 * FMAX  # rows and columns of the square walked per step (2 KiB DMA rows in bf16)


@nki.jit
def transpose_kernel(x):
    """x with its last two dims swapped; see the module docstring."""
    require(len(x.shape) in (2, 3), "transpose_kernel", f"x must be 2-D or 3-D, got {tuple(x.shape)}")
    require_float("transpose_kernel", "x", x)
    if len(x.shape) == 2:
        out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
        _transpose_2d(x, out)
    else:
        out = nl.ndarray((x.shape[0], x.shape[2], x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
        for bi in range(x.shape[0]):
            _transpose_2d(x[bi], out[bi])
    return out


def _transpose_2d(x, out):
    rows, cols = x.shape
    for r0 in range(0, rows, SQUARE):
        rs = min(SQUARE, rows - r0)
        for c0 in range(0, cols, SQUARE):
            cs = min(SQUARE, cols - c0)
            strips = []
            for i0 in range(0, rs, PMAX):
                rt = min(PMAX, rs - i0)
                strip = nl.ndarray((PMAX, cs), dtype=x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=strip[0:rt, 0:cs], src=x[r0 + i0 : r0 + i0 + rt, c0 : c0 + cs])
                strips.append(strip)
            for j0 in range(0, cs, PMAX):
                ct = min(PMAX, cs - j0)
                flipped = nl.ndarray((PMAX, rs), dtype=x.dtype, buffer=nl.psum)
                for i, strip in enumerate(strips):
                    rt = min(PMAX, rs - i * PMAX)
                    nisa.nc_transpose(dst=flipped[0:ct, i * PMAX : i * PMAX + rt], data=strip[0:rt, j0 : j0 + ct])
                tile = nl.ndarray((PMAX, rs), dtype=x.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=tile[0:ct, 0:rs], src=flipped[0:ct, 0:rs])
                nisa.dma_copy(dst=out[c0 + j0 : c0 + j0 + ct, r0 : r0 + rs], src=tile[0:ct, 0:rs])
