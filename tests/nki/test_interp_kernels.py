"""Tutorial-style kernels (tutorial_kernels.py, plain `import nki` source) against NumPy over shapes and dtypes;
entry-point behaviour: torch/NumPy in and out, tuples, LNC 2, in-place inputs, profiles."""

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from nki_helpers import TOL, f32, rand

from neuron_dynamo import nki

nki.make_importable()
import tutorial_kernels as tk  # noqa: E402  (needs `import nki` to resolve to the interpreter)

DTYPES = st.sampled_from(["float32", "bfloat16"])
SETTINGS = settings(max_examples=6, deadline=None)


@SETTINGS
@given(m=st.integers(1, 300), n=st.integers(1, 96), dtype=DTYPES)
def test_tensor_add(m, n, dtype):
    a, b = rand((m, n), dtype, 1), rand((m, n), dtype, 2)
    np.testing.assert_array_equal(f32(tk.tensor_add(a, b)), f32((f32(a) + f32(b)).astype(a.dtype)))


@SETTINGS
@given(k=st.sampled_from([128, 256, 384]), m=st.sampled_from([128, 256]), n=st.sampled_from([64, 512, 1024]),
       dtype=DTYPES)
def test_tiled_matmul_accumulates_over_k_in_psum(k, m, n, dtype):
    lhs_t, rhs = rand((k, m), dtype, 1), rand((k, n), dtype, 2)
    want = f32(lhs_t).T.astype(np.float64) @ f32(rhs)
    got = f32(tk.tiled_matmul(lhs_t, rhs))
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * np.sqrt(k))


@SETTINGS
@given(p=st.integers(1, 128), f=st.integers(1, 128), dtype=st.sampled_from(["float32", "bfloat16", "float16"]))
def test_transpose_through_nc_transpose(p, f, dtype):
    a = rand((p, f), dtype)
    np.testing.assert_array_equal(f32(tk.transpose(a)), f32(a).T)


@SETTINGS
@given(m=st.integers(1, 200), n=st.integers(2, 512), dtype=DTYPES)
def test_softmax(m, n, dtype):
    x = rand((m, n), dtype, low=-4, high=4)
    xf = f32(x).astype(np.float64)
    e = np.exp(xf - xf.max(1, keepdims=True))
    np.testing.assert_allclose(f32(tk.softmax(x)), e / e.sum(1, keepdims=True), rtol=TOL[dtype], atol=1e-6)


@SETTINGS
@given(m=st.integers(1, 200), n=st.integers(1, 512), dtype=DTYPES)
def test_rmsnorm(m, n, dtype):
    x, w = rand((m, n), dtype, 1), rand((1, n), dtype, 2)
    xf = f32(x).astype(np.float64)
    want = xf / np.sqrt((xf * xf).mean(1, keepdims=True) + 1e-6) * f32(w)
    np.testing.assert_allclose(f32(tk.rmsnorm(x, w, 1e-6)), want, rtol=TOL[dtype] * 2, atol=TOL[dtype])


@SETTINGS
@given(m=st.integers(1, 160), n=st.integers(1, 700), dtype=DTYPES)
def test_cumsum_through_tensor_tensor_scan(m, n, dtype):
    x = rand((m, n), dtype)
    want = np.cumsum(f32(x).astype(np.float64), axis=1)
    np.testing.assert_allclose(f32(tk.cumsum(x)), want, rtol=TOL[dtype], atol=TOL[dtype] * np.sqrt(n))


def test_torch_in_torch_out_bf16_and_tuple_outputs():
    a = torch.randn(130, 40, dtype=torch.bfloat16)
    b = torch.randn(130, 40, dtype=torch.bfloat16)
    got = tk.tensor_add(a, b)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got, (a.float() + b.float()).to(torch.bfloat16), rtol=0, atol=0)

    import nki.language as nl

    @nki.jit
    def two(a):
        o1 = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(o1, t)
        nl.store(o2, t)
        return o1, o2

    r = two(a[:64])
    assert isinstance(r, tuple) and len(r) == 2 and r[1].dtype == torch.float32
    r = two(f32(a[:64].float().numpy()))
    assert isinstance(r[0], np.ndarray)


def test_lnc2_program_instances_share_outputs_and_profile_combines():
    a = rand((256, 64))
    got = tk.lnc_scale[2](a, 3.0)
    np.testing.assert_allclose(got, 3 * a, rtol=1e-6)
    _, p1 = tk.lnc_scale.profile(a[:128], 3.0)
    _, p2 = tk.lnc_scale[2].profile(a, 3.0)
    assert p2.instructions["dma_copy"] == 4 and p2.cores == 2
    assert p1.instructions["dma_copy"] == 2
    sim = nki.simulate(tk.lnc_scale[2], profile=True)
    out, prof = sim(a, 3.0)
    np.testing.assert_allclose(out, 3 * a, rtol=1e-6)
    assert prof.estimated_ns > 0


def test_inputs_written_by_the_kernel_are_updated_in_place():
    a = rand((8, 8))
    before = a.copy()
    assert tk.scale_in_place(a, 2.0) is None
    np.testing.assert_allclose(a, 2 * before)
    t = torch.ones(4, 4, dtype=torch.bfloat16)
    tk.scale_in_place(t, 0.5)
    assert (t == 0.5).all()


def test_failed_kernel_leaves_inputs_untouched():
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def bad(a):
        t = nl.load(a)
        nisa.memset(t, 0.0)
        nisa.dma_copy(dst=a, src=t)
        nl.divide(t, t)

    a = rand((4, 4))
    before = a.copy()
    with pytest.raises(nki.NkiValidationError):
        bad(a)
    np.testing.assert_array_equal(a, before)


def test_matmul_profile_counts_instructions_and_flops():
    lhs_t, rhs = rand((256, 128), "bfloat16"), rand((256, 1024), "bfloat16")
    _, prof = tk.tiled_matmul.profile(lhs_t, rhs)
    assert prof.instructions == {"dma_copy": 2 * 2 * 2 + 2, "nc_matmul": 4, "tensor_copy": 2}
    assert prof.matmul_flops == 2 * 256 * 128 * 1024
    assert 0 < prof.tensor_utilisation <= 1


def test_fp8_inputs_are_rounded_on_the_way_in():
    a = rand((128, 128), "float8_e4m3")
    b = np.eye(128, dtype=np.float32).astype(ml_dtypes.float8_e4m3)
    np.testing.assert_array_equal(f32(tk.tiled_matmul(a, b)), f32(a).T.astype(ml_dtypes.float8_e4m3).astype(
        np.float32))


def test_lnc2_core_barrier_orders_writes_and_sendrecv_exchanges_tiles():
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def exchange(a):
        m, n = a.shape
        half = m // 2
        pid = nl.program_id(0)
        scratch = nl.ndarray((m, n), dtype=a.dtype, buffer=nl.shared_hbm)
        out = nl.ndarray((m, n), dtype=a.dtype, buffer=nl.shared_hbm)
        swapped = nl.ndarray((m, n), dtype=a.dtype, buffer=nl.shared_hbm)
        mine = nl.load(a[pid * half:(pid + 1) * half, :])
        nisa.dma_copy(dst=scratch[pid * half:(pid + 1) * half, :], src=mine)
        nisa.core_barrier(scratch, (0, 1))
        other = nl.load(scratch[(1 - pid) * half:(2 - pid) * half, :])  # written by the other instance
        nisa.dma_copy(dst=out[pid * half:(pid + 1) * half, :], src=other)
        got = nl.ndarray((half, n), dtype=a.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=mine, dst=got, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
        nisa.dma_copy(dst=swapped[pid * half:(pid + 1) * half, :], src=got)
        return out, swapped

    a = rand((64, 8))
    want = np.concatenate([a[32:], a[:32]])
    for got in exchange[2](a):
        np.testing.assert_array_equal(got, want)

    @nki.jit
    def unbalanced(a):
        if nl.program_id(0) == 1:
            nisa.core_barrier(a, (0, 1))

    with pytest.raises(nki.NkiValidationError, match="finished without reaching"):
        unbalanced[2](a)

    @nki.jit
    def unbalanced_first(a):
        if nl.program_id(0) == 0:
            nisa.core_barrier(a, (0, 1))

    with pytest.raises(nki.NkiValidationError, match="finished without reaching"):
        unbalanced_first[2](a)
    with pytest.raises(nki.NkiValidationError, match="LNC=2 launch"):
        exchange(a)


def test_returning_one_tensor_twice_gives_independent_arrays():
    import nki.language as nl

    @nki.jit
    def twice(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out, out

    x, y = twice(rand((4, 4)))
    x[...] = 0
    assert (y != 0).any()


def test_torch_thread_count_is_restored_after_a_run():
    before = torch.get_num_threads()
    tk.tensor_add(rand((4, 4)), rand((4, 4)))
    with pytest.raises(nki.NkiValidationError):
        tk.transpose(rand((200, 4)))
    assert torch.get_num_threads() == before
