"""nki.language convenience ops against NumPy, and the instructions they expand to."""

import math

import numpy as np
import pytest
from nki_helpers import f32, rand, run

import neuron_dynamo.nki.language as nl
from neuron_dynamo import nki


def _store(t):
    out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
    nl.store(out, t if t.buffer != nl.psum else nl.copy(t))
    return out


def test_creation_helpers():
    def k(a):
        t = nl.load(a)
        return tuple(_store(x) for x in (
            nl.zeros((2, 3), nl.float32), nl.ones((2, 3), nl.int32), nl.full((2, 3), 2.5, nl.bfloat16),
            nl.zeros_like(t), nl.empty_like(t, dtype=nl.int8), nl.rand((2, 3), nl.float32),
        )) + (nl.full((2, 2), 7, nl.int16, buffer=nl.shared_hbm), nl.shared_constant(np.eye(2, dtype=np.float32)))

    z, o, f, zl, el, r, hf, c = run(k, rand((2, 3)))

    def ident():
        return _store(nl.shared_identity_matrix(5)), _store(nl.shared_identity_matrix(4, dtype=nl.bfloat16))

    i8, i16 = run(ident)
    assert i8.dtype == np.uint8 and (i8 == np.eye(5)).all() and (f32(i16) == np.eye(4)).all()
    assert (z == 0).all() and (o == 1).all() and o.dtype == np.int32 and (f32(f) == 2.5).all()
    assert (zl == 0).all() and (el == 4).all() and ((r >= 0) & (r < 1)).all()
    assert (hf == 7).all() and (c == np.eye(2)).all()


@pytest.mark.parametrize("name,ref", [("add", np.add), ("subtract", np.subtract), ("multiply", np.multiply),
                                      ("maximum", np.maximum), ("minimum", np.minimum),
                                      ("less_equal", lambda a, b: (a <= b) * 1.0),
                                      ("logical_or", lambda a, b: ((a != 0) | (b != 0)) * 1.0)])
def test_binary_ops_tiles_and_scalars(name, ref):
    a, b = rand((8, 16), seed=1), rand((8, 16), seed=2)
    op = getattr(nl, name)

    def k(a, b):
        x, y = nl.load(a), nl.load(b)
        return _store(op(x, y)), _store(op(x, 0.25)), _store(op(0.25, y))

    tt, ts, st = run(k, a, b)
    np.testing.assert_allclose(tt, ref(a, b), rtol=1e-6)
    np.testing.assert_allclose(ts, ref(a, np.float32(0.25)), rtol=1e-6)
    np.testing.assert_allclose(st, ref(np.float32(0.25), b), rtol=1e-6)


def test_binary_result_dtype_and_power_of_tiles():
    def k(a, b):
        x, y = nl.load(a), nl.load(b)
        return _store(nl.add(x, y)), _store(nl.power(y, y)), _store(nl.multiply(x, y, dtype=nl.float32))

    a, b = rand((4, 4), "bfloat16"), rand((4, 4), low=0.5, high=2.0)
    s, p, m = run(k, a, b)
    assert s.dtype == np.float32 and p.dtype == np.float32 and m.dtype == np.float32
    np.testing.assert_allclose(p, b**b, rtol=1e-5)


@pytest.mark.parametrize("name,ref", [("exp", np.exp), ("log", np.log), ("sqrt", np.sqrt), ("rsqrt", lambda x: x**-0.5),
                                      ("sigmoid", lambda x: 1 / (1 + np.exp(-x))), ("square", np.square),
                                      ("reciprocal", lambda x: 1 / x), ("negative", np.negative),
                                      ("sin", np.sin), ("cos", np.cos), ("arctan", np.arctan), ("tanh", np.tanh),
                                      ("floor", np.floor), ("ceil", np.ceil), ("abs", np.abs), ("sign", np.sign),
                                      ("erf", np.vectorize(math.erf)), ("silu", lambda x: x / (1 + np.exp(-x))),
                                      ("relu", lambda x: np.maximum(x, 0)), ("logical_not", lambda x: (x == 0) * 1.0)])
def test_unary_ops(name, ref):
    x = rand((4, 32), low=0.1, high=2.0)

    def k(x):
        return _store(getattr(nl, name)(nl.load(x)))

    np.testing.assert_allclose(run(k, x), ref(x.astype(np.float64)), rtol=2e-6, atol=1e-6)


def test_nl_sin_cos_reduce_the_argument_range(caplog):
    x = np.array([[-20.0, -3.5, 0.0, 2.0, 9.0, 100.0]], np.float32)

    def k(x):
        t = nl.load(x)
        return _store(nl.sin(t)), _store(nl.cos(t))

    with caplog.at_level("WARNING", logger="neuron_dynamo.nki"):
        s, c = run(k, x)
    np.testing.assert_allclose(s, np.sin(x.astype(np.float64)), atol=1e-5)
    np.testing.assert_allclose(c, np.cos(x.astype(np.float64)), atol=1e-5)
    assert not [r for r in caplog.records if "valid ScalarE range" in r.getMessage()]


def test_invert_bitwise_on_ints():
    x = np.array([[0, 1, -2, 7]], np.int32)

    def k(x):
        return _store(nl.invert(nl.load(x)))

    np.testing.assert_array_equal(run(k, x), ~x)


@pytest.mark.parametrize("name,ref", [("sum", np.sum), ("max", np.max), ("min", np.min), ("mean", np.mean),
                                      ("prod", np.prod)])
@pytest.mark.parametrize("axis,keepdims", [([1, 2], False), ((2,), True), (-1, False)])
def test_reductions(name, ref, axis, keepdims):
    x = rand((8, 3, 5), low=0.5, high=1.5)
    ax = tuple(a % 3 for a in ((axis,) if isinstance(axis, int) else axis))

    def k(x):
        return _store(getattr(nl, name)(nl.load(x), axis=axis, keepdims=keepdims))

    got = run(k, x)
    want = ref(x, axis=ax, keepdims=keepdims)
    np.testing.assert_allclose(got.reshape(-1), want.reshape(-1), rtol=1e-5)


def test_var_all_and_reduce_axis_rules():
    x = rand((8, 64))

    def k(x):
        t = nl.load(x)
        return _store(nl.var(t, axis=1)), _store(nl.all(nl.greater(t, -2.0), axis=1))

    v, a = run(k, x)
    np.testing.assert_allclose(v[:, 0], x.var(1), rtol=1e-5)
    assert (a == 1.0).all()


def test_softmax_rms_norm_where_broadcast():
    x, w = rand((16, 64), seed=1), rand((1, 64), seed=2)

    def k(x, w):
        t, wt = nl.load(x), nl.load(w)
        sm = nl.softmax(t, axis=1)
        rn = nl.rms_norm(t, wt, axis=1, n=64, epsilon=1e-5)
        cond = nl.greater(t, 0.0)
        wh = nl.where(cond, t, 0.5)
        bw = nl.broadcast_to(wt, (16, 64))
        col = nl.broadcast_to(t[:, 0:1], (16, 4))
        ed = nl.expand_dims(t, 1)
        return _store(sm), _store(rn), _store(wh), _store(bw), _store(col), _store(nl.copy(ed))

    sm, rn, wh, bw, col, ed = run(k, x, w)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(rn, x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-5) * w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(wh, np.where(x > 0, x, 0.5))
    np.testing.assert_array_equal(bw, np.broadcast_to(w, (16, 64)))
    np.testing.assert_array_equal(col, np.broadcast_to(x[:, :1], (16, 4)))
    assert ed.shape == (16, 1, 64)


def test_load_store_copy_load_transpose2d_matmul_transpose():
    a, b = rand((64, 32), seed=1), rand((64, 96), seed=2)

    def k(a, b):
        x, y = nl.load(a), nl.load(b)
        prod = nl.matmul(x, y, transpose_x=True)  # PSUM [32, 96]
        tr = nl.transpose(x)  # PSUM [32, 64]
        return _store(prod), _store(tr)

    prod, tr = run(k, a, b)
    np.testing.assert_allclose(prod, a.T @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(tr, a.T)

    h = rand((16, 8), "bfloat16")

    def k2(h):
        return _store(nl.load_transpose2d(h)), _store(nl.load(h, dtype=nl.float32))

    t2, up = run(k2, h)
    np.testing.assert_array_equal(f32(t2), f32(h).T)
    np.testing.assert_array_equal(up, f32(h))


def test_program_ids_loops_and_device_print(capsys):
    seen = []

    def k(a):
        for i in nl.affine_range(2):
            for j in nl.sequential_range(1, 3):
                for s in nl.static_range(0, 4, 2):
                    seen.append((nl.program_id(0), nl.num_programs(), i, j, s))
        nl.fori_loop(0, 2, lambda i: seen.append(("fori", i)))
        with nl.no_reorder():
            nl.device_print("tile:", nl.load(a))

    run(k, rand((2, 2)))
    assert len(seen) == 2 * 2 * 2 + 2 and seen[0] == (0, 1, 0, 1, 0)
    assert "tile:" in capsys.readouterr().out


def test_nl_ops_expand_to_isa_instructions_in_the_profile():
    def k(a):
        t = nl.load(a)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.exp(nl.add(t, t)))
        return out

    _, profile = nki.jit(k).profile(rand((128, 512)))
    assert profile.instructions == {"dma_copy": 2, "tensor_tensor": 1, "activation": 1}


def test_gather_flattened_dropout_random_seed():
    data = rand((4, 10))
    idx = np.array([[9, 0, 3], [1, 1, 1], [0, 2, 4], [8, 7, 6]], np.int32)

    def k(data, idx):
        g = nl.gather_flattened(nl.load(data), nl.load(idx))
        nl.random_seed(7)
        kept = nl.dropout(nl.load(data), 0.0)
        dropped = nl.dropout(nl.load(data), 1.0)
        return _store(g), _store(kept), _store(dropped)

    g, kept, dropped = run(k, data, idx)
    np.testing.assert_array_equal(g, np.take_along_axis(data, idx, axis=1))
    np.testing.assert_array_equal(kept, data)
    assert (dropped == 0).all()


@pytest.mark.parametrize("name,ref", [("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or),
                                      ("bitwise_xor", np.bitwise_xor), ("left_shift", np.left_shift),
                                      ("right_shift", np.right_shift)])
def test_bitwise_binary_ops_on_int_tiles(name, ref):
    a = np.array([[1, 6, 255, 1024]], np.int32)
    b = np.array([[3, 1, 4, 2]], np.int32)

    def k(a, b):
        return _store(getattr(nl, name)(nl.load(a), nl.load(b)))

    np.testing.assert_array_equal(run(k, a, b), ref(a, b))


@pytest.mark.parametrize("name,ref", [("equal", np.equal), ("not_equal", np.not_equal), ("less", np.less),
                                      ("greater", np.greater), ("greater_equal", np.greater_equal),
                                      ("logical_and", lambda a, b: (a != 0) & (b != 0)),
                                      ("logical_xor", lambda a, b: (a != 0) ^ (b != 0))])
def test_other_binary_ops(name, ref):
    a = np.array([[-2.0, 0.0, 1.5, 3.0]], np.float32)
    b = np.array([[1.0, 0.0, 1.5, -4.0]], np.float32)

    def k(a, b):
        return _store(getattr(nl, name)(nl.load(a), nl.load(b)))

    np.testing.assert_array_equal(run(k, a, b), ref(a, b).astype(np.float32))


def test_buffers_program_ndim_and_nkiobject():
    seen = {}

    class Config(nl.NKIObject):
        scale = 2

    def k(a):
        seen["ndim"] = nl.program_ndim()
        seen["hbm"] = nl.hbm is nl.private_hbm
        t = nl.ndarray((2, 2), nl.float32, buffer=nl.hbm, address=None)
        seen["buffer"] = t.buffer
        seen["scale"] = Config().scale

    run(k, rand((2, 2)))
    assert seen == {"ndim": 1, "hbm": True, "buffer": nl.private_hbm, "scale": 2}
