"""Linear algebra on the simulator, compiled as a user would and compared with eager (fp32 at 1e-4).

The factorizations must be torch's own (LAPACK's pivots, reflector signs, the LU torch returns for the backward);
calls whose result LAPACK decides by rounding or flags (tied pivots, singular or indefinite matrices, NaN) are
recomputed by torch and counted; larger matrices and other dtypes are refused with a reason.
"""

import math

import pytest
import torch
from compiled import check_compiled, run_compiled

from neuron_dynamo import counters
from neuron_dynamo.lowering import linalg_factor

TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


def _check(fn, *args, lowered=True):
    return check_compiled(fn, *args, lowered=lowered, **TOLERANCE)


def _recomputes() -> int:
    return counters.stats().get("eager_recomputes", 0)


def _matrices(*shape, seed=0):
    """Well-conditioned random matrices (diagonally weighted)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator)
    return x + 3 * torch.eye(shape[-2], shape[-1])


def _spd(*shape, seed=0):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return x @ x.mT + torch.eye(shape[-1])


# ------------------------------------------------------------------------------------------------ LU family
@pytest.mark.parametrize("shape", [(5, 5), (3, 7, 5), (2, 3, 5), (1, 1)])
def test_lu_factor_is_lapacks(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    _check(torch.linalg.lu_factor_ex, x)
    _check(torch.linalg.lu, x)
    _check(lambda x: torch.lu_unpack(*torch.linalg.lu_factor_ex(x)[:2]), x)


def test_det_slogdet_and_the_lu_torch_saves_for_the_backward():
    x = torch.randn(3, 5, 5, generator=torch.Generator().manual_seed(2))
    for matrix in (x, x.mT):  # torch factors Aᵀ for a contiguous A
        _check(torch.ops.aten._linalg_det.default, matrix)
        _check(torch.ops.aten._linalg_slogdet.default, matrix)
    _check(torch.logdet, _spd(2, 4, 4))


def test_det_of_empty_and_one_by_one_matrices():
    _check(torch.linalg.det, torch.randn(3, 0, 0))
    _check(torch.linalg.slogdet, torch.randn(0, 0))
    _check(torch.linalg.det, torch.randn(3, 1, 1))
    _check(torch.linalg.det, torch.randn(0, 5, 5))


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve(left, adjoint):
    lu, pivots = torch.linalg.lu_factor(_matrices(2, 4, 4))
    b = torch.randn(2, 4, 3) if left else torch.randn(2, 3, 4)
    _check(lambda lu, p, b: torch.linalg.lu_solve(lu, p, b, left=left, adjoint=adjoint), lu, pivots, b)


@pytest.mark.parametrize("b_shape", [(5,), (2, 5), (2, 5, 3), (4, 2, 5, 1)])
def test_solve_and_inverse(b_shape):
    a, b = _matrices(2, 5, 5), torch.randn(b_shape)
    _check(torch.linalg.solve_ex, a, b)
    if b.dim() > 2:
        _check(lambda a, b: torch.linalg.solve_ex(a, b, left=False), a, b.mT)
    _check(torch.linalg.inv_ex, a)
    _check(torch.linalg.inv_ex, a.mT)  # non-contiguous


# ------------------------------------------------------------------------------------------------ triangular
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unit", [True, False])
def test_solve_triangular_reads_one_triangle(upper, left, unit):
    a = _matrices(3, 4, 4)
    a = a + torch.where(torch.eye(4, dtype=torch.bool), 0.0, math.nan).tril(-1 if upper else 1).nan_to_num(0.0)
    b = torch.randn(3, 4, 2) if left else torch.randn(3, 2, 4)
    _check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit), a, b)


@pytest.mark.parametrize("transpose", [True, False])
def test_triangular_solve_broadcasts(transpose):
    _check(lambda b, a: torch.triangular_solve(b, a, upper=False, transpose=transpose), torch.randn(2, 1, 5, 3),
           _matrices(3, 5, 5))


# ------------------------------------------------------------------------------------------------ Cholesky
@pytest.mark.parametrize("upper", [True, False])
def test_cholesky_family(upper):
    a = _spd(2, 5, 5)
    _check(lambda a: torch.linalg.cholesky_ex(a, upper=upper), a)
    _check(lambda a: torch.cholesky(a, upper=upper), a)
    factor = torch.linalg.cholesky(a, upper=upper)
    _check(lambda b, f: torch.cholesky_solve(b, f, upper=upper), torch.randn(2, 5, 3), factor)
    _check(lambda f: torch.cholesky_inverse(f, upper=upper), factor)


def test_cholesky_reads_the_lower_triangle_only():
    a = _spd(5, 5)
    _check(lambda a: torch.linalg.cholesky_ex(a), a + torch.triu(torch.full((5, 5), 7.0), 1))


# ------------------------------------------------------------------------------------------------ QR
@pytest.mark.parametrize("shape", [(5, 5), (2, 5, 2), (2, 5), (1, 1, 3, 3)])
def test_qr_family_signs_are_lapacks(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    _check(torch.geqrf, x)
    for mode in ("reduced", "complete", "r"):
        _check(lambda x, mode=mode: torch.linalg.qr(x, mode=mode), x)
    if x.shape[-2] >= x.shape[-1]:  # orgqr's reflectors: a tall or square matrix
        a, tau = torch.geqrf(x)
        _check(torch.linalg.householder_product, a, tau)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("transpose", [True, False])
def test_ormqr(left, transpose):
    a, tau = torch.geqrf(torch.randn(5, 3))
    c = torch.randn(5, 2) if left else torch.randn(2, 5)
    _check(lambda a, tau, c: torch.ormqr(a, tau, c, left=left, transpose=transpose), a, tau, c)


def test_householder_product_of_no_reflectors_is_the_identity():
    _check(torch.linalg.householder_product, torch.randn(5, 4), torch.randn(0))


# ------------------------------------------------------------------------------------------------ matrix_exp
@pytest.mark.parametrize("scale", [0.0, 0.1, 1.0, 8.0])
def test_matrix_exp(scale):
    _check(torch.linalg.matrix_exp, torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(4)) * scale)


def test_matrix_exp_of_bf16_computes_in_fp32():
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(5)).bfloat16()
    result, fallbacks = run_compiled(torch.linalg.matrix_exp, x)
    assert not fallbacks and result.dtype == torch.bfloat16
    torch.testing.assert_close(result, torch.linalg.matrix_exp(x.float()).bfloat16(), rtol=2e-2, atol=2e-2)


# ------------------------------------------------------------------------------------------------ gradients
def test_backward_of_det_solve_and_cholesky():
    a = _matrices(2, 4, 4).requires_grad_()
    b = torch.randn(2, 4, 2)
    fn = lambda a, b: (torch.linalg.det(a).sum() + torch.linalg.solve(a, b).sum()  # noqa: E731
                       + torch.linalg.cholesky(a @ a.mT).sum())
    torch._dynamo.reset()
    (compiled,) = torch.autograd.grad(torch.compile(fn, backend="neuron", dynamic=False)(a, b), a)
    (expected,) = torch.autograd.grad(fn(a, b), a)
    torch.testing.assert_close(compiled, expected, **TOLERANCE)


# ------------------------------------------------------------------------------------------------ doubtful calls
def test_tied_pivots_are_recomputed_by_torch():
    x = torch.tensor([[1.0, 2.0], [-1.0, 3.0]])  # |1| = |-1|: LAPACK's choice, by its rounding in general
    before = _recomputes()
    _check(torch.linalg.lu_factor_ex, x)
    assert _recomputes() > before


@pytest.mark.parametrize("fn", [torch.linalg.inv_ex, torch.linalg.cholesky_ex, torch.linalg.lu_factor_ex])
def test_singular_and_indefinite_matrices_report_info_as_torch(fn):
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    _check(fn, singular)


def test_singular_inverse_raises_as_torch():
    with pytest.raises(torch.linalg.LinAlgError):
        run_compiled(torch.linalg.inv, torch.zeros(3, 3))


def test_nan_input_is_recomputed_by_torch():
    x = _matrices(3, 3)
    x[1, 2] = math.nan
    _check(torch.linalg.det, x)
    _check(torch.linalg.matrix_exp, x)


# ------------------------------------------------------------------------------------------------ refusals
def test_large_and_double_matrices_are_refused_with_a_reason():
    big = _matrices(linalg_factor.SIZE_LIMIT + 1, linalg_factor.SIZE_LIMIT + 1)
    fallbacks = _check(torch.linalg.det, big, lowered=False)
    assert any("unrolled factorization" in reason for reason in fallbacks.values()), fallbacks
    fallbacks = _check(torch.linalg.det, _matrices(3, 3).double(), lowered=False)
    assert any("float64" in reason for reason in fallbacks.values()), fallbacks


def test_lu_without_pivoting_is_refused():
    reason = linalg_factor._lu_refusal(_node(torch.ops.aten.linalg_lu_factor_ex.default, (3, 3), pivot=False))
    assert "without pivoting" in reason


def _node(op, shape, **kwargs):
    import torch.fx as fx

    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(shape)
    return graph.call_function(op, (x,), kwargs)
