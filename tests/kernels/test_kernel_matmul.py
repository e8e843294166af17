"""matmul_kernel against torch: ragged shapes, batches, transposed operands, bias and activation epilogues."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DTYPES, assert_close, randn
from neuron_dynamo.kernels.matmul import matmul_kernel

TORCH_ACT = {
    "none": lambda x: x,
    "relu": torch.relu,
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def reference(a, b, bias=None, activation="none", transpose_a=False, transpose_b=False):
    a32, b32 = a.float(), b.float()
    if transpose_a:
        a32 = a32.transpose(-1, -2)
    if transpose_b:
        b32 = b32.transpose(-1, -2)
    out = a32 @ b32
    if bias is not None:
        out = out + bias.float()
    return TORCH_ACT[activation](out).to(a.dtype)


@settings(max_examples=8, deadline=None)
@given(
    m=st.integers(1, 260),
    k=st.integers(1, 300),
    n=st.integers(1, 700),
    dtype=st.sampled_from(DTYPES),
    transpose_a=st.booleans(),
    transpose_b=st.booleans(),
)
def test_matmul_ragged_shapes(m, k, n, dtype, transpose_a, transpose_b):
    a = randn(*((k, m) if transpose_a else (m, k)), dtype=dtype, seed=1)
    b = randn(*((n, k) if transpose_b else (k, n)), dtype=dtype, seed=2)
    out = matmul_kernel(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    assert_close(out, reference(a, b, transpose_a=transpose_a, transpose_b=transpose_b), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", sorted(TORCH_ACT))
def test_matmul_bias_and_activation(dtype, activation):
    a, b, bias = randn(130, 96, dtype=dtype, seed=3), randn(96, 520, dtype=dtype, seed=4), randn(520, dtype=dtype)
    out = matmul_kernel(a, b, bias, activation)
    assert_close(out, reference(a, b, bias, activation), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_batched_and_shared_weight(dtype):
    a, b = randn(3, 70, 140, dtype=dtype, seed=5), randn(3, 140, 33, dtype=dtype, seed=6)
    assert_close(matmul_kernel(a, b), reference(a, b), dtype)
    w = randn(33, 140, dtype=dtype, seed=7)  # a Linear weight [out, in]: x @ wᵀ
    assert_close(matmul_kernel(a, w, None, "none", False, True), reference(a, w, transpose_b=True), dtype)


def test_matmul_long_k_goes_through_partial_sums():
    """K larger than one chunk (2048 fp32 columns) accumulates partial products through the fp32 scratch."""
    a, b, bias = randn(40, 4500, seed=8), randn(4500, 24, seed=9), randn(24, seed=10)
    out = matmul_kernel(a, b, bias, "relu")
    assert_close(out, reference(a, b, bias, "relu"), torch.float32, factor=10)


def test_matmul_wide_n_spans_several_blocks():
    a, b = randn(128, 128, dtype=torch.bfloat16, seed=11), randn(128, 2100, dtype=torch.bfloat16, seed=12)
    assert_close(matmul_kernel(a, b), reference(a, b), torch.bfloat16)


def test_matmul_full_size_tiles_fit_on_chip():
    """The largest tiles the kernel uses (a 4096 x 2048 bf16 B block resident, four PSUM banks of accumulators,
    double-buffered A strips) pass the interpreter's SBUF/PSUM capacity checks."""
    a, b = randn(256, 4096, dtype=torch.bfloat16, seed=13), randn(4096, 2048, dtype=torch.bfloat16, seed=14)
    out, profile = matmul_kernel.profile(a, b)
    assert_close(out, reference(a, b), torch.bfloat16)
    assert profile.instructions["nc_matmul"] == 2 * 32 * 4  # M tiles x K tiles x PSUM banks


@pytest.mark.parametrize("dtype", (*DTYPES, torch.float16))
@pytest.mark.parametrize("m, k, n, batch", [(128, 64, 64, None), (200, 3000, 70, None), (60, 40, 600, 3)])
def test_matmul_adds_a_residual_as_eager_adds_two_tensors(dtype, m, k, n, batch):
    """C = A @ B + residual: the product is cast to the dtype and the residual added in that dtype, as eager's
    `mm(a, b) + r` (a long K goes through the partial sums first; a batch adds each item's own residual)."""
    lead = () if batch is None else (batch,)
    a, w = randn(*lead, m, k, dtype=dtype, seed=m), randn(n, k, dtype=dtype, seed=k, scale=0.1)
    residual = randn(*lead, m, n, dtype=dtype, seed=n)
    out = matmul_kernel(a, w, None, "none", False, True, residual)
    expected = reference(a, w, transpose_b=True) + residual
    assert_close(out, expected, dtype)
    with pytest.raises(Exception, match="residual"):
        matmul_kernel(a, w, None, "none", False, True, residual[..., :-1])
