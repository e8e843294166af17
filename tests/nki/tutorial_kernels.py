"""In-house tutorial-style NKI 0.6 kernels, written exactly as for the real toolchain (`import nki`).

They exercise the interpreter the way real kernels do: tiling over the 128 partitions, PSUM accumulation over K,
TensorE transposes, ScalarE reductions, scans. The caller runs `neuron_dynamo.nki.make_importable()` first.
"""

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def tensor_add(a, b):
    """out = a + b for [M, N] inputs, M a multiple of 128 (ragged last tile allowed)."""
    m, n = a.shape
    out = nl.ndarray((m, n), dtype=a.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    for i in nl.affine_range((m + pmax - 1) // pmax):
        rows = min(pmax, m - i * pmax)
        x = nl.ndarray((rows, n), dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray((rows, n), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a[nl.ds(i * pmax, rows), :])
        nisa.dma_copy(dst=y, src=b[nl.ds(i * pmax, rows), :])
        z = nl.ndarray((rows, n), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=z, data1=x, data2=y, op=nl.add)
        nisa.dma_copy(dst=out[nl.ds(i * pmax, rows), :], src=z)
    return out


@nki.jit
def tiled_matmul(lhs_t, rhs):
    """out[M, N] = lhs_t[K, M].T @ rhs[K, N], K/M multiples of 128, N a multiple of 512 or smaller."""
    k_size, m_size = lhs_t.shape
    _, n_size = rhs.shape
    tk, tm = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax
    tn = min(n_size, nl.tile_size.gemm_moving_fmax)
    out = nl.ndarray((m_size, n_size), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_size // tm):
        for n in nl.affine_range(n_size // tn):
            acc = nl.ndarray((tm, tn), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_size // tk):
                lhs_tile = nl.ndarray((tk, tm), dtype=lhs_t.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((tk, tn), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lhs_tile, src=lhs_t[k * tk:(k + 1) * tk, m * tm:(m + 1) * tm])
                nisa.dma_copy(dst=rhs_tile, src=rhs[k * tk:(k + 1) * tk, n * tn:(n + 1) * tn])
                nisa.nc_matmul(dst=acc, stationary=lhs_tile, moving=rhs_tile)
            res = nl.ndarray((tm, tn), dtype=lhs_t.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[m * tm:(m + 1) * tm, n * tn:(n + 1) * tn], src=res)
    return out


@nki.jit
def transpose(a):
    """out = a.T for a [P, F] input with P, F <= 128, through a TensorE nc_transpose."""
    p, f = a.shape
    out = nl.ndarray((f, p), dtype=a.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray((p, f), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    t = nl.ndarray((f, p), dtype=a.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=t, data=x)
    y = nl.ndarray((f, p), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=y, src=t)
    nisa.dma_copy(dst=out, src=y)
    return out


@nki.jit
def softmax(x):
    """Row softmax of [M, N]: max (VectorE), exp with bias and add-reduce (ScalarE), reciprocal, scale."""
    m, n = x.shape
    out = nl.ndarray((m, n), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range((m + 127) // 128):
        rows = min(128, m - i * 128)
        t = nl.ndarray((rows, n), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:i * 128 + rows, :])
        neg_max = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=t, axis=(1,), negate=True, keepdims=True)
        e = nl.ndarray((rows, n), dtype=nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=t, bias=neg_max, reduce_op=nl.add, reduce_res=total,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        inv = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv, data=total)
        y = nl.ndarray((rows, n), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[i * 128:i * 128 + rows, :], src=y)
    return out


@nki.jit
def rmsnorm(x, w, eps):
    """x * rsqrt(mean(x^2) + eps) * w for x [M, N], w [1, N] (w broadcast to all partitions by a DMA)."""
    m, n = x.shape
    out = nl.ndarray((m, n), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range((m + 127) // 128):
        rows = min(128, m - i * 128)
        t = nl.ndarray((rows, n), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i * 128:i * 128 + rows, :])
        wt = nl.ndarray((rows, n), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=wt, src=w.ap([[0, rows], [1, n]]))  # partition-broadcast read of the weight row
        sq = nl.ndarray((rows, n), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq, op=nl.square, data=t, reduce_op=nl.add, reduce_res=ss,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        rstd = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rstd, data=ss, op0=nl.multiply, operand0=1.0 / n, op1=nl.add, operand1=eps)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=rstd)
        y = nl.ndarray((rows, n), dtype=x.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=y, data=t, op0=nl.multiply, operand0=rstd, op1=nl.multiply, operand1=wt)
        nisa.dma_copy(dst=out[i * 128:i * 128 + rows, :], src=y)
    return out


@nki.jit
def cumsum(x):
    """Row-wise cumulative sum of [M, N] through tensor_tensor_scan, chunked along N with a carried state."""
    m, n = x.shape
    chunk = 256
    out = nl.ndarray((m, n), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range((m + 127) // 128):
        rows = min(128, m - i * 128)
        ones = nl.ndarray((rows, chunk), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
        carry = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=carry, value=0.0)
        for c in nl.sequential_range((n + chunk - 1) // chunk):
            cols = min(chunk, n - c * chunk)
            t = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x[i * 128:i * 128 + rows, c * chunk:c * chunk + cols])
            acc = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor_scan(dst=acc, data0=ones[:, 0:cols], data1=t, initial=carry, op0=nl.multiply,
                                    op1=nl.add)
            nisa.tensor_copy(dst=carry, src=acc[:, cols - 1:cols])
            y = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=y, src=acc)
            nisa.dma_copy(dst=out[i * 128:i * 128 + rows, c * chunk:c * chunk + cols], src=y)
    return out


@nki.jit
def lnc_scale(a, factor):
    """Each LNC program instance scales its half of the rows of `a` (a shared_hbm output)."""
    m, n = a.shape
    half = m // nl.num_programs()
    start = nl.program_id(0) * half
    out = nl.ndarray((m, n), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((half, n), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a[start:start + half, :])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
    nisa.dma_copy(dst=out[start:start + half, :], src=t)
    return out


@nki.jit
def scale_in_place(a, factor):
    """Writes into its input (the caller's array is updated) and returns nothing."""
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
    nisa.dma_copy(dst=a, src=t)
