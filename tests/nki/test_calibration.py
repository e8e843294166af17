"""The calibrated estimate: dependency model units, its bounds and the matmul tutorial's ordering.

Sources: AWS NKI performance guide (``nki/deep-dives/nki_perf_guide.rst``: dependent instructions, 189 ns II),
architecture guide (``trainium_inferentia2_arch.rst``: in-order engine streams synchronised by semaphores, 8 PSUM
banks), DMA overview (``nki-dma-overview.rst``), matmul tutorial (Neuron 2.23
``general/nki/tutorials/matrix_multiplication.rst``: the four kernels' Trn1 latencies). The full-size tutorial
shapes take minutes in the interpreter; these tests run [2048, 1024] @ [1024, 1024], the smallest shape the fully
optimised kernel's blocks allow, and `benchmarks/calibration.py` runs the full one.
"""

import importlib.util
import pathlib
import sys

import pytest
import torch

from neuron_dynamo import nki
from neuron_dynamo.nki.costmodel import CostModel, Instruction

ROOT = pathlib.Path(__file__).resolve().parents[2]
WHOLE = (0, 127, 0, 2047)


def _act(src, dst, engine="scalar", free=1):
    return Instruction(op="activation", engine=engine, partitions=128, free_elems=free, in_dtypes=("float32",),
                       out_dtype="float32", in_buffers=("sbuf",), out_buffer="sbuf",
                       reads=((src, WHOLE),), writes=((dst, WHOLE),))


def _run(instrs, target="trn1"):
    model = CostModel(target)
    for instr in instrs:
        model.record(instr)
    return model.profile()


def test_dependent_chain_costs_more_than_independent_instructions():
    chain = _run([_act(i, i + 1) for i in range(100)])
    independent = _run([_act(1000 + 2 * i, 1001 + 2 * i) for i in range(100)])
    assert chain.engine_busy_ns == independent.engine_busy_ns
    assert chain.estimated_ns > 3 * independent.estimated_ns
    assert independent.estimated_ns == pytest.approx(independent.perfect_overlap_ns)


def test_dependent_chain_initiation_interval_matches_perf_guide():
    """nki_perf_guide.rst: back-to-back dependent one-element ScalarE instructions run at an II of 189 ns (NC-v2)."""
    long, short = _run([_act(i, i + 1) for i in range(202)]), _run([_act(i, i + 1) for i in range(2)])
    ii = (long.schedule_ns - short.schedule_ns) / 200
    assert ii == pytest.approx(189, rel=0.05)


def test_cross_engine_dependency_waits_for_the_producer_and_the_semaphore():
    produce = _act(1, 2, engine="vector", free=4096)
    consume = _act(2, 3, engine="scalar", free=4096)
    dependent = _run([produce, consume])
    independent = _run([produce, _act(4, 5, engine="scalar", free=4096)])
    assert independent.estimated_ns == pytest.approx(max(independent.engine_busy_ns.values()))
    assert dependent.schedule_ns > sum(dependent.engine_busy_ns.values())


def test_anti_dependency_waits_for_the_earlier_reader():
    slow_read = _act(1, 2, engine="vector", free=8192)
    overwrite = _act(9, 1, engine="scalar", free=64)
    assert _run([slow_read, overwrite]).schedule_ns >= _run([slow_read]).schedule_ns + 64 / 1.4


def test_in_order_queue_blocks_independent_work_behind_a_waiting_instruction():
    producer = _act(1, 2, engine="vector", free=8192)
    waiting, free_work = _act(2, 3, free=64), _act(7, 8, free=64)
    assert _run([producer, waiting, free_work]).schedule_ns > _run([producer, free_work, waiting]).schedule_ns - 1
    assert _run([producer, free_work]).schedule_ns == pytest.approx(_run([producer]).schedule_ns)


def _matmul(dst):
    return Instruction(op="nc_matmul", engine="tensor", partitions=128, free_elems=512, in_dtypes=("bfloat16",) * 2,
                       out_dtype="float32", in_buffers=("sbuf", "sbuf"), out_buffer="psum",
                       reads=((1, (0, 127, 0, 255)), (2, (0, 127, 0, 1023))), writes=((dst, WHOLE),))


def _evacuate(src, dst):
    return Instruction(op="tensor_copy", engine="vector", partitions=128, free_elems=512 * 16,
                       in_dtypes=("float32",), out_dtype="bfloat16", in_buffers=("psum",), out_buffer="sbuf",
                       reads=((src, WHOLE),), writes=((dst, (0, 127, 0, 1023)),))


def test_ninth_psum_tile_waits_for_the_evacuation_of_the_first():
    """8 PSUM banks of 2 KiB per partition: TensorE cannot run more than 8 tiles ahead of the PSUM->SBUF copies."""
    eight = [i for t in range(8) for i in (_matmul(100 + t), _evacuate(100 + t, 200 + t))]
    nine = [*eight, _matmul(108)]
    nine_model = CostModel("trn1")
    for instr in nine:
        nine_model.record(instr)
    first_copy_end = 512 / 2.8 + 200 / 2.8 + 512 * 16 / 1.12
    assert nine_model._timeline.engine_free["tensor"] > first_copy_end


def _dma(src, dst, src_buf, dst_buf, nbytes=128 * 2048):
    return Instruction(op="dma_copy", engine="dma", partitions=128, free_elems=nbytes // 128 // 2,
                       in_dtypes=("bfloat16",), out_dtype="bfloat16", in_buffers=(src_buf,), out_buffer=dst_buf,
                       dma_bytes=nbytes, reads=((src, WHOLE),), writes=((dst, WHOLE),))


def test_load_compute_store_exposes_the_dma_latency_twice():
    """A load, a compute on it and a store of the result: nothing overlaps, each DMA pays its 1.3 us (trn1)."""
    prof = _run([_dma(1, 2, "hbm", "sbuf"), _act(2, 3, free=1024), _dma(3, 4, "sbuf", "hbm")])
    assert prof.schedule_ns > 2 * 1300 + 1024 / 1.4
    assert prof.perfect_overlap_ns <= prof.estimated_ns <= prof.serial_ns


def test_independent_loads_overlap_their_fixed_latency():
    """trn2 (hardware DGE, 0.6 us fixed): 16 small independent loads do not pay 16 fixed latencies."""
    loads = _run([_dma(10 + i, 50 + i, "hbm", "sbuf", nbytes=128 * 64) for i in range(16)], target="trn2")
    assert loads.schedule_ns < 4 * 600


def _tutorial():
    nki.make_importable()
    spec = importlib.util.spec_from_file_location("_matmul_tutorial", ROOT / "benchmarks/matmul_tutorial_kernels.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tutorial_profiles():
    import os

    kernels = _tutorial()
    old = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")
    os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = "trn1"
    try:
        lhs_t, rhs = torch.randn(1024, 2048).to(torch.bfloat16), torch.randn(1024, 1024).to(torch.bfloat16)
        ref = lhs_t.float().T @ rhs.float()
        out = {}
        for name in ("tiled", "hoisted", "block_free", "fully_optimized"):
            result, prof = getattr(kernels, name).profile(lhs_t, rhs)
            assert torch.allclose(result.float(), ref, atol=0.5, rtol=2e-2), name
            out[name] = prof
        return out
    finally:
        if old is None:
            del os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"]
        else:
            os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = old


def test_tutorial_kernels_keep_their_published_ordering(tutorial_profiles):
    times = [tutorial_profiles[k].estimated_ns for k in ("tiled", "hoisted", "block_free", "fully_optimized")]
    assert times == sorted(times, reverse=True)


def test_calibrated_estimate_lies_between_the_bounds(tutorial_profiles):
    for prof in tutorial_profiles.values():
        assert prof.perfect_overlap_ns <= prof.estimated_ns <= prof.serial_ns
        assert prof.tensor_utilisation == pytest.approx(prof.tensor_ideal_ns / prof.estimated_ns)
        assert "calibrated" in str(prof) and "perfect overlap" in str(prof)
