"""Scattered single ops on the NKI target, each equal to eager or refused with a reason.

angle and frexp (exact, from the bits), the empty-likes (any values: shape, dtype and strides count), empty
pooling results, integer index arithmetic that only an index reads (max_unpool), an int32 modulo of any size by a
small constant (take_along_dim), and the pairwise distances and bilinear form of `distance.py`.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from compiled import check_compiled, run_compiled

SPECIALS = [0.0, -0.0, 1.0, 3.0, -5.5, 0.1, math.inf, -math.inf, math.nan, 1e-40, -1e-45, 2.0**-126, 3.4e38, 0.75]


def _check(fn, *args, tol=0.0):
    check_compiled(fn, *args, rtol=tol, atol=tol)


# ------------------------------------------------------------------------------------------------ angle, frexp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_frexp_is_exact_on_specials_and_subnormals(dtype):
    x = torch.tensor(SPECIALS).to(dtype)
    _check(torch.frexp, x)
    _check(torch.frexp, x.reshape(2, 7).t())  # non-contiguous
    _check(torch.frexp, torch.tensor(2.5, dtype=dtype))  # 0-dim
    _check(torch.frexp, torch.empty(0, 3, dtype=dtype))


def test_frexp_of_random_values():
    x = torch.randn(300) * torch.logspace(-40, 38, 300)
    _check(torch.frexp, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
def test_angle_of_real_numbers(dtype):
    x = torch.tensor(SPECIALS) if dtype.is_floating_point else torch.tensor([-3, 0, 2, 7])
    _check(torch.angle, x.to(dtype))
    _check(lambda x: torch.angle(x) * 2 + 1, x.to(dtype))  # fused with its neighbours


# ------------------------------------------------------------------------------------------------ creation
def test_empty_likes_keep_shape_dtype_and_strides():
    for fn in (lambda x: torch.empty_permuted((2, 3, 4), (0, 2, 1)),
               lambda x: x.new_empty_strided((2, 3), (1, 2)),
               lambda x: x.new_empty_strided((0, 3), (3, 1), dtype=torch.int32)):
        result, fallbacks = run_compiled(fn, torch.randn(2))
        expected = fn(torch.randn(2))
        assert (result.shape, result.dtype) == (expected.shape, expected.dtype)
        assert result.numel() == 0 or result.stride() == expected.stride()
        assert not fallbacks, fallbacks


# ------------------------------------------------------------------------------------------------ pooling
@pytest.mark.parametrize(("fn", "shape"), [
    (lambda x: F.adaptive_avg_pool1d(x, 3), (0, 2, 5)),
    (lambda x: F.adaptive_avg_pool3d(x, (2, 1, 3)), (0, 2, 4, 4, 4)),
    (lambda x: F.adaptive_max_pool2d(x, 2), (0, 3, 4, 4)),
    (lambda x: F.avg_pool2d(x, 2), (0, 2, 4, 4)),
])
def test_pooling_of_empty_tensors_returns_the_empty_result(fn, shape):
    _check(fn, torch.randn(shape))


# ------------------------------------------------------------------------------------------------ integer indices
@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_max_unpool_index_arithmetic_is_lowered(spatial):
    pool, unpool = getattr(F, f"max_pool{spatial}d"), getattr(F, f"max_unpool{spatial}d")
    x = torch.randn(2, 3, *[6] * spatial)
    values, indices = pool(x, 2, return_indices=True)
    _check(lambda v, i: unpool(v, i, 2), values, indices)


def test_an_index_sum_read_otherwise_stays_refused():
    big = torch.tensor([2**24 + 1, 5])
    result, fallbacks = run_compiled(lambda i: i + torch.arange(2), big)
    assert torch.equal(result, big + torch.arange(2))
    assert any("2**24" in reason for reason in fallbacks.values()), fallbacks


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("divisor", [1, 3, 4, 7, -3, -4, 1000, -1023])
def test_modulo_of_any_int32_by_a_small_constant(dtype, divisor):
    x = torch.tensor([0, 1, -1, 5, -5, 2**31 - 1, -(2**31), 2**24 + 3, -(2**24) - 3, 123456789, -987654321],
                     dtype=dtype)
    _check(lambda x: torch.remainder(x, divisor), x)
    _check(lambda x: torch.fmod(x, divisor), x)


def test_modulo_by_a_large_constant_of_a_wide_dividend_is_refused():
    x = torch.tensor([2**30 + 7, -5], dtype=torch.int32)
    result, fallbacks = run_compiled(lambda x: torch.remainder(x, 100003), x)
    assert torch.equal(result, torch.remainder(x, 100003))
    assert any("2**22" in reason for reason in fallbacks.values()), fallbacks


def test_take_along_dim_wraps_any_index():
    t = torch.randn(3, 4)
    index = torch.tensor([[5, -1, 2**20, -(2**30)], [0, 1, 2, 3], [-4, -5, 7, 2**31 - 1]])
    _check(lambda t, i: torch.take_along_dim(t, i, 1), t, index)


# ------------------------------------------------------------------------------------------------ distances
@pytest.mark.parametrize("p", [0, 1, 2, 3, 0.5, 1.5, math.inf])
@pytest.mark.parametrize("mode", ["use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
                                  "donot_use_mm_for_euclid_dist"])
def test_cdist_follows_torchs_compute_mode(p, mode):
    a, b = torch.randn(2, 5, 3), torch.randn(1, 4, 3)
    _check(lambda a, b: torch.cdist(a, b, p, compute_mode=mode), a, b, tol=1e-4)


def test_cdist_shapes():
    _check(lambda a, b: torch.cdist(a, b), torch.randn(30, 3), torch.randn(4, 3), tol=1e-4)  # mm: > 25 rows
    _check(lambda a, b: torch.cdist(a, b), torch.randn(3, 0), torch.randn(4, 0))  # no features: zeros
    _check(lambda a, b: torch.cdist(a, b), torch.randn(0, 3), torch.randn(4, 3))
    _check(lambda a, b: torch.cdist(a, b, 1), torch.randn(3, 5).t(), torch.randn(4, 3), tol=1e-4)


@pytest.mark.parametrize("p", [0, 1, 2, 2.5, math.inf])
def test_pdist(p):
    _check(lambda x: F.pdist(x, p), torch.randn(6, 4), tol=1e-4)
    _check(lambda x: F.pdist(x, p), torch.randn(1, 4))  # no pairs


def test_bilinear():
    x1, x2, weight, bias = torch.randn(4, 3), torch.randn(4, 2), torch.randn(6, 3, 2), torch.randn(6)
    _check(F.bilinear, x1, x2, weight, bias, tol=1e-4)
    _check(F.bilinear, x1.bfloat16(), x2.bfloat16(), weight.bfloat16(), tol=2e-2)
    _check(F.bilinear, torch.randn(2, 5, 3), torch.randn(2, 5, 2), weight, tol=1e-4)


def test_distances_of_integers_are_refused_with_a_reason():
    from neuron_dynamo.lowering import distance

    class Node:
        target = torch.ops.aten._pdist_forward.default

    reason = distance._float_refusal(Node(), [torch.zeros(2, dtype=torch.int64)], 4)
    assert reason == "_pdist_forward of torch.int64"
    assert "2**22" in distance._float_refusal(Node(), [torch.zeros(2)], 2**23)


# ------------------------------------------------------------------------------------------------ nonzero_static
@pytest.mark.parametrize("size", [0, 2, 4, 12])
def test_nonzero_static_lists_positions_then_fill(size):
    x = torch.tensor([[0.0, 1.0, math.nan], [0.0, 0.0, -2.0], [3.0, -0.0, 0.0]])
    _check(lambda x: torch.nonzero_static(x, size=size), x)
    _check(lambda x: torch.nonzero_static(x, size=size, fill_value=7), x.bool().t())
    _check(lambda x: torch.nonzero_static(x, size=size), torch.tensor(2.0))
    _check(lambda x: torch.nonzero_static(x, size=size), torch.zeros(0, 3))


def test_long_nonzero_static_is_refused_with_a_reason():
    x = torch.ones(5000)
    result, fallbacks = run_compiled(lambda x: torch.nonzero_static(x, size=3), x)
    assert torch.equal(result, torch.nonzero_static(x, size=3))
    assert "more than 4096 positions (they are numbered by one cumsum)" in fallbacks["aten.nonzero_static.default"]
