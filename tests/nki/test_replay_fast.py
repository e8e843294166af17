"""The lean replay paths: steps that bind their views once and compute straight into dst (`out=`), the matmul's
bound GEMM and scratch buffer, the identity matmul without its GEMM, max/min reductions by torch, the accumulation
group's dropped fill, and the launch scope.

Every check records a kernel at one input, replays it at another and compares with a full run of that input
(`NEURON_DYNAMO_NKI_REPLAY=0`) bit for bit (`check_replay`); the kernels below also compare the values with a NumPy
reference of the documented semantics (nki.isa nc_matmul: `dst = stationary.T @ moving`, accumulated in fp32 PSUM;
tensor_scalar: `(data op0 operand0) op1 operand1`; activation: `op(data * scale + bias)` with the add-reduce into
`reduce_res`; nc_transpose swaps partition and free dims).
"""

import numpy as np
import pytest
import torch

import neuron_dynamo.nki as ndk
from neuron_dynamo.nki import replay, runtime
from neuron_dynamo.toolchain.simulator import SimulatorRegion

ndk.make_importable()

import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
from test_replay import LIBRARY, _bits, _fresh, check_replay, randn  # noqa: E402


@ndk.jit
def _accumulated_matmul(lhs_t, rhs):
    """out[M, N] = lhs_t.T @ rhs over two K tiles accumulated in one PSUM tile; rhs read through a strided view
    (every other column), the result evacuated with a cast to the input dtype."""
    k, m = lhs_t.shape
    n = rhs.shape[1] // 2
    out = nl.ndarray((m, n), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(k // 128):
        a = nl.ndarray((128, m), dtype=lhs_t.dtype, buffer=nl.sbuf)
        b = nl.ndarray((128, 2 * n), dtype=rhs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=lhs_t[i * 128:(i + 1) * 128, :])
        nisa.dma_copy(dst=b, src=rhs[i * 128:(i + 1) * 128, :])
        nisa.nc_matmul(dst=acc, stationary=a, moving=b[:, 0:2 * n:2])
    res = nl.ndarray((m, n), dtype=lhs_t.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


@ndk.jit
def _vector_scalar(x, dst_dtype):
    """tensor_scalar with ufunc stages (in place in an fp32 dst) and with a comparison (its 1.0/0.0 straight into
    the fp32 dst), a
    tensor_tensor and an exp activation with scale, bias tile and add-reduce, a TensorE transpose."""
    p, f = x.shape
    t = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    scaled = nl.ndarray((p, f), dtype=dst_dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=scaled, data=t, op0=nl.multiply, operand0=0.5, op1=nl.maximum, operand1=-0.25)
    mask = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=mask, data=t, op0=nl.greater, operand0=0.0)
    both = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=both, data1=scaled, data2=mask, op=nl.add)
    bias = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=bias, value=-1.0)
    e = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    total = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=both, bias=bias, scale=0.5, reduce_op=nl.add, reduce_res=total,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    tr = nl.ndarray((f, p), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=tr, data=e)
    out_t = nl.ndarray((f, p), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out_t, src=tr)
    out = nl.ndarray((f, p), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=out_t)
    sums = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=sums, src=total)
    return out, sums


def _bf16_round(values: np.ndarray) -> np.ndarray:
    return torch.from_numpy(values).to(torch.bfloat16).float().numpy()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_accumulated_matmul_replays_bit_identically(dtype, monkeypatch):
    check_replay(_accumulated_matmul, lambda s: (randn(256, 128, seed=s, dtype=dtype),
                                                 randn(256, 128, seed=s + 9, dtype=dtype)), monkeypatch)


def test_accumulated_matmul_computes_the_documented_product():
    lhs_t, rhs = randn(256, 96, seed=3), randn(256, 128, seed=4)
    k = _fresh(_accumulated_matmul)
    for _ in range(2):  # the full run, then the replay
        got = k(lhs_t, rhs).numpy()
        part = [lhs_t[i:i + 128].numpy().T.astype(np.float64) @ rhs[i:i + 128, ::2].numpy() for i in (0, 128)]
        np.testing.assert_allclose(got, part[0] + part[1], rtol=1e-5, atol=1e-4)


def test_accumulation_group_fill_is_not_replayed():
    """The first matmul of the group overwrites the whole PSUM tile; the second reads only bytes it wrote, so the
    tile's NaN fill is unobservable and a replay skips it."""
    k = _fresh(_accumulated_matmul)
    k(randn(256, 128, seed=1), randn(256, 128, seed=2))
    (program,) = k._programs.values()
    assert program.fills_dropped >= 1
    assert not any(getattr(fn, "__qualname__", "").startswith("Recording.allocated") for fn in program.steps)


@pytest.mark.parametrize("dst_dtype", [nl.float32, nl.bfloat16])
def test_vector_and_scalar_steps_replay_bit_identically(dst_dtype, monkeypatch):
    check_replay(_vector_scalar, lambda s: (randn(128, 64, seed=s), dst_dtype), monkeypatch)


def test_vector_and_scalar_steps_compute_the_documented_values():
    x = randn(128, 64, seed=5)
    k = _fresh(_vector_scalar)
    xs = x.numpy()
    both = np.maximum(xs * np.float32(0.5), np.float32(-0.25)) + (xs > 0).astype(np.float32)
    e = np.exp(both * np.float32(0.5) + np.float32(-1.0))
    for _ in range(2):
        out, sums = k(x, nl.float32)
        np.testing.assert_allclose(out.numpy(), e.T, rtol=1e-6)
        np.testing.assert_allclose(sums.numpy()[:, 0], e.sum(axis=1), rtol=1e-5)


@pytest.mark.parametrize("kernel, make_args", LIBRARY[:4], ids=lambda x: getattr(x, "__name__", ""))
def test_library_kernels_replay_through_the_lean_steps(kernel, make_args, monkeypatch):
    """The same library kernels as test_replay, with bf16 inputs where the kernel takes them (the cast paths)."""

    def bf16_args(s):
        return tuple(a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                     for a in make_args(s))

    check_replay(kernel, bf16_args, monkeypatch)


def _full_run(monkeypatch, kernel, *args):
    with monkeypatch.context() as m:
        m.setenv(replay.ENV, "0")
        return _fresh(kernel)(*args)


def test_a_new_shape_or_dtype_records_again(monkeypatch):
    k = _fresh(_accumulated_matmul)
    k(randn(256, 128, seed=1), randn(256, 128, seed=2))
    k(randn(128, 128, seed=1), randn(128, 128, seed=2))
    k(randn(128, 128, seed=1, dtype=torch.bfloat16), randn(128, 128, seed=2, dtype=torch.bfloat16))
    assert len(k._programs.values()) == 3


def test_a_launch_keys_its_plain_arguments_as_static_key_does():
    """The launch path keys tensors and plain scalars inline: the key must stay the one `replay.static_key` gives,
    so 1 and True (or 1 and 1.0) remain different compile-time arguments with their own recordings."""
    x = randn(128, 128, seed=1)
    plain = (1, True, None, "none", 1.0, (2, False))
    tensors: list = []
    key = runtime._signature((x, *plain), {}, "trn2", 1, tensors)
    assert len(tensors) == 1 and tensors[0] is x
    assert key[2][0] == ("torch", x.dtype, x.shape)
    assert key[2][1:] == tuple(replay.static_key(v) for v in plain)
    assert len({key[2][1], key[2][2], key[2][5]}) == 3


def test_strided_and_aliased_arguments_replay_as_the_full_run(monkeypatch):
    """A kernel reads its own contiguous copy of every argument, so a caller's strides or two arguments sharing
    memory change nothing the recorded stream depends on: the replay loads the values and matches a full run."""
    k = _fresh(_accumulated_matmul)
    k(randn(256, 128, seed=1), randn(256, 128, seed=2))
    wide = randn(256, 256, seed=3)
    strided = (wide[:, :128], wide[:, 128:].T.contiguous().T)  # non-contiguous views of the recorded shapes
    aliased = (wide[:, :128], wide[:, :128])  # both arguments the same memory
    for args in (strided, aliased):
        assert _bits(k(*args)) == _bits(_full_run(monkeypatch, _accumulated_matmul, *args))
    assert len(k._programs.values()) == 1 and k._programs.values()[0] is not None


def test_the_launch_scope_reads_the_environment_once_per_region(monkeypatch):
    """Inside a compiled region the replay switch is read when the region starts; outside, at every launch."""
    x = (randn(128, 64, seed=1), nl.float32)
    k = _fresh(_vector_scalar)
    with runtime.launch_scope():
        k(*x)
        monkeypatch.setenv(replay.ENV, "0")
        k(*x)  # still replaying: the switch was read at the scope's start
        assert len(k._programs.values()) == 1
    k2 = _fresh(_vector_scalar)
    k2(*x)
    assert k2._programs.values() == []


def test_a_region_pins_torch_to_one_thread_for_all_its_launches():
    before = torch.get_num_threads()
    seen = []

    class Lowered(torch.nn.Module):
        def forward(self, a):
            seen.append(torch.get_num_threads())
            out = _accumulated_matmul(a, a)
            seen.append(torch.get_num_threads())
            return out

    SimulatorRegion(Lowered())(randn(256, 128, seed=1))
    assert seen == [1, 1] and torch.get_num_threads() == before


@ndk.jit
def _half_swap(x):
    """Writes and reads 3-D views that NumPy cannot flatten to [P, F] without a copy (every other half-row, as
    RoPE's rotation does): a step must not bind such a copy."""
    p, t, d = x.shape
    h = d // 2
    a = nl.ndarray((p, t, d), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    y = nl.ndarray((p, t, d), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=y[:, :, 0:h], data1=a[:, :, h:d], data2=a[:, :, 0:h], op=nl.subtract)
    nisa.tensor_scalar(dst=y[:, :, h:d], data=a[:, :, 0:h], op0=nl.multiply, operand0=2.0)
    out = nl.ndarray((p, t, d), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=y)
    return out


def test_views_that_reshape_only_by_copying_are_read_and_written_in_place(monkeypatch):
    x = randn(128, 4, 8, seed=2)
    got = _fresh(_half_swap)(x).numpy()
    xs = x.numpy()
    np.testing.assert_array_equal(got[:, :, :4], xs[:, :, 4:] - xs[:, :, :4])
    np.testing.assert_array_equal(got[:, :, 4:], xs[:, :, :4] * np.float32(2.0))
    check_replay(_half_swap, lambda s: (randn(128, 4, 8, seed=s),), monkeypatch)


@ndk.jit
def _identity_accumulate(q_t, k_t, mask, stationary=None):
    """scores = q_tᵀ k_t in PSUM, then stationaryᵀ @ mask accumulated into it (the attention kernels add their masks
    with the identity as stationary: `nl.shared_identity_matrix` unless a stationary is passed), evicted to HBM."""
    d, m = q_t.shape
    n = k_t.shape[1]
    a = nl.ndarray((d, m), dtype=q_t.dtype, buffer=nl.sbuf)
    b = nl.ndarray((d, n), dtype=k_t.dtype, buffer=nl.sbuf)
    mk = nl.ndarray((m, n), dtype=mask.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=q_t)
    nisa.dma_copy(dst=b, src=k_t)
    nisa.dma_copy(dst=mk, src=mask)
    if stationary is None:
        ident = nl.shared_identity_matrix(m, dtype=nl.float32)
    else:
        ident = nl.ndarray((m, m), dtype=stationary.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ident, src=stationary)
    scores = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=scores, stationary=a, moving=b)
    nisa.nc_matmul(dst=scores, stationary=ident, moving=mk, accumulate=True)
    res = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=scores)
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def _masked_args(seed, bad=None):
    """q_t [16, 64], k_t [16, 96] and a finite mask [64, 96] (-30000 on masked scores); `bad` puts that value at
    mask[5, 7]."""
    mask = torch.where(randn(64, 96, seed=seed + 2) > 0, 0.0, -30000.0)
    if bad is not None:
        mask[5, 7] = bad
    return randn(16, 64, seed=seed), randn(16, 96, seed=seed + 1), mask


def _gemm_count(monkeypatch) -> list:
    calls = []
    mm = torch.mm

    def counted(*args, **kwargs):
        calls.append(1)
        return mm(*args, **kwargs)

    monkeypatch.setattr(torch, "mm", counted)
    return calls


@pytest.mark.parametrize("bad", [None, float("inf"), float("-inf"), float("nan")])
def test_identity_accumulation_is_the_documented_product(bad, monkeypatch):
    """`dst += stationary.T @ moving` (nc_matmul) with the identity as stationary: the mask itself while it is
    finite, without a GEMM; a non-finite entry makes its whole column non-finite (0 · inf is NaN), as the GEMM
    computes it."""
    q_t, k_t, mask = _masked_args(3, bad)
    with np.errstate(invalid="ignore"):
        want = q_t.numpy().T @ k_t.numpy() + np.eye(64, dtype=np.float32).T @ mask.numpy()
    k = _fresh(_identity_accumulate)
    gemms = _gemm_count(monkeypatch)
    for _ in range(2):  # the full run, then the replay
        got = k(q_t, k_t, mask).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        assert np.isfinite(got[:, 7]).any() == (bad is None)
    assert len(gemms) == (2 if bad is None else 4)  # one GEMM per call while the mask is finite


@pytest.mark.parametrize("bad", [None, float("inf")])
def test_identity_accumulation_replays_as_the_full_run(bad, monkeypatch):
    """Recorded with a finite mask, replayed with a finite one or one holding inf: both equal a full run."""
    check_replay(_identity_accumulate, lambda s: _masked_args(s, bad if s == 2 else None), monkeypatch)


def test_a_stationary_that_stops_being_the_identity_takes_the_gemm(monkeypatch):
    """The stationary was the identity when the call was recorded and is another matrix at the replay: the replay
    computes the GEMM, as the full run does."""
    def make_args(s):
        stationary = torch.eye(64) if s == 1 else randn(64, 64, seed=s + 5)
        return (*_masked_args(s), stationary)

    check_replay(_identity_accumulate, make_args, monkeypatch)


@ndk.jit
def _extremes(x):
    """Row max, negated row min (tensor_reduce) of an fp32 tile, and the row max of its bf16 copy."""
    p, f = x.shape
    t = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    low = nl.ndarray((p, f), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=low, src=t)
    red = nl.ndarray((p, 3), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=red[:, 0:1], op=nl.maximum, data=t, axis=(1,))
    nisa.tensor_reduce(dst=red[:, 1:2], op=nl.minimum, data=t, axis=(1,), negate=True)
    nisa.tensor_reduce(dst=red[:, 2:3], op=nl.maximum, data=low, axis=(1,))
    out = nl.ndarray((p, 3), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=red)
    return out


def test_max_and_min_reductions_are_numpys(monkeypatch):
    """nisa.tensor_reduce with maximum/minimum: the row's max and min, NaN when the row holds a NaN."""
    x = randn(128, 40, seed=4)
    x[3, 17] = float("nan")
    xs = x.numpy()
    want = np.stack([xs.max(axis=1), -xs.min(axis=1), _bf16_round(xs).max(axis=1)], axis=1)
    k = _fresh(_extremes)
    for _ in range(2):
        np.testing.assert_array_equal(k(x).numpy(), want)
    check_replay(_extremes, lambda s: (randn(128, 40, seed=s),), monkeypatch)


@ndk.jit
def _activations_in_place(x):
    """activation in place (data is dst) with a bias column of dst's own tile and a scale, then a copy activation
    with a scale, a bias tile and the add-reduce (ScalarE computing into an fp32 dst stage by stage)."""
    p, f = x.shape
    t = nl.ndarray((p, f + 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0:f], src=x)
    nisa.memset(dst=t[:, f:f + 1], value=0.25)
    nisa.activation(dst=t[:, 0:f], op=nl.exp, data=t[:, 0:f], bias=t[:, f:f + 1], scale=0.5)
    bias = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=bias, value=-1.0)
    u = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    total = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=u, op=nl.copy, data=t[:, 0:f], bias=bias, scale=2.0, reduce_op=nl.add, reduce_res=total,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    out = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=u)
    sums = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=sums, src=total)
    return out, sums


def test_activations_computed_in_place_are_the_documented_values(monkeypatch):
    """activation: `dst = op(data * scale + bias)`, the add-reduce summing dst's rows into reduce_res."""
    x = randn(128, 48, seed=6)
    e = np.exp(x.numpy() * np.float32(0.5) + np.float32(0.25))
    want = e * np.float32(2.0) + np.float32(-1.0)
    k = _fresh(_activations_in_place)
    for _ in range(2):
        out, sums = k(x)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
        np.testing.assert_allclose(sums.numpy()[:, 0], want.sum(axis=1), rtol=1e-5)
    check_replay(_activations_in_place, lambda s: (randn(128, 48, seed=s),), monkeypatch)


@ndk.jit
def _comparisons(x):
    """tensor_scalar comparisons into integer tiles: `x > 0` into uint8, `0.5 >= x` (reverse0) into int32."""
    p, f = x.shape
    t = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    pos = nl.ndarray((p, f), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=pos, data=t, op0=nl.greater, operand0=0.0)
    low = nl.ndarray((p, f), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=low, data=t, op0=nl.greater_equal, operand0=0.5, reverse0=True)
    out_pos = nl.ndarray((p, f), dtype=nl.uint8, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_pos, src=pos)
    out_low = nl.ndarray((p, f), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_low, src=low)
    return out_pos, out_low


def test_comparisons_into_integer_tiles_are_zero_or_one(monkeypatch):
    """ALU comparisons give 1.0/0.0 (False for NaN), which an integer dst stores as 1/0."""
    x = randn(128, 32, seed=8)
    x[0, 0] = float("nan")
    xs = x.numpy()
    k = _fresh(_comparisons)
    for _ in range(2):
        pos, low = k(x)
        np.testing.assert_array_equal(pos.numpy(), (xs > 0).astype(np.uint8))
        np.testing.assert_array_equal(low.numpy(), (np.float32(0.5) >= xs).astype(np.int32))
    check_replay(_comparisons, lambda s: (randn(128, 32, seed=s),), monkeypatch)
