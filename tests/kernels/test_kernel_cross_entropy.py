"""cross_entropy_kernel / cross_entropy_backward_kernel against torch, with ignored rows and a tiled vocabulary."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DTYPES, assert_close, randn
from neuron_dynamo.kernels.cross_entropy import cross_entropy_backward_kernel, cross_entropy_kernel

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
