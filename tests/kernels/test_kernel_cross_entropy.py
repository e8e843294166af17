"""cross_entropy_kernel / cross_entropy_backward_kernel against torch, with ignored rows and a tiled vocabulary."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DTYPES, assert_close, randn
from neuron_dynamo.kernels.cross_entropy import (
    cross_entropy_backward_kernel,
    cross_entropy_kernel,
    cross_entropy_loss_kernel,
)

F = torch.nn.functional


def make_labels(n, v, seed, ignore_index=-100):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, v, (n,), generator=gen, dtype=torch.int32)
    labels[torch.rand(n, generator=gen) < 0.25] = ignore_index
    return labels


def check_forward_and_backward(logits, labels, ignore_index=-100):
    dtype = logits.dtype
    loss, lse = cross_entropy_kernel(logits, labels, ignore_index)
    ref_loss = F.cross_entropy(logits.float(), labels.long(), ignore_index=ignore_index, reduction="none")
    torch.testing.assert_close(loss, ref_loss, rtol=2e-2 if dtype == torch.bfloat16 else 1e-4, atol=1e-3)
    torch.testing.assert_close(lse, torch.logsumexp(logits.float(), -1), rtol=1e-4, atol=1e-4)
    count = max(int((labels != ignore_index).sum()), 1)
    grad_loss = torch.full((logits.shape[0],), 1.0 / count)  # the mean reduction's gradient
    grad = cross_entropy_backward_kernel(logits, labels, lse, grad_loss, ignore_index)
    x = logits.float().requires_grad_()
    F.cross_entropy(x, labels.long(), ignore_index=ignore_index).backward()
    assert_close(grad, x.grad.to(dtype), dtype)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 200), v=st.integers(2, 900), dtype=st.sampled_from(DTYPES))
def test_cross_entropy_ragged(n, v, dtype):
    logits = randn(n, v, dtype=dtype, seed=n + v, scale=3.0)
    check_forward_and_backward(logits, make_labels(n, v, seed=v))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_large_vocabulary_is_tiled(dtype):
    logits = randn(20, 17000, dtype=dtype, seed=1, scale=4.0)
    labels = make_labels(20, 17000, seed=2, ignore_index=7)
    labels[0] = 16999  # a label in the last chunk
    check_forward_and_backward(logits, labels, ignore_index=7)


def test_cross_entropy_huge_vocabulary_splits_the_gather():
    """V > 131072: row offsets would leave fp32's exact-integer range, so a row tile is gathered in groups."""
    logits = randn(130, 140000, dtype=torch.bfloat16, seed=3)
    labels = make_labels(130, 140000, seed=4)
    labels[125] = 139999
    check_forward_and_backward(logits, labels)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("dtype", (*DTYPES, torch.float16))
@pytest.mark.parametrize("n, v", [(128, 128), (200, 37), (1, 5)])
def test_the_reduced_loss_and_its_gradient_match_torch(reduction, dtype, n, v):
    """cross_entropy_loss_kernel sums the rows (and counts them for the mean) in the kernel; the backward kernel
    takes the reduced loss's gradient: F.cross_entropy with that reduction and its autograd are the reference."""
    logits = randn(n, v, dtype=dtype, seed=n + v, scale=3.0)
    labels = make_labels(n, v, seed=v)
    labels[0] = 3 % v  # at least one row counts
    loss, total_weight, lse = cross_entropy_loss_kernel(logits, labels, -100, reduction == "mean")
    x = logits.float().requires_grad_()
    ref = F.cross_entropy(x, labels.long(), reduction=reduction)
    assert loss.shape == total_weight.shape == (1,) and loss.dtype == total_weight.dtype == dtype
    assert_close(loss[0], ref.detach().to(dtype), dtype)
    assert total_weight.item() == float(torch.tensor(float((labels != -100).sum())).to(dtype))
    torch.testing.assert_close(lse, torch.logsumexp(logits.float(), -1), rtol=1e-4, atol=1e-4)
    upstream = torch.tensor([0.75]).to(dtype)
    grad = cross_entropy_backward_kernel(logits, labels, lse, upstream, -100, reduction,
                                         total_weight if reduction == "mean" else None)
    ref.backward(upstream.float()[0])
    assert_close(grad, x.grad.to(dtype), dtype)


def test_a_mean_over_no_counted_row_is_nan_and_its_gradient_zero():
    """torch gives nan for a mean over rows that are all ignored, and a zero gradient (not 0 · nan)."""
    logits, labels = randn(6, 9, seed=1), torch.full((6,), -100, dtype=torch.int32)
    loss, total_weight, lse = cross_entropy_loss_kernel(logits, labels, -100, True)
    assert torch.isnan(loss).all() and total_weight.item() == 0
    grad = cross_entropy_backward_kernel(logits, labels, lse, torch.ones(1), -100, "mean", total_weight)
    assert torch.equal(grad, torch.zeros_like(logits))


def test_the_backward_kernel_refuses_a_total_weight_without_the_mean():
    logits, labels = randn(4, 9, seed=1), torch.zeros(4, dtype=torch.int32)
    _, lse = cross_entropy_kernel(logits, labels)
    with pytest.raises(Exception, match="total_weight"):
        cross_entropy_backward_kernel(logits, labels, lse, torch.ones(1), -100, "sum", torch.ones(1))
