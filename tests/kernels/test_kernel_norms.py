"""rmsnorm_kernel, rmsnorm_saved_kernel and layernorm_kernel against torch: ragged rows and widths, long rows,
optional parameters; rmsnorm_backward_kernel against autograd through Hugging Face's LlamaRMSNorm."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DTYPES, assert_close, randn
from neuron_dynamo.kernels.norms import layernorm_kernel, rmsnorm_backward_kernel, rmsnorm_kernel, rmsnorm_saved_kernel
from transformers.models.llama.modeling_llama import LlamaRMSNorm


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


def hf_gradients(x, weight, grad, eps=1e-6):
    """x's and the weight's gradients through Hugging Face's LlamaRMSNorm by autograd, and what its training
    forward saves for them: x and rstd as it computes them (in fp32), x̂ in x's dtype."""
    norm = LlamaRMSNorm(x.shape[-1], eps).to(x.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    x = x.clone().requires_grad_()
    norm(x).backward(grad)
    x32 = x.detach().float()
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return x.grad, norm.weight.grad, (x32, rstd, (x32 * rstd).to(x.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, d, residual", [(200, 64, True), (3, 5000, False)])
def test_rmsnorm_backward_gives_hugging_face_gradients(dtype, rows, d, residual):
    """Ragged row tiles (grad_w accumulates over two) and long rows (two chunks), with and without the residual
    stream's gradient; x and rstd in fp32 as Hugging Face's half-precision norm keeps them."""
    x, weight = randn(2, rows, d, dtype=dtype, seed=rows, scale=3.0), randn(d, dtype=dtype, seed=1)
    grad = randn(2, rows, d, dtype=dtype, seed=2)
    want_x, want_w, (x32, rstd, xhat) = hf_gradients(x, weight, grad)
    res = randn(2, rows, d, seed=3) if residual else None
    grad_x, grad_w = rmsnorm_backward_kernel(grad, x32, rstd, weight, xhat, res)
    assert grad_x.dtype == torch.float32 and grad_w.dtype == dtype
    assert_close(grad_x.to(dtype), want_x.float() + (res if residual else 0), dtype)
    assert_close(grad_w, want_w, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rmsnorm_backward_in_one_dtype_and_without_weight_gradient(dtype):
    """x and rstd in grad's dtype (a norm that does not upcast) give grad_x in that dtype; without x̂ (a frozen
    weight) the kernel returns grad_x alone, the same values."""
    x, weight, grad = randn(70, 96, dtype=dtype, seed=4, scale=2.0), randn(96, dtype=dtype, seed=5), randn(
        70, 96, dtype=dtype, seed=6)
    want_x, want_w, (x32, rstd, xhat) = hf_gradients(x, weight, grad)
    grad_x, grad_w = rmsnorm_backward_kernel(grad, x, rstd.to(dtype), weight, xhat)
    assert_close(grad_x, want_x, dtype)
    assert_close(grad_w, want_w, dtype)
    assert torch.equal(rmsnorm_backward_kernel(grad, x, rstd.to(dtype), weight), grad_x)
