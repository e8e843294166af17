"""Accumulating row scatter: base[rows[j]] += values[j] (index_put with accumulate, index_add, scatter_add, the
embedding backward), with duplicate rows summed and torch's +inf / -inf / NaN results.

Layout contract (`scatter_add_kernel(base, rows, values, include_self=True, mean=False)`):
  base     [R, C] (fp32, bf16 or fp16), R < 2^24 (row numbers are compared in fp32)
  rows     int32 [J], each in [-R, R) (a negative row counts from the end); a row outside adds nothing, so the
           caller checks the range
  values   [J, C] of base's dtype
  include_self  False: a row some value lands in starts from 0 instead of base (scatter_reduce's flag)
  mean     True: a row some value lands in is divided by its count of values (+1 with include_self)
  returns  [R, C] in base's dtype; the sums are formed in fp32 (up to the order of the additions, exact).
`embedding_backward_kernel(grad, ids, num_weights, padding_idx=-1, scale_grad_by_freq=False)`: the gradient of
  `embedding_kernel`'s table, torch's embedding_dense_backward: zeros [num_weights, D] with grad [*ids.shape, D]
  added at int32 ids; ids outside [0, num_weights) and those equal to padding_idx add nothing; scale_grad_by_freq
  divides each row by its count of ids. In grad's dtype, summed in fp32.

Tiling: the sum is a one-hot matmul on TensorE, contracting over the J values on the partitions. For each 128-row
tile of R, GpSimd's iota numbers the rows along the free dim and one compare against each value's row (a [J, 1]
column) gives the one-hot [J, 128] stationary (on GpSimd: it is redone per column block, VectorE has the rest).
The moving tile holds, per block of columns of C, the finite values (non-finite ones zeroed: a one-hot *product*
would turn every 0 · inf into NaN), a 0/1 count of the values that are +inf or NaN and one of those that are -inf
or NaN (and, for mean / include_self=False, a block of ones counting the hits) side by side in one PSUM bank,
accumulated over the 128-value tiles of J. On the way out of PSUM VectorE adds base, then +inf where the first
count is non-zero and -inf where the second is (both: NaN, as a NaN value or an inf meeting a -inf gives), by
predicated copies. Values and one-hots stay in the values' dtype (both exact). The moving tiles of a column block
stay in SBUF while the row tiles of R pass when they fit (`PARTS_BYTES`), else are rebuilt per row tile.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .contract import require, require_float
from .tiling import FMAX, PMAX, cdiv, itemsize

FLOAT_MAX = 3.4028234663852886e38  # the largest finite fp32: v <= it fails exactly for +inf and NaN
EXACT_ROWS = 1 << 24  # row numbers are compared in fp32, exact below this
PARTS_BYTES = 64 * 1024  # per partition, for the moving tiles of one column block kept across row tiles


@nki.jit
def scatter_add_kernel(base, rows, values, include_self=True, mean=False):
    """base with values added into (or averaged into) rows `rows`; see the module docstring."""
    name = "scatter_add_kernel"
    require(len(base.shape) == 2 and len(values.shape) == 2, name,
            f"base and values must be [R, C] and [J, C], got {tuple(base.shape)} and {tuple(values.shape)}")
    require_float(name, "base", base)
    require(values.dtype == base.dtype, name, f"values are {values.dtype} but base is {base.dtype}; cast them")
    require(values.shape[1] == base.shape[1], name, f"values have {values.shape[1]} columns, base {base.shape[1]}")
    _check_rows(name, rows, values.shape[0], base.shape[0])
    out = nl.ndarray(tuple(base.shape), dtype=base.dtype, buffer=nl.shared_hbm)
    _scatter_add(out, base, rows, values, include_self, mean, True, None)
    return out


@nki.jit
def embedding_backward_kernel(grad, ids, num_weights, padding_idx=-1, scale_grad_by_freq=False):
    """The gradient of `embedding_kernel`'s table; see the module docstring."""
    name = "embedding_backward_kernel"
    require_float(name, "grad", grad)
    require(tuple(grad.shape[:-1]) == tuple(ids.shape), name,
            f"grad must be [*ids.shape, D], got {tuple(grad.shape)} for ids {tuple(ids.shape)}")
    count = 1
    for size in ids.shape:
        count *= size
    flat_ids = ids.reshape((count,))
    _check_rows(name, flat_ids, count, num_weights)
    out = nl.ndarray((num_weights, grad.shape[-1]), dtype=grad.dtype, buffer=nl.shared_hbm)
    skip = padding_idx if 0 <= padding_idx < num_weights else None
    scale = bool(scale_grad_by_freq)  # each row's sum divided by its count of ids: a mean from zeros
    _scatter_add(out, None, flat_ids, grad.reshape((count, grad.shape[-1])), not scale, scale, False, skip)
    return out


def _check_rows(name, rows, count, r_size):
    require(str(rows.dtype) == "int32" and tuple(rows.shape) == (count,), name,
            f"row indices must be int32 [{count}], got {rows.dtype} {tuple(rows.shape)}; use .to(torch.int32)")
    require(r_size < EXACT_ROWS, name, f"{r_size} rows: at most 2^24 - 1 are exact in fp32")


def _scatter_add(out, base, rows, values, include_self, mean, wrap, skip):
    """out [R, C] = base with values [J, C] combined into rows `rows` [J]; the tiling is described in the module
    docstring. base None: zeros (for a mean of values alone, include_self=False). `wrap`: negative rows count
    from the end (else they land nowhere); `skip`: a row whose values land nowhere (None: none)."""
    r_size, c_size = out.shape
    j_size = values.shape[0]
    hits = mean or not include_self
    blocks = 4 if hits else 3
    width = FMAX // blocks  # columns of C per PSUM bank
    row_ids = [_row_ids(rows, j0, min(PMAX, j_size - j0), r_size, wrap, skip) for j0 in range(0, j_size, PMAX)]
    keep = cdiv(r_size, PMAX) > 1 and len(row_ids) * FMAX * itemsize(values.dtype) <= PARTS_BYTES
    for c0 in range(0, c_size, width):
        cc = min(width, c_size - c0)
        kept = [None] * len(row_ids)
        for r0 in range(0, r_size, PMAX):
            rt = min(PMAX, r_size - r0)
            numbers = nl.ndarray((PMAX, rt), dtype=nl.int32, buffer=nl.sbuf)
            nisa.iota(dst=numbers, pattern=[[1, rt]], offset=r0)
            acc = nl.ndarray((PMAX, blocks * cc), dtype=nl.float32, buffer=nl.psum)
            for ji in range(len(row_ids)):
                j0 = ji * PMAX
                jt = min(PMAX, j_size - j0)
                one_hot = nl.ndarray((PMAX, rt), dtype=values.dtype, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=one_hot[0:jt, 0:rt], data=numbers[0:jt, 0:rt], op0=nl.equal,
                                   operand0=row_ids[ji][0:jt, 0:1], engine=nisa.engine.gpsimd)
                moving = kept[ji]
                if moving == None:  # noqa: E711 (NKI forbids `is`)
                    moving = _moving(values, j0, jt, c0, cc, hits)
                    if keep:
                        kept[ji] = moving
                nisa.nc_matmul(dst=acc[0:rt, 0 : blocks * cc], stationary=one_hot[0:jt, 0:rt],
                               moving=moving[0:jt, 0 : blocks * cc], is_stationary_onezero=True, accumulate=ji > 0)
            _finish(base, out, acc, r0, rt, c0, cc, include_self, mean)


def _row_ids(rows, j0, jt, r_size, wrap, skip):
    """rows[j0:j0+jt] as an fp32 [128, 1] column: negative rows + R (with `wrap`), `skip` moved to R (nowhere)."""
    ids = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ids[0:jt, 0:1], src=rows.reshape((rows.shape[0], 1))[j0 : j0 + jt, 0:1])
    moves = [(nl.less, 0.0, float(r_size))] if wrap else []
    if skip != None:  # noqa: E711
        moves.append((nl.equal, float(skip), float(r_size - skip)))
    for compare, value, shift in moves:  # ids += (ids compare value) · shift
        moved = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=moved[0:jt, 0:1], data=ids[0:jt, 0:1], op0=compare, operand0=value, op1=nl.multiply,
                           operand1=shift)
        nisa.tensor_tensor(dst=ids[0:jt, 0:1], data1=ids[0:jt, 0:1], data2=moved[0:jt, 0:1], op=nl.add)
    return ids


def _moving(values, j0, jt, c0, cc, hits):
    """The moving tile [128, blocks·cc] of values[j0:j0+jt, c0:c0+cc]: finite values (others 0), 0/1 for +inf or
    NaN, 0/1 for -inf or NaN[, ones], in the values' dtype."""
    blocks = 4 if hits else 3
    moving = nl.ndarray((PMAX, blocks * cc), dtype=values.dtype, buffer=nl.sbuf)
    v = moving[0:jt, 0:cc]
    nisa.dma_copy(dst=v, src=values[j0 : j0 + jt, c0 : c0 + cc])
    for k, (compare, bound) in enumerate(((nl.less_equal, FLOAT_MAX), (nl.greater_equal, -FLOAT_MAX))):
        nisa.tensor_scalar(dst=moving[0:jt, (k + 1) * cc : (k + 2) * cc], data=v, op0=compare, operand0=bound,
                           op1=nl.subtract, operand1=1.0, reverse1=True)  # 1 - (v within bound)
    infinite = nl.ndarray((PMAX, cc), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=infinite[0:jt, 0:cc], data=v, op0=nl.multiply, operand0=0.0, op1=nl.not_equal,
                       operand1=0.0)  # v · 0 is 0 for finite v, NaN for ±inf and NaN
    nisa.tensor_copy_predicated(dst=v, src=0.0, predicate=infinite[0:jt, 0:cc])
    if hits:
        nisa.memset(dst=moving[0:jt, 3 * cc : 4 * cc], value=1.0)
    return moving


def _finish(base, out, acc, r0, rt, c0, cc, include_self, mean):
    """out[r0:r0+rt, c0:c0+cc] from the PSUM sums: base (unless replaced or None) + finite sum, then the
    infinities, the mean's division and the cast."""
    total = nl.ndarray((PMAX, cc), dtype=nl.float32, buffer=nl.sbuf)
    if base == None:  # noqa: E711 (zeros)
        nisa.tensor_copy(dst=total[0:rt, 0:cc], src=acc[0:rt, 0:cc])
    else:
        nisa.dma_copy(dst=total[0:rt, 0:cc], src=base[r0 : r0 + rt, c0 : c0 + cc])
        if not include_self:
            hit = nl.ndarray((PMAX, cc), dtype=nl.uint8, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=hit[0:rt, 0:cc], data=acc[0:rt, 3 * cc : 4 * cc], op0=nl.greater, operand0=0.0)
            nisa.tensor_copy_predicated(dst=total[0:rt, 0:cc], src=0.0, predicate=hit[0:rt, 0:cc])
        nisa.tensor_tensor(dst=total[0:rt, 0:cc], data1=total[0:rt, 0:cc], data2=acc[0:rt, 0:cc], op=nl.add)
    landed = nl.ndarray((PMAX, 2 * cc), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=landed[0:rt, 0 : 2 * cc], data=acc[0:rt, cc : 3 * cc], op0=nl.greater, operand0=0.0)
    for k, infinity in enumerate((float("inf"), float("-inf"))):
        moved = nl.ndarray((PMAX, cc), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=moved[0:rt, 0:cc], data=total[0:rt, 0:cc], op0=nl.add, operand0=infinity)
        nisa.tensor_copy_predicated(dst=total[0:rt, 0:cc], src=moved[0:rt, 0:cc],
                                    predicate=landed[0:rt, k * cc : (k + 1) * cc])
    if mean:
        count = nl.ndarray((PMAX, cc), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=count[0:rt, 0:cc], data=acc[0:rt, 3 * cc : 4 * cc], op0=nl.add,
                           operand0=float(include_self), op1=nl.maximum, operand1=1.0)
        nisa.reciprocal(dst=count[0:rt, 0:cc], data=count[0:rt, 0:cc])
        nisa.tensor_tensor(dst=total[0:rt, 0:cc], data1=total[0:rt, 0:cc], data2=count[0:rt, 0:cc], op=nl.multiply)
    nisa.dma_copy(dst=out[r0 : r0 + rt, c0 : c0 + cc], src=total[0:rt, 0:cc])
