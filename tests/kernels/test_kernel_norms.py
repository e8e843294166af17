"""rmsnorm_kernel, rmsnorm_saved_kernel and layernorm_kernel against torch: ragged rows and widths, long rows,
optional parameters."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DTYPES, assert_close, randn
from neuron_dynamo.kernels.norms import layernorm_kernel, rmsnorm_kernel, rmsnorm_saved_kernel


def rms_reference(x, weight, eps):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float() if weight is not None else y).to(x.dtype)


def ln_reference(x, weight, bias, eps):
    w = weight.float() if weight is not None else None
    b = bias.float() if bias is not None else None
    return torch.nn.functional.layer_norm(x.float(), x.shape[-1:], w, b, eps).to(x.dtype)


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 300), d=st.integers(2, 700), dtype=st.sampled_from(DTYPES), layer=st.booleans())
def test_norms_ragged(rows, d, dtype, layer):
    x = randn(rows, d, dtype=dtype, seed=rows + d, scale=3.0) + 2.0  # an offset mean: LayerNorm must centre
    weight, bias = randn(d, dtype=dtype, seed=1), randn(d, dtype=dtype, seed=2)
    if layer:
        assert_close(layernorm_kernel(x, weight, bias, 1e-5), ln_reference(x, weight, bias, 1e-5), dtype)
    else:
        assert_close(rmsnorm_kernel(x, weight, 1e-6), rms_reference(x, weight, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_without_parameters_and_leading_dims(dtype):
    x = randn(2, 3, 96, dtype=dtype, seed=4)
    assert_close(rmsnorm_kernel(x, None, 1e-5), rms_reference(x, None, 1e-5), dtype)
    assert_close(layernorm_kernel(x, None, None, 1e-5), ln_reference(x, None, None, 1e-5), dtype)


def test_norms_long_rows_are_chunked():
    x = randn(5, 9000, seed=6) * 2 + 100.0  # |mean| ≫ std: the two-pass variance stays exact
    weight, bias = randn(9000, seed=7), randn(9000, seed=8)
    assert_close(layernorm_kernel(x, weight, bias, 1e-5), ln_reference(x, weight, bias, 1e-5), torch.float32)
    assert_close(rmsnorm_kernel(x, weight, 1e-6), rms_reference(x, weight, 1e-6), torch.float32)


@settings(max_examples=6, deadline=None)
@given(rows=st.integers(1, 300), d=st.sampled_from([2, 64, 700, 9000]), dtype=st.sampled_from(DTYPES))
def test_saved_rmsnorm_returns_what_a_training_forward_saves(rows, d, dtype):
    """(y, x̂, rstd) as Hugging Face's RMSNorm computes them in x's dtype: rstd = rsqrt(mean(x²) + eps) per row,
    x̂ = x · rstd, y = weight · x̂."""
    x = randn(2, rows, d, dtype=dtype, seed=rows + d, scale=3.0)
    weight = randn(d, dtype=dtype, seed=3)
    y, xhat, rstd = rmsnorm_saved_kernel(x, weight, 1e-6)
    want_rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(dtype)
    want_xhat = x * want_rstd
    assert y.shape == xhat.shape == x.shape and rstd.shape == (2 * rows, 1)
    assert_close(rstd.reshape(2, rows, 1), want_rstd, dtype)
    assert_close(xhat, want_xhat, dtype)
    assert_close(y, weight * want_xhat, dtype)
