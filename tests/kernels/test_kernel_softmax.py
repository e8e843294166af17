"""softmax_kernel / log_softmax_kernel against torch: ragged rows, long rows (two passes), scale and mask."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DTYPES, assert_close, randn
from neuron_dynamo.kernels.softmax import log_softmax_kernel, softmax_kernel


def reference(x, mask, scale, log):
    logits = x.float() * scale + (mask.float() if mask is not None else 0.0)
    out = torch.log_softmax(logits, -1) if log else torch.softmax(logits, -1)
    return out.to(x.dtype)


@settings(max_examples=10, deadline=None)
@given(
    rows=st.integers(1, 300),
    d=st.integers(1, 700),
    dtype=st.sampled_from(DTYPES),
    log=st.booleans(),
    scale=st.sampled_from([1.0, 0.125, 3.0]),
    masked=st.booleans(),
)
def test_softmax_ragged(rows, d, dtype, log, scale, masked):
    x = randn(rows, d, dtype=dtype, seed=rows * 7 + d, scale=4.0)
    mask = None
    if masked:
        mask = torch.where(randn(rows, d, seed=3) > 0.5, -30000.0, 0.0).to(dtype)
    kernel = log_softmax_kernel if log else softmax_kernel
    out = kernel(x, mask, scale)
    ref = reference(x, mask, scale, log)
    if log and masked:  # masked logits are ~-30000: compare the unmasked ones, where precision matters
        keep = mask == 0
        assert_close(out[keep], ref[keep], dtype)
    else:
        assert_close(out, ref, dtype)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_long_rows_take_two_passes(log):
    """Rows longer than one 8192-column chunk: running max/sum across chunks (online softmax)."""
    x = randn(3, 20000, seed=5, scale=6.0)
    x[1, 15000] = 40.0  # the max sits in the last chunk: the running sum must be rescaled
    kernel = log_softmax_kernel if log else softmax_kernel
    assert_close(kernel(x, None, 0.5), reference(x, None, 0.5, log), torch.float32)


def test_softmax_keeps_leading_dims():
    x = randn(2, 3, 5, 40, dtype=torch.bfloat16, seed=9)
    assert_close(softmax_kernel(x), reference(x, None, 1.0, False), torch.bfloat16)


def test_softmax_with_infinite_mask():
    x = randn(5, 300, seed=11)
    mask = torch.zeros(5, 300)
    mask[:, 100:] = float("-inf")
    assert_close(softmax_kernel(x, mask, 0.5), reference(x, mask, 0.5, False), torch.float32)
    out, ref = log_softmax_kernel(x, mask, 0.5), reference(x, mask, 0.5, True)
    assert_close(out[:, :100], ref[:, :100], torch.float32)
    assert torch.isneginf(out[:, 100:]).all()
