"""RMSNorm and LayerNorm over the last dimension.

Layout contract:
  rmsnorm_kernel(x, weight, eps):            y = x * rsqrt(mean(x², -1) + eps) * weight
  rmsnorm_saved_kernel(x, weight, eps):      (y, x̂, rstd) with x̂ = x * rstd and y = x̂ * weight, rstd [rows, 1]:
                                             what a training graph saves for the backward, in one launch
  layernorm_kernel(x, weight, bias, eps):    y = (x - mean) * rsqrt(var + eps) * weight + bias (biased var)
  x       [..., D], any rank ≥ 2, any D (fp32, bf16 or fp16); rows = product of the leading dims
  weight  [D] or None (no scale); bias [D] or None (layernorm only)
  returns a tensor of x's shape and dtype; statistics are computed in fp32.

Tiling: rows go on the 128 partitions, D along the free dim in chunks of up to 8192 columns. The statistics
are streaming passes with a free-dim add-reduction: Σx² for RMSNorm on ScalarE; Σx (VectorE and ScalarE
taking turns by row tile), then Σ(x-mean)² on ScalarE for LayerNorm, which stays exact when |mean| ≫ std.
VectorE applies them in one or two passes (scalar_tensor_tensor fuses the per-row shift/scale with the
weight or bias row; those rows are broadcast once to all partitions by a K=1 matmul). A row block that fits
one chunk is read from HBM once; longer rows are re-read per pass.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .contract import require, require_float, require_vector
from .tiling import PMAX, as_rows, broadcast_rows

COLS = 8192  # columns per chunk
CACHED_CHUNKS = 4  # weight/bias rows kept on chip for up to this many chunks; longer rows re-broadcast them


@nki.jit
def rmsnorm_kernel(x, weight=None, eps=1e-6):
    """RMSNorm over the last dim; see the module docstring."""
    return _norm(x, weight, None, eps, False)


@nki.jit
def rmsnorm_saved_kernel(x, weight, eps=1e-6):
    """RMSNorm over the last dim that also returns x̂ = x * rstd and rstd ([rows, 1], x's dtype); see the module
    docstring. y = x̂ * weight is rounded as eager's two products are."""
    return _norm(x, weight, None, eps, False, saved=True)


@nki.jit
def layernorm_kernel(x, weight=None, bias=None, eps=1e-5):
    """LayerNorm over the last dim; see the module docstring."""
    return _norm(x, weight, bias, eps, True)


def _norm(x, weight, bias, eps, centre, saved=False):
    name = "layernorm_kernel" if centre else ("rmsnorm_saved_kernel" if saved else "rmsnorm_kernel")
    require(len(x.shape) >= 2, name, f"x must have at least 2 dims (rows, D), got {tuple(x.shape)}")
    require_float(name, "x", x)
    require(not saved or weight != None, name, "weight is required (without one, y is x̂)")  # noqa: E711
    for label, param in (("weight", weight), ("bias", bias)):
        if param != None:  # noqa: E711
            require_vector(name, label, param, x.shape[-1])
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    xr, outr = as_rows(x), as_rows(out)
    rows, d = xr.shape
    if saved:
        xhat = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        rstd_out = nl.ndarray((rows, 1), dtype=x.dtype, buffer=nl.shared_hbm)
        xhatr = as_rows(xhat)
    chunks = [(c0, min(COLS, d - c0)) for c0 in range(0, d, COLS)]
    has_weight, has_bias = weight != None, bias != None  # noqa: E711 (NKI forbids `is`)
    w_rows = _param_rows(weight, chunks, x.dtype) if has_weight else None
    b_rows = _param_rows(bias, chunks, x.dtype) if has_bias else None
    for r0 in range(0, rows, PMAX):
        pr = min(PMAX, rows - r0)
        kept = None
        if len(chunks) == 1:
            kept = nl.ndarray((PMAX, d), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=kept[0:pr, 0:d], src=xr[r0 : r0 + pr, 0:d])
        neg_mean = None
        if centre:  # Σx alternates between VectorE and ScalarE by row tile: neither outgrows the DMA time
            on_vector = (r0 // PMAX) % 2 == 0
            neg_mean = _row_sum(xr, r0, pr, chunks, kept, nl.copy, None, on_vector)
            nisa.tensor_scalar(dst=neg_mean[0:pr, 0:1], data=neg_mean[0:pr, 0:1], op0=nl.multiply, operand0=-1.0 / d,
                               engine=nisa.engine.gpsimd)
        rstd = _row_sum(xr, r0, pr, chunks, kept, nl.square, neg_mean, False)
        nisa.tensor_scalar(dst=rstd[0:pr, 0:1], data=rstd[0:pr, 0:1], op0=nl.multiply, operand0=1.0 / d,
                           op1=nl.add, operand1=eps)
        nisa.activation(dst=rstd[0:pr, 0:1], op=nl.rsqrt, data=rstd[0:pr, 0:1])
        if saved:
            nisa.dma_copy(dst=rstd_out[r0 : r0 + pr, 0:1], src=rstd[0:pr, 0:1])
        for i, (c0, cc) in enumerate(chunks):
            tile = kept if kept != None else _load(xr, r0, pr, c0, cc)  # noqa: E711
            y = nl.ndarray((PMAX, cc), dtype=x.dtype, buffer=nl.sbuf)
            x_c, y_c = tile[0:pr, 0:cc], y[0:pr, 0:cc]
            shift = neg_mean[0:pr, 0:1] if centre else 0.0
            if saved:  # x̂ = x * rstd kept, then y = x̂ * w
                w = _param_chunk(weight, w_rows, chunks, i, x.dtype)
                nisa.tensor_scalar(dst=y_c, data=x_c, op0=nl.multiply, operand0=rstd[0:pr, 0:1])
                nisa.dma_copy(dst=xhatr[r0 : r0 + pr, c0 : c0 + cc], src=y_c)
                nisa.tensor_tensor(dst=y_c, data1=y_c, data2=w[0:pr, 0:cc], op=nl.multiply)
            elif has_weight and not centre:  # RMSNorm: y = (x * rstd) * w in one VectorE pass
                w = _param_chunk(weight, w_rows, chunks, i, x.dtype)
                nisa.scalar_tensor_tensor(dst=y_c, data=x_c, op0=nl.multiply, operand0=rstd[0:pr, 0:1],
                                          op1=nl.multiply, operand1=w[0:pr, 0:cc])
            elif has_weight:  # LayerNorm: y = ((x - mean) * w) * rstd (+ b), two VectorE passes
                w = _param_chunk(weight, w_rows, chunks, i, x.dtype)
                nisa.scalar_tensor_tensor(dst=y_c, data=x_c, op0=nl.add, operand0=shift, op1=nl.multiply,
                                          operand1=w[0:pr, 0:cc])
                if has_bias:
                    b = _param_chunk(bias, b_rows, chunks, i, x.dtype)
                    nisa.scalar_tensor_tensor(dst=y_c, data=y_c, op0=nl.multiply, operand0=rstd[0:pr, 0:1],
                                              op1=nl.add, operand1=b[0:pr, 0:cc])
                else:
                    nisa.tensor_scalar(dst=y_c, data=y_c, op0=nl.multiply, operand0=rstd[0:pr, 0:1])
            else:
                nisa.tensor_scalar(dst=y_c, data=x_c, op0=nl.add, operand0=shift, op1=nl.multiply,
                                   operand1=rstd[0:pr, 0:1])
                if has_bias:
                    b = _param_chunk(bias, b_rows, chunks, i, x.dtype)
                    nisa.tensor_tensor(dst=y_c, data1=y_c, data2=b[0:pr, 0:cc], op=nl.add)
            nisa.dma_copy(dst=outr[r0 : r0 + pr, c0 : c0 + cc], src=y[0:pr, 0:cc])
    if saved:
        return out, xhat, rstd_out
    return out


def _param_rows(vec, chunks, dtype):
    """A [D] parameter broadcast to 128 partitions per chunk: a list of tiles, or None where the row is too
    long to keep on chip (then `_param_chunk` broadcasts each chunk when it is needed)."""
    if len(chunks) > CACHED_CHUNKS:
        return None
    return [broadcast_rows(vec, c0, cc, dtype) for c0, cc in chunks]


def _param_chunk(vec, cache, chunks, i, dtype):
    if cache != None:  # noqa: E711
        return cache[i]
    return broadcast_rows(vec, chunks[i][0], chunks[i][1], dtype)


def _load(xr, r0, pr, c0, cc):
    tile = nl.ndarray((PMAX, cc), dtype=xr.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile[0:pr, 0:cc], src=xr[r0 : r0 + pr, c0 : c0 + cc])
    return tile


def _row_sum(xr, r0, pr, chunks, kept, op, bias, on_vector):
    """Σ op(x + bias) over each row as a [128, 1] fp32 tile: on ScalarE (activation with add-reduction), or for
    a plain Σx on VectorE (tensor_reduce) when `on_vector`."""
    total = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    for i, (c0, cc) in enumerate(chunks):
        tile = kept if kept != None else _load(xr, r0, pr, c0, cc)  # noqa: E711
        part = total if i == 0 else nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        if on_vector:
            nisa.tensor_reduce(dst=part[0:pr, 0:1], op=nl.add, data=tile[0:pr, 0:cc], axis=(1,))
        else:
            scratch = nl.ndarray((PMAX, cc), dtype=xr.dtype, buffer=nl.sbuf)
            nisa.activation_reduce(dst=scratch[0:pr, 0:cc], op=op, data=tile[0:pr, 0:cc], reduce_op=nl.add,
                                   reduce_res=part[0:pr, 0:1],
                                   bias=bias[0:pr, 0:1] if bias != None else None)  # noqa: E711
        if i > 0:
            nisa.tensor_tensor(dst=total[0:pr, 0:1], data1=total[0:pr, 0:1], data2=part[0:pr, 0:1], op=nl.add)
    return total
