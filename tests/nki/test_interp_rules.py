"""Every rule the interpreter enforces: a kernel that breaks it raises NkiValidationError naming the rule and the
kernel's own source line (reference/nki.md §1.8 known limitations and §2.1)."""

import inspect

import numpy as np
import pytest
from nki_helpers import rand, run

import neuron_dynamo.nki.isa as nisa
import neuron_dynamo.nki.language as nl
from neuron_dynamo import nki
from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.nki.errors import NkiTargetError, NkiValidationError


def sb(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)


def ps(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.psum)


def _partition_too_big():
    sb((129, 4))


def _matmul_k_over_tile():
    # K is the partition dim, so it can only exceed the array rows in TensorE row-tiling mode
    nisa.nc_matmul(ps((64, 64)), sb((128, 64)), sb((128, 64)), tile_position=(0, 0), tile_size=(64, 128))


def _stationary_free():
    nisa.nc_matmul(ps((128, 64)), sb((128, 129)), sb((128, 64)))


def _moving_free():
    nisa.nc_matmul(ps((128, 513)), sb((128, 128)), sb((128, 513)))


def _psum_bank_crossing():
    acc = ps((128, 1024))
    nisa.nc_matmul(acc[:, 256:768], sb((128, 128)), sb((128, 512)))


def _psum_banks():
    tiles = [ps((128, 512)) for _ in range(9)]
    for t in tiles:
        nisa.memset(t, 0.0)
    for t in tiles:  # all nine are live at once
        nisa.tensor_copy(sb((128, 512)), t)


def _sbuf_capacity_single():
    sb((128, 57 * 1024))  # 228 KiB per partition > 224 KiB (trn2)


def _sbuf_capacity_live():
    a, b = sb((128, 30 * 1024)), sb((128, 30 * 1024))  # 2 x 120 KiB live together
    nisa.memset(a, 0.0)
    nisa.memset(b, 0.0)
    nisa.tensor_copy(a, b)


def _te_reads_sbuf():
    nisa.nc_matmul(ps((64, 64)), ps((64, 64)), sb((64, 64)))


def _te_writes_psum():
    nisa.nc_matmul(sb((64, 64)), sb((64, 64)), sb((64, 64)))


def _dma_reads_psum(out):
    nisa.dma_copy(dst=out, src=ps((4, 4)))


def _gpsimd_psum():
    nisa.tensor_copy(ps((4, 4)), sb((4, 4)), engine=nisa.engine.gpsimd)


def _tensor_tensor_both_psum():
    nisa.tensor_tensor(sb((4, 4)), ps((4, 4)), ps((4, 4)), op=nl.add)


def _matmul_fp32_pairing():
    nisa.nc_matmul(ps((64, 64)), sb((64, 64), nl.float32), sb((64, 64), nl.bfloat16))


def _nl_divide():
    nl.divide(sb((4, 4)), sb((4, 4)))


def _nl_mod():
    nl.fmod(sb((4, 4)), 2.0)


def _nl_power_scalar():
    nl.power(sb((4, 4)), 2.0)


def _nl_broadcast():
    nl.add(sb((4, 4)), sb((4, 1)))


def _nl_matmul_no_transpose():
    nl.matmul(sb((64, 64)), sb((64, 64)))


def _nl_store_psum(out):
    nl.store(out, ps((4, 4)))


def _slice_out_of_bounds(out):
    nl.load(out[0:8, :])


def _buffer_string():
    nl.ndarray((4, 4), nl.float32, buffer="sbuf")


def _permute_partition():
    sb((4, 8)).permute((1, 0))


def _transpose_vector_too_big():
    nisa.nc_transpose(sb((64, 40)), sb((40, 64)), engine=nisa.engine.vector)


def _bn_stats_fmax():
    nisa.bn_stats(sb((4, 6)), sb((4, 600)))


def _reduce_axis():
    nisa.tensor_reduce(sb((4, 1, 8)), nl.add, sb((4, 5, 8)), axis=1)


def _memset_float_into_int():
    nisa.memset(sb((4, 4), nl.int32), 1.5)


def _scalar_engine_ops():
    nisa.tensor_scalar(sb((4, 4)), sb((4, 4)), op0=nl.subtract, operand0=1.0, engine=nisa.engine.scalar)


def _dma_oob_error(ids):
    idx = nl.load(ids)
    table = nl.ndarray((4, 8), nl.float32, buffer=nl.private_hbm)
    nisa.dma_copy(dst=sb((2, 8)), src=table.ap([[8, 2], [1, 8]], vector_offset=idx))


def _shape_mismatch():
    nisa.tensor_tensor(sb((4, 8)), sb((4, 8)), sb((4, 9)), op=nl.add)


def _dma_transpose_dtype():
    nisa.dma_transpose(sb((8, 4)), sb((4, 8), nl.float32))


CASES = [
    (_partition_too_big, "partition-dim", "at most 128"),
    (_matmul_k_over_tile, "matmul-k", "K=128 exceeds 64"),
    (_stationary_free, "matmul-stationary-free", "M=129"),
    (_moving_free, "matmul-moving-free", "N=513"),
    (_psum_bank_crossing, "psum-bank", "bank boundary"),
    (_psum_banks, "psum-capacity", "PSUM banks"),
    (_sbuf_capacity_single, "sbuf-capacity", "229376"),
    (_sbuf_capacity_live, "sbuf-capacity", "245760 bytes per partition"),
    (_te_reads_sbuf, "tensor-engine-reads-sbuf", "SBUF only"),
    (_te_writes_psum, "tensor-engine-writes-psum", "PSUM only"),
    (_dma_reads_psum, "dma-psum", "DMA cannot access PSUM"),
    (_gpsimd_psum, "gpsimd-psum", "GpSimd cannot access PSUM"),
    (_tensor_tensor_both_psum, "tensor-tensor-psum", "both in PSUM"),
    (_matmul_fp32_pairing, "matmul-fp32-pairing", "paired"),
    (_nl_divide, "nl-divide", "reciprocal"),
    (_nl_mod, "nl-mod", "fails on Trainium"),
    (_nl_power_scalar, "nl-power-scalar", "scalar"),
    (_nl_broadcast, "nl-broadcast", "do not broadcast"),
    (_nl_matmul_no_transpose, "nl-matmul-transpose", "transpose_x=True"),
    (_nl_store_psum, "store-psum", "PSUM"),
    (_slice_out_of_bounds, "index-out-of-bounds", "out of bounds"),
    (_buffer_string, "buffer-object", "nl.sbuf"),
    (_permute_partition, "partition-dim", "partition dim"),
    (_transpose_vector_too_big, "transpose-size", "32x32"),
    (_bn_stats_fmax, "bn-stats-fmax", "512"),
    (_reduce_axis, "reduce-axis", "trailing free dims"),
    (_memset_float_into_int, "memset-value", "integer"),
    (_scalar_engine_ops, "scalar-engine-ops", "multiply+add"),
    (_dma_oob_error, "dma-oob", "oob_mode"),
    (_shape_mismatch, "shape-mismatch", "same partitions"),
    (_dma_transpose_dtype, "dma-transpose-dtype", "2-byte"),
]


@pytest.mark.parametrize("body,rule,text", CASES, ids=[c[1] + ":" + c[0].__name__ for c in CASES])
def test_rule_violation_names_rule_and_kernel_line(body, rule, text):
    args = {
        "out": np.zeros((4, 4), np.float32),
        "ids": np.array([[1], [7]], np.int32),
    }
    params = list(inspect.signature(body).parameters)
    with pytest.raises(NkiValidationError) as info:
        run(body, *(args[p] for p in params))
    err = info.value
    assert err.rule == rule
    assert text in str(err)
    assert isinstance(err, NeuronDynamoError)
    # the message starts with this file and the offending line: in the kernel body, or in the sb()/ps() helper
    # it called (the innermost frame that is not interpreter code)
    allowed = set()
    for fn in (body, sb, ps):
        lines, start = inspect.getsourcelines(fn)
        allowed.update(range(start, start + len(lines)))
    assert err.site[0] == __file__
    assert err.site[1] in allowed
    assert str(err).startswith(f"{__file__}:{err.site[1]}: [{rule}]")


def test_kernel_outputs_must_be_shared_hbm():
    def k(a):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.hbm)
        nisa.dma_copy(dst=out, src=nl.load(a))
        return out

    with pytest.raises(NkiValidationError, match="shared_hbm") as info:
        run(k, rand((4, 4)))
    assert info.value.rule == "output-shared-hbm"


def test_language_restrictions_on_arguments_and_signature():
    def kwonly(a, *, scale):
        return None

    with pytest.raises(NkiValidationError, match="keyword-only"):
        nki.jit(kwonly)(rand((4, 4)), scale=2)

    def takes(a):
        return None

    with pytest.raises(NkiValidationError, match="tuples, not lists"):
        run(takes, [1, 2])
    with pytest.raises(NkiValidationError, match="cast it to int32"):
        run(takes, np.zeros((2, 2), np.int64))


def test_nested_jit_is_rejected():
    inner = nki.jit(lambda a: None)

    def outer(a):
        inner(a)

    with pytest.raises(NkiValidationError, match="sub-kernels must be plain functions"):
        run(outer, rand((4, 4)))


def test_isa_call_outside_a_kernel():
    with pytest.raises(NkiValidationError, match="only run inside a kernel"):
        nl.ndarray((4, 4), nl.float32)


@pytest.mark.parametrize(
    "target,n_ok,n_bad,why",
    [("trn1", 512, 513, "moving free size"), ("trn2", 512, 513, "moving free size"),
     ("trn3", 4096, 4097, "needs 16388 bytes per partition")],  # on trn3 the whole PSUM is the limit
)
def test_moving_free_limit_per_target(monkeypatch, target, n_ok, n_bad, why):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)

    def k(n):
        nisa.nc_matmul(ps((16, n)), sb((16, 16)), sb((16, n)))

    run(k, n_ok)
    with pytest.raises(NkiValidationError, match=why):
        run(k, n_bad)


@pytest.mark.parametrize("target,free_ok", [("trn1", 48 * 1024), ("trn2", 56 * 1024), ("trn3", 64 * 1024)])
def test_sbuf_capacity_per_target(monkeypatch, target, free_ok):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)

    def k(n):
        sb((128, n))

    run(k, free_ok)
    with pytest.raises(NkiValidationError, match="bytes per partition"):
        run(k, free_ok + 1)


def test_target_specific_rules(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")

    def bias_scalar():
        nisa.activation(sb((4, 4)), nl.exp, sb((4, 4)), bias=1.0)

    with pytest.raises(NkiValidationError, match="on trn1 bias must be"):
        run(bias_scalar)
    with pytest.raises(NkiValidationError, match="LNC=2 needs trn2"):
        nki.jit(lambda: None)[2]()
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")

    def bf16_psum():  # trn3 TensorE may write bf16 PSUM
        nisa.nc_matmul(ps((16, 16), nl.bfloat16), sb((16, 16), nl.bfloat16), sb((16, 16), nl.bfloat16))

    run(bf16_psum)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with pytest.raises(NkiValidationError, match="dst must be float32"):
        run(bf16_psum)


def test_unknown_target_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with pytest.raises(NkiTargetError, match="trn1, trn2, trn3"):
        run(lambda: None)


def test_capacity_counts_liveness_not_python_references():
    def k():
        for _ in range(4):  # each iteration's tile is dead before the next one is used
            t = sb((128, 40 * 1024))  # 160 KiB per partition
            nisa.memset(t, 0.0)
        keep = [ps((128, 512)) for _ in range(8)]  # 8 banks held by Python, used one after another
        for p in keep:
            nisa.memset(p, 0.0)

    run(k)


def _matmul_dst_shape():
    nisa.nc_matmul(ps((64, 32)), sb((16, 64)), sb((16, 64)))


def _matmul_int_dtype():
    nisa.nc_matmul(ps((16, 16)), sb((16, 16), nl.int8), sb((16, 16), nl.int8))


def _hwdge_cast(out):
    nisa.dma_copy(dst=sb((4, 4), nl.bfloat16), src=out, dge_mode=nisa.dge_mode.hwdge)


def _dma_elements(out):
    nisa.dma_copy(dst=sb((4, 5)), src=out)


def _dma_rmw_op(out):
    nisa.dma_copy(dst=sb((4, 4)), src=out, dst_rmw_op=nl.multiply)


def _transpose_dtype():
    nisa.nc_transpose(ps((8, 4), nl.bfloat16), sb((4, 8)))


def _te_transpose_memory():
    nisa.nc_transpose(sb((64, 40)), sb((40, 64)), engine=nisa.engine.tensor)


def _activation_reduce_op():
    nisa.activation(sb((4, 4)), nl.exp, sb((4, 4)), reduce_op=nl.maximum, reduce_res=sb((4, 1)))


def _alu_kind():
    nisa.tensor_scalar(sb((4, 4), nl.int32), sb((4, 4), nl.int32), op0=nl.add, operand0=1, op1=nl.bitwise_and,
                       operand1=3)


def _bitvec_float():
    nisa.tensor_tensor(sb((4, 4)), sb((4, 4)), sb((4, 4)), op=nl.bitwise_xor)


def _not_an_alu_op():
    nisa.tensor_tensor(sb((4, 4)), sb((4, 4)), sb((4, 4)), op=nl.exp)


def _iota_pattern():
    nisa.iota(sb((4, 8), nl.int32), [[1, 7]], offset=0)


def _ellipsis_twice():
    sb((4, 4))[..., ...]


def _too_many_indices():
    sb((4, 4))[0, 0, 0]


def _negative_step():
    sb((4, 4))[:, ::-1]


def _reshape_needs_copy():
    sb((4, 2, 3)).permute((0, 2, 1)).reshape((4, 6))


def _view_dtype_size():
    sb((4, 3), nl.uint8).view(nl.float32)  # NkiTensor.view: contraction needs a last dim divisible by the ratio


def _write_to_broadcast():
    nisa.memset(sb((4, 1)).broadcast(1, 8), 0.0)


def _float_index():
    sb((4, 4))[0:2.5]


def _program_id_axis():
    nl.program_id(1)


def _fori_step():
    nl.fori_loop(0, 4, lambda i: None, step=0)


def _activation_op():
    nisa.activation(sb((4, 4)), nl.add, sb((4, 4)))


def _tensor_scalar_operand_shape():
    nisa.tensor_scalar(sb((4, 4)), sb((4, 4)), op0=nl.add, operand0=sb((4, 2)))


def _gpsimd_iota_psum():
    nisa.iota(ps((4, 4), nl.float32), [[1, 4]], offset=0)


MORE_CASES = [
    (_matmul_dst_shape, "matmul-dst-shape", "[M=64, N=64]"),
    (_matmul_int_dtype, "matmul-dtype", "not a TensorE input dtype"),
    (_hwdge_cast, "dge-mode", "cannot cast"),
    (_dma_elements, "dma-elements", "16 elements"),
    (_dma_rmw_op, "removed-api", "dma_compute"),
    (_transpose_dtype, "transpose-dtype", "must equal"),
    (_te_transpose_memory, "tensor-engine-writes-psum", "reads SBUF and writes PSUM"),
    (_activation_reduce_op, "activation-reduce-op", "nl.add"),
    (_alu_kind, "alu-kind", "must both be arithmetic or both bit-vector"),
    (_bitvec_float, "bitvec-dtype", "integer tiles"),
    (_not_an_alu_op, "alu-op", "not an NKI ALU operator"),
    (_iota_pattern, "pattern", "7 elements"),
    (_ellipsis_twice, "index", "one Ellipsis"),
    (_too_many_indices, "index", "too many indices"),
    (_negative_step, "index", "positive"),
    (_reshape_needs_copy, "reshape", "without a copy"),
    (_view_dtype_size, "view", "multiple of 4 bytes"),
    (_write_to_broadcast, "write-to-broadcast", "broadcast view"),
    (_float_index, "compile-time-int", "integer"),
    (_program_id_axis, "program-id", "one (LNC) axis"),
    (_fori_step, "fori-loop", "positive"),
    (_activation_op, "activation-op", "not an activation function"),
    (_tensor_scalar_operand_shape, "operand-shape", "[4, 1]"),
    (_gpsimd_iota_psum, "gpsimd-psum", "SBUF"),
]


@pytest.mark.parametrize("body,rule,text", MORE_CASES, ids=[c[1] + ":" + c[0].__name__ for c in MORE_CASES])
def test_instruction_limits(body, rule, text):
    test_rule_violation_names_rule_and_kernel_line(body, rule, text)


def test_hwdge_needs_trn2_and_shared_hbm_must_match_across_instances(monkeypatch):
    def bad_shared(a):
        nl.ndarray((4 + nl.program_id(0), 4), nl.float32, buffer=nl.shared_hbm)

    with pytest.raises(NkiValidationError, match="allocate shared tensors identically"):
        nki.jit(bad_shared)[2](rand((4, 4)))
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")

    def hwdge(a):
        nisa.dma_copy(dst=sb((4, 4)), src=a, dge_mode=nisa.dge_mode.hwdge)

    with pytest.raises(NkiValidationError, match="hardware DGE needs trn2"):
        run(hwdge, rand((4, 4)))


def test_kernel_must_return_tensors_and_lnc_must_be_1_or_2():
    def returns_int(a):
        return 3

    with pytest.raises(NkiValidationError, match="return NKI tensors"):
        run(returns_int, rand((2, 2)))
    with pytest.raises(NkiValidationError, match="must be 1 or 2"):
        nki.jit(returns_int)[4]
    with pytest.raises(NkiValidationError, match="dict keys must be strings"):
        run(returns_int, {1: 2})


def test_reading_unwritten_memory_is_logged_once(caplog):
    def k(a):
        t = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf, name="scratch")
        u = sb((4, 4))
        nisa.tensor_copy(u, t)
        nisa.tensor_copy(u, t)
        out = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, u)
        return out

    with caplog.at_level("WARNING", logger="neuron_dynamo.nki"):
        got = run(k, rand((4, 4)))
    assert np.isnan(got).all()
    warnings = [r.getMessage() for r in caplog.records if "nothing has written" in r.getMessage()]
    assert len(warnings) == 1 and "scratch" in warnings[0] and __file__ in warnings[0]


def test_activation_inputs_outside_the_scalar_engine_range_are_logged(caplog):
    def k(a):
        t = nl.load(a)
        y = sb((2, 4))
        for _ in range(2):
            nisa.activation(y, op=nl.sin, data=t)  # no range reduction on hardware
        nisa.activation(y, op=nl.exp, data=t)  # exp is valid everywhere

    with caplog.at_level("WARNING", logger="neuron_dynamo.nki"):
        run(k, np.array([[0.0, 1.0, 9.0, -1.0], [2.0, 3.0, 0.5, 0.0]], np.float32))
    messages = [r.getMessage() for r in caplog.records if "valid ScalarE range" in r.getMessage()]
    assert len(messages) == 1 and "activation sin" in messages[0] and "[-1, 9]" in messages[0]
