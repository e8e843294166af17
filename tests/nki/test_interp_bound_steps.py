"""Instructions whose replayed steps are bound at record time (torch kernels, `out=` into dst, bit patterns and
integer comparisons without conversion) against NumPy and eager PyTorch, on the edge cases each shortcut must keep:
views without a [P, F] form, strided rows, overlapping operands, saturating casts, NaN. Every kernel runs twice, the
second call replaying the first's recording."""

import numpy as np
import pytest
import torch
from nki_helpers import rand

import neuron_dynamo.nki as ndk
import neuron_dynamo.nki.isa as nisa
import neuron_dynamo.nki.language as nl


def _out(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)


def _twice(fn, *args):
    """The results of a recorded call and of its replay (equal bit for bit), as NumPy arrays."""
    kernel = ndk.jit(fn)
    first, second = (kernel(*args) for _ in range(2))
    first, second = (tuple(map(np.asarray, out if isinstance(out, tuple) else (out,))) for out in (first, second))
    for a, b in zip(first, second, strict=True):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    return first


def test_bit_vector_ops_on_patterns_of_each_width():
    patterns = np.array([[0, 1, 0x7F, 0x80, 0xFF, 0x1234, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]], np.uint64)
    cases = [(nl.bitwise_and, -2), (nl.bitwise_xor, -1), (nl.bitwise_or, 0x101), (nl.right_shift, 3),
             (nl.right_shift, 40), (nl.left_shift, 5), (nl.left_shift, 33)]

    for dtype, width in ((np.int8, 8), (np.uint16, 16), (np.int32, 32)):
        x = (patterns & ((1 << width) - 1)).astype(np.dtype(f"uint{width}")).view(dtype)

        def k(x):
            t = nl.load(x)
            outs = []
            for op, value in cases:
                d = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=d, data=t, op0=op, operand0=value)
                o = _out(x.shape, x.dtype)
                nl.store(o, d)
                outs.append(o)
            return tuple(outs)

        unsigned = x.view(np.dtype(f"uint{width}")).astype(np.uint64)
        for got, (op, value) in zip(_twice(k, x), cases, strict=True):
            if op is nl.right_shift:
                want = unsigned >> np.uint64(value) if value < 64 else 0 * unsigned
            elif op is nl.left_shift:
                want = unsigned << np.uint64(value)
            else:
                ufunc = {nl.bitwise_and: np.bitwise_and, nl.bitwise_xor: np.bitwise_xor, nl.bitwise_or: np.bitwise_or}
                want = ufunc[op](unsigned, np.uint64(value % 2**64))
            want = (want & np.uint64((1 << width) - 1)).astype(np.dtype(f"uint{width}")).view(dtype)
            np.testing.assert_array_equal(got, want, err_msg=f"{dtype.__name__} {op.__name__} {value}")


def test_integer_comparisons_follow_fp32_values_and_int_stores_saturate():
    ints = np.array([[0, 3, -3, 2**24 + 1, 2**25 + 1, -(2**31), 2**31 - 1, 7]], np.int32)
    floats = np.array([[2.5, -3.5, np.nan, np.inf, -np.inf, 1e10, -1e10, 0.49999997]], np.float32)

    def k(ints, floats):
        ti, tf = nl.load(ints), nl.load(floats)
        outs = []
        for op, value in ((nl.equal, 0.0), (nl.less, 3.0), (nl.greater_equal, 0.5), (nl.equal, 2.0**25)):
            d = nl.ndarray(ints.shape, dtype=nl.uint8, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=d, data=ti, op0=op, operand0=value)
            outs.append(d)
        r = nl.ndarray(floats.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=tf, op0=nl.add, operand0=0.0)
        u = nl.ndarray(floats.shape, dtype=nl.uint8, buffer=nl.sbuf)
        nisa.tensor_copy(dst=u, src=tf)
        s = nl.ndarray(ints.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s, data1=ti, data2=ti, op=nl.add)
        results = []
        for v in (*outs, r, u, s):
            o = _out(v.shape, v.dtype)
            nl.store(o, v)
            results.append(o)
        return tuple(results)

    eq0, lt3, ge_half, eq_big, r, u, s = _twice(k, ints, floats)
    x = ints.astype(np.float32)
    np.testing.assert_array_equal(eq0, x == 0)
    np.testing.assert_array_equal(lt3, x < 3)
    np.testing.assert_array_equal(ge_half, x >= 0.5)
    np.testing.assert_array_equal(eq_big, x == np.float32(2**25))  # 2**25 + 1 rounds to 2**25 in fp32

    def saturate(v, dtype):
        info = np.iinfo(dtype)
        wide = np.clip(np.rint(v.astype(np.float64)), info.min, info.max)
        return np.where(np.isnan(wide), 0, wide).astype(dtype)

    np.testing.assert_array_equal(r, saturate(floats, np.int32))
    np.testing.assert_array_equal(u, saturate(floats, np.uint8))
    np.testing.assert_array_equal(s, saturate(x + x, np.int32))


def test_elementwise_on_strided_and_four_dim_views_with_overlap():
    x, c = rand((128, 256), seed=1, low=-4, high=4), rand((128, 1), seed=2)

    def k(x, c):
        t, ct = nl.load(x), nl.load(c)
        a = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=a, data=t[:, 0:256:4], op0=nl.multiply, operand0=0.5, op1=nl.maximum, operand1=-1.0)
        b = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=b, src=t)
        nisa.tensor_scalar(dst=b[:, 1:129], data=b[:, 0:128], op0=nl.subtract, operand0=ct, op1=nl.multiply,
                           operand1=2.0)  # dst overlaps data shifted by one column
        h = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=h, src=t)
        nisa.scalar_tensor_tensor(dst=h[:, 0:128], data=h[:, 0:128], op0=nl.multiply, operand0=2.0,
                                  op1=nl.subtract, operand1=h[:, 64:192])  # stage 2 reads what stage 1 writes
        q = t.reshape((128, 4, 2, 32))
        e = nl.ndarray((128, 4, 1, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=e, data1=q[:, :, 0:1, :], data2=q[:, :, 1:2, :], op=nl.subtract)
        m = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=m, data1=t[:, 0:256:2], data2=t[:, 1:256:2], op=nl.maximum)
        g = nl.ndarray((128, 4, 1, 32), dtype=nl.float32, buffer=nl.sbuf)
        row = t[:, 0:32].reshape((128, 1, 1, 32)).broadcast(1, 4)  # stride 0 across dim 1
        nisa.tensor_tensor(dst=g, data1=q[:, :, 1:2, :], data2=row, op=nl.multiply)
        outs = []
        for v in (a, b, h, e, m, g):
            o = _out(v.shape)
            nl.store(o, v)
            outs.append(o)
        return tuple(outs)

    a, b, h, e, m, g = _twice(k, x, c)
    np.testing.assert_array_equal(a, np.maximum(x[:, ::4] * np.float32(0.5), np.float32(-1)))
    want_b = x.copy()
    want_b[:, 1:129] = (x[:, 0:128] - c) * np.float32(2)
    np.testing.assert_array_equal(b, want_b)
    want_h = x.copy()
    want_h[:, 0:128] = x[:, 0:128] * np.float32(2) - x[:, 64:192]
    np.testing.assert_array_equal(h, want_h)
    q = x.reshape(128, 4, 2, 32)
    np.testing.assert_array_equal(e, q[:, :, 0:1, :] - q[:, :, 1:2, :])
    np.testing.assert_array_equal(m, np.maximum(x[:, 0::2], x[:, 1::2]))
    np.testing.assert_array_equal(g, q[:, :, 1:2, :] * x[:, None, None, 0:32])


def _eager(name, x):
    t = torch.from_numpy(x).requires_grad_(name.endswith("_dx"))
    fn = {"sigmoid": torch.sigmoid, "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
          "softplus": torch.nn.functional.softplus, "mish": torch.nn.functional.mish, "erf": torch.erf,
          "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "exp": torch.exp}[name.removesuffix("_dx")]
    y = fn(t)
    if name.endswith("_dx"):
        (y,) = torch.autograd.grad(y.sum(), t)
    return y.detach().numpy()


@pytest.mark.parametrize("name", ["sigmoid", "silu", "silu_dx", "gelu", "gelu_dx", "softplus", "mish", "erf",
                                  "rsqrt", "reciprocal", "exp"])
def test_activations_match_eager_pytorch(name):
    x, b = rand((128, 96), seed=3, low=0.05, high=3.0), rand((128, 1), seed=4, low=-0.04, high=0.04)
    if name not in ("rsqrt", "reciprocal"):
        x = x * np.where(rand((128, 96), seed=5) > 0, 1, -8).astype(np.float32)  # negatives and tails
    op = getattr(nl, name)

    def k(x, b):
        t, bt = nl.load(x), nl.load(b)
        wide = nl.ndarray((128, 192), dtype=nl.float32, buffer=nl.sbuf)  # dst with strided rows
        r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=wide[:, 0:96], op=op, data=t, bias=bt, scale=0.5, reduce_op=nl.add, reduce_res=r,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        h = nl.ndarray((128, 96), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.activation(dst=h, op=op, data=t)
        s = nl.ndarray((128, 97), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s[:, 0:96], src=t)
        nisa.activation(dst=s[:, 1:97], op=op, data=s[:, 0:96])  # data overlaps dst, shifted by one column
        outs = [_out((128, 96)), _out((128, 1)), _out((128, 96), nl.bfloat16), _out((128, 96))]
        for o, v in zip(outs, (wide[:, 0:96], r, h, s[:, 1:97]), strict=True):
            nl.store(o, v)
        return tuple(outs)

    y, r, h, shifted = _twice(k, x, b)
    want = _eager(name, x * np.float32(0.5) + b)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=2e-6)
    np.testing.assert_allclose(r[:, 0], want.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h.astype(np.float32), _eager(name, x), rtol=8e-3, atol=1e-6)
    np.testing.assert_allclose(shifted, _eager(name, x), rtol=1e-6, atol=2e-6)


def test_sum_reduce_and_predicated_copy_into_dst():
    x = rand((64, 4, 16), seed=6)
    pred = (rand((64, 64), seed=7) > 0).astype(np.uint8) * 3

    def k(x, pred):
        t, pt = nl.load(x), nl.load(pred)
        s = nl.ndarray((64, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=s, op=nl.add, data=t, axis=(2,), negate=True)
        c = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=c, value=5.0)
        nisa.tensor_copy_predicated(dst=c, src=t.reshape((64, 64)), predicate=pt, reverse_pred=True)
        nisa.tensor_copy_predicated(dst=c[:, 0:8], src=-2.0, predicate=pt[:, 0:8])
        outs = [_out((64, 4)), _out((64, 64))]
        for o, v in zip(outs, (s, c), strict=True):
            nl.store(o, v)
        return tuple(outs)

    s, c = _twice(k, x, pred)
    np.testing.assert_allclose(s, -x.sum(2), rtol=1e-6, atol=1e-6)
    want = np.where(pred == 0, x.reshape(64, 64), np.float32(5))
    want[:, :8] = np.where(pred[:, :8] != 0, np.float32(-2), want[:, :8])
    np.testing.assert_array_equal(c, want)
