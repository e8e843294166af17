"""Cross-entropy over a large vocabulary, forward and backward, with ignore_index.

Layout contract:
  cross_entropy_kernel(logits, labels, ignore_index=-100) -> (loss, lse)
    logits  [N, V] (fp32, bf16 or fp16), any N and V (V may be 100k+: it is tiled)
    labels  int32 [N]; a row whose label equals ignore_index contributes nothing
    loss    fp32 [N]: lse[n] - logits[n, labels[n]] (0 on ignored rows); the caller reduces it (sum / mean
            over the rows that are not ignored), so the kernel does not fix the reduction
    lse     fp32 [N]: the row logsumexp, saved for the backward
  cross_entropy_loss_kernel(logits, labels, ignore_index=-100, mean=True) -> (loss, total_weight, lse)
    the same rows reduced in the kernel: loss [1] = Σ row losses (÷ total_weight for the mean) and total_weight [1]
    = the number of rows that count, both in logits' dtype (rounded from fp32, as torch's nll_loss), lse as above
  cross_entropy_backward_kernel(logits, labels, lse, grad_loss, ignore_index=-100, reduction="none",
                                total_weight=None) -> grad_logits
    reduction "none": grad_loss fp32 [N] = d(total loss)/d(loss[n]); "sum" / "mean": grad_loss [1] is the reduced
    loss's gradient (in its dtype), which every row that counts gets (divided by total_weight [1] for the mean,
    rounded to that dtype, as torch divides). grad_logits [N, V] in logits' dtype: (softmax(logits) -
    onehot(labels)) * the row's gradient, zero on ignored rows.

Tiling: rows on partitions, the vocabulary along the free dim in 8192-column chunks. The forward shares the
online max/sum of the softmax kernel (one read of the logits when V fits a chunk, else a running max and
rescaled sum) and fetches each row's label logit with one indirect DMA (element offsets row·V + label built
on GpSimd), so VectorE only takes the row max. The backward recomputes softmax from the saved lse with one
ScalarE exp per chunk, scales it by the row's gradient on VectorE and stores it; then an indirect DMA scatter
rewrites each row's label column with (softmax - 1) · grad. The reduced loss sums the row losses and the counted
rows over the partitions on TensorE (onesᵀ · [loss, valid], accumulated in one PSUM tile across row tiles).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .contract import require, require_float, require_vector
from .softmax import row_stats
from .tiling import PMAX

COLS = 8192
EXACT_FP32_INT = 1 << 24  # integers up to here are exact in fp32 (offsets are formed by fp32 arithmetic)


@nki.jit
def cross_entropy_kernel(logits, labels, ignore_index=-100):
    """Per-row cross-entropy loss and logsumexp; see the module docstring."""
    _check(logits, labels, "cross_entropy_kernel")
    n, v = logits.shape
    loss = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm)
    lse = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm)
    loss2, lse2 = loss.reshape((n, 1)), lse.reshape((n, 1))
    for r0 in range(0, n, PMAX):
        pr = min(PMAX, n - r0)
        row_loss, _ = _row_losses(logits, labels, ignore_index, r0, pr, lse2)
        nisa.dma_copy(dst=loss2[r0 : r0 + pr, 0:1], src=row_loss[0:pr, 0:1])
    return loss, lse


@nki.jit
def cross_entropy_loss_kernel(logits, labels, ignore_index=-100, mean=True):
    """The row losses reduced to one (sum or mean over the rows that count); see the module docstring."""
    _check(logits, labels, "cross_entropy_loss_kernel")
    n, v = logits.shape
    lse = nl.ndarray((n,), dtype=nl.float32, buffer=nl.shared_hbm)
    lse2 = lse.reshape((n, 1))
    ones = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    sums = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.psum)  # (Σ loss, Σ valid), accumulated over row tiles
    for r0 in range(0, n, PMAX):
        pr = min(PMAX, n - r0)
        row_loss, valid = _row_losses(logits, labels, ignore_index, r0, pr, lse2)
        pair = nl.ndarray((PMAX, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=pair[0:pr, 0:1], src=row_loss[0:pr, 0:1], engine=nisa.engine.gpsimd)
        nisa.tensor_copy(dst=pair[0:pr, 1:2], src=valid[0:pr, 0:1], engine=nisa.engine.gpsimd)
        nisa.nc_matmul(dst=sums[0:1, 0:2], stationary=ones[0:pr, 0:1], moving=pair[0:pr, 0:2])
    totals = nl.ndarray((1, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=totals, src=sums)
    if mean:
        nisa.tensor_tensor(dst=totals[0:1, 0:1], data1=totals[0:1, 0:1], data2=totals[0:1, 1:2], op=nl.divide)
    rounded = nl.ndarray((1, 2), dtype=logits.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=rounded, src=totals)
    loss = nl.ndarray((1,), dtype=logits.dtype, buffer=nl.shared_hbm)
    total_weight = nl.ndarray((1,), dtype=logits.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=loss.reshape((1, 1)), src=rounded[0:1, 0:1])
    nisa.dma_copy(dst=total_weight.reshape((1, 1)), src=rounded[0:1, 1:2])
    return loss, total_weight, lse


def _row_losses(logits, labels, ignore_index, r0, pr, lse2):
    """Rows r0.. : their losses (0 where ignored) and 1.0/0.0 for the rows that count, as fp32 [128, 1] tiles;
    their logsumexp is stored into lse2 [N, 1]."""
    v = logits.shape[1]
    chunks = [(c0, min(COLS, v - c0)) for c0 in range(0, v, COLS)]
    valid, offsets = _label_offsets(labels, r0, pr, v, ignore_index)
    picked = _gather(logits, r0, pr, v, offsets)
    neg_max, total, _ = row_stats(logits, None, 1.0, r0, pr, chunks)
    row_lse = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=row_lse[0:pr, 0:1], op=nl.log, data=total[0:pr, 0:1])
    nisa.tensor_tensor(dst=row_lse[0:pr, 0:1], data1=row_lse[0:pr, 0:1], data2=neg_max[0:pr, 0:1],
                       op=nl.subtract, engine=nisa.engine.gpsimd)
    row_loss = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=row_loss[0:pr, 0:1], data=row_lse[0:pr, 0:1], op0=nl.subtract,
                              operand0=picked[0:pr, 0:1], op1=nl.multiply, operand1=valid[0:pr, 0:1])
    nisa.dma_copy(dst=lse2[r0 : r0 + pr, 0:1], src=row_lse[0:pr, 0:1])
    return row_loss, valid


@nki.jit
def cross_entropy_backward_kernel(logits, labels, lse, grad_loss, ignore_index=-100, reduction="none",
                                  total_weight=None):
    """Gradient of the row losses (or of their sum or mean) with respect to the logits; see the module docstring."""
    _check(logits, labels, "cross_entropy_backward_kernel")
    n, v = logits.shape
    require_vector("cross_entropy_backward_kernel", "lse", lse, n)
    require(reduction in ("none", "sum", "mean"), "cross_entropy_backward_kernel",
            f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    require((total_weight != None) == (reduction == "mean"), "cross_entropy_backward_kernel",  # noqa: E711
            "total_weight is given exactly for the mean reduction")
    reduced = reduction != "none"
    require_vector("cross_entropy_backward_kernel", "grad_loss", grad_loss, 1 if reduced else n)
    grad = nl.ndarray((n, v), dtype=logits.dtype, buffer=nl.shared_hbm)
    lse2 = lse.reshape((n, 1))
    gp = nisa.engine.gpsimd
    scalar_grad = _loss_grad(grad_loss, total_weight) if reduced else None
    for r0 in range(0, n, PMAX):
        pr = min(PMAX, n - r0)
        valid, offsets = _label_offsets(labels, r0, pr, v, ignore_index)
        neg_lse = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=neg_lse[0:pr, 0:1], src=lse2[r0 : r0 + pr, 0:1])
        nisa.tensor_scalar(dst=neg_lse[0:pr, 0:1], data=neg_lse[0:pr, 0:1], op0=nl.multiply, operand0=-1.0,
                           engine=gp)
        given = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        if reduced:  # the loss's gradient on every row (a partition-broadcast DMA of the one value)
            nisa.dma_copy(dst=given[0:pr, 0:1], src=scalar_grad.ap([[0, pr], [1, 1]]))
        else:
            nisa.dma_copy(dst=given[0:pr, 0:1], src=grad_loss.reshape((n, 1))[r0 : r0 + pr, 0:1])
        row_grad = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)  # 0 on ignored rows, even if given is nan
        counts = nl.ndarray((PMAX, 1), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=counts[0:pr, 0:1], data=valid[0:pr, 0:1], op0=nl.not_equal, operand0=0.0, engine=gp)
        nisa.memset(dst=row_grad[0:pr, 0:1], value=0.0, engine=gp)
        nisa.tensor_copy_predicated(dst=row_grad[0:pr, 0:1], src=given[0:pr, 0:1], predicate=counts[0:pr, 0:1])
        for c0 in range(0, v, COLS):  # softmax * grad everywhere ...
            cc = min(COLS, v - c0)
            tile = nl.ndarray((PMAX, cc), dtype=logits.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile[0:pr, 0:cc], src=logits[r0 : r0 + pr, c0 : c0 + cc])
            probs = nl.ndarray((PMAX, cc), dtype=logits.dtype, buffer=nl.sbuf)
            nisa.activation(dst=probs[0:pr, 0:cc], op=nl.exp, data=tile[0:pr, 0:cc], bias=neg_lse[0:pr, 0:1])
            out = nl.ndarray((PMAX, cc), dtype=logits.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=out[0:pr, 0:cc], data=probs[0:pr, 0:cc], op0=nl.multiply,
                               operand0=row_grad[0:pr, 0:1])
            nisa.dma_copy(dst=grad[r0 : r0 + pr, c0 : c0 + cc], src=out[0:pr, 0:cc])
        # ... then the label column of each row is rewritten: (softmax - 1) * grad, by an indirect scatter
        picked = _gather(logits, r0, pr, v, offsets)
        fixed = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=fixed[0:pr, 0:1], op=nl.exp, data=picked[0:pr, 0:1], bias=neg_lse[0:pr, 0:1])
        nisa.scalar_tensor_tensor(dst=fixed[0:pr, 0:1], data=fixed[0:pr, 0:1], op0=nl.subtract, operand0=1.0,
                                  op1=nl.multiply, operand1=row_grad[0:pr, 0:1])
        fixed_out = nl.ndarray((PMAX, 1), dtype=logits.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=fixed_out[0:pr, 0:1], src=fixed[0:pr, 0:1], engine=gp)
        for g0, gn, index in offsets:
            nisa.dma_copy(dst=grad.ap([[1, gn], [1, 1]], offset=(r0 + g0) * v, vector_offset=index[0:gn, 0:1]),
                          src=fixed_out[g0 : g0 + gn, 0:1])
    return grad


def _loss_grad(grad_loss, total_weight):
    """The gradient every row of a reduced loss gets, in fp32 HBM [1]: grad_loss, or grad_loss / total_weight for a
    mean, divided in fp32 and rounded to the loss's dtype (as torch divides in that dtype)."""
    value = nl.ndarray((1, 1), dtype=grad_loss.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=value, src=grad_loss.reshape((1, 1)))
    as_f32 = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=as_f32, src=value)
    if total_weight != None:  # noqa: E711 (NKI forbids `is`)
        weight = nl.ndarray((1, 1), dtype=total_weight.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=weight, src=total_weight.reshape((1, 1)))
        weight_f32 = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=weight_f32, src=weight)
        quotient = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=quotient, data1=as_f32, data2=weight_f32, op=nl.divide)
        nisa.tensor_copy(dst=value, src=quotient)  # rounded to the loss's dtype
        nisa.tensor_copy(dst=as_f32, src=value)
    out = nl.ndarray((1,), dtype=nl.float32, buffer=nl.private_hbm)
    nisa.dma_copy(dst=out.reshape((1, 1)), src=as_f32)
    return out


def _check(logits, labels, name):
    require(len(logits.shape) == 2, name, f"logits must be [N, V], got {tuple(logits.shape)} (flatten the rows)")
    require_float(name, "logits", logits)
    require(str(labels.dtype) == "int32", name, f"labels must be int32, got {labels.dtype}; use labels.to(torch.int32)")
    require_vector(name, "labels", labels, logits.shape[0])


def _label_offsets(labels, r0, pr, v, ignore_index):
    """For rows r0.. : 1.0/0.0 for rows that count (label != ignore_index), and the element offsets of each
    row's label column for the indirect DMA, as (first row, rows, int32 [rows, 1] tile) groups.

    The offset (row - first row) · V + label is formed in fp32 arithmetic, exact below 2^24, so a group spans
    at most 2^24 / V rows (all 128 for V ≤ 131072; rounded down to a multiple of 32). Ignored labels are
    clamped to column 0; their rows are zeroed by `valid`.
    """
    gp = nisa.engine.gpsimd
    raw = nl.ndarray((PMAX, 1), dtype=labels.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=raw[0:pr, 0:1], src=labels.reshape((labels.shape[0], 1))[r0 : r0 + pr, 0:1])
    valid = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=valid[0:pr, 0:1], data=raw[0:pr, 0:1], op0=nl.not_equal, operand0=float(ignore_index),
                       engine=gp)
    group = min(PMAX, EXACT_FP32_INT // v)
    if group >= 32:  # groups start on a 32-partition boundary (the partition-start alignment of the engines)
        group = group // 32 * 32
    offsets = []
    for g0 in range(0, pr, group):
        gn = min(group, pr - g0)
        label = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=label[0:gn, 0:1], src=raw[g0 : g0 + gn, 0:1])  # to partition 0 of its own tile
        nisa.tensor_scalar(dst=label[0:gn, 0:1], data=label[0:gn, 0:1], op0=nl.maximum, operand0=0.0, engine=gp)
        row_start = nl.ndarray((PMAX, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=row_start[0:gn, 0:1], pattern=[[0, 1]], offset=0, channel_multiplier=v)
        index = nl.ndarray((PMAX, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=index[0:gn, 0:1], data1=row_start[0:gn, 0:1], data2=label[0:gn, 0:1], op=nl.add,
                           engine=gp)
        offsets.append((g0, gn, index))
    return valid, offsets


def _gather(logits, r0, pr, v, offsets):
    """logits[r, label[r]] for the rows r0.. as fp32 [128, 1], by indirect DMA (one element per row)."""
    picked = nl.ndarray((PMAX, 1), dtype=logits.dtype, buffer=nl.sbuf)
    for g0, gn, index in offsets:
        nisa.dma_copy(dst=picked[g0 : g0 + gn, 0:1],
                      src=logits.ap([[1, gn], [1, 1]], offset=(r0 + g0) * v, vector_offset=index[0:gn, 0:1]))
    as_f32 = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=as_f32[0:pr, 0:1], src=picked[0:pr, 0:1], engine=nisa.engine.gpsimd)
    return as_f32
