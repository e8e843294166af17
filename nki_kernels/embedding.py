"""Embedding lookup: gather table rows by index with indirect DMA.

Layout contract (`embedding_kernel`):
  ids     int32 indices of any shape (NKI has no int64: cast with `ids.to(torch.int32)`), each in [0, V)
  table   [V, D] (any dtype)
  returns [*ids.shape, D] in the table's dtype: out[..., :] = table[ids[...], :], bit-exact.

Tiling: 128 indices at a time go to SBUF, one per partition; one indirect DMA (an access pattern over the
table whose row offset comes from the index vector) gathers the 128 rows into SBUF, one DMA stores them.
Wide rows are gathered in column chunks of 8192 elements.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .contract import require
from .tiling import PMAX

COLS = 8192


@nki.jit
def embedding_kernel(ids, table):
    """table[ids]; see the module docstring."""
    require(str(ids.dtype) == "int32", "embedding_kernel", f"ids must be int32 (NKI has no int64), got {ids.dtype}; "
            "use ids.to(torch.int32)")
    require(len(table.shape) == 2, "embedding_kernel", f"table must be [V, D], got {tuple(table.shape)}")
    vocab, d = table.shape
    out = nl.ndarray(tuple(ids.shape) + (d,), dtype=table.dtype, buffer=nl.shared_hbm)
    count = 1
    for size in ids.shape:
        count *= size
    flat_ids = ids.reshape((count, 1))
    flat_out = out.reshape((count, d))
    for r0 in range(0, count, PMAX):
        n = min(PMAX, count - r0)
        idx = nl.ndarray((PMAX, 1), dtype=ids.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx[0:n, 0:1], src=flat_ids[r0 : r0 + n, 0:1])
        for c0 in range(0, d, COLS):
            cc = min(COLS, d - c0)
            rows = nl.ndarray((PMAX, cc), dtype=table.dtype, buffer=nl.sbuf)
            gathered = table.ap([[d, n], [1, cc]], offset=c0, vector_offset=idx[0:n, 0:1], indirect_dim=0)
            nisa.dma_copy(dst=rows[0:n, 0:cc], src=gathered)
            nisa.dma_copy(dst=flat_out[r0 : r0 + n, c0 : c0 + cc], src=rows[0:n, 0:cc])
    return out
