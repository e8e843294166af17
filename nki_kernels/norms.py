"""RMSNorm and LayerNorm over the last dimension.

Layout contract:
  rmsnorm_kernel(x, weight, eps):            y = x * rsqrt(mean(x², -1) + eps) * weight
  rmsnorm_saved_kernel(x, weight, eps):      (y, x̂, rstd) with x̂ = x * rstd and y = x̂ * weight, rstd [rows, 1]:
                                             what a training graph saves for the backward, in one launch
  layernorm_kernel(x, weight, bias, eps):    y = (x - mean) * rsqrt(var + eps) * weight + bias (biased var)
  x       [..., D], any rank ≥ 2, any D (fp32, bf16 or fp16); rows = product of the leading dims
  weight  [D] or None (no scale); bias [D] or None (layernorm only)
  returns a tensor of x's shape and dtype; statistics are computed in fp32.

  rmsnorm_backward_kernel(grad, x, rstd, weight, xhat=None, residual=None, rstd_cubed=None):
      the backward of y = weight * x̂ with x̂ = x * rstd, in the op order of AOTAutograd's graph for it:
      a = grad * weight (rounded to grad's dtype), s = Σ_D a * x per row,
      grad_x = (residual + a * rstd) + ((s * -0.5) * rstd³ / D) * 2x, grad_w = Σ_rows grad * x̂;
      returns (grad_x, grad_w), or grad_x alone when xhat is None (a frozen weight).
  grad    [..., D] (fp32, bf16 or fp16); weight [D], xhat [..., D] in grad's dtype; grad_w [D] in grad's dtype,
          D ≤ 65536 when xhat is given
  x       grad's shape; x, rstd ([rows, 1] or [..., 1]), residual and rstd_cubed (the copy of rstd the graph
          cubes; default rstd) in one dtype: grad's, or fp32 (Hugging Face's half-precision norms keep x and rstd
          in fp32); grad_x has x's shape and dtype. The arithmetic after a is fp32.

Tiling: rows go on the 128 partitions, D along the free dim in chunks of up to 8192 columns. The statistics
are streaming passes with a free-dim add-reduction: Σx² for RMSNorm on ScalarE; Σx (VectorE and ScalarE
taking turns by row tile), then Σ(x-mean)² on ScalarE for LayerNorm, which stays exact when |mean| ≫ std.
VectorE applies them in one or two passes (scalar_tensor_tensor fuses the per-row shift/scale with the
weight or bias row; those rows are broadcast once to all partitions by a K=1 matmul). A row block that fits
one chunk is read from HBM once; longer rows are re-read per pass.

The backward keeps rows on partitions too, in chunks of `BACKWARD_COLS` (a row that fits one is read once):
a first pass forms a and Σ a*x on VectorE, and the weight's gradient: grad * x̂ on GpSimd, then on TensorE each
128-column slice of it is the stationary operand against a column of ones, so Σ_rows lands with D on the
partitions, one PSUM column per slice, accumulating over the row tiles in one PSUM bank (read once at the end, a
DMA per slice). A second pass writes grad_x: a * rstd on ScalarE (with the residual: one VectorE
scalar_tensor_tensor), then x * (2 * the row's coefficient) plus that on VectorE.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .contract import require, require_float, require_vector
from .tiling import FMAX, PMAX, as_rows, broadcast_rows, cdiv

COLS = 8192  # columns per chunk
BACKWARD_COLS = 4096  # columns per chunk of the backward (fp32: 16 KiB per partition per tile, ≤ 6 tiles live)
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


@nki.jit
def rmsnorm_backward_kernel(grad, x, rstd, weight, xhat=None, residual=None, rstd_cubed=None):
    """The gradients of y = weight * (x * rstd) as AOTAutograd's graph of Hugging Face's RMSNorm computes them:
    (grad_x, grad_w), or grad_x alone without xhat; see the module docstring."""
    name = "rmsnorm_backward_kernel"
    require(len(grad.shape) >= 2, name, f"grad must have at least 2 dims (rows, D), got {tuple(grad.shape)}")
    require_float(name, "grad", grad)
    require_float(name, "x", x)
    require(tuple(x.shape) == tuple(grad.shape), name, f"x {tuple(x.shape)} must have grad's shape {tuple(grad.shape)}")
    require(x.dtype == grad.dtype or x.dtype == nl.float32, name, f"x is {x.dtype}: grad's dtype or fp32")
    gr, xr = as_rows(grad), as_rows(x)
    rows, d = xr.shape
    require_vector(name, "weight", weight, d)
    require(weight.dtype == grad.dtype, name, f"weight is {weight.dtype}, grad {grad.dtype}: cast it")
    for label, t, shape, dtype in (("xhat", xhat, xr.shape, grad.dtype),
                                   ("residual", residual, xr.shape, x.dtype), ("rstd", rstd, (rows, 1), x.dtype),
                                   ("rstd_cubed", rstd_cubed, (rows, 1), x.dtype)):
        if t != None:  # noqa: E711 (NKI forbids `is`)
            require(tuple(as_rows(t).shape) == shape and t.dtype == dtype, name,
                    f"{label} must be {shape} (rows of it) in {dtype}, got {tuple(t.shape)} {t.dtype}")
    require(xhat == None or d <= PMAX * FMAX, name, f"D={d} exceeds {PMAX * FMAX} (one PSUM bank of grad_w)")  # noqa: E711
    grad_x = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    outr = as_rows(grad_x)
    rstd_r = as_rows(rstd)
    cubed_r = as_rows(rstd_cubed) if rstd_cubed != None else None  # noqa: E711
    res_r = as_rows(residual) if residual != None else None  # noqa: E711
    xhat_r = as_rows(xhat) if xhat != None else None  # noqa: E711
    chunks = [(c0, min(BACKWARD_COLS, d - c0)) for c0 in range(0, d, BACKWARD_COLS)]
    w_rows = _param_rows(weight, chunks, grad.dtype)
    if xhat_r != None:  # noqa: E711
        ones = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
        dw_sum = nl.ndarray((PMAX, cdiv(d, PMAX)), dtype=nl.float32, buffer=nl.psum)
    for r0 in range(0, rows, PMAX):
        pr = min(PMAX, rows - r0)
        r = _column(rstd_r, r0, pr)
        total = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        kept = None
        for i, (c0, cc) in enumerate(chunks):
            g, xt = _load(gr, r0, pr, c0, cc), _load(xr, r0, pr, c0, cc)
            a = _grad_times_weight(g, weight, w_rows, chunks, i, pr, grad.dtype)
            prod = nl.ndarray((PMAX, cc), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=prod[0:pr, 0:cc], data1=a[0:pr, 0:cc], data2=xt[0:pr, 0:cc], op=nl.multiply)
            part = total if i == 0 else nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=part[0:pr, 0:1], op=nl.add, data=prod[0:pr, 0:cc], axis=(1,))
            if i > 0:
                nisa.tensor_tensor(dst=total[0:pr, 0:1], data1=total[0:pr, 0:1], data2=part[0:pr, 0:1], op=nl.add)
            if xhat_r != None:  # noqa: E711  Σ_rows grad * x̂, 128 columns at a time: slice^T @ ones
                xh = _load(xhat_r, r0, pr, c0, cc)
                gxh = nl.ndarray((PMAX, cc), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=gxh[0:pr, 0:cc], data1=g[0:pr, 0:cc], data2=xh[0:pr, 0:cc], op=nl.multiply,
                                   engine=nisa.engine.gpsimd)
                for j0 in range(0, cc, PMAX):
                    ct, col = min(PMAX, cc - j0), (c0 + j0) // PMAX
                    nisa.nc_matmul(dst=dw_sum[0:ct, col : col + 1], stationary=gxh[0:pr, j0 : j0 + ct],
                                   moving=ones[0:pr, 0:1], accumulate=r0 > 0)
            if len(chunks) == 1:
                kept = (a, xt)
        _coefficient(total, _column(cubed_r, r0, pr) if cubed_r != None else r, pr, d)  # noqa: E711
        for i, (c0, cc) in enumerate(chunks):
            if kept != None:  # noqa: E711
                a, xt = kept
            else:
                xt = _load(xr, r0, pr, c0, cc)
                a = _grad_times_weight(_load(gr, r0, pr, c0, cc), weight, w_rows, chunks, i, pr, grad.dtype)
            direct = nl.ndarray((PMAX, cc), dtype=nl.float32, buffer=nl.sbuf)
            if res_r != None:  # noqa: E711
                res = _load(res_r, r0, pr, c0, cc)
                nisa.scalar_tensor_tensor(dst=direct[0:pr, 0:cc], data=a[0:pr, 0:cc], op0=nl.multiply,
                                          operand0=r[0:pr, 0:1], op1=nl.add, operand1=res[0:pr, 0:cc])
            else:
                nisa.tensor_scalar(dst=direct[0:pr, 0:cc], data=a[0:pr, 0:cc], op0=nl.multiply,
                                   operand0=r[0:pr, 0:1], engine=nisa.engine.scalar)
            out = nl.ndarray((PMAX, cc), dtype=x.dtype, buffer=nl.sbuf)
            nisa.scalar_tensor_tensor(dst=out[0:pr, 0:cc], data=xt[0:pr, 0:cc], op0=nl.multiply,
                                      operand0=total[0:pr, 0:1], op1=nl.add, operand1=direct[0:pr, 0:cc])
            nisa.dma_copy(dst=outr[r0 : r0 + pr, c0 : c0 + cc], src=out[0:pr, 0:cc])
    if xhat_r == None:  # noqa: E711
        return grad_x
    return grad_x, _store_columns(dw_sum, d, grad.dtype)


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


def _coefficient(total, rstd, pr, d):
    """Σ a * x (a [128, 1] tile) turned in place into twice the row's coefficient, ((s * -0.5) * rstd³ / D) * 2,
    each step rounded as the graph's (rstd³ = (rstd * rstd) * rstd, as eager's pow(·, 3)): x times it is the
    graph's coefficient times 2x exactly."""
    cubed = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=cubed[0:pr, 0:1], data=rstd[0:pr, 0:1], op0=nl.multiply,
                              operand0=rstd[0:pr, 0:1], op1=nl.multiply, operand1=rstd[0:pr, 0:1])
    nisa.scalar_tensor_tensor(dst=total[0:pr, 0:1], data=total[0:pr, 0:1], op0=nl.multiply, operand0=-0.5,
                              op1=nl.multiply, operand1=cubed[0:pr, 0:1])
    nisa.tensor_scalar(dst=total[0:pr, 0:1], data=total[0:pr, 0:1], op0=nl.divide, operand0=float(d),
                       op1=nl.multiply, operand1=2.0)


def _column(t, r0, pr):
    """Rows r0:r0+pr of a [rows, 1] HBM tensor as an fp32 [128, 1] tile (the DMA casts)."""
    tile = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile[0:pr, 0:1], src=t[r0 : r0 + pr, 0:1])
    return tile


def _grad_times_weight(g, weight, w_rows, chunks, i, pr, dtype):
    """a = grad * weight for chunk i, rounded to grad's dtype as the graph's product is."""
    cc = chunks[i][1]
    w = _param_chunk(weight, w_rows, chunks, i, dtype)
    a = nl.ndarray((PMAX, cc), dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=a[0:pr, 0:cc], data1=g[0:pr, 0:cc], data2=w[0:pr, 0:cc], op=nl.multiply)
    return a


def _store_columns(sums, d, dtype):
    """A [128, ceil(d/128)] PSUM tile holding v[j*128 + p] at (p, j) written out as a [d] HBM vector."""
    out = nl.ndarray((d,), dtype=dtype, buffer=nl.shared_hbm)
    outc = out.reshape((d, 1))
    cols = cdiv(d, PMAX)
    tile = nl.ndarray((PMAX, cols), dtype=dtype, buffer=nl.sbuf)
    full, last = d // PMAX, d % PMAX  # columns of 128 values, values in a last partial column
    if full:
        nisa.tensor_copy(dst=tile[0:PMAX, 0:full], src=sums[0:PMAX, 0:full])
    if last:
        nisa.tensor_copy(dst=tile[0:last, full : full + 1], src=sums[0:last, full : full + 1])
    for j in range(cols):
        ct = min(PMAX, d - j * PMAX)
        nisa.dma_copy(dst=outc[j * PMAX : j * PMAX + ct, 0:1], src=tile[0:ct, j : j + 1])
    return out


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
