"""Softmax and log-softmax over the last dimension, numerically stable, with optional scale and additive mask.

Layout contract (`softmax_kernel`, `log_softmax_kernel`):
  x     [..., D], any rank ≥ 2, any D (fp32, bf16 or fp16); rows = product of the leading dims
  mask  optional additive mask of exactly x's shape (any float dtype; -inf or a large negative value for
        masked positions; as in torch, a row masked entirely with -inf gives NaN, with finite values uniform)
  scale python float > 0 applied to x before the mask: softmax(scale * x + mask)
  returns a tensor of x's shape and dtype.

Tiling: rows go on the 128 partitions, D along the free dim. A row block whose D fits one chunk (8192
columns) is read once: VectorE finds the row max (negated), ScalarE computes exp(scale*x - max) and its row
sum in the same pass (activation_reduce), VectorE scales by the reciprocal sum; HBM traffic is one
read and one write. Longer rows take two passes over column chunks: the first keeps a running max and a
rescaled running sum (online softmax), the second recomputes and writes the normalised chunks.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .contract import require, require_float
from .tiling import PMAX, as_rows

COLS = 8192  # columns per chunk: an fp32 work tile of 32 KiB per partition


@nki.jit
def softmax_kernel(x, mask=None, scale=1.0):
    """softmax(scale * x + mask) over the last dim; see the module docstring."""
    return _softmax(x, mask, scale, False)


@nki.jit
def log_softmax_kernel(x, mask=None, scale=1.0):
    """log_softmax(scale * x + mask) over the last dim; see the module docstring."""
    return _softmax(x, mask, scale, True)


def _softmax(x, mask, scale, log):
    name = "log_softmax_kernel" if log else "softmax_kernel"
    require(len(x.shape) >= 2, name, f"x must have at least 2 dims (rows, D), got {tuple(x.shape)}")
    require_float(name, "x", x)
    require(scale > 0, name, f"scale must be > 0, got {scale}")
    if mask != None:  # noqa: E711
        require(tuple(mask.shape) == tuple(x.shape), name,
                f"mask shape {tuple(mask.shape)} must equal x's {tuple(x.shape)} (expand it first)")
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    xr, outr = as_rows(x), as_rows(out)
    maskr = as_rows(mask) if mask != None else None  # noqa: E711 (NKI forbids `is`)
    rows, d = xr.shape
    for r0 in range(0, rows, PMAX):
        pr = min(PMAX, rows - r0)
        chunks = [(c0, min(COLS, d - c0)) for c0 in range(0, d, COLS)]
        neg_max, total, kept = row_stats(xr, maskr, scale, r0, pr, chunks)
        _write_rows(xr, maskr, scale, outr, r0, pr, chunks, neg_max, total, kept, log)
    return out


def load_logits(xr, maskr, scale, r0, pr, c0, cc):
    """One chunk of logits as (tile, factor) with logits = factor * tile; the mask is added on VectorE."""
    x_tile = nl.ndarray((PMAX, cc), dtype=xr.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_tile[0:pr, 0:cc], src=xr[r0 : r0 + pr, c0 : c0 + cc])
    if maskr == None:  # noqa: E711
        return x_tile, scale
    m_tile = nl.ndarray((PMAX, cc), dtype=maskr.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=m_tile[0:pr, 0:cc], src=maskr[r0 : r0 + pr, c0 : c0 + cc])
    logits = nl.ndarray((PMAX, cc), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=logits[0:pr, 0:cc], data=x_tile[0:pr, 0:cc], op0=nl.multiply, operand0=scale,
                              op1=nl.add, operand1=m_tile[0:pr, 0:cc])
    return logits, 1.0


def row_stats(xr, maskr, scale, r0, pr, chunks):
    """(-max, sum of exp(logit - max)) per row as [128, 1] fp32 tiles, online over the column chunks.

    With a single chunk it also returns (tile, factor, exps), so that the caller neither reads nor
    exponentiates the chunk again.
    """
    neg_max = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    total = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    kept = None
    for i, (c0, cc) in enumerate(chunks):
        tile, factor = load_logits(xr, maskr, scale, r0, pr, c0, cc)
        chunk_neg_max = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=chunk_neg_max[0:pr, 0:1], op=nl.maximum, data=tile[0:pr, 0:cc], axis=(1,), negate=True)
        if factor != 1.0:
            nisa.tensor_scalar(dst=chunk_neg_max[0:pr, 0:1], data=chunk_neg_max[0:pr, 0:1], op0=nl.multiply,
                               operand0=factor)
        if i > 0:  # online update: new max, and the old sum rescaled by exp(old max - new max)
            new_neg_max = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=new_neg_max[0:pr, 0:1], data1=neg_max[0:pr, 0:1], data2=chunk_neg_max[0:pr, 0:1],
                               op=nl.minimum)
            shrink = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=shrink[0:pr, 0:1], data1=new_neg_max[0:pr, 0:1], data2=neg_max[0:pr, 0:1],
                               op=nl.subtract)
            nisa.activation(dst=shrink[0:pr, 0:1], op=nl.exp, data=shrink[0:pr, 0:1])
            nisa.tensor_tensor(dst=total[0:pr, 0:1], data1=total[0:pr, 0:1], data2=shrink[0:pr, 0:1], op=nl.multiply)
            chunk_neg_max = new_neg_max
        chunk_sum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        exps = nl.ndarray((PMAX, cc), dtype=xr.dtype, buffer=nl.sbuf)
        nisa.activation_reduce(dst=exps[0:pr, 0:cc], op=nl.exp, data=tile[0:pr, 0:cc], reduce_op=nl.add,
                               reduce_res=chunk_sum[0:pr, 0:1], bias=chunk_neg_max[0:pr, 0:1], scale=factor)
        if len(chunks) == 1:
            kept = (tile, factor, exps)
        if i == 0:
            nisa.tensor_copy(dst=total[0:pr, 0:1], src=chunk_sum[0:pr, 0:1])
        else:
            nisa.tensor_tensor(dst=total[0:pr, 0:1], data1=total[0:pr, 0:1], data2=chunk_sum[0:pr, 0:1], op=nl.add)
        nisa.tensor_copy(dst=neg_max[0:pr, 0:1], src=chunk_neg_max[0:pr, 0:1])
    return neg_max, total, kept


def _write_rows(xr, maskr, scale, outr, r0, pr, chunks, neg_max, total, kept, log):
    """Second pass: normalise each chunk with the row statistics and store it."""
    if log:  # log_softmax = logit - max - log(sum): one VectorE pass with a per-row shift
        shift = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=shift[0:pr, 0:1], op=nl.log, data=total[0:pr, 0:1])
        nisa.tensor_tensor(dst=shift[0:pr, 0:1], data1=neg_max[0:pr, 0:1], data2=shift[0:pr, 0:1], op=nl.subtract)
    else:
        inv_total = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv_total[0:pr, 0:1], data=total[0:pr, 0:1])
    for c0, cc in chunks:
        if kept != None:  # noqa: E711
            tile, factor, exps = kept
        else:
            tile, factor = load_logits(xr, maskr, scale, r0, pr, c0, cc)
            exps = None
        out_tile = nl.ndarray((PMAX, cc), dtype=outr.dtype, buffer=nl.sbuf)
        if log:  # factor * x + shift on VectorE (ScalarE already made its exp pass)
            nisa.tensor_scalar(dst=out_tile[0:pr, 0:cc], data=tile[0:pr, 0:cc], op0=nl.multiply, operand0=factor,
                               op1=nl.add, operand1=shift[0:pr, 0:1])
        else:
            if exps == None:  # noqa: E711
                exps = nl.ndarray((PMAX, cc), dtype=outr.dtype, buffer=nl.sbuf)
                nisa.activation(dst=exps[0:pr, 0:cc], op=nl.exp, data=tile[0:pr, 0:cc], scale=factor,
                                bias=neg_max[0:pr, 0:1])
            nisa.tensor_scalar(dst=out_tile[0:pr, 0:cc], data=exps[0:pr, 0:cc], op0=nl.multiply,
                               operand0=inv_total[0:pr, 0:1])
        nisa.dma_copy(dst=outr[r0 : r0 + pr, c0 : c0 + cc], src=out_tile[0:pr, 0:cc])
