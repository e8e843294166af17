"""Estimated Trainium device time of an NKI kernel run (INTERFACE DRAFT — the cost-model helper fills it in).

Contract between the interpreter and the cost model:

* the interpreter creates one `CostModel(target)` per kernel run (per program instance under LNC>1),
* every executed ISA instruction (and every `nl.*` convenience op, after the interpreter has expanded it
  into the instruction(s) it stands for) is reported with `CostModel.record(Instruction(...))`,
* at the end the interpreter calls `CostModel.profile()` and hands the `Profile` to the user.

The interpreter decides *which engine* runs an instruction (its `engine=` argument, or the default engine
of that instruction); the cost model decides *how long* it takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Instruction:
    """One executed instruction, as the interpreter saw it."""

    op: str  # ISA name: "nc_matmul", "nc_transpose", "activation", "tensor_tensor", "tensor_scalar", "dma_copy", ...
    engine: str  # "tensor" | "vector" | "scalar" | "gpsimd" | "dma" | "sync"
    partitions: int  # active partitions (1..128); for DMA, the partition count of the SBUF side (or 1)
    free_elems: int  # elements per partition streamed by the engine (matmul: moving free size N)
    in_dtypes: tuple[str, ...]  # NKI dtype names of the inputs, e.g. ("bfloat16", "float32")
    out_dtype: str
    in_buffers: tuple[str, ...]  # "sbuf" | "psum" | "hbm" for each input
    out_buffer: str
    dma_bytes: int = 0  # DMA only: bytes moved
    flops: int = 0  # useful FLOPs (matmul: 2*K*M*N) for utilisation figures
    extra: dict = field(default_factory=dict)  # op-specific facts: alu op name, K, M, contiguity, ...


@dataclass
class Profile:
    """What one kernel run cost, estimated."""

    target: str
    instructions: dict[str, int]  # op name -> count
    engine_busy_ns: dict[str, float]  # engine -> busy time
    dma_bytes: int
    estimated_ns: float  # lower bound: perfect overlap between engines (max of engine busy times)
    serial_ns: float  # upper bound: no overlap at all (sum of engine busy times)
    matmul_flops: int
    tensor_utilisation: float  # useful matmul FLOPs / (TensorE peak * estimated time)
    hbm_roofline_fraction: float  # (HBM bytes / HBM bandwidth) / estimated time


class CostModel:
    def __init__(self, target: str = "trn2") -> None:
        self.target = target

    def record(self, instr: Instruction) -> None:
        raise NotImplementedError

    def profile(self) -> Profile:
        raise NotImplementedError
