"""Each nki.isa instruction against NumPy (positive cases; rule violations live in test_interp_rules.py)."""

import math

import ml_dtypes
import numpy as np
import pytest
from nki_helpers import f32, rand, run

import neuron_dynamo.nki.isa as nisa
import neuron_dynamo.nki.language as nl


def _out(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)


def _sum_atol(terms, axis=0):
    """Absolute tolerance for fp32 sums of `terms` along `axis` that the kernel and NumPy add in different orders.

    Either order is within n * eps/2 * sum|terms| of the exact sum (n terms), so the two differ by at most
    n * eps * sum|terms|, taken at the largest sum. The bound must be absolute: a relative one fails wherever the
    signed terms cancel to near zero. It covers any summation order, so also other CPUs' BLAS kernels and SIMD widths.
    """
    terms = np.asarray(terms, dtype=np.float64)
    return terms.shape[axis] * float(np.finfo(np.float32).eps) * float(np.abs(terms).sum(axis).max())


def _gemm_atol(lhs_t, rhs):
    """`_sum_atol` of the K products behind each element of `lhs_t.T @ rhs`."""
    return _sum_atol(f32(lhs_t)[:, :, None] * f32(rhs)[:, None, :])


def test_dma_copy_hbm_sbuf_roundtrip_with_cast():
    a = rand((64, 96))

    def k(a):
        t = nl.ndarray((64, 96), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        out = _out((64, 96))
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(run(k, a), a.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_dma_copy_reshapes_equal_element_counts_and_dma_compute_adds():
    a = rand((4, 6))

    def k(a):
        t = nl.ndarray((2, 12), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        out = _out((2, 12))
        nisa.dma_copy(dst=out, src=t)
        nisa.dma_compute(dst=out, srcs=[t, out], reduce_op=nl.add)
        return out

    np.testing.assert_allclose(run(k, a), 2 * a.reshape(2, 12))


def test_indirect_dma_gather_embedding_rows():
    table = rand((50, 16))
    ids = np.array([[3], [0], [49], [7], [3]], dtype=np.int32)

    def k(table, ids):
        idx = nl.ndarray((5, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=ids)
        rows = nl.ndarray((5, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=table.ap([[16, 5], [1, 16]], vector_offset=idx, indirect_dim=0))
        out = _out((5, 16))
        nisa.dma_copy(dst=out, src=rows)
        return out

    np.testing.assert_array_equal(run(k, table, ids), table[ids[:, 0]])


def test_indirect_dma_scatter_and_oob_skip():
    ids = np.array([[1], [9], [0]], dtype=np.int32)  # 9 is out of range for 4 rows
    vals = rand((3, 8))

    def k(ids, vals):
        idx = nl.ndarray((3, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=ids)
        v = nl.ndarray((3, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=v, src=vals)
        out = nl.zeros((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out.ap([[8, 3], [1, 8]], vector_offset=idx), src=v, oob_mode=nisa.oob_mode.skip)
        return out

    got = run(k, ids, vals)
    want = np.zeros((4, 8), np.float32)
    want[1], want[0] = vals[0], vals[2]
    np.testing.assert_array_equal(got, want)


def test_dma_transpose_2d():
    a = rand((32, 48), "bfloat16")

    def k(a):
        t = nl.ndarray((48, 32), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a)
        out = _out((48, 32), nl.bfloat16)
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(f32(run(k, a)), f32(a).T)


def test_tensor_copy_casts_and_memset():
    a = rand((16, 8))

    def k(a):
        t = nl.load(a)
        h = nl.ndarray((16, 8), dtype=nl.float16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=h, src=t, engine=nisa.engine.scalar)
        z = nl.ndarray((16, 8), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=z, value=7, engine=nisa.engine.gpsimd)
        out, out2 = _out((16, 8), nl.float16), _out((16, 8), nl.int32)
        nisa.dma_copy(dst=out, src=h)
        nisa.dma_copy(dst=out2, src=z)
        return out, out2

    h, z = run(k, a)
    np.testing.assert_array_equal(h, a.astype(np.float16))
    assert (z == 7).all() and z.dtype == np.int32


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e4m3"])
def test_nc_matmul_psum_accumulation_over_k(dtype):
    lhsT, rhs = rand((256, 64), dtype, 1), rand((256, 200), dtype, 2)

    def k(lhsT, rhs):
        ps = nl.ndarray((64, 200), dtype=nl.float32, buffer=nl.psum)
        for i in range(2):
            s = nl.load(lhsT[i * 128:(i + 1) * 128, :])
            m = nl.load(rhs[i * 128:(i + 1) * 128, :])
            nisa.nc_matmul(dst=ps, stationary=s, moving=m)
        out = _out((64, 200))
        nisa.dma_copy(dst=out, src=nl.copy(ps))
        return out

    np.testing.assert_allclose(run(k, lhsT, rhs), f32(lhsT).T @ f32(rhs), rtol=1e-4, atol=1e-4)


def test_nc_matmul_accumulate_flags_and_eviction_closes_group():
    s, m = rand((32, 16), seed=3), rand((32, 8), seed=4)

    def k(s, m):
        st, mv = nl.load(s), nl.load(m)
        ps = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps, st, mv)  # overwrite (first of group)
        nisa.nc_matmul(ps, st, mv)  # accumulate
        first = nl.copy(ps)  # eviction closes the group
        nisa.nc_matmul(ps, st, mv)  # a new group: overwrite
        second = nl.copy(ps)
        nisa.nc_matmul(ps, st, mv, accumulate=True)
        third = nl.copy(ps)
        nisa.nc_matmul(ps, st, mv, accumulate=False)
        fourth = nl.copy(ps)
        outs = [_out((16, 8)) for _ in range(4)]
        for o, v in zip(outs, (first, second, third, fourth), strict=True):
            nl.store(o, v)
        return tuple(outs)

    ref = s.T @ m
    got = run(k, s, m)
    for g, factor in zip(got, (2, 1, 2, 1), strict=True):
        np.testing.assert_allclose(g, factor * ref, rtol=1e-5, atol=1e-5)


def test_nc_matmul_transpose_mode_is_bit_exact():
    a = rand((64, 32), "bfloat16")

    def k(a):
        t = nl.load(a)
        ident = nl.shared_identity_matrix(64, dtype=nl.bfloat16)
        ps = nl.ndarray((32, 64), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_matmul(ps, t, ident, is_transpose=True)
        out = _out((32, 64), nl.bfloat16)
        nl.store(out, nl.copy(ps))
        return out

    np.testing.assert_array_equal(f32(run(k, a)), f32(a).T)


@pytest.mark.parametrize("engine,shape", [(nisa.engine.tensor, (96, 80)), (nisa.engine.vector, (32, 20))])
def test_nc_transpose_engines(engine, shape):
    a = rand(shape)

    def k(a):
        t = nl.load(a)
        buf = nl.psum if engine is nisa.engine.tensor else nl.sbuf
        d = nl.ndarray((shape[1], shape[0]), dtype=nl.float32, buffer=buf)
        nisa.nc_transpose(dst=d, data=t, engine=engine)
        out = _out((shape[1], shape[0]))
        nl.store(out, nl.copy(d))
        return out

    np.testing.assert_array_equal(run(k, a), a.T)


def test_activation_scale_bias_and_reduce_registers():
    x, b = rand((8, 40), seed=5), rand((8, 1), seed=6)

    def k(x, b):
        xt, bt = nl.load(x), nl.load(b)
        y = nl.ndarray((8, 40), dtype=nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((8, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=y, op=nl.exp, data=xt, bias=bt, scale=2.0, reduce_op=nl.add, reduce_res=r,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        r2 = nl.ndarray((8, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=y, op=nl.exp, data=xt, bias=bt, scale=2.0, reduce_op=nl.add, reduce_res=r2,
                        reduce_cmd=nisa.reduce_cmd.reduce)  # adds on top of the registers
        r3 = nl.ndarray((8, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=y, op=nl.exp, data=xt, reduce_op=nl.add, reduce_res=r3, bias=bt, scale=xt[:, 0:1])
        outs = [_out((8, 40)), _out((8, 1)), _out((8, 1)), _out((8, 1))]
        for o, v in zip(outs, (y, r, r2, r3), strict=True):
            nl.store(o, v)
        return tuple(outs)

    y, r, r2, r3 = run(k, x, b)
    want = np.exp(2 * x + b)
    np.testing.assert_allclose(r, want.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(r2, 2 * want.sum(1, keepdims=True), rtol=1e-5)
    want3 = np.exp(x * x[:, :1] + b)
    np.testing.assert_allclose(y, want3, rtol=1e-5)
    np.testing.assert_allclose(r3, want3.sum(1, keepdims=True), rtol=1e-5)


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / 2**0.5))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("op,ref", [(nl.gelu, _gelu), (nl.silu, lambda x: x / (1 + np.exp(-x))),
                                    (nl.relu, lambda x: np.maximum(x, 0)), (nl.copy, lambda x: x), (np.tanh, np.tanh),
                                    (nl.rsqrt, lambda x: 1 / np.sqrt(x)), (nl.gelu_apprx_tanh, _gelu_tanh),
                                    (nl.softplus, lambda x: np.log1p(np.exp(x)))])
def test_activation_functions(op, ref):
    x = rand((4, 64), low=0.1, high=3.0)

    def k(x):
        t = nl.load(x)
        y = nl.ndarray((4, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=y, op=op, data=t)
        out = _out((4, 64))
        nl.store(out, y)
        return out

    np.testing.assert_allclose(run(k, x), ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op,ref", [(nl.add, np.add), (nl.subtract, np.subtract), (np.multiply, np.multiply),
                                    (nl.maximum, np.maximum), (nl.greater, lambda a, b: (a > b) * 1.0),
                                    (nl.power, lambda a, b: np.abs(a) ** b)])
def test_tensor_tensor_arith(op, ref):
    a, b = rand((8, 3, 5), seed=1), rand((8, 15), seed=2)
    if op is nl.power:
        a = np.abs(a)

    def k(a, b):
        ta, tb = nl.load(a), nl.load(b)
        d = nl.ndarray((8, 15), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=d, data1=ta, data2=tb, op=op)
        out = _out((8, 15))
        nl.store(out, d)
        return out

    np.testing.assert_allclose(run(k, a, b), ref(a.reshape(8, 15), b), rtol=1e-6)


def test_tensor_tensor_bitvec_on_int_patterns():
    a = np.array([[-1, 5, 12, -8]], dtype=np.int32)
    b = np.array([[1, 3, 2, 28]], dtype=np.int32)

    def k(a, b):
        ta, tb = nl.load(a), nl.load(b)
        outs = []
        for op in (nl.bitwise_and, nl.bitwise_xor, nl.right_shift, nl.left_shift):
            d = nl.ndarray((1, 4), dtype=nl.int32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=d, data1=ta, data2=tb, op=op)
            o = _out((1, 4), nl.int32)
            nl.store(o, d)
            outs.append(o)
        return tuple(outs)

    and_, xor, rshift, lshift = run(k, a, b)
    np.testing.assert_array_equal(and_, a & b)
    np.testing.assert_array_equal(xor, a ^ b)
    np.testing.assert_array_equal(rshift, (a.view(np.uint32) >> b.view(np.uint32)).view(np.int32))  # logical
    np.testing.assert_array_equal(lshift, a << b)


def test_tensor_scalar_two_ops_reverse_and_vector_operand():
    x, v = rand((8, 16), seed=1), rand((8, 1), seed=2)

    def k(x, v):
        t, vt = nl.load(x), nl.load(v)
        d = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=d, data=t, op0=nl.subtract, operand0=vt, reverse0=True, op1=nl.multiply, operand1=3.0)
        out = _out((8, 16))
        nl.store(out, d)
        return out

    np.testing.assert_allclose(run(k, x, v), (v - x) * 3.0, rtol=1e-6)


def test_scalar_tensor_tensor():
    x, y = rand((8, 16), seed=1), rand((8, 16), seed=2)

    def k(x, y):
        t, u = nl.load(x), nl.load(y)
        d = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=d, data=t, op0=nl.multiply, operand0=2.0, op1=nl.subtract, operand1=u,
                                  reverse1=True)
        out = _out((8, 16))
        nl.store(out, d)
        return out

    np.testing.assert_allclose(run(k, x, y), y - 2 * x, rtol=1e-6)


@pytest.mark.parametrize("axis,keep", [((2,), False), ((1, 2), True), (-1, True)])
def test_tensor_reduce_trailing_axes_negate(axis, keep):
    x = rand((8, 4, 6))
    ax = tuple(a % 3 for a in ((axis,) if isinstance(axis, int) else axis))
    want = -x.max(axis=ax, keepdims=True)
    shape = want.shape if keep else (8, 4) if ax == (2,) else (8, 1)

    def k(x):
        t = nl.load(x)
        d = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=d, op=nl.maximum, data=t, axis=axis, negate=True, keepdims=keep)
        out = _out(shape)
        nl.store(out, d)
        return out

    np.testing.assert_array_equal(run(k, x).reshape(-1), want.reshape(-1))


def test_tensor_tensor_scan_general_recurrence():
    d0, d1 = rand((4, 20), seed=1), rand((4, 20), seed=2)
    init = rand((4, 1), seed=3)

    def k(d0, d1, init):
        a, b, i = nl.load(d0), nl.load(d1), nl.load(init)
        d = nl.ndarray((4, 20), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=d, data0=a, data1=b, initial=i, op0=nl.multiply, op1=nl.add)
        out = _out((4, 20))
        nl.store(out, d)
        return out

    want = np.empty_like(d0)
    prev = init[:, 0]
    for j in range(20):
        prev = d0[:, j] * prev + d1[:, j]
        want[:, j] = prev
    np.testing.assert_allclose(run(k, d0, d1, init), want, rtol=1e-5, atol=1e-6)


def test_iota_and_affine_select_causal_mask():
    x = rand((8, 8))

    def k(x):
        t = nl.load(x)
        io = nl.ndarray((8, 8), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(io, [[1, 8]], offset=3, channel_multiplier=10)
        masked = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.sbuf)
        # keep column <= row: row - col >= 0
        nisa.affine_select(dst=masked, pattern=[[-1, 8]], channel_multiplier=1, on_true_tile=t,
                           on_false_value=-1e9, cmp_op=nl.greater_equal)
        o1, o2 = _out((8, 8), nl.int32), _out((8, 8))
        nl.store(o1, io)
        nl.store(o2, masked)
        return o1, o2

    io, masked = run(k, x)
    np.testing.assert_array_equal(io, 3 + 10 * np.arange(8)[:, None] + np.arange(8)[None, :])
    np.testing.assert_array_equal(masked, np.where(np.tril(np.ones((8, 8))) > 0, x, np.float32(-1e9)))


def test_reciprocal_bn_stats_bn_aggr():
    x = rand((8, 1000), low=0.5, high=2.0)

    def k(x):
        t = nl.load(x)
        r = nl.ndarray((8, 1000), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(r, t)
        stats = nl.ndarray((8, 2, 6), dtype=nl.float32, buffer=nl.sbuf)
        for c in range(2):
            nisa.bn_stats(dst=stats[:, c, :], data=t[:, c * 500:(c + 1) * 500])
        mv = nl.ndarray((8, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        o1, o2 = _out((8, 1000)), _out((8, 2))
        nl.store(o1, r)
        nl.store(o2, mv)
        return o1, o2

    r, mv = run(k, x)
    np.testing.assert_allclose(r, 1 / x, rtol=1e-6)
    np.testing.assert_allclose(mv[:, 0], x.mean(1), rtol=1e-5)
    np.testing.assert_allclose(mv[:, 1], x.var(1), rtol=1e-4)


def test_partition_reduce_max8_dropout_predicated_copy():
    x = rand((16, 32))

    def k(x):
        t = nl.load(x)
        pr = nl.ndarray((1, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(dst=pr, op=nl.add, data=t)
        m8 = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=m8, src=t)
        dz = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dropout(dst=dz, data=t, prob=1.0)
        pred = nl.ndarray((16, 32), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=pred, data=t, op0=nl.greater, operand0=0.0)
        sel = nl.zeros((16, 32), dtype=nl.float32)
        nisa.tensor_copy_predicated(dst=sel, src=t, predicate=pred)
        outs = [_out((1, 32)), _out((16, 8)), _out((16, 32)), _out((16, 32))]
        for o, v in zip(outs, (pr, m8, dz, sel), strict=True):
            nl.store(o, v)
        return tuple(outs)

    pr, m8, dz, sel = run(k, x)
    np.testing.assert_allclose(pr[0], x.sum(0), rtol=1e-5, atol=_sum_atol(x, axis=0))
    np.testing.assert_array_equal(m8, -np.sort(-x, axis=1)[:, :8])
    assert (dz == 0).all()
    np.testing.assert_array_equal(sel, np.where(x > 0, x, 0))


def test_enums_and_nc_version(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen2")
    seen = []

    def k():
        seen.append(nisa.get_nc_version())

    run(k)
    assert seen == [nisa.nc_version.gen2]
    assert nisa.engine.vector.value == 5 and nisa.reduce_cmd.reset_reduce.value == 3
    assert {m.name for m in nisa.dge_mode} == {"unknown", "swdge", "hwdge", "none"}
    assert nisa.oob_mode.skip and nisa.matmul_perf_mode.double_row and nisa.vector_engine is nisa.engine.vector


def test_tensor_scalar_reduce_select_reduce_range_select():
    x = rand((8, 16), seed=7)
    lo, hi = np.full((8, 1), 3.0, np.float32), np.arange(8, dtype=np.float32).reshape(8, 1) + 4

    def k(x, lo, hi):
        t, lt, ht = nl.load(x), nl.load(lo), nl.load(hi)
        d = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((8, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=d, data=t, op0=nl.multiply, operand0=2.0, reduce_op=nl.add, reduce_res=r)
        pred = nl.ndarray((8, 16), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=pred, data=t, op0=nl.greater, operand0=0.0)
        s = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        sm = nl.ndarray((8, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=s, predicate=pred, on_true=t, on_false=-5.0, reduce_res=sm,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce)
        g = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        gm = nl.ndarray((8, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.range_select(dst=g, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=lt, bound1=ht,
                          reduce_res=gm, reduce_cmd=nisa.reduce_cmd.reset_reduce, on_false_value=-1e30)
        outs = [_out((8, 16)), _out((8, 1)), _out((8, 16)), _out((8, 1)), _out((8, 16)), _out((8, 1))]
        for o, v in zip(outs, (d, r, s, sm, g, gm), strict=True):
            nl.store(o, v)
        return tuple(outs)

    d, r, s, sm, g, gm = run(k, x, lo, hi)
    np.testing.assert_allclose(d, 2 * x, rtol=1e-6)
    np.testing.assert_allclose(r[:, 0], (2 * x).sum(1), rtol=1e-5, atol=_sum_atol(2 * x, axis=1))
    np.testing.assert_array_equal(s, np.where(x > 0, x, -5.0))
    np.testing.assert_array_equal(sm[:, 0], np.where(x > 0, x, -5.0).max(1))
    idx = np.arange(16)[None, :]
    want = np.where((idx >= 3) & (idx < hi), x, np.float32(-1e30))
    np.testing.assert_array_equal(g, want)
    np.testing.assert_array_equal(gm[:, 0], want.max(1))


def test_exponential_is_trn3_only(monkeypatch):
    x = rand((4, 8))

    def k(x):
        t = nl.load(x)
        d = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.exponential(dst=d, src=t, max_value=1.0, reduce_res=s, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        o1, o2 = _out((4, 8)), _out((4, 1))
        nl.store(o1, d)
        nl.store(o2, s)
        return o1, o2

    with pytest.raises(nisa.NkiValidationError, match="trn3"):
        run(k, x)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    d, s = run(k, x)
    np.testing.assert_allclose(d, np.exp(x - 1), rtol=1e-6)
    np.testing.assert_allclose(s[:, 0], np.exp(x - 1).sum(1), rtol=1e-5)


def test_stream_shuffle_find_index8_match_replace8():
    x = np.arange(64 * 10, dtype=np.float32).reshape(64, 10) % 7
    mask = [31 - i for i in range(32)]
    mask[5] = 255

    def k(x):
        t = nl.load(x)
        sh = nl.zeros((64, 10), dtype=nl.float32)
        nisa.nc_stream_shuffle(dst=sh, src=t, shuffle_mask=mask)
        vals = nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=vals, src=x[:, 0:8])
        idx = nl.ndarray((64, 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=idx, data=t, vals=vals)
        rep = nl.ndarray((64, 10), dtype=nl.float32, buffer=nl.sbuf)
        ridx = nl.ndarray((64, 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=rep, data=t, vals=vals, imm=-1.0, dst_idx=ridx)
        outs = [_out((64, 10)), _out((64, 8), nl.uint32), _out((64, 10)), _out((64, 8), nl.uint32)]
        for o, v in zip(outs, (sh, idx, rep, ridx), strict=True):
            nl.store(o, v)
        return tuple(outs)

    sh, idx, rep, ridx = run(k, x)
    want = np.zeros_like(x)
    for q in (0, 32):
        for i, m in enumerate(mask):
            if m != 255:
                want[q + i] = x[q + m]
    np.testing.assert_array_equal(sh, want)
    first = np.array([[list(row).index(v) for v in row[:8]] for row in x])
    np.testing.assert_array_equal(idx, first)
    assert (rep == -1).sum(axis=1).min() >= 7  # eight values, duplicates replace successive occurrences
    np.testing.assert_array_equal(ridx[:, 0], first[:, 0])


def test_registers_drive_loops():
    def k(n):
        reg = nisa.register_alloc()
        nisa.register_load(reg, n)
        total = nl.zeros((1, 1), dtype=nl.float32)
        for _ in nl.dynamic_range(reg):
            nisa.tensor_scalar(dst=total, data=total, op0=nl.add, operand0=1.0)
        r2 = nisa.register_alloc(3)
        nisa.register_move(r2, 5)
        assert r2 * 2 + 1 == 11 and 20 - r2 == 15 and r2 < 6
        row = nl.load(n.reshape((1, 1))[0:1, nl.ds(r2 - 5, 1)])  # registers work as slice bounds
        nisa.tensor_tensor(dst=total, data1=total, data2=row, op=nl.add)
        wide = nl.zeros((1, 8), dtype=nl.float32)
        one = nl.ones((1, 1), dtype=nl.float32)
        nisa.tensor_copy(dst=wide[:, nl.ds(r2, 1)], src=one)
        nisa.tensor_copy(dst=total, src=wide.ap([[8, 1], [1, 1]], scalar_offset=r2, indirect_dim=1))  # total = 1
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.register_store(out, r2)
        o2 = _out((1, 1))
        nl.store(o2, total)
        return out, o2

    out, total = run(k, np.array([[4]], np.int32))
    assert out[0, 0] == 5 and total[0, 0] == 1


def test_dma_compute_sums_sources():
    a, b = rand((8, 8), seed=1), rand((8, 8), seed=2)

    def k(a, b):
        out = _out((8, 8))
        nisa.dma_compute(dst=out, srcs=[a, nl.load(b)], scales=[1.0, 1.0], reduce_op=nl.add)
        return out

    np.testing.assert_allclose(run(k, a, b), a + b, rtol=1e-6)


def test_auto_accumulation_groups_close_only_where_psum_is_read():
    s, m = rand((32, 16), seed=3), rand((32, 8), seed=4)

    def k(s, m):
        st, mv = nl.load(s), nl.load(m)
        ps = nl.ndarray((16, 2, 8), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps[:, 0, :], st, mv)
        nisa.nc_matmul(ps[:, 1, :], st, mv)
        first_half = nl.copy(ps[:, 0, :])  # evicts group 0 only
        nisa.nc_matmul(ps[:, 0, :], st, mv)  # new group: overwrite
        nisa.nc_matmul(ps[:, 1, :], st, mv)  # group 1 still open: accumulate
        o1, o2 = _out((16, 8)), _out((16, 2, 8))
        nl.store(o1, first_half)
        nl.store(o2, nl.copy(ps))
        return o1, o2

    first, both = run(k, s, m)
    ref = s.T @ m
    atol = _gemm_atol(s, m)  # K=32: ~4e-5; an accumulated group holds two such sums, so twice that
    # overwritten vs accumulated differs by |ref| per element: thousands of times the tolerance
    assert np.median(np.abs(ref)) > 1000 * 2 * atol
    np.testing.assert_allclose(first, ref, rtol=1e-5, atol=atol)
    np.testing.assert_allclose(both[:, 0], ref, rtol=1e-5, atol=atol)
    np.testing.assert_allclose(both[:, 1], 2 * ref, rtol=1e-5, atol=2 * atol)


def test_nc_matmul_multi_dim_operands_flatten_free_dims():
    s, m = rand((16, 2, 4), seed=1), rand((16, 3, 5), seed=2)

    def k(s, m):
        ps = nl.ndarray((8, 3, 5), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps, nl.load(s), nl.load(m))
        out = _out((8, 3, 5))
        nl.store(out, nl.copy(ps))
        return out

    got = run(k, s, m)
    lhs_t, rhs = s.reshape(16, 8), m.reshape(16, 15)
    np.testing.assert_allclose(got.reshape(8, 15), lhs_t.T @ rhs, rtol=1e-5, atol=_gemm_atol(lhs_t, rhs))
