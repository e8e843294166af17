"""NkiTensor views, indexing rank rules, access patterns, allocation and dtype storage."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nki_helpers import f32, rand, run

import neuron_dynamo.nki.isa as nisa
import neuron_dynamo.nki.language as nl
from neuron_dynamo.nki.errors import NkiValidationError


def test_sbuf_rank_rules_and_hbm_numpy_indexing():
    seen = {}

    def k(a):
        t = nl.ndarray((8, 4, 6), nl.float32, buffer=nl.sbuf)
        seen["p_int"] = t[3].shape  # int on the partition dim keeps it with size 1
        seen["free_int"] = t[:, 2].shape  # int on a free dim drops it
        seen["both_free"] = t[:, 1, 2].shape  # would leave 1 dim: the last free dim stays with size 1
        seen["ellipsis"] = t[..., 0:2].shape
        seen["ds"] = t[nl.ds(2, 3), :, nl.ds(1, 4)].shape
        seen["hbm"] = a[1].shape  # HBM drops integer-indexed dims as NumPy does
        seen["neg"] = a[-1, -2:].shape

    run(k, rand((5, 7)))
    assert seen == {
        "p_int": (1, 4, 6), "free_int": (8, 6), "both_free": (8, 1), "ellipsis": (8, 4, 2), "ds": (3, 4, 4),
        "hbm": (7,), "neg": (2,),
    }


def test_views_share_storage_and_report_strides_offset():
    seen = {}

    def k(a):
        t = nl.load(a)  # (4, 6)
        v = t[1:3, 2:6:2]
        seen["strides"], seen["offset"] = v.strides, v.offset
        r = t.reshape((4, 2, 3))
        seen["reshape"] = (r.shape, r.is_contiguous())
        p = r.permute((0, 2, 1))
        seen["permute"] = (p.shape, p.is_contiguous(), p.get_pattern())
        b = t[:, 0:1].broadcast(1, 5)
        seen["broadcast"] = b.shape
        e = t.expand_dim(1)
        seen["expand"] = (e.shape, e.squeeze_dim(1).shape)
        seen["flatten"] = r.flatten_dims(1, 2).shape
        seen["reshape_dim"] = t.reshape_dim(1, (3, 2)).shape
        seen["slice_select"] = (t.slice(1, 0, 4, 2).shape, t.select(1, 5).shape)
        seen["view"] = t.view(nl.int32).dtype
        nisa.memset(t[:, 0:2], 9.0)  # writes through the view into the same storage
        out = nl.ndarray((4, 6), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    a = rand((4, 6))
    got = run(k, a)
    assert seen["strides"] == (6, 2) and seen["offset"] == 8
    assert seen["reshape"] == ((4, 2, 3), True)
    assert seen["permute"] == ((4, 3, 2), False, [[6, 4], [1, 3], [3, 2]])
    assert seen["broadcast"] == (4, 5)
    assert seen["expand"] == ((4, 1, 6), (4, 6))
    assert seen["flatten"] == (4, 6) and seen["reshape_dim"] == (4, 3, 2)
    assert seen["slice_select"] == ((4, 2), (4, 1))
    assert seen["view"] == "int32"
    want = a.copy()
    want[:, 0:2] = 9.0
    np.testing.assert_array_equal(got, want)


def test_ap_addresses_base_storage():
    a = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 12)

    def k(a):
        t = nl.load(a)
        v = t[1:2, 5:7].ap([[12, 2], [3, 2], [1, 3]], offset=1)  # .ap ignores the view it is called on
        d = nl.ndarray((2, 2, 3), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(d, v)
        out = nl.ndarray((2, 2, 3), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, d)
        return out

    want = np.stack([a[p, 1:].reshape(-1)[[0, 1, 2, 3, 4, 5]].reshape(2, 3) for p in range(2)])
    np.testing.assert_array_equal(run(k, a), want)


def test_ap_rejects_wrong_partition_step_and_out_of_range():
    def bad_step(a):
        nl.load(a).ap([[5, 2], [1, 4]])

    def out_of_range(a):
        a.ap([[4, 10], [1, 4]])

    with pytest.raises(NkiValidationError, match="addresses partitions"):
        run(bad_step, rand((2, 6)))
    with pytest.raises(NkiValidationError, match="reaches element"):
        run(out_of_range, rand((2, 6)))


def test_fresh_allocations_are_nan_or_4():
    def k():
        f = nl.ndarray((2, 3), nl.bfloat16, buffer=nl.shared_hbm)
        i = nl.ndarray((2, 3), nl.int16, buffer=nl.shared_hbm)
        return f, i

    f, i = run(k)
    assert np.isnan(f32(f)).all() and (i == 4).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3", "float8_e5m2", "float8_e4m3fn", "float16"])
def test_low_precision_storage_rounds_like_ml_dtypes(dtype):
    x = rand((4, 32), low=-3, high=3)

    def k(x):
        t = nl.ndarray((4, 32), dtype, buffer=nl.sbuf)
        nisa.tensor_copy(t, nl.load(x))
        out = nl.ndarray((4, 32), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(t, nl.float32))
        return out

    storage = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    np.testing.assert_array_equal(run(k, x), x.astype(storage).astype(np.float32))


def test_float_to_int_rounds_half_even_and_saturates_tf32_rounds():
    x = np.array([[0.5, 1.5, 2.5, -0.5, 300.0, -300.0, np.nan, 1.0000001]], dtype=np.float32)

    def k(x):
        t = nl.load(x)
        i8 = nl.ndarray((1, 8), nl.int8, buffer=nl.sbuf)
        nisa.tensor_copy(i8, t)
        tf = nl.ndarray((1, 8), nl.tfloat32, buffer=nl.sbuf)
        nisa.tensor_copy(tf, t)
        o1 = nl.ndarray((1, 8), nl.int8, buffer=nl.shared_hbm)
        o2 = nl.ndarray((1, 8), nl.float32, buffer=nl.shared_hbm)
        nl.store(o1, i8)
        nl.store(o2, nl.copy(tf, nl.float32))
        return o1, o2

    i8, tf = run(k, x)
    np.testing.assert_array_equal(i8[0], [0, 2, 2, 0, 127, -128, 0, 1])
    assert tf[0, 7] == 1.0 and tf[0, 4] == 300.0  # 1 + 2^-23 rounds away in tf32's 10-bit mantissa


def test_tile_size_constants_follow_target(monkeypatch):
    assert (nl.tile_size.pmax, nl.tile_size.psum_fmax, nl.tile_size.gemm_stationary_fmax) == (128, 512, 128)
    assert nl.tile_size.gemm_moving_fmax == 512 and nl.tile_size.psum_num_banks == 8
    assert nl.tile_size.bn_stats_fmax == 512 and nl.tile_size.psum_bank_fmax_bytes == 2048
    assert nl.tile_size.sbuf_fmax_bytes == 224 * 1024
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    assert nl.tile_size.sbuf_fmax_bytes == 192 * 1024


def test_tensor_has_no_truth_value_or_item_assignment():
    def truth():
        if nl.ndarray((2, 2), nl.float32):
            pass

    def assign():
        t = nl.ndarray((2, 2), nl.float32)
        t[0, 0] = 1.0

    def add(a):
        t = nl.load(a)
        t += t

    def iterate(a):
        for _row in nl.load(a):
            pass

    with pytest.raises(NkiValidationError, match="truth value"):
        run(truth)
    with pytest.raises(NkiValidationError, match="no `__iadd__` operator"):
        run(add, rand((2, 2)))
    with pytest.raises(NkiValidationError, match="not iterable"):
        run(iterate, rand((2, 2)))
    with pytest.raises(NkiValidationError, match="item assignment"):
        run(assign)


@st.composite
def _index(draw, shape):
    key = []
    for n in shape:
        if draw(st.booleans()):
            key.append(draw(st.integers(-n, n - 1)))
        else:
            start = draw(st.integers(0, n))
            stop = draw(st.integers(start, n))
            key.append(slice(start, stop, draw(st.integers(1, 3))))
    return tuple(key)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.lists(st.integers(1, 6), min_size=2, max_size=4).map(tuple))
def test_hbm_views_match_numpy_and_sbuf_keeps_rank(data, shape):
    key = data.draw(_index(shape))
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    seen = {}

    def k(a):
        seen["hbm"] = np.array(a[key]._read())
        t = nl.load(a)
        seen["sbuf"] = np.array(t[key]._read())

    run(k, a)
    np.testing.assert_array_equal(seen["hbm"], a[key])
    sb = seen["sbuf"]
    assert sb.size == a[key].size and sb.ndim >= min(2, len(shape))
    np.testing.assert_array_equal(sb.reshape(-1), a[key].reshape(-1))


def test_fast_bf16_casts_match_ml_dtypes_bit_for_bit():
    from neuron_dynamo.nki import dtypes

    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x00000001, 0x007FFFFF, 0x3F808000,
                        0x3F818000, 0x7F7FFFFF], dtype=np.uint32)  # zeros, infs, subnormals, ties, max
    x = np.concatenate([bits, special]).view(np.float32)
    ours = dtypes.to_dtype(x, "bfloat16")
    with np.errstate(invalid="ignore"):  # NaN inputs
        ref = x.astype(ml_dtypes.bfloat16)
    nan = np.isnan(x)
    assert np.isnan(ours[nan].astype(np.float32)).all()
    np.testing.assert_array_equal(ours[~nan].view(np.uint16), ref[~nan].view(np.uint16))
    np.testing.assert_array_equal(dtypes.as_f32(ref[~nan]), ref[~nan].astype(np.float32))
