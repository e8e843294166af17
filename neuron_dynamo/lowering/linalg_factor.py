"""Linear algebra on the NKI targets, the factorizations: LU with partial pivoting, Cholesky, Householder QR.

The matrices of these ops are small (a transform, a covariance, a block of a model), so each factorization is the
textbook LAPACK algorithm written as plain torch code (`generated.run_traced`), unrolled over the static matrix
size: one step per column, each step element-wise work on the whole batch of matrices at once (masks select the
column, the pivot row and the trailing block). The steps follow LAPACK's conventions, so the results are the ones
torch returns, not merely equivalent ones: getrf's pivot is the first row of largest magnitude; geqrf's reflectors
are larfg's (v[0] = 1, beta = -sign(alpha)·‖x‖, tau = (beta - alpha)/beta); potrf reads one triangle only.

What a fixed program cannot reproduce is checked while it runs: each program also returns a *doubt* flag per
matrix — a pivot choice decided by rounding (two candidates within `TIE` of each other, where LAPACK's blocked
kernels round differently), a zero pivot (singular: LAPACK's `info`, on which torch raises or returns its own
partial factors), a matrix that is not positive definite, a non-finite input. A doubtful call is recomputed by
torch (`eager_recomputes` counts it, and it is logged), so the result, the `info` and any error are torch's own.
Larger matrices are refused (`SIZE_LIMIT`): the unrolled program grows with n.
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx

from neuron_dynamo import counters
from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten
log = logging.getLogger("neuron_dynamo.lowering.linalg")

SIZE_LIMIT = 32  # largest matrix dim: the programs are unrolled over it (n steps of O(n²) work each)
ELEMENT_LIMIT = 2**24  # positions are computed in fp32
TIE = 2.0**-12  # pivot candidates closer than this (relative) are chosen by rounding: the call is recomputed
FACTOR_OPS = (aten.linalg_lu_factor_ex.default, aten.linalg_lu.default, aten.lu_unpack.default,
              aten._linalg_det.default, aten._linalg_slogdet.default, aten.linalg_cholesky_ex.default,
              aten.cholesky.default, aten.geqrf.default, aten.linalg_householder_product.default,
              aten.ormqr.default, aten.linalg_qr.default)


@lowers(*FACTOR_OPS, family="linalg")
def reference(op, *args, **kwargs):
    """Reference kernel: torch's LAPACK."""
    return op(*args, **kwargs)


# ------------------------------------------------------------------------------------------------ refusals
def matrix_refusal(node: fx.Node, dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> str | None:
    """Why a linear-algebra node runs eagerly: a dtype torch's CPU LAPACK path does not take (eager raises), a
    matrix dim beyond `SIZE_LIMIT`, or a symbolic shape."""
    values = [arg.meta.get("val") for arg in node.all_input_nodes]
    for value in values:
        if not isinstance(value, torch.Tensor):
            return "a non-tensor operand"
        if value.dtype.is_floating_point and value.dtype not in dtypes:
            return f"a {str(value.dtype).removeprefix('torch.')} matrix (computed in {dtypes[0]} only)"
        try:
            dims, count = [int(d) for d in value.shape[-2:]], int(value.numel())
        except (TypeError, ValueError, RuntimeError):
            return "a symbolic shape"
        if value.dtype.is_floating_point and max(dims, default=0) > SIZE_LIMIT:
            return (f"a {'×'.join(map(str, dims))} matrix: the unrolled factorization is written for matrices up to "
                    f"{SIZE_LIMIT}×{SIZE_LIMIT}")
        if count >= ELEMENT_LIMIT:
            return "a batch of 2**24 elements or more (positions are computed in fp32)"
    return None


def _lu_refusal(node: fx.Node) -> str | None:
    if not node.kwargs.get("pivot", True):
        return "an LU without pivoting (torch's CPU kernel raises)"
    return matrix_refusal(node)


def _qr_refusal(node: fx.Node) -> str | None:
    mode = node.args[1] if len(node.args) > 1 else node.kwargs.get("mode", "reduced")
    if mode not in ("reduced", "complete", "r"):
        return f"mode={mode!r} (torch raises)"
    return matrix_refusal(node)


# ------------------------------------------------------------------------------------------------ running
def empty_result(*tensors: torch.Tensor) -> bool:
    return any(t.numel() == 0 for t in tensors)


def run_checked(op, args: tuple, kwargs: dict, name: str, program, tensors: list[torch.Tensor]):
    """`program(*tensors)` (its last output the doubt flag per matrix) as NKI kernels; torch's own result where
    any matrix is doubtful (see the module docstring)."""
    from neuron_dynamo.lowering.generated import run_traced

    *outputs, doubtful = run_traced(name, program, tensors)
    if bool(doubtful.any()):
        counters.bump("eager_recomputes")
        log.info("%s: a matrix whose result LAPACK decides by rounding or flags (tie, singular, not definite, "
                 "non-finite): recomputed by torch", op)
        return op(*args, **kwargs)
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


# ------------------------------------------------------------------------------------------------ plain torch helpers
def positions(n: int, dim: int, rank: int) -> torch.Tensor:
    """0..n-1 as fp32 along `dim` of a tensor of `rank` dims (for masks)."""
    return torch.arange(n, dtype=torch.float32).reshape([n if d == dim else 1 for d in range(rank)])


def non_finite(x: torch.Tensor) -> torch.Tensor:
    """Per matrix of a [B, m, n] batch: whether any element is inf or NaN (x - x is NaN exactly there)."""
    return ((x - x) != 0).reshape(x.shape[0], -1).any(1)


def select_rows(b: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """b[order[i]] for each row i of a [B, m, k] batch (`order` [B, m], fp32 row numbers): a masked sum, exact."""
    pick = order[:, :, None] == positions(b.shape[1], 2, 3)  # [B, i, j]
    return torch.where(pick[:, :, :, None], b[:, None, :, :], 0.0).sum(2)


def place_rows(w: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """x with x[order[i]] = w[i] (the inverse of `select_rows`)."""
    pick = order[:, None, :] == positions(w.shape[1], 1, 3)  # [B, r, i]
    return torch.where(pick[:, :, :, None], w[:, None, :, :], 0.0).sum(2)


def eye(count: int, m: int, n: int) -> torch.Tensor:
    return (positions(m, 1, 3) == positions(n, 2, 3)).to(torch.float32).expand(count, m, n)


# ------------------------------------------------------------------------------------------------ LU (getrf)
def lu_steps(a: torch.Tensor):
    """getrf on a [B, m, n] batch: (LU, 0-based pivot rows [B, k] as fp32, doubt [B])."""
    count, m, n = a.shape
    rows, r3, c3 = positions(m, 1, 2), positions(m, 1, 3), positions(n, 2, 3)
    doubtful = non_finite(a)
    pivots = []
    for k in range(min(m, n)):
        candidates = torch.where(rows >= k, a[:, :, k].abs(), -1.0)
        best = candidates.amax(1, keepdim=True)
        pivot_row = torch.where(candidates == best, rows, float(m)).amin(1, keepdim=True)
        close = (candidates >= best * (1.0 - TIE)).to(torch.float32).sum(1)
        doubtful = doubtful | (close > 1.5) | (best[:, 0] == 0)
        at_k, at_p = r3 == k, r3 == pivot_row[:, :, None]
        row_k, row_p = a[:, k, :], torch.where(at_p, a, 0.0).sum(1)
        a = torch.where(at_k, row_p[:, None, :], torch.where(at_p, row_k[:, None, :], a))
        below = r3 > k
        multipliers = a[:, :, k:k + 1] * (1.0 / row_p[:, None, k:k + 1])
        a = torch.where(below & (c3 == k), multipliers, a)
        a = a - torch.where(below & (c3 > k), multipliers * row_p[:, None, :], 0.0)
        pivots.append(pivot_row)
    pivots = torch.cat(pivots, 1) if pivots else torch.zeros(count, 0)
    return a, pivots, doubtful


def row_order(pivots: torch.Tensor, m: int) -> torch.Tensor:
    """The rows of A in P^T A = L U, from the 0-based pivots [B, k] (the swaps applied in turn)."""
    rows = positions(m, 1, 2)
    order = rows.expand(pivots.shape[0], m)
    for k in range(pivots.shape[1]):
        at_k, at_p = rows == k, rows == pivots[:, k:k + 1]
        swapped = torch.where(at_p, order, 0.0).sum(1, keepdim=True)
        order = torch.where(at_k, swapped, torch.where(at_p, order[:, k:k + 1], order))
    return order


def unpack(lu: torch.Tensor, order: torch.Tensor):
    """(P, L, U) of a factored [B, m, n] batch: L unit lower m×k, U upper k×n, A = P L U."""
    count, m, n = lu.shape
    k = min(m, n)
    r3 = positions(m, 1, 3)
    lower = torch.where(r3[:, :, :k] > positions(k, 2, 3), lu[:, :, :k], (r3 == positions(k, 2, 3)).to(lu.dtype))
    upper = torch.where(positions(k, 1, 3) <= positions(n, 2, 3), lu[:, :k, :], 0.0)
    permutation = (order[:, None, :] == r3).to(lu.dtype)
    return permutation, lower, upper


def _batched(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, *x.shape[-2:])


def _pivot_numbers(pivots: torch.Tensor, batch) -> torch.Tensor:
    return (pivots + 1.0).to(torch.int32).reshape(*batch, pivots.shape[1])


@lowers(aten.linalg_lu_factor_ex.default, family="linalg", target="simulator", accepts=_lu_refusal,
        handles_empty=True)
def lu_factor_ex(op, a, *, pivot=True, check_errors=False):
    """(LU, pivots, info): info is 0 — a singular matrix is doubtful, so torch gives its own."""
    if empty_result(a):
        return op(a, pivot=pivot, check_errors=check_errors)

    def program(a):
        lu, pivots, doubtful = lu_steps(_batched(a))
        info = torch.zeros(a.shape[:-2], dtype=torch.int32)
        return lu.reshape(a.shape), _pivot_numbers(pivots, a.shape[:-2]), info, doubtful

    return run_checked(op, (a,), {"pivot": pivot, "check_errors": check_errors}, "lu_factor_ex", program, [a])


@lowers(aten.linalg_lu.default, family="linalg", target="simulator", accepts=_lu_refusal, handles_empty=True)
def linalg_lu(op, a, *, pivot=True):
    if empty_result(a):
        return op(a, pivot=pivot)

    def program(a):
        lu, pivots, doubtful = lu_steps(_batched(a))
        batch = a.shape[:-2]
        p, lower, upper = unpack(lu, row_order(pivots, a.shape[-2]))
        return p.reshape(*batch, *p.shape[1:]), lower.reshape(*batch, *lower.shape[1:]), upper.reshape(
            *batch, *upper.shape[1:]), doubtful

    return run_checked(op, (a,), {"pivot": pivot}, "linalg_lu", program, [a])


@lowers(aten.lu_unpack.default, family="linalg", target="simulator", accepts=matrix_refusal, handles_empty=True)
def lu_unpack(op, lu, pivots, unpack_data=True, unpack_pivots=True):
    """P, L, U from given factors; pivots outside 1..m make torch raise, so they are doubtful."""
    args = (lu, pivots, unpack_data, unpack_pivots)
    if empty_result(lu) or not (unpack_data and unpack_pivots):
        return op(*args)

    def program(lu, pivots):
        batch, m = lu.shape[:-2], lu.shape[-2]
        rows = pivots.reshape(-1, pivots.shape[-1]).to(torch.float32) - 1.0
        doubtful = ((rows < 0) | (rows >= m)).any(1)
        p, lower, upper = unpack(_batched(lu), row_order(rows, m))
        return p.reshape(*batch, *p.shape[1:]), lower.reshape(*batch, *lower.shape[1:]), upper.reshape(
            *batch, *upper.shape[1:]), doubtful

    return run_checked(op, args, {}, "lu_unpack", program, [lu, pivots])


def _det_program(a: torch.Tensor, transposed: bool, log_abs: bool):
    """det (or sign and log|det|) from the LU of A — of Aᵀ where torch factors its column-major view."""
    batch, n = a.shape[:-2], a.shape[-1]
    matrices = _batched(a)
    lu, pivots, doubtful = lu_steps(matrices.mT if transposed else matrices)
    swaps = (pivots != positions(n, 1, 2)).to(torch.float32).sum(1)
    parity = 1.0 - 2.0 * (swaps - 2.0 * torch.floor(swaps * 0.5))
    diagonal = lu.diagonal(dim1=1, dim2=2)
    factors = lu.reshape(a.shape), _pivot_numbers(pivots, batch)
    if log_abs:
        sign = diagonal.sign().prod(1) * parity
        return sign.reshape(batch), diagonal.abs().log().sum(1).reshape(batch), *factors, doubtful
    return (diagonal.prod(1) * parity).reshape(batch), *factors, doubtful


def _det_of_nothing(a: torch.Tensor, log_abs: bool):
    """det of 0×0 matrices: 1 (sign 1, log|det| 0)."""
    batch = a.shape[:-2]
    ones = torch.ones(batch)
    factors = a * 1.0, torch.zeros(*batch, 0, dtype=torch.int32)
    return ((ones, ones * 0.0) if log_abs else (ones,)) + factors + (torch.zeros(1, dtype=torch.bool),)


@lowers(aten._linalg_det.default, aten._linalg_slogdet.default, family="linalg", target="simulator",
        accepts=matrix_refusal, handles_empty=True)
def determinant(op, a):
    """det = the product of U's diagonal and the permutation's sign; slogdet the signs and the sum of log|u_ii|.
    torch factors Aᵀ for a contiguous A (its column-major view): the LU and pivots returned (for the backward)
    are of the same matrix."""
    log_abs = op is aten._linalg_slogdet.default
    if a.shape[:-2].numel() == 0:
        return op(a)  # no matrices
    if a.shape[-1] == 0:
        return run_checked(op, (a,), {}, f"det_empty:{log_abs}", lambda a: _det_of_nothing(a, log_abs), [a])
    transposed = a.is_contiguous()
    return run_checked(op, (a,), {}, f"det:{log_abs}:{transposed}",
                       lambda a: _det_program(a, transposed, log_abs), [a])


# ------------------------------------------------------------------------------------------------ Cholesky (potrf)
def cholesky_steps(a: torch.Tensor, upper: bool):
    """potrf on a [B, n, n] batch reading the lower (upper) triangle only: (L, or U = Lᵀ, and doubt [B])."""
    n = a.shape[-1]
    r3, c3 = positions(n, 1, 3), positions(n, 2, 3)
    a = torch.where(r3 <= c3, a, a.mT) if upper else torch.where(r3 >= c3, a, a.mT)
    doubtful = non_finite(a)
    factor = torch.zeros_like(a)
    rows = positions(n, 1, 2)
    for j in range(n):
        square = a[:, j, j:j + 1]
        doubtful = doubtful | (square[:, 0] > 0).logical_not()
        root = torch.sqrt(square)
        column = torch.where(rows > j, a[:, :, j] * (1.0 / root), torch.where(rows == j, root, 0.0))
        factor = torch.where(c3 == j, column[:, :, None], factor)
        a = a - torch.where((r3 > j) & (c3 > j), column[:, :, None] * column[:, None, :], 0.0)
    return (factor.mT if upper else factor), doubtful


@lowers(aten.linalg_cholesky_ex.default, aten.cholesky.default, family="linalg", target="simulator",
        accepts=matrix_refusal, handles_empty=True)
def cholesky(op, a, *args, **kwargs):
    """L (or U) with the other triangle zero; a matrix that is not positive definite is doubtful (torch raises
    or reports info)."""
    ex = op is aten.linalg_cholesky_ex.default
    upper = kwargs.get("upper", False) if ex else (args[0] if args else kwargs.get("upper", False))
    if empty_result(a):
        return op(a, *args, **kwargs)

    def program(a):
        factor, doubtful = cholesky_steps(_batched(a), upper)
        factor = factor.reshape(a.shape)
        if ex:
            return factor, torch.zeros(a.shape[:-2], dtype=torch.int32), doubtful
        return factor, doubtful

    return run_checked(op, (a, *args), kwargs, f"cholesky:{ex}:{upper}", program, [a])


# ------------------------------------------------------------------------------------------------ QR (geqrf)
def geqrf_steps(a: torch.Tensor):
    """geqr2 on a [B, m, n] batch: (R above the diagonal with the reflectors' v below it, tau [B, k], doubt)."""
    count, m, n = a.shape
    rows, c3 = positions(m, 1, 2), positions(n, 2, 3)
    doubtful = non_finite(a)
    taus = []
    for j in range(min(m, n)):
        column = a[:, :, j]
        alpha = column[:, j:j + 1]
        below = rows > j
        norm = torch.sqrt(torch.where(below, column * column, 0.0).sum(1, keepdim=True))
        untouched = norm == 0  # larfg: H = I
        beta = -torch.copysign(torch.sqrt(alpha * alpha + norm * norm), alpha)
        tau = torch.where(untouched, 0.0, (beta - alpha) / beta)
        scale = torch.where(untouched, 1.0, 1.0 / (alpha - beta))
        v = torch.where(rows == j, 1.0, torch.where(below, column * scale, 0.0))
        weights = (v[:, :, None] * a).sum(1)  # vᵀ A [B, n]
        a = a - torch.where(c3 > j, tau[:, :, None] * v[:, :, None] * weights[:, None, :], 0.0)
        reflected = torch.where(rows == j, torch.where(untouched, alpha, beta), torch.where(below, v, column))
        a = torch.where(c3 == j, reflected[:, :, None], a)
        taus.append(tau)
    return a, torch.cat(taus, 1) if taus else torch.zeros(count, 0), doubtful


def apply_reflectors(reflectors: torch.Tensor, tau: torch.Tensor, c: torch.Tensor, left: bool, transpose: bool):
    """Q·C, Qᵀ·C, C·Q or C·Qᵀ for Q = H_1 … H_k, H_i = I - tau_i v_i v_iᵀ with v_i in column i of `reflectors`
    below the diagonal (v_i[i] = 1), as ormqr/orgqr apply them."""
    m, k = reflectors.shape[1], tau.shape[1]
    rows = positions(m, 1, 2)
    first_last = left == transpose  # Qᵀ·C and C·Q apply H_1 first
    for i in (range(k) if first_last else reversed(range(k))):
        v = torch.where(rows == i, 1.0, torch.where(rows > i, reflectors[:, :, i], 0.0))
        t = tau[:, i:i + 1, None]
        if left:
            c = c - t * v[:, :, None] * (v[:, :, None] * c).sum(1, keepdim=True)
        else:
            c = c - t * (c * v[:, None, :]).sum(2, keepdim=True) * v[:, None, :]
    return c


@lowers(aten.geqrf.default, family="linalg", target="simulator", accepts=matrix_refusal, handles_empty=True)
def geqrf(op, a):
    if empty_result(a):
        return op(a)

    def program(a):
        qr, tau, doubtful = geqrf_steps(_batched(a))
        return qr.reshape(a.shape), tau.reshape(*a.shape[:-2], tau.shape[1]), doubtful

    return run_checked(op, (a,), {}, "geqrf", program, [a])


@lowers(aten.linalg_householder_product.default, family="linalg", target="simulator", accepts=matrix_refusal,
        handles_empty=True)
def householder_product(op, a, tau):
    """orgqr: the first n columns of H_1 … H_k."""
    if empty_result(a):
        return op(a, tau)

    def program(a, tau):
        reflectors = _batched(a)
        count, m, n = reflectors.shape
        q = apply_reflectors(reflectors, tau.reshape(count, -1), eye(count, m, n), left=True, transpose=False)
        return q.reshape(a.shape), torch.zeros(1, dtype=torch.bool)

    return run_checked(op, (a, tau), {}, "householder_product", program, [a, tau])


@lowers(aten.ormqr.default, family="linalg", target="simulator", accepts=matrix_refusal, handles_empty=True)
def ormqr(op, a, tau, c, left=True, transpose=False):
    args = (a, tau, c, left, transpose)
    if empty_result(c) or a.shape[:-2] != c.shape[:-2]:
        return op(*args)  # nothing to compute, or shapes torch rejects

    def program(a, tau, c):
        count = _batched(c).shape[0]
        out = apply_reflectors(_batched(a), tau.reshape(count, -1), _batched(c), left, transpose)
        return out.reshape(c.shape), torch.zeros(1, dtype=torch.bool)

    return run_checked(op, args, {}, f"ormqr:{left}:{transpose}", program, [a, tau, c])


@lowers(aten.linalg_qr.default, family="linalg", target="simulator", accepts=_qr_refusal, handles_empty=True)
def linalg_qr(op, a, mode="reduced"):
    """geqrf, then Q by orgqr (m×k, or m×m for mode='complete') and R the upper triangle."""
    if empty_result(a):
        return op(a, mode)
    m, n = a.shape[-2:]
    k = min(m, n)

    def program(a):
        batch = a.shape[:-2]
        qr, tau, doubtful = geqrf_steps(_batched(a))
        rows = m if mode == "complete" else k
        r = torch.where(positions(rows, 1, 3) <= positions(n, 2, 3), qr[:, :rows, :], 0.0)
        r = r.reshape(*batch, rows, n)
        if mode == "r":
            return torch.zeros(0), r, doubtful
        columns = m if mode == "complete" else k
        q = apply_reflectors(qr[:, :, :k], tau, eye(qr.shape[0], m, columns), left=True, transpose=False)
        return q.reshape(*batch, m, columns), r, doubtful

    return run_checked(op, (a, mode), {}, f"linalg_qr:{mode}", program, [a])
