"""scatter_add_kernel against torch's accumulating index writes (index_put with accumulate, scatter_reduce), and
embedding_backward_kernel against torch's embedding_dense_backward."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import TOLERANCES, assert_close, randn
from neuron_dynamo.kernels.contract import KernelContractError
from neuron_dynamo.kernels.scatter import embedding_backward_kernel, scatter_add_kernel
from torch._decomp.decompositions import embedding_dense_backward

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INF, NAN = math.inf, math.nan


def random_rows(count, rows, seed):
    """int32 rows in [-R, R): negative ones count from the end, as torch's index_put takes them."""
    return torch.randint(-rows, rows, (count,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)


def reduced(base, rows, values, reduce, include_self):
    """torch's scatter_reduce of whole rows (sum or mean), in fp32."""
    index = (rows.long() % base.shape[0]).reshape(-1, 1).expand(-1, base.shape[1])
    return base.float().scatter_reduce(0, index, values.float(), reduce, include_self=include_self)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [
    (128, 128, 64),  # the tiny Llama's embedding backward: one tile of each
    (300, 200, 600),  # R and J not multiples of 128 (3 and 2 tiles), C > 512 (four column blocks)
    (5, 7, 3),  # more values than rows: duplicates
])
def test_scatter_add_sums_like_index_put(shape, dtype):
    rows_count, count, cols = shape
    base, values = randn(rows_count, cols, dtype=dtype, seed=1), randn(count, cols, dtype=dtype, seed=2)
    rows = random_rows(count, rows_count, seed=3)
    rows[: min(count, 4)] = rows[0]  # one row hit several times at least
    ref = base.float().index_put((rows.long(),), values.float(), accumulate=True)
    assert_close(scatter_add_kernel(base, rows, values), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_values_land_only_in_their_rows(dtype):
    """+inf and -inf in one row's column give NaN, as does a NaN value or base; no other row sees them."""
    base = torch.tensor([[1.0, -INF, 2.0, 3.0], [0.0, 1.0, INF, 4.0], [5.0, 6.0, 7.0, 8.0], [NAN, 1.0, 2.0, 3.0]])
    values = torch.tensor([[INF, INF, -INF, 1.0], [-INF, 2.0, 1.0, NAN], [1.0, 2.0, 3.0, 4.0], [INF, 0.0, 0.0, 0.0],
                           [-INF, -INF, 0.0, 0.0]])
    rows = torch.tensor([0, 0, 1, 2, -1], dtype=torch.int32)
    base, values = base.to(dtype), values.to(dtype)
    ref = base.index_put((rows.long(),), values, accumulate=True)  # small integers: exact in every dtype
    torch.testing.assert_close(scatter_add_kernel(base, rows, values), ref, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_include_self_and_mean_like_scatter_reduce(reduce, include_self):
    """Two row tiles (the moving tiles kept in SBUF between them), three value tiles, rows nothing lands in."""
    base, values = randn(130, 20, seed=4), randn(260, 20, seed=5)
    values[7, 3], values[9, 4], values[11, 4] = INF, -INF, NAN
    rows = random_rows(260, 100, seed=6)  # rows 100.. stay as they are
    out = scatter_add_kernel(base, rows, values, include_self=include_self, mean=reduce == "mean")
    torch.testing.assert_close(out, reduced(base, rows, values, reduce, include_self), equal_nan=True)


def test_many_value_tiles_rebuild_the_moving_tiles_per_row_tile():
    """33 value tiles exceed the SBUF budget for keeping them: each row tile loads them again."""
    base, values = randn(200, 2, seed=7), randn(4200, 2, seed=8)
    rows = random_rows(4200, 200, seed=9)
    ref = base.index_put((rows.long(),), values, accumulate=True)
    torch.testing.assert_close(scatter_add_kernel(base, rows, values), ref, rtol=1e-5, atol=1e-4)


@settings(max_examples=12, deadline=None)
@given(
    rows_count=st.integers(1, 260),
    count=st.integers(1, 260),
    cols=st.integers(1, 40),
    dtype=st.sampled_from(DTYPES),
    reduce=st.sampled_from(["sum", "mean"]),
    include_self=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_and_rows(rows_count, count, cols, dtype, reduce, include_self, seed):
    base, values = randn(rows_count, cols, dtype=dtype, seed=seed), randn(count, cols, dtype=dtype, seed=seed + 1)
    rows = random_rows(count, rows_count, seed)
    out = scatter_add_kernel(base, rows, values, include_self=include_self, mean=reduce == "mean")
    ref = reduced(base, rows, values, reduce, include_self)
    rtol, atol = TOLERANCES[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, rtol=rtol, atol=atol * max(1.0, ref.abs().max().item()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padding_idx", [-1, 5])
@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
def test_embedding_backward_like_torch(dtype, padding_idx, scale_grad_by_freq):
    """Two row tiles, three id tiles, repeated ids and the padding row among them."""
    ids = torch.randint(0, 150, (2, 140), generator=torch.Generator().manual_seed(10))
    ids[0, :6] = 5
    grad = randn(2, 140, 24, dtype=dtype, seed=11)
    ref = torch.ops.aten.embedding_dense_backward(grad.float(), ids, 150, padding_idx, scale_grad_by_freq)
    out = embedding_backward_kernel(grad, ids.to(torch.int32), 150, padding_idx, scale_grad_by_freq)
    assert_close(out, ref, dtype)


def test_embedding_backward_drops_ids_out_of_range():
    """Negative ids and ids past the table add nothing (torch's decomposition masks them out)."""
    ids = torch.tensor([[0, -1, 3, 9], [12, 3, -5, 2]])
    grad = randn(2, 4, 3, seed=12)
    ref = embedding_dense_backward(grad, ids, 10, -1, False)
    torch.testing.assert_close(embedding_backward_kernel(grad, ids.to(torch.int32), 10), ref)


def test_arguments_outside_the_contract_are_refused():
    base, values = randn(4, 3), randn(2, 3)
    with pytest.raises(KernelContractError, match="row indices must be int32"):
        scatter_add_kernel(base, torch.tensor([0, 1], dtype=torch.int16), values)
    with pytest.raises(KernelContractError, match="values are"):
        scatter_add_kernel(base, torch.tensor([0, 1], dtype=torch.int32), values.bfloat16())
