"""`nki.isa`: the NKI 0.6 instruction set on CPU.

Every instruction checks the hardware rules it is subject to (reference/nki.md §1.5–1.7, §2.1) *before* touching
memory, executes as one vectorised NumPy call in fp32 (bit-vector ops on integer bit patterns), casts the result to
`dst.dtype`, and reports itself to the program instance's cost model with the engine that runs it. The semantics live
one module per engine (`tensore`; `vectore`, `reductions`, `gpsimd`, `gather`, `prng` for VectorE/GpSimd; `scalare`;
`dma`); the operand checks they share live in `operands`. MX (`nc_matmul_mx`, `quantize_mx`, x4 dtypes) is not
implemented.
"""

from neuron_dynamo.nki.errors import NkiValidationError
from neuron_dynamo.nki.isa.dma import dma_compute, dma_copy, dma_transpose
from neuron_dynamo.nki.isa.enums import (
    dge_mode,
    dma_engine,
    engine,
    get_nc_sub_version,
    get_nc_version,
    gpsimd_engine,
    matmul_perf_mode,
    nc_version,
    oob_mode,
    reduce_cmd,
    scalar_engine,
    tensor_engine,
    unknown_engine,
    vector_engine,
)
from neuron_dynamo.nki.isa.gather import local_gather, nc_n_gather, nonzero_with_count, sequence_bounds, topk
from neuron_dynamo.nki.isa.gpsimd import affine_select, iota, tensor_partition_reduce
from neuron_dynamo.nki.isa.lnc import core_barrier, sendrecv
from neuron_dynamo.nki.isa.prng import rand2, rand_get_state, rand_set_state, rng, set_rng_seed
from neuron_dynamo.nki.isa.reductions import (
    bn_aggr,
    bn_stats,
    max8,
    nc_find_index8,
    nc_match_replace8,
    range_select,
    select_reduce,
    tensor_reduce,
    tensor_scalar_cumulative,
    tensor_scalar_reduce,
    tensor_tensor_scan,
)
from neuron_dynamo.nki.isa.registers import (
    VirtualRegister,
    register_alloc,
    register_load,
    register_move,
    register_store,
)
from neuron_dynamo.nki.isa.scalare import activate2, activation, activation_reduce
from neuron_dynamo.nki.isa.tensore import nc_matmul, nc_transpose
from neuron_dynamo.nki.isa.vectore import (
    dropout,
    exponential,
    memset,
    nc_stream_shuffle,
    reciprocal,
    scalar_tensor_tensor,
    tensor_copy,
    tensor_copy_dynamic_dst,
    tensor_copy_dynamic_src,
    tensor_copy_predicated,
    tensor_scalar,
    tensor_tensor,
)

__all__ = [
    "NkiValidationError", "engine", "reduce_cmd", "oob_mode", "dge_mode", "matmul_perf_mode", "nc_version",
    "dma_engine", "get_nc_version", "dma_copy", "dma_transpose", "tensor_copy", "memset", "nc_matmul", "nc_transpose",
    "activation", "activation_reduce", "tensor_tensor", "tensor_scalar", "scalar_tensor_tensor", "tensor_reduce",
    "tensor_tensor_scan", "iota", "affine_select", "reciprocal", "bn_stats", "bn_aggr", "tensor_partition_reduce",
    "dropout", "max8", "tensor_copy_predicated", "core_barrier", "sendrecv", "dma_compute", "tensor_scalar_reduce",
    "select_reduce", "range_select", "exponential", "nc_stream_shuffle", "nc_find_index8", "nc_match_replace8",
    "tensor_copy_dynamic_src", "tensor_copy_dynamic_dst", "VirtualRegister", "register_alloc", "register_move",
    "register_load", "register_store", "tensor_engine", "vector_engine", "scalar_engine", "gpsimd_engine",
    "unknown_engine", "get_nc_sub_version", "tensor_scalar_cumulative", "activate2", "local_gather", "nc_n_gather",
    "sequence_bounds", "nonzero_with_count", "topk", "rng", "rand2", "set_rng_seed", "rand_set_state",
    "rand_get_state",
]
