"""transpose_kernel is exact against torch for ragged 2-D and batched shapes."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DTYPES, randn
from neuron_dynamo.kernels.transpose import transpose_kernel


@settings(max_examples=10, deadline=None)
@given(
    rows=st.integers(1, 1100), cols=st.integers(1, 600), batch=st.sampled_from([0, 2]), dtype=st.sampled_from(DTYPES)
)
def test_transpose_is_exact(rows, cols, batch, dtype):
    x = randn(*((batch,) if batch else ()), rows, cols, dtype=dtype, seed=rows * cols)
    out = transpose_kernel(x)
    assert out.dtype == dtype
    assert torch.equal(out, x.transpose(-1, -2))
