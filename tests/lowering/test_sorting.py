"""Sorting and order statistics on the simulator, compared with eager exactly (values, positions, dtypes).

Inputs have many ties, NaN, ±inf and -0.0, so the positions test torch's tie order; refused calls run eagerly
with a reason.
"""

import math

import pytest
import torch
from compiled import check_compiled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_dynamo.lowering import sorting

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))


def _tied(shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    """Few distinct values, with NaN, ±inf and -0.0 among the floats."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, shape, generator=generator).to(torch.float32)
    if dtype.is_floating_point:
        specials = torch.tensor([math.nan, math.inf, -math.inf, -0.0])
        pick = torch.randint(0, 12, shape, generator=generator)
        x = torch.where(pick < 4, specials[pick.clamp(max=3)], x)
    return x.to(dtype)


def _check(fn, *args, lowered=True):
    return check_compiled(fn, *args, rtol=0, atol=0, lowered=lowered)


SHAPES = st.sampled_from([(), (1,), (5,), (3, 7), (4, 1, 6), (2, 17), (2, 3, 9)])
DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.int32, torch.int64, torch.uint8, torch.bool])


@SETTINGS
@given(SHAPES, DTYPES, st.integers(0, 3), st.booleans(), st.integers(0, 99))
def test_stable_sort_matches_eager(shape, dtype, dim, descending, seed):
    x = _tied(shape, dtype, seed)
    dim = dim % max(len(shape), 1) if shape else 0
    bounded = _bounded(dtype)
    _check(lambda x: torch.sort(bounded(x), dim=dim, descending=descending, stable=True), x)


def _bounded(dtype):
    """int32/int64 inputs clamped in the graph: a bound the lowering can prove (unbounded ones are refused)."""
    if dtype in (torch.int32, torch.int64):
        return lambda x: x.clamp(-1000, 1000)
    return lambda x: x


@pytest.mark.parametrize("length", [1, 2, 5, 16])
def test_unstable_sort_is_insertion_sort_up_to_16(length):
    x = _tied((3, length), seed=length)
    _check(lambda x: torch.sort(x, dim=1, descending=True), x)
    _check(lambda x: torch.argsort(x, dim=1), x)


def test_sort_of_a_non_contiguous_input_along_every_dim():
    x = _tied((6, 5, 4)).transpose(0, 2)
    for dim in range(3):
        _check(lambda x, dim=dim: torch.sort(x, dim=dim, stable=True), x)


def test_values_only_sort_of_any_length():
    x = _tied((1, 300)).reshape(300)
    _check(lambda x: torch.msort(x), x)
    _check(lambda x: torch.sort(x).values, x)


def test_long_unstable_sort_with_indices_is_refused():
    fallbacks = _check(lambda x: torch.sort(x), _tied((40,)), lowered=False)
    assert "introsort" in fallbacks["aten.sort.default"]


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest):
    x = _tied((4, 12))
    _check(lambda x: torch.topk(x, 5, dim=1, largest=largest).values, x)
    _check(lambda x: torch.topk(x, 2, dim=1, largest=largest), _tied((4, 3)))
    _check(lambda x: torch.topk(x, 1, largest=largest), torch.tensor(2.5))
    fallbacks = _check(lambda x: torch.topk(x, 5, dim=1, largest=largest), x, lowered=False)
    assert "nth_element" in fallbacks["aten.topk.default"]


@SETTINGS
@given(SHAPES, st.sampled_from([torch.float32, torch.bfloat16, torch.int32]), st.integers(0, 3), st.booleans(),
       st.integers(0, 99))
def test_median_along_a_dim_matches_eager(shape, dtype, dim, keepdim, seed):
    x = _tied(shape, dtype, seed)
    dim = dim % max(len(shape), 1) if shape else 0
    bounded = _bounded(dtype)
    _check(lambda x: torch.median(bounded(x), dim, keepdim), x)
    if dtype.is_floating_point:
        _check(lambda x: torch.nanmedian(x, dim, keepdim), x)


@pytest.mark.parametrize("length", [1, 3, 4, 7, 13, 24])
def test_nanmedian_of_nan_only_rows(length):
    x = _tied((3, length))
    x[1] = math.nan
    _check(lambda x: torch.nanmedian(x, 1), x)


def test_whole_tensor_medians():
    for x in (_tied((5, 6)), _tied((7,), torch.int16), torch.full((4,), math.nan), torch.tensor(3.0)):
        _check(lambda x: torch.median(x), x)
        _check(lambda x: torch.nanmedian(x), x)


def test_kthvalue():
    x = _tied((3, 8))
    for k in (1, 4, 8):
        _check(lambda x, k=k: torch.kthvalue(x, k, 1).values, x)
    _check(lambda x: torch.kthvalue(x, 2, 1), _tied((3, 2)))
    fallbacks = _check(lambda x: torch.kthvalue(x, 4, 1), x, lowered=False)
    assert "quickselect" in fallbacks["aten.kthvalue.default"]


@SETTINGS
@given(st.integers(0, 9), st.sampled_from([(), (4,), (3, 5)]), st.booleans(), st.booleans(), st.integers(0, 99))
def test_searchsorted_matches_eager_even_unsorted(length, shape, right, out_int32, seed):
    sequence, values = _tied((length,), seed=seed), _tied(shape, seed=seed + 1)
    _check(lambda s, v: torch.searchsorted(s, v, right=right, out_int32=out_int32), sequence.sort().values, values)
    _check(lambda s, v: torch.searchsorted(s, v, right=right), sequence, values)
    _check(lambda v, s: torch.bucketize(v, s, right=right, out_int32=out_int32), values, sequence.sort().values)


def test_searchsorted_rows_and_sorter():
    sequence, values = _tied((3, 6)), _tied((3, 4), seed=1)
    sorter = torch.sort(sequence, dim=1, stable=True).indices
    _check(lambda s, v: torch.searchsorted(s, v, side="right"), sequence.sort(dim=1).values, values)
    _check(lambda s, v, o: torch.searchsorted(s, v, sorter=o), sequence, values, sorter)


@pytest.mark.parametrize("invert", [False, True])
def test_isin(invert):
    elements, tests = _tied((4, 5)), _tied((6,), seed=3)
    _check(lambda e, t: torch.isin(e, t, invert=invert), elements, tests)
    _check(lambda e, t: torch.isin(e, t, invert=invert), elements.to(torch.int8), tests.to(torch.int16).abs())
    _check(lambda e: torch.isin(e, 0.0, invert=invert), elements)


def test_empty_and_one_element_inputs():
    _check(lambda x: torch.sort(x, stable=True), torch.empty(0, 3), lowered=False)
    _check(lambda x: torch.sort(x, dim=0, stable=True), torch.tensor([[1.5, -0.0]]))
    _check(lambda x: torch.sort(x), torch.tensor(4.0))
    _check(lambda s, v: torch.searchsorted(s, v), torch.empty(0), torch.tensor([1.0, 2.0]))


def test_refusals_say_why():
    big = torch.arange(2**25, 2**25 + 10, dtype=torch.int64)
    fallbacks = _check(lambda x: torch.sort(x, stable=True), big, lowered=False)
    assert "2**24" in fallbacks["aten.sort.stable"]
    fallbacks = _check(lambda x: torch.sort(x, stable=True).values, torch.randn(sorting.SORT_LIMIT + 1),
                       lowered=False)
    assert "bitonic" in fallbacks["aten.sort.stable"]


def test_all_nan_index_follows_libstdcxx():
    for n in range(1, 200):
        assert sorting._all_nan_index(n) == torch.full((n,), math.nan).nanmedian(0).indices.item()
