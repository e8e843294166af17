"""Kernels in the style of AWS's NKI 0.6 examples, one per API of issue 13's defects 1-10, checked against NumPy.

Written from the documentation (SDK aws-neuron-sdk@81ce03a, `nki/api/nki/{language,isa}/__init__.py` and
`nki/migration/index.rst`), never from the interpreter's behaviour: each test names the page it follows.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from neuron_dynamo import nki
from neuron_dynamo.nki.errors import NkiValidationError

nki.make_importable()
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
import nki.typing as nt  # noqa: E402

TRN3 = pytest.mark.usefixtures("trn3")


@pytest.fixture
def trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")


def _load(src):
    t = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t


def _store(tile):
    out = nl.ndarray(tile.shape, dtype=tile.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile)
    return out


def test_typing_annotations_avgpool_style():
    """migration/index.rst "nki.typing module": `X: nt.tensor[128, 512]` annotations; average_pool2d example imports
    `from nki.typing import tensor`."""
    from nki.typing import tensor

    @nki.jit
    def double(x: nt.tensor[128, 512], out: tensor[128, 512]):
        t = _load(x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.random.default_rng(0).standard_normal((128, 512)).astype(np.float32)
    np.testing.assert_array_equal(double(x, np.zeros_like(x)), 2 * x)


def test_tile_size_sbuf_totals_and_alignments():
    """nki.language.tile_size.rst: sbuf_size_bytes is the total over all partitions, sbuf_fmax_bytes per partition;
    psum_min_align / sbuf_min_align exist."""
    ts = nl.tile_size
    assert ts.sbuf_size_bytes == ts.pmax * ts.sbuf_fmax_bytes
    assert ts.total_available_sbuf_size == ts.sbuf_fmax_bytes
    assert ts.sbuf_fmax == ts.sbuf_fmax_bytes // 4
    assert ts.psum_min_align > 0 and ts.sbuf_min_align > 0


def test_nkiobject_dataclass_keyword_fields():
    """nki-language-guide.rst "Class Support": every NKIObject class is a data class; the default __init__ takes
    each field (annotated or not, default None) and calls __post_init__; the stub's NKIObject.__init__(**kwargs)."""

    @dataclasses.dataclass
    class Params(nl.NKIObject):
        scale: float = 1.0
        offset = None

        def __post_init__(self):
            self.ready = True

    @dataclasses.dataclass(frozen=True)
    class Frozen(nl.NKIObject):
        k: int

    p = Params(offset=3)
    assert (p.scale, p.offset, p.ready) == (1.0, 3, True)
    assert Params(2.0).scale == 2.0 and Frozen(4).k == 4 and nl.NKIObject(a=1).a == 1

    @nki.jit
    def shift(x, params):
        t = _load(x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=params.scale, op1=nl.add, operand1=params.offset)
        return _store(t)

    x = np.ones((4, 8), np.float32)
    np.testing.assert_array_equal(shift(x, Params(scale=2.0, offset=3)), 5 * x)


@pytest.mark.parametrize("n_cols", [1, 2])
def test_indirect_dma_transpose_gathers_column_major(n_cols):
    """isa dma_transpose, "Indirect transpose example with 2D indices": flat_indices = indices.T.flatten(),
    gathered = src[flat_indices, :], dst = gathered.T."""

    @nki.jit
    def gather_transpose(src_hbm, idx_hbm):
        p, f = 128, 128 * n_cols
        idx_sb = nl.load(idx_hbm)
        dst_sb = nl.ndarray((p, f), dtype=src_hbm.dtype, buffer=nl.sbuf)
        nisa.memset(dst=dst_sb, value=0.0)
        src_ap = src_hbm.ap(pattern=[[p, f], [1, p]], vector_offset=idx_sb, indirect_dim=0)
        nisa.dma_transpose(dst=dst_sb, src=src_ap, axes=(1, 0))
        return _store(dst_sb)

    rng = np.random.default_rng(1)
    src = rng.standard_normal((512, 128)).astype(ml_dtypes.bfloat16)
    idx = rng.integers(0, 512, size=(128, n_cols)).astype(np.uint32)
    expect = src[idx.T.flatten()].T
    np.testing.assert_array_equal(gather_transpose(src, idx), expect)


def test_returning_the_output_argument_at_lnc1():
    """isa dma_copy "Indirect scatter example": `def indirect_scatter_kernel(src_data, indices, output)` writes
    `output` and returns it."""

    @nki.jit
    def scatter(src_data, indices, output):
        idx = nl.ndarray(indices.shape, dtype=indices.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=indices)
        rows = _load(src_data)
        dst = output.ap(pattern=[[output.shape[1], indices.shape[0]], [1, output.shape[1]]], vector_offset=idx,
                        indirect_dim=0)
        nisa.dma_copy(dst=dst, src=rows)
        return output

    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = scatter(src, np.array([[4], [0], [2]], np.int32), np.zeros((5, 4), np.float32))
    np.testing.assert_array_equal(out[[4, 0, 2]], src)
    assert not out[[1, 3]].any()


@pytest.mark.parametrize("op,ref", [(nl.abs, np.abs), (nl.square, np.square), (nl.relu, lambda x: np.maximum(x, 0)),
                                    (nl.reciprocal, lambda x: 1 / x), (nl.rsqrt, lambda x: 1 / np.sqrt(np.abs(x)))])
def test_unary_alu_operators_in_tensor_scalar(op, ref):
    """nki.api.shared.rst "Supported Math Operators": abs, square, relu, rsqrt, reciprocal are Arithmetic Unary
    ALU operators, legal as op0 of tensor_scalar."""

    @nki.jit
    def k(x):
        t = _load(x)
        nisa.tensor_scalar(dst=t, data=t, op0=op, operand0=0.0)
        return _store(t)

    x = np.array([[-2.0, -0.5, 0.25, 4.0]], np.float32)
    x = np.abs(x) if op is nl.rsqrt else x
    np.testing.assert_allclose(k(x), ref(x), rtol=1e-6)


def test_invert_and_tensor_scalar_reduce_with_unary_op():
    """nki.api.shared.rst: invert is a Bitvec operator; tensor_scalar_reduce takes an ALU op0."""

    @nki.jit
    def k(x, y):
        t = _load(x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.invert, operand0=0)
        f = _load(y)
        total = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=f, data=f, op0=nl.square, operand0=0.0, reduce_op=nl.add, reduce_res=total)
        return _store(t), _store(total)

    inv, total = k(np.array([[0, 5]], np.int32), np.array([[1.0, -2.0, 3.0]], np.float32))
    np.testing.assert_array_equal(inv, [[-1, -6]])
    assert total[0, 0] == 14.0


@TRN3
def test_abs_max_abs_min_keep_the_signed_value():
    """language abs_max / abs_min: the signed original of larger / smaller magnitude, ties give y; trn3 only."""

    @nki.jit
    def k(a, b):
        x, y = _load(a), _load(b)
        return _store(nl.abs_max(x, y)), _store(nl.abs_min(x, y))

    a = np.array([[-5.0, 1.0, 2.0]], np.float32)
    b = np.array([[3.0, -1.0, -7.0]], np.float32)
    hi, lo = k(a, b)
    np.testing.assert_array_equal(hi, [[-5.0, -1.0, -7.0]])
    np.testing.assert_array_equal(lo, [[3.0, -1.0, 2.0]])


def test_abs_max_is_refused_before_trn3():
    """language abs_max: "Available only on NeuronCore-v4 (trn3) and newer"."""

    @nki.jit
    def k(a):
        x = _load(a)
        return _store(nl.abs_max(x, x))

    with pytest.raises(NkiValidationError, match="trn3"):
        k(np.ones((1, 2), np.float32))


def test_view_scales_the_last_dim():
    """NkiTensor.view: fp32 (128, 64) -> uint8 (128, 256); uint8 (128, 256) -> fp32 (128, 64)."""

    @nki.jit
    def k(x):
        t = _load(x)
        b = t.view(nl.uint8)
        assert b.shape == (128, 256) and b.view(nl.float32).shape == (128, 64)
        return _store(b)

    x = np.random.default_rng(2).standard_normal((128, 64)).astype(np.float32)
    np.testing.assert_array_equal(k(x), x.view(np.uint8))


def test_rearrange_select_and_vector_select_views():
    """NkiTensor.rearrange (einops patterns), select(dim, tensor) (dynamic select) and vector_select (per-partition
    rows of an HBM tensor)."""

    @nki.jit
    def k(x, table, which, rows):
        t = _load(x)
        r = t.rearrange(("b", ("h", "w")), ("b", "w", "h"), {"h": 4})
        assert r.shape == (128, 6, 4)
        moved = nl.ndarray((128, 6, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=moved, src=r)
        idx = _load(which)
        picked = _load(table.select(0, idx))
        offsets = _load(rows)
        gathered = _load(table.vector_select(0, offsets))
        return _store(moved), _store(picked), _store(gathered)

    x = np.arange(128 * 24, dtype=np.float32).reshape(128, 24)
    table = np.arange(4 * 8 * 3, dtype=np.float32).reshape(4, 8, 3)
    rows = np.array([[3], [1], [0], [3], [2], [2], [0], [1]], np.int32)
    moved, picked, gathered = k(x, table, np.array([[2]], np.int32), rows)
    np.testing.assert_array_equal(moved, x.reshape(128, 4, 6).transpose(0, 2, 1))
    np.testing.assert_array_equal(picked, table[2])
    np.testing.assert_array_equal(gathered, table[rows[:, 0]])


def test_language_names_of_0_6():
    """language stub: DType, is_hbm/is_on_chip/is_psum/is_sbuf, prelu/bypass/average operators, while_loop;
    `nki.dtype` in annotations (nki-library)."""
    assert nl.DType is str and nki.dtype is str
    assert nl.is_hbm(nl.shared_hbm) and nl.is_hbm(nl.hbm) and not nl.is_hbm(nl.sbuf)
    assert nl.is_on_chip(nl.psum) and nl.is_psum(nl.psum) and nl.is_sbuf(nl.sbuf) and not nl.is_sbuf(nl.psum)
    assert {nl.prelu._nki_op, nl.bypass._nki_op, nl.average._nki_op} == {"prelu", "bypass", "average"}


def test_while_loop_counts_down():
    """language while_loop example: a flag-driven loop adding `val` until the counter reaches zero."""

    @nki.jit
    def k(data, count_input):
        val = _load(data)
        acc = nl.zeros((1, 1), dtype=nl.float32, buffer=nl.sbuf)
        count_sb = _load(count_input)
        one_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=one_sb, value=1)
        reg = nisa.register_alloc()
        nisa.register_load(reg, count_sb)

        def body(r):
            nisa.tensor_tensor(dst=acc, data1=acc, data2=val, op=nl.add)
            nisa.tensor_tensor(dst=count_sb, data1=count_sb, data2=one_sb, op=nl.subtract)
            nisa.register_load(r, count_sb)
            return r

        nl.while_loop(reg, body)
        return _store(acc)

    assert k(np.array([[2.5]], np.float32), np.array([[3]], np.int32))[0, 0] == 7.5


def test_tensor_scalar_cumulative_running_sum_and_max():
    """isa tensor_scalar_cumulative pseudocode: reg = op1(op0(x[i], imm0), reg); out[i] = reg."""

    @nki.jit
    def k(x):
        t = _load(x)
        s = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=s, src=t, op0=nl.multiply, op1=nl.add, imm0=2.0)
        m = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=m, src=t, op0=nl.add, op1=nl.maximum, imm0=0.0,
                                      imm1=10.0, reduce_cmd=nisa.reduce_cmd.load_reduce)
        return _store(s), _store(m)

    x = np.array([[1.0, 3.0, -2.0, 12.0]], np.float32)
    s, m = k(x)
    np.testing.assert_array_equal(s, np.cumsum(2 * x, axis=1))
    np.testing.assert_array_equal(m, [[10.0, 10.0, 10.0, 12.0]])


@TRN3
def test_activate2_scale_bias_gelu_and_prelu():
    """isa activate2 example: multiply by 2.0, add 0.5, then GELU; PReLU slope from relu_param."""

    @nki.jit
    def k(x):
        t = _load(x)
        g = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=g, op=nl.gelu_apprx_tanh, data=t, imm0=2.0, imm1=0.5, op0=nl.multiply, op1=nl.add)
        p = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((t.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=p, op=nl.prelu, data=t, imm0=0.0, imm1=0.0, op0=nl.bypass, op1=nl.bypass,
                       relu_param=0.1, reduce_op=nl.add, reduce_res=total, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return _store(g), _store(p), _store(total)

    x = np.array([[-1.0, 0.0, 2.0]], np.float32)
    g, p, total = k(x)
    y = 2 * x + 0.5
    np.testing.assert_allclose(g, 0.5 * y * (1 + np.tanh(0.7978845608 * (y + 0.044715 * y**3))), rtol=1e-5)
    np.testing.assert_allclose(p, [[-0.1, 0.0, 2.0]], rtol=1e-6)
    np.testing.assert_allclose(total, [[1.9]], rtol=1e-6)


def test_gpsimd_gathers():
    """isa nc_n_gather (per-partition flattened gather, uint32 indices) and local_gather (test_nki_isa_local_gather:
    per 16-partition core, indices flattened order='F', num_elem_per_idx contiguous elements)."""

    @nki.jit
    def k(data, indices, src, index):
        d, i = _load(data), _load(indices)
        out = nl.ndarray(i.shape, dtype=d.dtype, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=out, data=d, indices=i)
        s, ix = _load(src), _load(index)
        lg = nl.ndarray((32, 6 * 2), dtype=s.dtype, buffer=nl.sbuf)
        nisa.local_gather(dst=lg, src_buffer=s, index=ix, num_elem_per_idx=2, num_valid_indices=6)
        return _store(out), _store(lg)

    rng = np.random.default_rng(3)
    data = rng.standard_normal((4, 3, 5)).astype(np.float32)
    indices = rng.integers(0, 15, size=(4, 7)).astype(np.uint32)
    src = rng.standard_normal((32, 20)).astype(np.float32)
    index = np.tile(rng.integers(0, 9, size=(16, 1)), (2, 1)).astype(np.uint16) * 2
    gathered, local = k(data, indices, src, index)
    np.testing.assert_array_equal(gathered, np.take_along_axis(data.reshape(4, 15), indices.astype(np.int64), 1))
    expect = np.empty((32, 6, 2), np.float32)
    for c in (0, 16):
        flat = index[c:c + 16].flatten(order="F")[:6].astype(np.int64)
        expect[c:c + 16] = src[c:c + 16][:, (flat[:, None] + np.arange(2)).reshape(-1)].reshape(16, 6, 2)
    np.testing.assert_array_equal(local, expect.reshape(32, 12))


def test_sequence_bounds_and_nonzero_with_count():
    """isa sequence_bounds (NumPy equivalent of test_nki_isa_sequence_bounds: [start, end) per run, padding id 0 gives
    (n, -1)) and nonzero_with_count (indices + index_offset, padding, count; partitions 0, 16, ...)."""

    @nki.jit
    def k(ids, x):
        s = _load(ids)
        b = nl.ndarray((1, 2, ids.shape[1]), dtype=nl.int32, buffer=nl.sbuf)
        nisa.sequence_bounds(dst=b, segment_ids=s)
        t = _load(x)
        nz = nl.ndarray((x.shape[0], x.shape[1] + 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=nz, value=7)
        nisa.nonzero_with_count(dst=nz, src=t, index_offset=16, padding_val=-1)
        return _store(b), _store(nz)

    bounds, nz = k(np.array([[1, 1, 2, 0, 3, 3]], np.int32),
                   np.tile(np.array([[0, 1, 1, 0, 0, 1, 0, 0]], np.float32), (32, 1)))
    np.testing.assert_array_equal(bounds[0], [[0, 0, 2, 6, 4, 4], [2, 2, 3, -1, 6, 6]])
    np.testing.assert_array_equal(nz[0], [17, 18, 21, -1, -1, -1, -1, -1, 3])
    np.testing.assert_array_equal(nz[16], nz[0])
    assert (nz[1] == 7).all()


def test_topk_of_the_16_partition_snake():
    """isa topk example: n = 42 bf16 elements in a 16-partition snake (element i at partition i % 16, column
    i // 16), K = 8 largest in ascending order with their indices."""

    @nki.jit
    def topk_kernel(in_tensor):
        n, k = 42, 8
        src = _load(in_tensor)
        val_dst = nl.ndarray((in_tensor.shape[0], k), dtype=nl.bfloat16, buffer=nl.sbuf)
        idx_dst = nl.ndarray((in_tensor.shape[0], k), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.topk(val_dst=val_dst, idx_dst=idx_dst, src=src, n=n)
        return _store(val_dst), _store(idx_dst)

    x = np.random.default_rng(4).permutation(16 * 3).astype(np.float32).reshape(3, 16).T.astype(ml_dtypes.bfloat16)
    vals, idx = topk_kernel(x)
    snake = x.astype(np.float32).flatten(order="F")[:42]
    best = np.sort(snake)[-8:]
    np.testing.assert_array_equal(vals[0].astype(np.float32), best)
    np.testing.assert_array_equal(snake[idx[0].astype(np.int64)], best)


def test_random_number_instructions(monkeypatch):
    """isa rng (integer bits), set_rng_seed (same seed, same sequence), rand_set_state / rand_get_state (uint32,
    6 words per GpSimd lane), rand2 (uniform in [min, max], trn3), get_nc_sub_version."""

    @nki.jit
    def k(seed):
        s = _load(seed)
        a = nl.ndarray((4, 8), dtype=nl.uint16, buffer=nl.sbuf)
        b = nl.ndarray((4, 8), dtype=nl.uint16, buffer=nl.sbuf)
        nisa.set_rng_seed(src_seeds=s)
        nisa.rng(dst=a)
        nisa.set_rng_seed(src_seeds=s)
        nisa.rng(dst=b)
        state = nl.ndarray((4, 6), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.memset(dst=state, value=5)
        nisa.rand_set_state(src_seeds=state)
        back = nl.ndarray((4, 6), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.rand_get_state(dst=back)
        assert nisa.get_nc_sub_version() == 0
        return _store(a), _store(b), _store(back)

    a, b, back = k(np.array([[42]], np.uint32))
    np.testing.assert_array_equal(a, b)
    assert (back == 5).all()

    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")

    @nki.jit
    def uniform():
        t = nl.ndarray((8, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.rand2(dst=t, min=-2.0, max=3.0)
        return _store(t)

    u = uniform()
    assert u.min() >= -2.0 and u.max() <= 3.0 and u.std() > 0.5


def test_removed_api_raises_with_the_migration_hint():
    """migration/index.rst: nki.jit(platform_target=...) raises since 0.3 (use NEURON_PLATFORM_TARGET_OVERRIDE);
    dma_copy(dst_rmw_op=...) removed in 0.3 (use dma_compute); tensor_copy_dynamic_src/_dst removed in 0.4."""
    with pytest.raises(NkiValidationError, match="NEURON_PLATFORM_TARGET_OVERRIDE"):
        nki.jit(platform_target="trn1")

    @nki.jit
    def rmw(x):
        t = _load(x)
        nisa.dma_copy(dst=t, src=x, dst_rmw_op=nl.add)

    @nki.jit
    def dynamic(x):
        t = _load(x)
        nisa.tensor_copy_dynamic_src(dst=t, src=t)

    with pytest.raises(NkiValidationError, match="dma_compute"):
        rmw(np.ones((2, 2), np.float32))
    with pytest.raises(NkiValidationError, match="scalar_offset"):
        dynamic(np.ones((2, 2), np.float32))
