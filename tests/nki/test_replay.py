"""Replay of recorded kernel calls (`neuron_dynamo.nki.replay`): bit-identical to the full interpreter.

Each check records a kernel at one input, replays it at another, and compares the replay with a full run of the
same input (`NEURON_DYNAMO_NKI_REPLAY=0`), bit for bit, outputs and in-place written arguments alike.
"""

import numpy as np
import pytest
import torch

import neuron_dynamo.nki as ndk
from neuron_dynamo.nki import replay
from neuron_dynamo.nki.runtime import Kernel

ndk.make_importable()

import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
import tutorial_kernels as tk  # noqa: E402
from neuron_dynamo.kernels import (  # noqa: E402
    activations,
    attention,
    attention_bwd,
    cross_entropy,
    embedding,
    matmul,
    norms,
    rope,
    scans,
    softmax,
    transpose,
)


def _bits(value):
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return [_bits(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.dtype, tuple(value.shape), value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    if isinstance(value, np.ndarray):
        return value.dtype, value.shape, np.ascontiguousarray(value).tobytes()
    return value


def _fresh(kernel: Kernel) -> Kernel:
    return Kernel(kernel.fn, kernel.lnc, kernel.options)


def check_replay(kernel: Kernel, make_args, monkeypatch, replayable: bool = True) -> None:
    """Record at make_args(1), replay at make_args(2), and compare with a full run of make_args(2)."""
    k = _fresh(kernel)
    k(*make_args(1))
    programs = list(k._programs.values())
    assert len(programs) == 1 and (programs[0] is not None) == replayable, programs
    args = make_args(2)
    replayed = k.profile(*args)
    with monkeypatch.context() as m:
        m.setenv(replay.ENV, "0")
        full_args = make_args(2)
        full = k.profile(*full_args)
    assert _bits(replayed[0]) == _bits(full[0])
    assert _bits(args) == _bits(full_args)  # arguments the kernel wrote
    assert replayed[1].to_dict() == full[1].to_dict()
    assert (k._programs.values()[0] is not None) == replayable  # the replay did not fall back to a full run


def randn(*shape, seed, dtype=torch.float32, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def ints(high, *shape, seed):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.int32)


TUTORIAL = [
    (tk.tensor_add, lambda s: (randn(200, 64, seed=s), randn(200, 64, seed=s + 9))),
    (tk.tiled_matmul, lambda s: (randn(256, 128, seed=s), randn(256, 512, seed=s + 9))),
    (tk.transpose, lambda s: (randn(64, 96, seed=s, dtype=torch.bfloat16),)),
    (tk.softmax, lambda s: (randn(130, 64, seed=s),)),
    (tk.rmsnorm, lambda s: (randn(130, 64, seed=s), randn(1, 64, seed=s + 9), 1e-6)),
    (tk.cumsum, lambda s: (randn(64, 300, seed=s),)),
    (tk.lnc_scale[2], lambda s: (randn(256, 32, seed=s), 1.5)),
    (tk.scale_in_place, lambda s: (randn(64, 32, seed=s).numpy(), 2.0)),
]


@pytest.mark.parametrize("kernel, make_args", TUTORIAL, ids=lambda x: getattr(x, "__name__", ""))
def test_tutorial_kernels_replay_bit_identically(kernel, make_args, monkeypatch):
    check_replay(kernel, make_args, monkeypatch)


def _attention_args(s):
    q, k, v = (randn(1, 2, 256, 64, seed=s + i) for i in range(3))
    return q, k, v, None, True, 0.125, torch.tensor([200], dtype=torch.int32) if s == 1 else torch.tensor(
        [97], dtype=torch.int32)


def _attention_bwd_args(s):
    q, k, v = (randn(1, 1, 128, 64, seed=s + i) for i in range(3))
    out, lse = attention.attention_kernel(q, k, v, None, True, 0.125)
    return q, k, v, out, randn(1, 1, 128, 64, seed=s + 5), lse, None, True, 0.125


LIBRARY = [
    (activations.activation_kernel, lambda s: (randn(130, 96, seed=s), "gelu")),
    (activations.gated_activation_kernel, lambda s: (randn(64, 96, seed=s), randn(64, 96, seed=s + 1), "silu")),
    (attention.attention_kernel, _attention_args),
    (attention_bwd.attention_backward_kernel, _attention_bwd_args),
    (cross_entropy.cross_entropy_kernel, lambda s: (randn(130, 300, seed=s, scale=3.0), ints(300, 130, seed=s))),
    (cross_entropy.cross_entropy_backward_kernel,
     lambda s: (randn(20, 50, seed=s), ints(50, 20, seed=s), randn(20, seed=s + 1), randn(20, seed=s + 2), 7)),
    (embedding.embedding_kernel, lambda s: (ints(40, 3, 50, seed=s), randn(40, 24, seed=s, dtype=torch.bfloat16))),
    (matmul.matmul_kernel, lambda s: (randn(130, 200, seed=s), randn(200, 70, seed=s + 1), randn(70, seed=s + 2),
                                      "relu")),
    (norms.rmsnorm_kernel, lambda s: (randn(130, 96, seed=s, dtype=torch.bfloat16), randn(96, seed=s + 1), 1e-6)),
    (norms.layernorm_kernel, lambda s: (randn(70, 96, seed=s), randn(96, seed=s + 1), randn(96, seed=s + 2))),
    (rope.rope_kernel, lambda s: (randn(1, 2, 64, 32, seed=s), randn(64, 32, seed=s + 1), randn(64, 32, seed=s + 2))),
    (scans.cumsum_kernel, lambda s: (randn(40, 300, seed=s),)),
    (scans.cummax_kernel, lambda s: (randn(40, 70, seed=s),)),
    (scans.linear_recurrence_kernel, lambda s: (randn(40, 70, seed=s), randn(40, 70, seed=s + 1))),
    (softmax.softmax_kernel, lambda s: (randn(130, 96, seed=s), None, 0.5)),
    (softmax.log_softmax_kernel, lambda s: (randn(40, 96, seed=s), randn(40, 96, seed=s + 1), 1.0)),
    (transpose.transpose_kernel, lambda s: (randn(130, 70, seed=s),)),
]


@pytest.mark.parametrize("kernel, make_args", LIBRARY, ids=lambda x: getattr(x, "__name__", ""))
def test_library_kernels_replay_bit_identically(kernel, make_args, monkeypatch):
    check_replay(kernel, make_args, monkeypatch)


@ndk.jit
def _register_loop(x, counter):
    """The trip count comes from the data (register_load): a replay could not follow it."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nisa.register_alloc()
    nisa.register_load(r, counter)
    for _ in range(r):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out, src=t)
    return out


@ndk.jit
def _dropout(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dropout(dst=t, data=t, prob=0.5)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_data_dependent_control_flow_runs_in_full(monkeypatch):
    check_replay(_register_loop, lambda s: (randn(8, 4, seed=s), torch.tensor([s], dtype=torch.int32)), monkeypatch,
                 replayable=False)
    x = randn(8, 4, seed=0)
    assert torch.equal(_register_loop(x, torch.tensor([3], dtype=torch.int32)), x * 8)


def test_random_numbers_are_not_replayed(monkeypatch):
    check_replay(_dropout, lambda s: (randn(8, 64, seed=s),), monkeypatch, replayable=False)


@ndk.jit
def _transpose_by_matmul(x, moving):
    """nc_matmul(is_transpose=True) is bit-exact only when `moving` is the identity: the path depends on data."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    m = nl.ndarray(moving.shape, dtype=moving.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    nisa.dma_copy(dst=m, src=moving)
    p = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.psum)
    nisa.nc_matmul(dst=p, stationary=a, moving=m, is_transpose=True)
    y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=y, src=p)
    nisa.dma_copy(dst=out, src=y)
    return out


def test_a_replay_that_would_take_another_path_reruns_in_full(monkeypatch):
    k = _fresh(_transpose_by_matmul)
    x = randn(32, 32, seed=1, dtype=torch.bfloat16)
    eye = torch.eye(32, dtype=torch.bfloat16)
    assert torch.equal(k(x, eye), x.T)
    other = eye.flip(0)
    with monkeypatch.context() as m:
        m.setenv(replay.ENV, "0")
        expected = _fresh(_transpose_by_matmul)(x, other)
    assert torch.equal(k(x, other), expected)
    assert list(k._programs.values()) == [None]  # from now on this signature runs in full


def test_the_environment_variable_turns_replay_off(monkeypatch):
    monkeypatch.setenv(replay.ENV, "0")
    k = _fresh(tk.tensor_add)
    k(randn(8, 8, seed=1), randn(8, 8, seed=2))
    assert list(k._programs.values()) == []


def test_replayed_outputs_are_the_callers_own(monkeypatch):
    """A replay reuses the recorded arrays: an earlier result must not change under a later call."""
    k = _fresh(tk.tensor_add)
    a, b = randn(8, 8, seed=1), randn(8, 8, seed=2)
    first = k(a, b)
    k(b, b)
    k(a, a)
    assert torch.equal(first, a + b)


def test_rules_are_checked_at_each_new_signature():
    k = _fresh(tk.transpose)
    k(randn(64, 96, seed=1))
    with pytest.raises(ndk.NkiValidationError, match="partition-dim"):
        k(randn(64, 200, seed=1))  # a new shape: checked in full (its transpose has 200 partitions)


def test_compiled_models_replay_bit_identically(monkeypatch):
    """The backend's generated and library kernels, through torch.compile, twice at new inputs."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(), torch.nn.LayerNorm(96),
                              torch.nn.Linear(96, 10), torch.nn.LogSoftmax(dim=-1))
    attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)

    def attend(x):
        return attn(x, x, x, need_weights=False)[0].softmax(-1)

    for model, shape in ((mlp, (6, 48)), (attend, (2, 16, 32))):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="neuron", options={"target": "simulator", "cache": "off"})
        with torch.no_grad():
            compiled(randn(*shape, seed=1))
            replayed = compiled(randn(*shape, seed=2))
            with monkeypatch.context() as m:
                m.setenv(replay.ENV, "0")
                full = compiled(randn(*shape, seed=2))
        assert _bits(replayed) == _bits(full)
