"""Element-wise activations and their gated forms (SwiGLU / GeGLU halves).

Layout contract:
  activation_kernel(x, op):           op(x)
  gated_activation_kernel(a, b, op):  op(a) * b   (a and b of one shape and dtype)
  op     "silu" | "gelu" (exact, erf) | "gelu_tanh" | "relu" | "sigmoid" | "tanh" | "none"
  x/a/b  any shape (fp32, bf16 or fp16); returns a tensor of that shape and dtype.

Tiling: element-wise work ignores the logical shape, so a tensor whose size is a multiple of 128 is viewed
as [128, size/128] (every partition busy, long DMA rows) and walked in chunks of 4096 columns; any other size
falls back to rows-on-partitions tiling of its [rows, last dim] view. ScalarE evaluates the activation
table function in one pass; the gate product runs on VectorE.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .contract import require, require_float
from .tiling import PMAX, as_rows

COLS = 4096  # columns per chunk

ACTIVATIONS = {
    "none": nl.copy,
    "relu": nl.relu,
    "silu": nl.silu,
    "gelu": nl.gelu,
    "gelu_tanh": nl.gelu_apprx_tanh,
    "sigmoid": nl.sigmoid,
    "tanh": nl.tanh,
}


@nki.jit
def activation_kernel(x, op="silu"):
    """op(x) element-wise; see the module docstring."""
    require(op in ACTIVATIONS, "activation_kernel", f"op {op!r} is not one of {sorted(ACTIVATIONS)}")
    require_float("activation_kernel", "x", x)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    _elementwise(ACTIVATIONS[op], _flat(x), None, _flat(out))
    return out


@nki.jit
def gated_activation_kernel(a, b, op="silu"):
    """op(a) * b element-wise; see the module docstring."""
    name = "gated_activation_kernel"
    require(op in ACTIVATIONS, name, f"op {op!r} is not one of {sorted(ACTIVATIONS)}")
    require(tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype, name,
            f"a {tuple(a.shape)} {a.dtype} and b {tuple(b.shape)} {b.dtype} must match in shape and dtype")
    require_float(name, "a", a)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    _elementwise(ACTIVATIONS[op], _flat(a), _flat(b), _flat(out))
    return out


def _flat(t):
    """The 2-D view the kernel walks: [128, size/128] when possible, else [rows, last dim]."""
    size = 1
    for dim in t.shape:
        size *= dim
    if size % PMAX == 0:
        return t.reshape((PMAX, size // PMAX))
    return as_rows(t) if len(t.shape) >= 2 else t.reshape((1, size))


def _elementwise(fn, a, b, out):
    rows, cols = a.shape
    for r0 in range(0, rows, PMAX):
        pr = min(PMAX, rows - r0)
        for c0 in range(0, cols, COLS):
            cc = min(COLS, cols - c0)
            a_tile = nl.ndarray((PMAX, cc), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a_tile[0:pr, 0:cc], src=a[r0 : r0 + pr, c0 : c0 + cc])
            y = nl.ndarray((PMAX, cc), dtype=out.dtype, buffer=nl.sbuf)
            nisa.activation(dst=y[0:pr, 0:cc], op=fn, data=a_tile[0:pr, 0:cc])
            if b != None:  # noqa: E711 (NKI forbids `is`)
                b_tile = nl.ndarray((PMAX, cc), dtype=b.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=b_tile[0:pr, 0:cc], src=b[r0 : r0 + pr, c0 : c0 + cc])
                nisa.tensor_tensor(dst=y[0:pr, 0:cc], data1=y[0:pr, 0:cc], data2=b_tile[0:pr, 0:cc], op=nl.multiply)
            nisa.dma_copy(dst=out[r0 : r0 + pr, c0 : c0 + cc], src=y[0:pr, 0:cc])
