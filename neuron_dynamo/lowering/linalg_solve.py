"""Linear algebra on the NKI targets, the solvers: triangular solves, LU and Cholesky solves, the inverse, the
matrix exponential.

Built on `linalg_factor` (read its docstring: plain torch programs unrolled over the static matrix size, with a
doubt flag per matrix that makes torch recompute the call). A triangular solve is forward (back) substitution as
trsm does it, one row of unknowns per step, reading only the triangle the op names; a zero on a non-unit diagonal
or a non-finite operand is doubtful (trsm's inf/NaN pattern is its loop order's). `linalg.solve` and `inv` factor
A by `lu_steps` and substitute; `matrix_exp` is scaling and squaring of a Taylor polynomial after a shift by the mean
eigenvalue, computed in fp32 and rounded once: not torch's degrees (18 after scaling to θ₁₈ ≈ 3), whose extra
squarings leave fp32 results off by more than the tolerance where elements cancel (torch's own included).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from neuron_dynamo.lowering.linalg_factor import (
    empty_result,
    eye,
    lu_steps,
    matrix_refusal,
    non_finite,
    place_rows,
    positions,
    row_order,
    run_checked,
    select_rows,
)
from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten

DEGREE, THETA = 30, 6.0  # Taylor degree and 1-norm bound: the truncation error θ³¹/31! is below 2e-10
MAX_SQUARINGS = 16  # beyond: a 1-norm above θ·2**16, whose exponential overflows fp32 anyway (recomputed)
MAX_SHIFT = 80.0  # e^μ within fp32
SOLVE_OPS = (aten.linalg_solve_triangular.default, aten.triangular_solve.default, aten.linalg_lu_solve.default,
             aten._linalg_solve_ex.default, aten.linalg_inv_ex.default, aten.cholesky_solve.default,
             aten.cholesky_inverse.default, aten.linalg_matrix_exp.default)


@lowers(*SOLVE_OPS, family="linalg")
def reference(op, *args, **kwargs):
    """Reference kernel: torch's LAPACK."""
    return op(*args, **kwargs)


# ------------------------------------------------------------------------------------------------ substitution
def substitute(t: torch.Tensor, b: torch.Tensor, lower: bool, unit: bool) -> torch.Tensor:
    """X with T X = B for [B, n, n] triangular T (its other triangle is never read) and [B, n, k] B."""
    n = t.shape[-1]
    rows, columns = positions(n, 1, 3), positions(n, 1, 2)
    x = torch.zeros_like(b)
    for i in (range(n) if lower else reversed(range(n))):
        known = torch.where(columns < i if lower else columns > i, t[:, i, :], 0.0)
        value = b[:, i, :] - (known[:, :, None] * x).sum(1)
        if not unit:
            value = value / t[:, i, i:i + 1]
        x = torch.where(rows == i, value[:, None, :], x)
    return x


def triangle(t: torch.Tensor, lower: bool) -> torch.Tensor:
    rows, columns = positions(t.shape[-1], 1, 3), positions(t.shape[-1], 2, 3)
    return torch.where(rows >= columns if lower else rows <= columns, t, 0.0)


def substitution_doubt(t: torch.Tensor, b: torch.Tensor, lower: bool, unit: bool) -> torch.Tensor:
    """A zero on a non-unit diagonal or a non-finite operand (of the triangle read)."""
    doubtful = non_finite(triangle(t, lower)) | non_finite(b)
    if not unit:
        doubtful = doubtful | (t.diagonal(dim1=1, dim2=2) == 0).any(1)
    return doubtful


def _broadcast(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Size]:
    """a and b with their batch dims broadcast and flattened: ([B, …, …], [B, …, …], batch)."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    flat = lambda x: x.expand(*batch, *x.shape[-2:]).reshape(-1, *x.shape[-2:])  # noqa: E731
    return flat(a), flat(b), batch


def solve_triangular_program(a, b, upper: bool, left: bool, unit: bool):
    """(X, doubt) with A X = B (X A = B when not `left`: Aᵀ Xᵀ = Bᵀ, Aᵀ of the other triangle)."""
    a, b, batch = _broadcast(a, b)
    lower = not upper
    if not left:
        a, b, lower = a.mT, b.mT, upper
    x = substitute(a, b, lower, unit)
    doubtful = substitution_doubt(a, b, lower, unit)
    x = x if left else x.mT
    return x.reshape(*batch, *x.shape[-2:]), doubtful


@lowers(aten.linalg_solve_triangular.default, family="linalg", target="simulator", accepts=matrix_refusal,
        handles_empty=True)
def solve_triangular(op, a, b, *, upper, left=True, unitriangular=False):
    kwargs = {"upper": upper, "left": left, "unitriangular": unitriangular}
    if empty_result(a, b):
        return op(a, b, **kwargs)
    return run_checked(op, (a, b), kwargs, f"solve_triangular:{upper}:{left}:{unitriangular}",
                       lambda a, b: solve_triangular_program(a, b, upper, left, unitriangular), [a, b])


@lowers(aten.triangular_solve.default, family="linalg", target="simulator", accepts=matrix_refusal,
        handles_empty=True)
def triangular_solve(op, b, a, upper=True, transpose=False, unitriangular=False):
    """(X with op(A) X = b, A's copy), both broadcast over the batch dims."""
    args = (b, a, upper, transpose, unitriangular)
    if empty_result(a, b):
        return op(*args)

    def program(b, a):
        x, doubtful = solve_triangular_program(a.mT if transpose else a, b, upper != transpose, True, unitriangular)
        coefficient = a.expand(*x.shape[:-2], *a.shape[-2:]).clone()
        return x, coefficient, doubtful

    return run_checked(op, args, {}, f"triangular_solve:{upper}:{transpose}:{unitriangular}", program, [b, a])


# ------------------------------------------------------------------------------------------------ LU solves
def lu_solve_steps(lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, adjoint: bool):
    """X with A X = B (Aᵀ X = B when `adjoint`) for A = P L U given as [B, n, n] LU and 0-based fp32 pivots."""
    order = row_order(pivots, lu.shape[-1])
    if adjoint:  # Uᵀ Lᵀ Pᵀ X = B
        z = substitute(lu.mT, b, lower=True, unit=False)
        return place_rows(substitute(lu.mT, z, lower=False, unit=True), order)
    y = substitute(lu, select_rows(b, order), lower=True, unit=True)
    return substitute(lu, y, lower=False, unit=False)


def lu_doubt(lu: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return non_finite(lu) | non_finite(b) | (lu.diagonal(dim1=1, dim2=2) == 0).any(1)


@lowers(aten.linalg_lu_solve.default, family="linalg", target="simulator", accepts=matrix_refusal,
        handles_empty=True)
def lu_solve(op, lu, pivots, b, *, left=True, adjoint=False):
    """Given factors: pivots outside 1..n make torch raise, so they are doubtful."""
    kwargs = {"left": left, "adjoint": adjoint}
    if empty_result(lu, b):
        return op(lu, pivots, b, **kwargs)

    def program(lu, pivots, b):
        n = lu.shape[-1]
        factors, rhs, batch = _broadcast(lu, b if left else b.mT)
        pivot_rows = (pivots.to(torch.float32) - 1.0).unsqueeze(-1).expand(*batch, n, 1).reshape(-1, n)
        x = lu_solve_steps(factors, pivot_rows, rhs, adjoint if left else not adjoint)
        doubtful = lu_doubt(factors, rhs) | ((pivot_rows < 0) | (pivot_rows >= n)).any(1)
        x = x.reshape(*batch, *x.shape[-2:])
        return (x if left else x.mT), doubtful

    return run_checked(op, (lu, pivots, b), kwargs, f"lu_solve:{left}:{adjoint}", program, [lu, pivots, b])


def _is_vector(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch's rule for a batch of vectors as the right-hand side."""
    return b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])


@lowers(aten._linalg_solve_ex.default, family="linalg", target="simulator", accepts=matrix_refusal,
        handles_empty=True)
def solve_ex(op, a, b, *, left=True, check_errors=False):
    """(X, LU, pivots, info) with A X = B (X A = B): the LU of A either way, as torch returns it for the
    backward; info is 0 — a singular A is doubtful."""
    kwargs = {"left": left, "check_errors": check_errors}
    if empty_result(a, b):
        return op(a, b, **kwargs)
    vector = _is_vector(a, b)

    def program(a, b):
        n, batch_a = a.shape[-1], a.shape[:-2]
        lu, pivots, doubtful = lu_steps(a.reshape(-1, n, n))
        rhs = b.unsqueeze(-1) if vector else (b if left else b.mT)
        factors, rhs, batch = _broadcast(lu.reshape(*batch_a, n, n), rhs)
        pivot_rows = pivots.reshape(*batch_a, n, 1).expand(*batch, n, 1).reshape(-1, n)
        x = lu_solve_steps(factors, pivot_rows, rhs, adjoint=not left).reshape(*batch, n, -1)
        x = x.squeeze(-1) if vector else (x if left else x.mT)
        info = torch.zeros(batch_a, dtype=torch.int32)
        return x, lu.reshape(a.shape), (pivots + 1.0).to(torch.int32).reshape(*batch_a, n), info, doubtful

    return run_checked(op, (a, b), kwargs, f"solve_ex:{left}:{vector}", program, [a, b])


@lowers(aten.linalg_inv_ex.default, family="linalg", target="simulator", accepts=matrix_refusal, handles_empty=True)
def inv_ex(op, a, *, check_errors=False):
    """A⁻¹ as the solve of A X = I (as torch computes it); a singular A is doubtful (torch raises or reports)."""
    if empty_result(a):
        return op(a, check_errors=check_errors)

    def program(a):
        n = a.shape[-1]
        lu, pivots, doubtful = lu_steps(a.reshape(-1, n, n))
        x = lu_solve_steps(lu, pivots, eye(lu.shape[0], n, n), adjoint=False)
        return x.reshape(a.shape), torch.zeros(a.shape[:-2], dtype=torch.int32), doubtful

    return run_checked(op, (a,), {"check_errors": check_errors}, "inv_ex", program, [a])


# ------------------------------------------------------------------------------------------------ Cholesky solves
@lowers(aten.cholesky_solve.default, family="linalg", target="simulator", accepts=matrix_refusal,
        handles_empty=True)
def cholesky_solve(op, b, factor, upper=False):
    """X with A X = B for A = L Lᵀ (Uᵀ U): two substitutions."""
    if empty_result(b, factor):
        return op(b, factor, upper)

    def program(b, factor):
        rhs_factor, rhs, batch = _broadcast(factor, b)
        lower = rhs_factor.mT if upper else rhs_factor
        x = substitute(lower.mT, substitute(lower, rhs, lower=True, unit=False), lower=False, unit=False)
        return x.reshape(*batch, *x.shape[-2:]), substitution_doubt(lower, rhs, lower=True, unit=False)

    return run_checked(op, (b, factor, upper), {}, f"cholesky_solve:{upper}", program, [b, factor])


@lowers(aten.cholesky_inverse.default, family="linalg", target="simulator", accepts=matrix_refusal,
        handles_empty=True)
def cholesky_inverse(op, factor, upper=False):
    """(L Lᵀ)⁻¹ = L⁻ᵀ L⁻¹ (for U: U⁻¹ U⁻ᵀ), L⁻¹ by substitution against I."""
    if empty_result(factor):
        return op(factor, upper)

    def program(factor):
        n = factor.shape[-1]
        matrices = factor.reshape(-1, n, n)
        lower = matrices.mT if upper else matrices
        identity = eye(matrices.shape[0], n, n)
        inverse = substitute(lower, identity, lower=True, unit=False)
        result = torch.bmm(inverse.mT, inverse)
        return result.reshape(factor.shape), substitution_doubt(lower, identity, lower=True, unit=False)

    return run_checked(op, (factor, upper), {}, f"cholesky_inverse:{upper}", program, [factor])


# ------------------------------------------------------------------------------------------------ matrix exponential
def _exp_refusal(node: fx.Node) -> str | None:
    return matrix_refusal(node, (torch.float32, torch.bfloat16, torch.float16))


def exp_program(a: torch.Tensor):
    """exp(A) = e^μ · T₃₀((A - μI)/2ˢ)^(2ˢ) with μ = trace(A)/n, s the least that brings the 1-norm under θ: the
    shift and the wide θ mean fewer squarings, each of which doubles the rounding error (the squarings past a
    matrix's s keep it; `MAX_SQUARINGS` are unrolled, more — or an e^μ beyond fp32 — is doubtful)."""
    n = a.shape[-1]
    x = a.reshape(-1, n, n).to(torch.float32)
    count = x.shape[0]
    identity = eye(count, n, n)
    shift = x.diagonal(dim1=1, dim2=2).sum(1, keepdim=True) * (1.0 / n)
    x = x - shift[:, :, None] * identity
    norm = x.abs().sum(1).amax(1, keepdim=True)
    squarings = torch.clamp(torch.ceil(torch.log2(norm * (1.0 / THETA))), min=0.0)
    doubtful = non_finite(x) | (squarings[:, 0] > MAX_SQUARINGS) | (shift[:, 0].abs() > MAX_SHIFT)
    x = x * torch.exp2(-squarings)[:, :, None]
    taylor = identity + x * (1.0 / DEGREE)
    for k in range(DEGREE - 1, 0, -1):
        taylor = identity + torch.bmm(x, taylor) * (1.0 / k)
    for step in range(MAX_SQUARINGS):
        taylor = torch.where(squarings[:, :, None] > step, torch.bmm(taylor, taylor), taylor)
    return (taylor * torch.exp(shift)[:, :, None]).reshape(a.shape).to(a.dtype), doubtful


@lowers(aten.linalg_matrix_exp.default, family="linalg", target="simulator", accepts=_exp_refusal,
        handles_empty=True)
def matrix_exp(op, a):
    if empty_result(a):
        return op(a)
    return run_checked(op, (a,), {}, "matrix_exp", exp_program, [a])
