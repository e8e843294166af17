"""Scans along the last dim: running products, maxima, minima, and the first-order linear recurrence.

Layout contract (every kernel): x (or a, b) is [rows, n], any rows and n, float32/bfloat16/float16; the result has
x's shape and dtype. Rows go on the 128 partitions and VectorE's `tensor_tensor_scan` walks the free dim in chunks
of COLS columns; the last column of a chunk is the next chunk's initial value, so the whole row is one sequential
scan in fp32, in the order eager PyTorch's CPU kernels use.

- `cumsum_kernel(x)`:             r[i] = x[i] + r[i-1],        r[-1] = 0
- `cumprod_kernel(x)`:            r[i] = x[i] · r[i-1],        r[-1] = 1
- `cummax_kernel(x)`:             r[i] = max(x[i], r[i-1]),    r[-1] = -inf (NaN propagates, as in torch)
- `cummin_kernel(x)`:             r[i] = min(x[i], r[i-1]),    r[-1] = +inf
- `linear_recurrence_kernel(a, b)`: r[i] = a[i] · r[i-1] + b[i], r[-1] = 0 (an online log-sum-exp, a cumsum)
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .contract import require, require_float
from .tiling import PMAX

COLS = 2048  # columns per chunk: three fp32 work tiles of 8 KiB per partition


@nki.jit
def cumsum_kernel(x):
    """Running sum along the last dim of a [rows, n] tensor; see the module docstring."""
    return _scan("cumsum_kernel", x, None, nl.add, 0.0)


@nki.jit
def cumprod_kernel(x):
    """Running product along the last dim of a [rows, n] tensor; see the module docstring."""
    return _scan("cumprod_kernel", x, None, nl.multiply, 1.0)


@nki.jit
def cummax_kernel(x):
    """Running maximum along the last dim of a [rows, n] tensor; see the module docstring."""
    return _scan("cummax_kernel", x, None, nl.maximum, float("-inf"))


@nki.jit
def cummin_kernel(x):
    """Running minimum along the last dim of a [rows, n] tensor; see the module docstring."""
    return _scan("cummin_kernel", x, None, nl.minimum, float("inf"))


@nki.jit
def linear_recurrence_kernel(a, b):
    """r[i] = a[i] · r[i-1] + b[i] along the last dim of [rows, n] tensors a and b; see the module docstring."""
    return _scan("linear_recurrence_kernel", a, b, nl.multiply, 0.0)


def _scan(name, x, b, op, initial):
    """`op0 = op` folds the previous value into x[i]; `op1 = add` adds b[i] (zeros when b is None)."""
    require(len(x.shape) == 2, name, f"x must be [rows, n], got {tuple(x.shape)}")
    require_float(name, "x", x)
    if b != None:  # noqa: E711 (NKI forbids `is`)
        require(tuple(b.shape) == tuple(x.shape), name, f"b {tuple(b.shape)} must have x's shape {tuple(x.shape)}")
    rows, n = x.shape
    out = nl.ndarray((rows, n), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, rows, PMAX):
        pr = min(PMAX, rows - r0)
        carry = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=carry[0:pr, 0:1], value=initial)
        for c0 in range(0, n, COLS):
            cc = min(COLS, n - c0)
            data = nl.ndarray((PMAX, cc), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=data[0:pr, 0:cc], src=x[r0:r0 + pr, c0:c0 + cc])
            addend = nl.ndarray((PMAX, cc), dtype=nl.float32, buffer=nl.sbuf)
            if b != None:  # noqa: E711
                nisa.dma_copy(dst=addend[0:pr, 0:cc], src=b[r0:r0 + pr, c0:c0 + cc])
            else:
                nisa.memset(dst=addend[0:pr, 0:cc], value=0.0)
            result = nl.ndarray((PMAX, cc), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor_scan(dst=result[0:pr, 0:cc], data0=data[0:pr, 0:cc], data1=addend[0:pr, 0:cc],
                                    initial=carry[0:pr, 0:1], op0=op, op1=nl.add)
            nisa.tensor_copy(dst=carry[0:pr, 0:1], src=result[0:pr, cc - 1:cc])
            stored = nl.ndarray((PMAX, cc), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=stored[0:pr, 0:cc], src=result[0:pr, 0:cc])
            nisa.dma_copy(dst=out[r0:r0 + pr, c0:c0 + cc], src=stored[0:pr, 0:cc])
    return out
