"""The launch path of a replayed call (`Kernel._run` / `_replay`): what it must keep doing while it stays lean.

A replay copies the caller's tensors into the recorded argument arrays (torch arguments all at once), runs the
recorded steps and hands out copies of the results. Each check compares with the full interpreter
(`NEURON_DYNAMO_NKI_REPLAY=0`, bit for bit, through `check_replay`) or with the documented arithmetic (nki.isa
tensor_tensor: `dst = data1 op data2`; tensor_scalar: `dst = data op0 operand0`).
"""

import numpy as np
import pytest
import torch

import neuron_dynamo.nki as ndk
from neuron_dynamo.nki import replay, runtime
from neuron_dynamo.toolchain import simulator

ndk.make_importable()

import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
from test_replay import _fresh, check_replay, randn  # noqa: E402


@ndk.jit
def _pair(a, b, rows, cols, step=1.0):
    """Two results of two inputs, as a generated element-wise kernel returns them: a * b and a + step."""
    ta = nl.ndarray((rows, cols), dtype=a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray((rows, cols), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    prod = nl.ndarray((rows, cols), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod, data1=ta, data2=tb, op=nl.multiply)
    inc = nl.ndarray((rows, cols), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=inc, data=ta, op0=nl.add, operand0=step)
    out_prod = nl.ndarray((rows, cols), dtype=a.dtype, buffer=nl.shared_hbm)
    out_inc = nl.ndarray((rows, cols), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_prod, src=prod)
    nisa.dma_copy(dst=out_inc, src=inc)
    return out_prod, out_inc


@ndk.jit
def _echo(x):
    """The input, through SBUF (a bool input is stored as uint8 and handed back as bool)."""
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def _pair_args(kind: str, seed: int, rows: int = 128, cols: int = 48):
    a, b = randn(rows, cols, seed=seed), randn(rows, cols, seed=seed + 9)
    if kind == "numpy":
        a, b = a.numpy(), b.numpy()
    elif kind == "mixed":
        b = b.numpy()
    elif kind == "bfloat16":
        a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    elif kind == "strided":
        a, b = randn(cols, rows, seed=seed).T, randn(rows, 2 * cols, seed=seed + 9)[:, ::2]
    return a, b, rows, cols


@pytest.mark.parametrize("kind", ["torch", "numpy", "mixed", "bfloat16", "strided"])
def test_a_replay_gives_every_kind_of_caller_the_full_runs_results(kind, monkeypatch):
    check_replay(_pair, lambda s: _pair_args(kind, s), monkeypatch)


def test_a_bool_input_and_result_replay_as_the_full_run(monkeypatch):
    check_replay(_echo, lambda s: (randn(64, 40, seed=s) > 0,), monkeypatch)
    k = _fresh(_echo)
    for s in (1, 2):
        x = randn(64, 40, seed=s) > 0
        got = k(x)
        assert got.dtype == torch.bool and torch.equal(got, x)


def test_a_call_at_another_shape_dtype_or_constant_never_replays_a_program_of_another():
    k = _fresh(_pair)
    calls = [((128, 48), torch.float32, 1.0), ((64, 32), torch.float32, 1.0), ((128, 48), torch.float32, 2.0),
             ((128, 48), torch.bfloat16, 1.0)]
    for shape, dtype, step in calls * 2:  # each recorded, then each replayed
        a, b = randn(*shape, seed=1, dtype=dtype), randn(*shape, seed=2, dtype=dtype)
        prod, inc = k(a, b, *shape, step)
        assert prod.shape == shape and prod.dtype == dtype
        assert torch.equal(prod, a * b) and torch.equal(inc, a + step)
    assert len(k._programs.values()) == len(calls)


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_replayed_results_are_fresh_arrays_the_caller_owns(kind):
    """Mutating a result, or keeping it, changes nothing in later calls, and later calls change nothing in it."""
    k = _fresh(_pair)
    a, b, rows, cols = _pair_args(kind, 1)
    want = np.asarray(a) * np.asarray(b)
    for _ in range(3):  # the recorded call, then replays
        first, _ = k(a, b, rows, cols)
        first[...] = 7.0
        second, _ = k(a, b, rows, cols)
        np.testing.assert_array_equal(np.asarray(second), want)
        assert (np.asarray(first) == 7.0).all()


def test_inputs_that_require_grad_replay_without_autograd(monkeypatch):
    """A call under grad mode with a leaf that requires grad: the replay copies its values and records nothing."""
    def make_args(s):
        a, b, rows, cols = _pair_args("torch", s)
        return a.requires_grad_(), b, rows, cols

    check_replay(_pair, make_args, monkeypatch)
    k = _fresh(_pair)
    for s in (1, 2):
        a, b, rows, cols = make_args(s)
        prod, _ = k(a, b, rows, cols)
        assert not prod.requires_grad
        np.testing.assert_array_equal(prod.numpy(), a.detach().numpy() * b.numpy())
    (program,) = k._programs.values()
    assert not any(alias.requires_grad for alias in program.loads.aliases)


def test_a_launch_accounts_the_same_estimate_recorded_or_replayed():
    k = _fresh(_pair)
    args = _pair_args("torch", 1)
    _, profile = k.profile(*args)
    with simulator.device_time() as spent:
        simulator.launch(k, *_pair_args("torch", 2))
        with simulator.device_time() as inner:
            simulator.launch(k, *_pair_args("torch", 3))
    assert inner.kernels == 1 and inner.ns == profile.estimated_ns
    assert spent.kernels == 2 and spent.ns == 2 * profile.estimated_ns
    replayed = k.profile(*args)[1]
    replayed.engine_busy_ns.clear()  # the caller's copy: the kept profile is not changed
    assert k.profile(*args)[1].to_dict() == profile.to_dict()


def test_the_least_recently_used_program_is_dropped_first(monkeypatch):
    monkeypatch.setattr(replay, "MAX_PROGRAMS_PER_KERNEL", 2)
    full_runs = []
    full_run = runtime.Kernel._full_run

    def counted(self, *args):
        full_runs.append(args[0][2:])
        return full_run(self, *args)

    monkeypatch.setattr(runtime.Kernel, "_full_run", counted)
    k = _fresh(_pair)
    for rows in (32, 64, 32, 96, 32, 64):  # 64 is the least recently used when 96 comes
        k(*_pair_args("torch", 1, rows, 16))
    assert full_runs == [(32, 16), (64, 16), (96, 16), (64, 16)]


@ndk.jit
def _row_blocks(x):
    """x + 1 block by block: every iteration's tiles die before the next one allocates its own."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, x.shape[0], 128):
        t = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0:r0 + 128, 0:x.shape[1]])
        inc = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=inc, data=t, op0=nl.add, operand0=1.0)
        nisa.dma_copy(dst=out[r0:r0 + 128, 0:x.shape[1]], src=inc)
    return out


def test_a_recorded_launch_reuses_the_arrays_of_its_dead_tiles(monkeypatch):
    """A tile the kernel can no longer name gives its memory to the next allocation, also while the call is recorded
    (the recorded steps keep the storage, not the tile): eight row blocks use three tile arrays, not sixteen (a
    name's old tile dies when the new one is bound to it), and replays still match the full interpreter bit for bit."""
    make = lambda s: (randn(8 * 128, 64, seed=s),)  # noqa: E731
    check_replay(_row_blocks, make, monkeypatch)
    kernel = _fresh(_row_blocks)
    (x,) = make(3)
    torch.testing.assert_close(kernel(x), x + 1, rtol=0, atol=0)
    (program,) = kernel._programs.values()
    tiles = {id(s.data) for s in program.storages if s.buffer == "sbuf"}
    assert len(tiles) == 3
    torch.testing.assert_close(kernel(make(4)[0]), make(4)[0] + 1, rtol=0, atol=0)
