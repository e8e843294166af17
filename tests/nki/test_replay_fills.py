"""Replays skip the fresh-memory fills no instruction observes, and keep every other one.

The full (first) run always fills fresh allocations with NaN, so a read of unwritten memory shows up; a replay reuses
the recorded arrays, which still hold the previous call's values. Each check records at one input and replays at
another, then compares with a full run of that input bit for bit (`check_replay`): a fill wrongly skipped would show
the recorded call's values where the full run shows NaN.
"""

import numpy as np
import torch

import neuron_dynamo.nki as ndk
from neuron_dynamo.nki import fills

ndk.make_importable()

import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402
from test_replay import _fresh, check_replay, randn  # noqa: E402


def _program(kernel, *args):
    k = _fresh(kernel)
    k(*args)
    (program,) = k._programs.values()
    return program


@ndk.jit
def _chunked_copy(x):
    """A tile written in two column halves, the first half read before the second is written (software
    pipelining): every byte is written before it is read, so neither tile's fill is observable."""
    p, f = x.shape
    out = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    u = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    half = f // 2
    nisa.dma_copy(dst=t[:, 0:half], src=x[:, 0:half])
    nisa.tensor_scalar(dst=u[:, 0:half], data=t[:, 0:half], op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=t[:, half:f], src=x[:, half:f])
    nisa.tensor_scalar(dst=u[:, half:f], data=t[:, half:f], op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out, src=u)
    return out


def test_tiles_written_before_read_are_not_refilled(monkeypatch):
    check_replay(_chunked_copy, lambda s: (randn(64, 32, seed=s),), monkeypatch)
    assert _program(_chunked_copy, randn(64, 32, seed=1)).fills_dropped == 3  # t, u and the output


@ndk.jit
def _reads_unwritten_half(x):
    """Reads a tile of which only half was written: the other half is fresh memory (NaN in the interpreter)."""
    p, f = x.shape
    out = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0:f // 2], src=x[:, 0:f // 2])
    nisa.dma_copy(dst=out, src=t)
    return out


def test_a_read_of_unwritten_memory_keeps_the_fill(monkeypatch):
    check_replay(_reads_unwritten_half, lambda s: (randn(64, 32, seed=s),), monkeypatch)
    assert _program(_reads_unwritten_half, randn(64, 32, seed=1)).fills_dropped == 1  # the output only
    out = _reads_unwritten_half(randn(64, 32, seed=3))
    assert torch.isnan(out[:, 16:]).all() and not torch.isnan(out[:, :16]).any()


@ndk.jit
def _in_place_on_fresh_tile(x):
    """`tensor_tensor(dst=t, data1=t, ...)` on a fresh tile: the instruction reads t before it writes it."""
    p, f = x.shape
    out = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    y = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=y, src=x)
    nisa.tensor_tensor(dst=t, data1=t, data2=y, op=nl.add)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_an_instruction_reading_its_fresh_dst_keeps_the_fill(monkeypatch):
    check_replay(_in_place_on_fresh_tile, lambda s: (randn(64, 32, seed=s),), monkeypatch)
    assert _program(_in_place_on_fresh_tile, randn(64, 32, seed=1)).fills_dropped == 2  # y and the output


@ndk.jit
def _accumulate_into_fresh_psum(a, b):
    """`nc_matmul(accumulate=True)` adds to PSUM (the NKI 0.6 ISA reference for nisa.nc_matmul: "True adds to
    PSUM", undefined on an uninitialised location): the first matmul reads the fresh tile."""
    k, m = a.shape
    _, n = b.shape
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    sa = nl.ndarray((k, m), dtype=a.dtype, buffer=nl.sbuf)
    sb = nl.ndarray((k, n), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sa, src=a)
    nisa.dma_copy(dst=sb, src=b)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=sa, moving=sb, accumulate=True)
    res = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_psum_accumulation_into_a_fresh_tile_keeps_the_fill(monkeypatch):
    check_replay(_accumulate_into_fresh_psum, lambda s: (randn(32, 16, seed=s), randn(32, 8, seed=s + 1)),
                 monkeypatch)
    program = _program(_accumulate_into_fresh_psum, randn(32, 16, seed=1), randn(32, 8, seed=2))
    assert program.fills_dropped == 4  # sa, sb, res, the output: not acc


def test_bytes_of_a_strided_view():
    data = np.zeros((4, 6), dtype=np.float32)
    done = np.zeros(data.nbytes, dtype=np.bool_)
    fills._bytes_of(done, data[1:3, ::2], data)[...] = True
    marked = done.reshape(4, 6, 4).all(axis=2)
    expected = np.zeros((4, 6), dtype=bool)
    expected[1:3, ::2] = True
    assert (marked == expected).all() and done.sum() == expected.sum() * 4


@ndk.jit
def _short_rows(x):
    """A 128-row tile of which only the input's rows are used (a short sequence), and an output whose last
    column nothing writes: the caller reads the output, so its fill stays; the tile's unused rows are never read."""
    p, f = x.shape
    out = nl.ndarray((p, f + 1), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((nl.tile_size.pmax, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:p, :], src=x)
    nisa.dma_copy(dst=out[:, 0:f], src=t[0:p, :])
    return out


def test_unused_rows_are_not_refilled_but_unwritten_outputs_are(monkeypatch):
    check_replay(_short_rows, lambda s: (randn(64, 32, seed=s),), monkeypatch)
    assert _program(_short_rows, randn(64, 32, seed=1)).fills_dropped == 1  # t only
    _short_rows(randn(64, 32, seed=1))
    assert torch.isnan(_short_rows(randn(64, 32, seed=2))[:, 32]).all()
