"""The cost model on hand-computed instruction costs (reference/nki.md §2.2–2.4)."""

import json

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neuron_dynamo.nki.isa as nisa
import neuron_dynamo.nki.language as nl
from neuron_dynamo import nki
from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.nki.costmodel import (
    CostModel,
    CostModelError,
    Instruction,
    combine_profiles,
    dma_efficiency,
)

BF16, FP32 = "bfloat16", "float32"


def matmul(n, m=128, k=128, dtype=BF16, **extra):
    return Instruction(
        "nc_matmul",
        "tensor",
        k,
        n,
        (dtype, dtype),
        FP32,
        ("sbuf", "sbuf"),
        "psum",
        flops=2 * k * m * n,
        extra={"M": m, **extra},
    )


def vector(op, n, in_dtypes=(BF16,), out_dtype=BF16, in_buffers=("sbuf",), out_buffer="sbuf", engine="vector", **extra):
    return Instruction(op, engine, 128, n, in_dtypes, out_dtype, in_buffers, out_buffer, extra=extra)


def dma(partitions, bytes_per_partition, src="hbm", dst="sbuf", op="dma_copy", **extra):
    return Instruction(
        op,
        "dma",
        partitions,
        bytes_per_partition // 2,
        (BF16,),
        BF16,
        (src,),
        dst,
        dma_bytes=partitions * bytes_per_partition,
        extra=extra,
    )


def stream_ns(nbytes, dma_rate, hbm_sides=1, hbm_rate=360):
    """A transfer streams at the DMA engines' rate, but never faster than HBM allows."""
    return max(nbytes / dma_rate, nbytes * hbm_sides / hbm_rate)


def busy_ns(target, *instrs, engine=None):
    model = CostModel(target)
    for instr in instrs:
        model.record(instr)
    profile = model.profile()
    return profile.engine_busy_ns[engine or instrs[0].engine]


# ---- TensorE ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("target", "clock"), [("trn1", 2.8), ("trn2", 2.4), ("trn3", 2.4)])
def test_full_bf16_matmul_tile_costs_its_moving_columns(target, clock):
    # max(min(64, 128), 512) = 512 TensorE cycles
    assert busy_ns(target, matmul(512)) == pytest.approx(512 / clock)


@pytest.mark.parametrize(
    ("n", "m", "dtype", "cycles"),
    [
        (512, 128, FP32, 4 * 512),  # fp32 is 4x
        (32, 128, BF16, 64),  # min(64, M) floors the moving term
        (8, 16, BF16, 16),  # a tiny stationary tile floors at M
        (100, 16, BF16, 100),
    ],
)
def test_matmul_cycle_formula(n, m, dtype, cycles):
    assert busy_ns("trn2", matmul(n, m, dtype=dtype)) == pytest.approx(cycles / 2.4)


def test_full_matmul_stream_is_full_tensor_utilisation():
    model = CostModel("trn2")
    for _ in range(8):
        model.record(matmul(512))
    profile = model.profile()
    assert profile.matmul_flops == 8 * 2 * 128 * 128 * 512
    assert profile.tensor_utilisation == pytest.approx(1.0)
    assert profile.bottleneck == "tensor"


def test_small_matmuls_and_fp32_have_low_utilisation():
    model = CostModel("trn2")
    model.record(matmul(32, m=128, k=32))  # 64 cycles for 2*32*128*32 FLOPs
    # peak does 32768 FLOP/cycle: ideal = 262144 / 32768 = 8 cycles out of 64
    assert model.profile().tensor_utilisation == pytest.approx(8 / 64)
    fp32 = CostModel("trn2")
    fp32.record(matmul(512, dtype=FP32))  # measured against the fp32 peak (a quarter of bf16): fully used
    assert fp32.profile().tensor_utilisation == pytest.approx(1.0)


def test_double_row_fp8_counts_twice_the_flops_per_cycle():
    model = CostModel("trn2")
    model.record(matmul(512, k=256, dtype="float8_e4m3", perf_mode="double_row"))
    assert model.profile().engine_busy_ns["tensor"] == pytest.approx(512 / 2.4)
    assert model.profile().tensor_utilisation == pytest.approx(1.0)


def test_transposes_are_not_useful_flops():
    model = CostModel("trn2")
    model.record(Instruction("nc_transpose", "tensor", 128, 32, (BF16,), BF16, ("sbuf",), "psum"))
    model.record(matmul(128, is_transpose=True))
    profile = model.profile()
    # nc_transpose: max(P, min(64, F)) = 128 cycles; the transpose-mode matmul max(64, 128) = 128 cycles
    assert profile.engine_busy_ns["tensor"] == pytest.approx(256 / 2.4)
    assert profile.matmul_flops == 0 and profile.tensor_utilisation == 0.0


# ---- Vector / Scalar / GpSimd ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "instr", "cycles"),
    [
        # tensor_copy max(MIN_II, N), trn2 VectorE perf mode 4x for bf16 SBUF->SBUF contiguous, 2x otherwise
        ("trn1", vector("tensor_copy", 1024), 1024),
        ("trn2", vector("tensor_copy", 1024), 256),
        ("trn2", vector("tensor_copy", 1024, contiguous=False), 512),
        ("trn2", vector("tensor_copy", 1024, in_buffers=("psum",)), 512),
        ("trn2", vector("tensor_copy", 1024, in_dtypes=(FP32,), in_buffers=("psum",)), 1024),
        ("trn2", vector("tensor_copy", 128), 64),  # MIN_II
        ("trn2", vector("tensor_copy", 1024, dynamic_address=True), 600),
        ("trn2", vector("tensor_scalar", 1024, in_dtypes=(FP32,), out_dtype=FP32), 1024),
        # a fp32 [P, 1] operand tile is not streamed: the bf16 data keeps the 4x mode
        ("trn2", vector("tensor_scalar", 1024, (BF16, FP32), BF16, ("sbuf", "sbuf")), 256),
        ("trn2", vector("scalar_tensor_tensor", 512, (BF16, FP32, BF16), BF16, ("sbuf",) * 3, alu_op="add"), 256),
        ("trn1", vector("tensor_scalar", 1024, stride_bytes=32), 2048),  # stride > 16 B halves bandwidth
        # tensor_tensor: N if one input in PSUM or bf16 add/sub/mul contiguous, else 2N; trn2 2x for bf16 SBUF
        ("trn1", vector("tensor_tensor", 512, (FP32, FP32), FP32, ("sbuf", "sbuf"), alu_op="add"), 1024),
        ("trn1", vector("tensor_tensor", 512, (BF16, BF16), BF16, ("sbuf", "sbuf"), alu_op="add"), 512),
        ("trn1", vector("tensor_tensor", 512, (BF16, BF16), BF16, ("sbuf", "sbuf"), alu_op="maximum"), 1024),
        ("trn1", vector("tensor_tensor", 512, (FP32, FP32), FP32, ("psum", "sbuf"), alu_op="add"), 512),
        ("trn2", vector("tensor_tensor", 512, (BF16, BF16), BF16, ("sbuf", "sbuf"), alu_op="add"), 256),
        ("trn2", vector("tensor_tensor", 512, (BF16, BF16), BF16, ("sbuf", "sbuf"), alu_op="maximum"), 512),
        ("trn2", vector("tensor_tensor", 512, (FP32, FP32), FP32, ("sbuf", "sbuf"), alu_op="add"), 1024),
        ("trn2", vector("tensor_tensor_scan", 512, (FP32, FP32), FP32, ("sbuf", "sbuf")), 1024),
        # tensor_reduce: N/2 for bf16 add/max, else N
        ("trn2", vector("tensor_reduce", 512, alu_op="add"), 256),
        ("trn2", vector("tensor_reduce", 512, in_dtypes=(FP32,), alu_op="add"), 512),
        ("trn2", vector("tensor_reduce", 64, alu_op="maximum"), 64),
        ("trn2", vector("reciprocal", 512, (FP32,), FP32), 4096),
        ("trn2", vector("memset", 512, (), value=0), 256),
        ("trn2", vector("memset", 512, (), value=1.0), 512),
        ("trn2", vector("memset", 512, (), FP32, value=0), 512),
        ("trn2", vector("bn_stats", 512, (FP32,), FP32), 512),
        ("trn2", vector("bn_aggr", 96, (FP32,), FP32), 416),
        ("trn2", vector("bn_aggr", 6, (FP32,), FP32), 64),
        ("trn2", vector("nc_transpose", 32, (FP32,), FP32), 64),
        ("trn3", vector("exponential", 1024, (FP32,), FP32), 256),
        ("trn2", vector("some_future_op", 300, (FP32,), FP32), 300),
    ],
)
def test_vector_engine_cycle_formulas(target, instr, cycles):
    clock = {"trn1": 1.12, "trn2": 0.96, "trn3": 1.2}[target]
    assert busy_ns(target, instr) == pytest.approx(cycles / clock)


@pytest.mark.parametrize(
    ("target", "instr", "cycles"),
    [
        ("trn2", vector("activation", 512, (FP32,), FP32, engine="scalar"), 512),
        ("trn2", vector("activation", 512, (FP32,), FP32, engine="scalar", reduce=True), 576),
        ("trn2", vector("activation", 10, (FP32,), FP32, engine="scalar"), 64),
        ("trn1", vector("activation", 512, (FP32,), FP32, engine="scalar"), 512),
        ("trn2", vector("tensor_copy", 1024, engine="scalar"), 1024),  # no ScalarE perf mode on trn2
        ("trn3", vector("tensor_copy", 1024, engine="scalar"), 512),  # trn3 ScalarE 2x
        ("trn3", vector("tensor_copy", 1024, ("float8_e4m3",), "float8_e4m3", engine="scalar"), 512),
        ("trn2", vector("tensor_copy", 1024, engine="gpsimd"), 1024),
        ("trn2", vector("iota", 512, (), "int32", (), engine="gpsimd"), 662),
        ("trn2", vector("affine_select", 512, (FP32,), FP32, engine="gpsimd"), 662),
    ],
)
def test_scalar_and_gpsimd_cycle_formulas(target, instr, cycles):
    clock = {"trn1": 1.4, "trn2": 1.2, "trn3": 1.2}[target]
    assert busy_ns(target, instr) == pytest.approx(cycles / clock)


# ---- DMA ----------------------------------------------------------------------------------------------------


def test_dma_efficiency_curve_has_the_documented_shape():
    assert dma_efficiency(4096) == pytest.approx(1.0)
    assert dma_efficiency(64 * 1024) == 1.0
    assert 0.9 < dma_efficiency(2048) < 1.0  # near peak
    assert dma_efficiency(256) < 0.6  # overhead-bound below 256 B
    assert dma_efficiency(64) < 0.25


@settings(max_examples=50, deadline=None)
@given(st.floats(1, 1e6), st.floats(1, 1e6))
def test_dma_efficiency_is_monotone_and_bounded(a, b):
    lo, hi = sorted((a, b))
    assert 0 < dma_efficiency(lo) <= dma_efficiency(hi) <= 1.0


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 128), st.integers(1, 32768), st.integers(1, 32768), st.sampled_from(["trn1", "trn2", "trn3"]))
def test_a_dma_never_gets_cheaper_with_more_bytes(partitions, bytes_a, bytes_b, target):
    small, large = sorted((bytes_a * 2, bytes_b * 2))
    assert busy_ns(target, dma(partitions, small)) <= busy_ns(target, dma(partitions, large))


def test_one_large_dma_costs_fixed_overhead_plus_bytes_over_bandwidth():
    model = CostModel("trn2")
    model.record(dma(128, 4096))  # 512 KiB, 16 engines x 23 B/ns at full efficiency
    profile = model.profile()
    stream = stream_ns(128 * 4096, 16 * 23)
    assert stream == pytest.approx(128 * 4096 / 360)  # HBM (360 B/ns per core) is narrower than 16 x 23 B/ns
    assert profile.engine_busy_ns["dma"] == pytest.approx(600 + stream)
    assert profile.serial_ns == pytest.approx(600 + stream)
    assert profile.hbm_bytes == profile.dma_bytes == 128 * 4096 and profile.sbuf_dma_bytes == 0
    assert profile.dma_transfers == 1


def test_many_dmas_overlap_over_queues_and_hit_the_hbm_roofline():
    model = CostModel("trn2")
    for _ in range(32):
        model.record(dma(128, 4096))
    profile = model.profile()
    # 16 queues hide the fixed overheads; HBM at 360 B/ns (below the 368 B/ns of the DMA engines) binds
    assert profile.engine_busy_ns["dma"] == pytest.approx(32 * 128 * 4096 / 360)
    assert profile.hbm_bytes / 360 / profile.perfect_overlap_ns == pytest.approx(1.0)  # the lower bound hits it
    assert profile.hbm_roofline_fraction <= 1.0  # from the calibrated time
    assert profile.serial_ns == pytest.approx(32 * (600 + 128 * 4096 / 360))


def test_small_dmas_are_overhead_bound():
    small, large = CostModel("trn2"), CostModel("trn2")
    small.record(dma(128, 64))  # 8 KiB in 64 B rows
    large.record(dma(128, 64, contiguous_bytes=8192))  # the same bytes as one contiguous run
    small_ns = small.profile().engine_busy_ns["dma"]
    assert small_ns == pytest.approx(600 + 128 * 64 / (16 * 23 * dma_efficiency(64)))
    assert large.profile().engine_busy_ns["dma"] == pytest.approx(600 + stream_ns(128 * 64, 16 * 23))
    assert small_ns > large.profile().engine_busy_ns["dma"]


def test_dma_partition_fanout_trn1_fixed_cost_swdge_and_transpose():
    # 8 partitions use one DMA engine; trn1 pays 1.3 us per transfer
    assert busy_ns("trn1", dma(8, 4096)) == pytest.approx(1300 + 8 * 4096 / 17)
    assert busy_ns("trn2", dma(128, 4096, dge_mode="swdge")) == pytest.approx(1300 + 128 * 4096 / 360)
    transpose = dma(128, 4096, op="dma_transpose")
    assert busy_ns("trn2", transpose) == pytest.approx(600 + 128 * 4096 / (16 * 23 * 0.9))
    on_chip = dma(128, 4096, src="sbuf", op="dma_transpose")
    assert busy_ns("trn2", on_chip) == pytest.approx(600 + 128 * 4096 / (16 * 23 * 0.5))


def test_dma_bytes_split_hbm_traffic_from_on_chip_copies():
    model = CostModel("trn3")
    model.record(dma(128, 1024, src="sbuf", dst="sbuf"))
    model.record(dma(1, 8192, src="hbm", dst="shared_hbm"))  # HBM->HBM: read and write both hit HBM
    profile = model.profile()
    assert profile.sbuf_dma_bytes == 128 * 1024
    assert profile.hbm_bytes == 2 * 8192
    assert profile.dma_bytes == 128 * 1024 + 8192


# ---- profile --------------------------------------------------------------------------------------------------


def test_estimated_time_is_the_busiest_engine_and_serial_is_the_sum():
    model = CostModel("trn2")
    model.record(matmul(512))  # 213.3 ns tensor
    model.record(vector("tensor_copy", 512, (FP32,), BF16, ("psum",)))  # 512 / 0.96 = 533.3 ns vector
    model.record(dma(128, 1024, src="sbuf", dst="hbm"))
    profile = model.profile()
    dma_ns = 600 + stream_ns(128 * 1024, 16 * 23 * dma_efficiency(1024))
    assert profile.perfect_overlap_ns == pytest.approx(dma_ns)
    assert profile.serial_ns == pytest.approx(512 / 2.4 + 512 / 0.96 + dma_ns)
    assert profile.instructions == {"nc_matmul": 1, "tensor_copy": 1, "dma_copy": 1}
    assert profile.engine_instructions == {"tensor": 1, "vector": 1, "dma": 1}
    assert profile.bottleneck == "dma"
    text = str(profile)
    assert "Estimated device time on trn2" in text and "tensor" in text and "dma" in text
    assert "serial time by op: dma_copy" in text
    assert json.loads(json.dumps(profile.to_dict()))["bottleneck"] == "dma"


def test_empty_run_has_zero_time():
    profile = CostModel().profile()
    assert profile.estimated_ns == profile.serial_ns == 0.0
    assert profile.tensor_utilisation == profile.hbm_roofline_fraction == 0.0
    assert profile.bottleneck == ""
    assert "0.00 us" in str(profile)


instructions = st.one_of(
    st.builds(matmul, st.integers(1, 512), st.integers(1, 128), st.integers(1, 128), st.sampled_from([BF16, FP32])),
    st.builds(
        lambda op, n, dt: vector(op, n, (dt,), dt),
        st.sampled_from(["tensor_copy", "tensor_scalar", "tensor_reduce", "reciprocal", "bn_stats"]),
        st.integers(1, 4096),
        st.sampled_from([BF16, FP32]),
    ),
    st.builds(dma, st.integers(1, 128), st.integers(2, 131072).map(lambda b: b // 2 * 2)),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(instructions, min_size=1, max_size=30), st.sampled_from(["trn1", "trn2", "trn3"]))
def test_bounds_are_ordered_and_fractions_bounded(instrs, target):
    model = CostModel(target)
    for instr in instrs:
        model.record(instr)
    profile = model.profile()
    assert 0 < profile.perfect_overlap_ns <= profile.estimated_ns <= profile.serial_ns * (1 + 1e-9)
    assert profile.perfect_overlap_ns == pytest.approx(max(profile.engine_busy_ns.values()))
    assert 0 <= profile.tensor_utilisation <= 1 + 1e-9
    assert 0 <= profile.hbm_roofline_fraction <= 1 + 1e-9
    assert sum(profile.instructions.values()) == len(instrs)
    assert sum(profile.op_busy_ns.values()) == pytest.approx(profile.serial_ns)


# ---- LNC ------------------------------------------------------------------------------------------------------


def test_combined_lnc_instances_run_in_parallel():
    one = CostModel("trn2")
    one.record(matmul(512))
    one.record(dma(128, 4096))
    p0 = one.profile()
    other = CostModel("trn2")
    other.record(matmul(512))
    p1 = other.profile()
    both = combine_profiles([p0, p1])
    assert both.cores == 2
    assert both.estimated_ns == pytest.approx(p0.estimated_ns)
    assert both.engine_busy_ns["tensor"] == pytest.approx(512 / 2.4)
    assert both.instructions == {"nc_matmul": 2, "dma_copy": 1}
    assert both.matmul_flops == 2 * p1.matmul_flops
    assert both.tensor_utilisation == pytest.approx(2 * (512 / 2.4) / (2 * p0.estimated_ns))
    assert both.hbm_roofline_fraction == pytest.approx(128 * 4096 / (2 * 360) / p0.estimated_ns)
    assert combine_profiles([p0]).to_dict() == p0.to_dict()


# ---- bad input ------------------------------------------------------------------------------------------------


def test_bad_input_raises_clear_errors():
    with pytest.raises(CostModelError, match="unknown Trainium target 'trn9'.*trn1"):
        CostModel("trn9")
    assert CostModel("gen4").target == "trn3"
    assert issubclass(CostModelError, NeuronDynamoError)
    model = CostModel()
    with pytest.raises(CostModelError, match="unknown engine 'pool'"):
        model.record(vector("tensor_copy", 8, engine="pool"))
    assert model.profile().instructions == {}  # nothing half-recorded
    with pytest.raises(CostModelError, match="dma_bytes must be >= 0"):
        model.record(dma(1, -2))
    with pytest.raises(CostModelError, match="at least one Profile"):
        combine_profiles([])
    with pytest.raises(CostModelError, match="different targets"):
        combine_profiles([CostModel("trn1").profile(), CostModel("trn2").profile()])


# ---- end to end: tiny kernels through the interpreter ------------------------------------------------------------


def _tensor_add(x, y):
    rows = x.shape[0] // nl.num_programs()
    r0 = nl.program_id(0) * rows
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x[r0 : r0 + rows, :])
    nisa.dma_copy(dst=b, src=y[r0 : r0 + rows, :])
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=out[r0 : r0 + rows, :], src=a)
    return out


def _add_dma_ns():
    """One [128, 512] fp32 transfer: 2 KiB per partition over 16 engines, or HBM's 360 B/ns if narrower."""
    return stream_ns(128 * 2048, 16 * 23 * dma_efficiency(2048))


def test_tensor_add_kernel_profile_matches_hand_count():
    x, y = np.random.default_rng(0).standard_normal((2, 128, 512), dtype=np.float32)
    out, profile = nki.simulate(nki.jit(_tensor_add), profile=True)(x, y)
    np.testing.assert_allclose(out, x + y, rtol=1e-6)
    assert profile.target == "trn2" and profile.cores == 1
    assert profile.instructions == {"dma_copy": 3, "tensor_tensor": 1}
    vector_ns = 2 * 512 / 0.96  # fp32 add from SBUF: 2N VectorE cycles, no performance mode
    assert profile.engine_busy_ns["vector"] == pytest.approx(vector_ns)
    transfer = _add_dma_ns()
    assert profile.engine_busy_ns["dma"] == pytest.approx(3 * transfer)  # the 16 engines are the limit
    assert profile.perfect_overlap_ns == pytest.approx(3 * transfer)
    # serial: + the semaphore latency (200 cycles at 1.2 GHz) of the add waiting on its loads
    assert profile.serial_ns == pytest.approx(vector_ns + 3 * (600 + transfer) + 200 / 1.2)
    assert profile.hbm_bytes == profile.dma_bytes == 3 * 128 * 512 * 4
    assert profile.bottleneck == "dma" and profile.tensor_utilisation == 0.0


def test_target_override_changes_the_estimate(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    x = np.ones((128, 512), dtype=np.float32)
    _, profile = nki.jit(_tensor_add).profile(x, x)
    assert profile.target == "trn1"
    assert profile.engine_busy_ns["vector"] == pytest.approx(2 * 512 / 1.12)


def test_lnc2_instances_overlap_in_the_combined_profile():
    x, y = np.random.default_rng(1).standard_normal((2, 256, 512), dtype=np.float32)
    out, profile = nki.jit(_tensor_add)[2].profile(x, y)
    np.testing.assert_allclose(out, x + y, rtol=1e-6)
    assert profile.cores == 2
    assert profile.instructions == {"dma_copy": 6, "tensor_tensor": 2}
    assert profile.engine_busy_ns["vector"] == pytest.approx(2 * 512 / 0.96)  # not added across the cores
    assert profile.perfect_overlap_ns == pytest.approx(3 * _add_dma_ns())
    assert profile.hbm_roofline_fraction == pytest.approx(6 * 128 * 2048 / (2 * 360) / profile.estimated_ns)


def _matmul_over_k(a_t, b):
    k_size, m_size = a_t.shape
    n_size = b.shape[1]
    c = nl.ndarray((m_size, n_size), dtype=b.dtype, buffer=nl.shared_hbm)
    acc = nl.ndarray((m_size, n_size), dtype=nl.float32, buffer=nl.psum)
    for k0 in range(0, k_size, 128):
        stationary = nl.ndarray((128, m_size), dtype=a_t.dtype, buffer=nl.sbuf)
        moving = nl.ndarray((128, n_size), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=stationary, src=a_t[k0 : k0 + 128, :])
        nisa.dma_copy(dst=moving, src=b[k0 : k0 + 128, :])
        nisa.nc_matmul(dst=acc, stationary=stationary, moving=moving, accumulate=k0 > 0)
    out = nl.ndarray((m_size, n_size), dtype=b.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=acc)
    nisa.dma_copy(dst=c, src=out)
    return c


@pytest.mark.parametrize("k_tiles", [1, 3])
def test_matmul_kernel_counts_and_tensor_time(k_tiles):
    rng = np.random.default_rng(2)
    a_t = rng.standard_normal((128 * k_tiles, 64), dtype=np.float32).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((128 * k_tiles, 512), dtype=np.float32).astype(ml_dtypes.bfloat16)
    out, profile = nki.jit(_matmul_over_k).profile(a_t, b)
    expected = a_t.astype(np.float32).T @ b.astype(np.float32)
    np.testing.assert_allclose(out.astype(np.float32), expected, rtol=2e-2, atol=2e-2 * np.abs(expected).max())
    assert profile.instructions == {"dma_copy": 2 * k_tiles + 1, "nc_matmul": k_tiles, "tensor_copy": 1}
    # each matmul: max(min(64, M=64), N=512) = 512 TensorE cycles; the PSUM fp32 -> bf16 copy: 512 VectorE cycles
    assert profile.engine_busy_ns["tensor"] == pytest.approx(k_tiles * 512 / 2.4)
    assert profile.engine_busy_ns["vector"] == pytest.approx(512 / 0.96)
    assert profile.matmul_flops == 2 * 128 * k_tiles * 64 * 512
    ideal_ns = profile.matmul_flops / (128 * 128 * 2 * 2.4)
    assert profile.tensor_utilisation == pytest.approx(ideal_ns / profile.estimated_ns)
