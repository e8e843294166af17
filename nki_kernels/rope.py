"""Rotary position embedding in the Hugging Face `rotate_half` layout.

Layout contract (`rope_kernel`):
  x         [B, H, S, D] (queries or keys, D even; fp32, bf16 or fp16)
  cos, sin  [B, S, D] (what HF's rotary embedding returns) or [S, D] (shared by the batch), x's dtype
  returns   x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2]),
            in x's shape and dtype. Products and sums round to x's dtype, as HF's eager code does.

Tiling: the rotation never mixes tokens, so any token may sit on any partition. When S is a multiple of
128, partition p holds the S/128 consecutive tokens p·S/128 … (one contiguous HBM run per partition: long
DMA descriptors); otherwise tokens go on partitions 128 at a time. The cos/sin tiles of a (batch, token
block) are loaded once and reused by every head; per head one DMA brings x in, VectorE and GpSimd share the
five element-wise products and sums over [tokens, D/2] views, and one DMA stores the result.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .contract import require, require_float
from .tiling import PMAX

TOKENS = 32  # tokens per partition per step (a 128 x 32 x D tile)


@nki.jit
def rope_kernel(x, cos, sin):
    """Apply rotary embeddings to x; see the module docstring."""
    name = "rope_kernel"
    require(len(x.shape) == 4 and x.shape[3] % 2 == 0, name,
            f"x must be [B, H, S, D] with D even, got {tuple(x.shape)}")
    require_float(name, "x", x)
    batch, heads, seq, d = x.shape
    for label, t in (("cos", cos), ("sin", sin)):
        require(tuple(t.shape) in ((batch, seq, d), (seq, d)) and t.dtype == x.dtype, name,
                f"{label} must be [B, S, D] or [S, D] = {(batch, seq, d)} in x's dtype {x.dtype}, "
                f"got {tuple(t.shape)} {t.dtype}")
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    per_row = seq // PMAX if seq % PMAX == 0 else 1  # tokens per partition row of the view
    for b in range(batch):
        cos_b = _rows(cos[b] if len(cos.shape) == 3 else cos, per_row)
        sin_b = _rows(sin[b] if len(sin.shape) == 3 else sin, per_row)
        rows = cos_b.shape[0]
        for r0 in range(0, rows, PMAX):
            pr = min(PMAX, rows - r0)
            for t0 in range(0, per_row, TOKENS):
                cols = slice(t0 * d, min(per_row, t0 + TOKENS) * d)
                tokens = cols.stop // d - t0
                c = _load(cos_b, r0, pr, cols)
                s = _load(sin_b, r0, pr, cols)
                for h in range(heads):
                    x_h = _rows(x[b, h], per_row)
                    y = _rotate(_load(x_h, r0, pr, cols), c, s, pr, tokens, d)
                    nisa.dma_copy(dst=_rows(out[b, h], per_row)[r0 : r0 + pr, cols], src=y[0:pr, 0 : tokens * d])
    return out


def _rows(t, per_row):
    """An [S, D] HBM view as [S / per_row, per_row · D]: per_row consecutive tokens per row."""
    return t.reshape((t.shape[0] // per_row, per_row * t.shape[1]))


def _load(src, r0, pr, cols):
    tile = nl.ndarray((PMAX, cols.stop - cols.start), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile[0:pr, :], src=src[r0 : r0 + pr, cols])
    return tile


def _rotate(xt, c, s, pr, tokens, d):
    """y = x*cos + rotate_half(x)*sin over a [pr, tokens, d] tile (3-D views of the 2-D tiles)."""
    half = d // 2
    gp = nisa.engine.gpsimd
    x3, c3, s3 = (t.reshape((PMAX, tokens, d))[0:pr] for t in (xt, c, s))
    straight = nl.ndarray((PMAX, tokens, d), dtype=xt.dtype, buffer=nl.sbuf)
    rotated = nl.ndarray((PMAX, tokens, d), dtype=xt.dtype, buffer=nl.sbuf)
    y = nl.ndarray((PMAX, tokens * d), dtype=xt.dtype, buffer=nl.sbuf)
    y3 = y.reshape((PMAX, tokens, d))[0:pr]
    lo, hi = slice(0, half), slice(half, d)
    nisa.tensor_tensor(dst=straight[0:pr], data1=x3, data2=c3, op=nl.multiply)
    nisa.tensor_tensor(dst=rotated[0:pr, :, lo], data1=x3[:, :, hi], data2=s3[:, :, lo], op=nl.multiply)
    nisa.tensor_tensor(dst=rotated[0:pr, :, hi], data1=x3[:, :, lo], data2=s3[:, :, hi], op=nl.multiply, engine=gp)
    nisa.tensor_tensor(dst=y3[:, :, lo], data1=straight[0:pr, :, lo], data2=rotated[0:pr, :, lo], op=nl.subtract,
                       engine=gp)
    nisa.tensor_tensor(dst=y3[:, :, hi], data1=straight[0:pr, :, hi], data2=rotated[0:pr, :, hi], op=nl.add)
    return y
