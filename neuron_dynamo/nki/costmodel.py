"""Estimated Trainium device time of an NKI kernel run.

Without hardware, this model is the project's only performance figure, so every number it produces is an
**estimate**: it says how long the instructions the interpreter executed would keep each engine busy on the
target, not what a real NeuronCore measures.

Contract with the interpreter: one `CostModel(target)` per program instance per kernel run; every executed
ISA instruction (``nl.*`` convenience ops after their expansion into ISA instructions) is reported with
`CostModel.record(Instruction(...))`; `CostModel.profile()` returns the `Profile`. Under LNC > 1 the program
instances run in parallel on their own physical cores: `combine_profiles` merges their profiles. The
interpreter decides *which engine* runs an instruction; the model decides *how long* it takes.

Assumptions (section numbers refer to ``reference/nki.md``):

* Clocks and HBM bandwidth per core, per target: §2.2 and §2.3. TensorE 2.8 / 2.4 / 2.4 GHz, VectorE
  1.12 / 0.96 / 1.2 GHz, ScalarE and GpSimd 1.4 / 1.2 / 1.2 GHz (trn1 / trn2 / trn3). The Sync engine's clock is
  not documented; it is assumed equal to ScalarE's. HBM per core ≈ 410 / 360 / 600 GB/s (§2.2, derived there
  from the per-chip figures; trn2 is per *physical* core, i.e. per LNC program instance).
* Engine streaming (§2.4): an engine processes one element per partition per cycle, so an instruction costs
  ``max(MIN_II, cycles(N))`` engine cycles, where N is the number of elements per partition and MIN_II = 64
  cycles. Fewer than 128 partitions cost the same as 128. The per-instruction cycle formulas are the NC-v2
  "estimated instruction cost" formulas of §2.4, used for every target:

  - ``nc_matmul``: ``max(min(64, M), N)`` TensorE cycles (M = stationary free size, N = moving free size),
    4× for fp32 operands; K does not change the time (the systolic array is 128 deep). Without M the term
    ``min(64, M)`` is taken as 64.
  - ``nc_transpose`` on TensorE: ``max(P, min(64, F))`` for a ``[P, F]`` input; on VectorE ``max(MIN_II, F)``.
  - ``activation``/``activate2``: ``max(MIN_II, N)`` ScalarE cycles, plus MIN_II when it also reduces.
  - ``tensor_copy``, ``tensor_scalar`` (and ``tensor_scalar_reduce``/``_cumulative``), ``dropout``,
    ``bn_stats``: ``max(MIN_II, N)``; a dynamic-address ``tensor_copy`` has MIN_II ≈ 600 cycles.
  - ``tensor_tensor`` and ``scalar_tensor_tensor``: ``max(MIN_II, N)`` when one input is in PSUM or when all
    dtypes are bf16 and the ALU op is add/subtract/multiply on contiguous data, else ``max(MIN_II, 2N)``.
    ``tensor_tensor_scan`` (not in §2.4) is assumed to cost like a ``tensor_tensor`` that cannot take the fast
    path: ``max(MIN_II, 2N)``.
  - ``tensor_reduce``: ``N/2`` for a bf16 add/max, else ``N`` (floored at MIN_II like every instruction).
  - ``reciprocal`` (VectorE): ``max(MIN_II, 8N)``; ``memset``: ``max(MIN_II, N/2)`` for a zero bf16/fp16 fill,
    else ``max(MIN_II, N)``; ``iota``/``affine_select``: ``150 + N`` GpSimd cycles; ``bn_aggr``:
    ``max(MIN_II, 13N/3)``; trn3 VectorE ``exponential``: ScalarE's exp at 4× the rate (§2.3).
  - Any other instruction: ``max(MIN_II, N)`` on its engine (an approximation, logged at debug level once per
    op name and run).

* Performance modes (§2.3), applied by dividing the streaming term (not MIN_II) by the factor: on trn2 and
  trn3 VectorE, ``tensor_copy``/``tensor_scalar`` with 16-bit float data and destination (trn3: also fp8; a
  ``[P, 1]`` scalar operand tile is read once per partition and does not count) run 4× when
  both sides are SBUF and the innermost free dim is contiguous, 2× when non-contiguous or when exactly one side
  is PSUM; ``tensor_tensor`` with all-16-bit SBUF inputs runs 2×. trn3 ScalarE gets the 2× mode for
  ``tensor_copy``/``tensor_scalar``. A free-dim stride above 16 bytes halves the bandwidth (§2.4): the
  streaming term doubles.
* Not modelled in the engine busy times (the lower bound): dependencies and their latencies (the calibrated
  estimate below adds them); NC-v2's shared SBUF/PSUM port restrictions (§2.3); the cost of issuing a DMA on a
  compute engine; LoadStationary (assumed hidden in the background, §2.4).
* DMA (§2.2, §2.4): a transfer costs a fixed overhead plus its bytes over its bandwidth. The fixed overhead is
  1.3 µs (semaphore-to-start) on trn1 and for software DGE, 0.6 µs for a hardware-DGE instruction on trn2/trn3
  (where the default DGE mode is assumed to be hardware). A transfer with an SBUF side fans out over
  ``ceil(P/8)`` of the 16 DMA engines (8 partitions per engine); an HBM↔HBM transfer uses all 16. Each engine
  streams 17 / 23 / 33 B/ns (trn1 / trn2 / trn3, the "achievable peak" table) times an efficiency that depends
  on the contiguous bytes per descriptor (by default the bytes per partition): ``eff(b) = (b / (b + 256)) /
  (4096 / (4096 + 256))``, capped at 1 — a descriptor costs about as much as moving 256 B, which makes
  transfers below 256 B per partition overhead-bound (eff ≈ 0.5 at 256 B, 0.2 at 64 B), 2 KiB near peak
  (0.94) and 4 KiB saturating (1.0), the shape §2.4 describes (the constant 256 B is fitted, not documented).
  ``dma_transpose`` runs at 90% (from HBM) or 50% (SBUF→SBUF) of that (§2.4). A transfer touching HBM never
  streams faster than the per-core HBM bandwidth allows (both sides count for HBM→HBM).
* DMA overlap: transfers are spread round-robin over the 16 DMA queues; a queue runs its transfers in order
  (fixed overhead + streaming each), queues run in parallel. The DMA "engine" busy time is the largest of: the
  busiest queue, the time the 16 engines need for all bytes at their aggregate bandwidth, and the time HBM
  needs for all HBM traffic at the per-core HBM bandwidth.
* Perfect-overlap bound (``Profile.perfect_overlap_ns``, a lower bound) = the largest engine busy time, DMA
  counted as one more engine, as if the compiler's schedule hid every dependency. Serial bound (``serial_ns``) =
  the sum of every instruction's own duration, each DMA transfer with its full fixed overhead, plus the
  dependency latency (below) of every instruction that waits on a compute result: no overlap at all.

Calibrated estimate (``Profile.estimated_ns``): `Timeline` list-schedules the instructions in program order, which
is what makes real kernels slower than the perfect-overlap bound. Its parameters, each with its source:

* In-order engine queues: each compute engine has its own sequencer and runs its instruction stream in order;
  engines synchronise through hardware semaphores (``trainium_inferentia2_arch.rst``). An instruction that
  waits blocks every later instruction of its engine.
* Dependencies from ``Instruction.reads``/``writes`` (overlapping regions of one storage): a true dependency
  waits for the producer to finish plus ``DEPENDENCY_LATENCY_CYCLES`` = 200 cycles of the producer's engine
  (the semaphore and SBUF/PSUM write-commit latency). Source: ``nki_perf_guide.rst`` measures an initiation
  interval of 189 ns = 264 ScalarE cycles on NC-v2 for back-to-back dependent one-element instructions, i.e.
  MIN_II (64) + 200; the architecture guide's "≈100 cycles static overhead + ≈60 cycles access initiation" is
  the same order. Anti and output dependencies wait for the earlier access to finish (no latency: the engine
  only has to see the semaphore). Matmuls accumulating into one PSUM tile are output dependencies on TensorE
  itself: they pipeline.
* PSUM evacuation: a fresh PSUM tile takes the next of the 8 banks of 2 KiB per partition (§2.2) in rotation
  and waits until everything that used the tile previously there has finished, so TensorE cannot run more than
  8 banks ahead of the engine copying PSUM to SBUF.
* DMA: transfers are triggered in program order from one in-order queue (a transfer whose source is not ready
  yet holds up the ones behind it, as a DMA queue does, ``nki-dma-overview.rst``); the data moves
  ``dma_fixed_ns`` (the 1.3 µs / 0.6 µs semaphore-to-start latency, §2.4) after the trigger, on the
  ``ceil(P/8)`` DMA engines its partitions map to, each processing one transfer at a time
  (``trainium_inferentia2_arch.rst``). On an engine a transfer costs its descriptors (one per contiguous DMA
  buffer, by default one per partition) plus its bytes at the engine's rate (capped at its share of HBM).
  A descriptor costs ``STATIC_DESCRIPTOR_NS`` = 75 ns on trn1, whose descriptors are generated statically on
  the host and fetched from HBM by the DMA engine (``trainium2_arch.rst``, "Descriptor Generation Engine");
  the value is **fitted** to the four published latencies of AWS's matmul tutorial (Trn1, see
  ``benchmarks/calibration.py``), not documented. On trn2/trn3 (hardware DGE generates descriptors on demand)
  a descriptor costs the time of DESCRIPTOR_OVERHEAD_BYTES at the engine's rate, the lower bound's figure.
* The schedule's makespan (``Profile.schedule_ns``) is kept within [perfect overlap, serial]; the lower clamp
  binds when the DMA queues' summed fixed overheads (the lower bound's round-robin queue model) exceed what the
  pipelined schedule pays.
* Not modelled: SBUF capacity and the compiler's buffer allocation (every tile the kernel allocates is a fresh
  buffer, so loads run ahead as far as dependencies and the DMA queue allow); instruction reordering by the
  compiler; DMA queue QoS (trn3).
* TensorE utilisation = (useful matmul FLOPs at the peak of their dtype) / calibrated estimated time. The peak is
  128 × 128 × 2 FLOP per TensorE cycle for bf16/fp16/tf32/fp8 (≈ 92 / 79 / 79 TFLOPS, §2.2), a quarter of that
  for fp32, twice that for fp8 ``double_row`` (trn2/trn3). Transposes are not useful FLOPs.
* HBM roofline fraction = (HBM bytes / HBM bandwidth per core) / calibrated estimated time, where HBM bytes count both
  sides of every DMA that touch HBM (an HBM→HBM copy counts twice). SBUF↔SBUF DMA bytes are reported apart.
* LNC program instances run on separate physical cores in parallel: per-engine busy times are not added across
  cores; the combined estimated and serial times are the largest instance's; utilisation and roofline
  fractions are taken against the peak of all cores together.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from neuron_dynamo.errors import NeuronDynamoError

log = logging.getLogger("neuron_dynamo.nki.costmodel")


class CostModelError(NeuronDynamoError):
    """The cost model was given something it cannot price (unknown target, malformed instruction)."""


@dataclass(frozen=True)
class Instruction:
    """One executed instruction, as the interpreter saw it.

    ``extra`` keys the model reads (all optional): ``M`` (nc_matmul stationary free size), ``perf_mode``
    (nc_matmul, e.g. "double_row"), ``is_transpose`` (nc_matmul), ``alu_op`` (ALU op name such as "add",
    "multiply", "maximum" for tensor_tensor/tensor_reduce), ``reduce`` (activation with add-reduction),
    ``value`` (memset fill value), ``contiguous`` (innermost free dim has unit stride for every operand; default
    True), ``stride_bytes`` (largest innermost free-dim stride of any operand, in bytes), ``dynamic_address``
    (tensor_copy through a runtime address), ``contiguous_bytes`` (DMA: bytes per contiguous descriptor chunk;
    default bytes per partition), ``dge_mode`` (DMA: "hwdge" | "swdge" | "none" | "unknown").

    Input order: the streamed data first (``tensor_copy``/``tensor_scalar``/``activation``: ``in_*[0]``; ``[P, 1]``
    scalar operand tiles after it); ``tensor_tensor``: data1, data2; ``scalar_tensor_tensor``: data, then the
    optional operand0 tile, then the tensor operand last. Only streamed inputs decide the performance modes.
    """

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
    # What the instruction touches, for dependency tracking: one (storage id, (first partition, last partition,
    # first byte, last byte)) per input / for the output. Storage ids are `Storage.serial`: unique in the process.
    reads: tuple = ()
    writes: tuple = ()


@dataclass(frozen=True)
class TargetSpec:
    """The figures of one Trainium generation the model needs (reference/nki.md §2.2–2.4)."""

    name: str
    clock_ghz: dict[str, float]  # compute engine -> clock
    hbm_bytes_per_ns: float  # per core (GB/s == B/ns)
    dma_engine_bytes_per_ns: float  # achievable peak of one of the 16 DMA engines
    dma_fixed_ns: float  # fixed cost of one transfer with the target's default descriptor generation
    vector_perf_mode: bool  # trn2+: VectorE 4x/2x modes
    scalar_perf_mode: bool  # trn3: ScalarE 2x mode
    fp8_vector_fast: bool  # trn3: fp8 counts as a fast 16-bit-class dtype on Vector/Scalar
    double_row: bool  # fp8 double_row matmul (2x FLOPs per cycle)


TARGETS: dict[str, TargetSpec] = {
    "trn1": TargetSpec(
        name="trn1",
        clock_ghz={"tensor": 2.8, "vector": 1.12, "scalar": 1.4, "gpsimd": 1.4, "sync": 1.4},
        hbm_bytes_per_ns=410.0,
        dma_engine_bytes_per_ns=17.0,
        dma_fixed_ns=1300.0,
        vector_perf_mode=False,
        scalar_perf_mode=False,
        fp8_vector_fast=False,
        double_row=False,
    ),
    "trn2": TargetSpec(
        name="trn2",
        clock_ghz={"tensor": 2.4, "vector": 0.96, "scalar": 1.2, "gpsimd": 1.2, "sync": 1.2},
        hbm_bytes_per_ns=360.0,
        dma_engine_bytes_per_ns=23.0,
        dma_fixed_ns=600.0,
        vector_perf_mode=True,
        scalar_perf_mode=False,
        fp8_vector_fast=False,
        double_row=True,
    ),
    "trn3": TargetSpec(
        name="trn3",
        clock_ghz={"tensor": 2.4, "vector": 1.2, "scalar": 1.2, "gpsimd": 1.2, "sync": 1.2},
        hbm_bytes_per_ns=600.0,
        dma_engine_bytes_per_ns=33.0,
        dma_fixed_ns=600.0,
        vector_perf_mode=True,
        scalar_perf_mode=True,
        fp8_vector_fast=True,
        double_row=True,
    ),
}
_TARGET_ALIASES = {"gen2": "trn1", "gen3": "trn2", "gen4": "trn3"}

MIN_II = 64  # engine cycles per instruction, §2.4
DYNAMIC_ADDRESS_MIN_II = 600  # dynamic-address tensor_copy, §2.4
SWDGE_FIXED_NS = 1300.0  # semaphore-to-start of a software-DGE transfer, §2.4
DMA_ENGINES = 16  # per core, §2.2
DMA_QUEUES = 16
PARTITIONS_PER_DMA_ENGINE = 8
DESCRIPTOR_OVERHEAD_BYTES = 256.0  # fitted: see the module docstring
DMA_SATURATION_BYTES = 4096.0
PE_FLOPS_PER_CYCLE = 128 * 128 * 2  # TensorE bf16 peak per cycle

# Calibrated timeline (see the module docstring, "Calibrated estimate").
DEPENDENCY_LATENCY_CYCLES = 200  # true-dependency wait, nki_perf_guide.rst: II 189 ns = 264 cycles = MIN_II + 200
PSUM_BANKS = 8  # §2.2: 8 banks of 2 KiB per partition
PSUM_BANK_BYTES = 2048
STATIC_DESCRIPTOR_NS = 75.0  # trn1: one DMA buffer's descriptor, fetched from HBM (fitted, see the docstring)

DMA_OPS = frozenset({"dma_copy", "dma_transpose", "dma_compute"})
COMPUTE_ENGINES = ("tensor", "vector", "scalar", "gpsimd", "sync")

_FP16_CLASS = frozenset({"bfloat16", "float16", "bf16", "fp16"})
_FAST_TT_OPS = frozenset({"add", "subtract", "multiply"})
_FAST_REDUCE_OPS = frozenset({"add", "maximum", "max"})


def resolve_target(target: str) -> TargetSpec:
    """The `TargetSpec` of a target name ("trn1" | "trn2" | "trn3", or the "gen2/3/4" spellings)."""
    name = _TARGET_ALIASES.get(str(target).lower(), str(target).lower())
    if name not in TARGETS:
        raise CostModelError(
            f"unknown Trainium target {target!r} for the cost model; use one of {sorted(TARGETS)} "
            "(NEURON_PLATFORM_TARGET_OVERRIDE accepts the same names)"
        )
    return TARGETS[name]


def dma_efficiency(chunk_bytes: float) -> float:
    """Fraction of a DMA engine's peak reached with descriptors of `chunk_bytes` contiguous bytes (§2.4 shape)."""
    if chunk_bytes <= 0:
        return 1.0 / (1.0 + DESCRIPTOR_OVERHEAD_BYTES)
    at_saturation = DMA_SATURATION_BYTES / (DMA_SATURATION_BYTES + DESCRIPTOR_OVERHEAD_BYTES)
    return min(1.0, chunk_bytes / (chunk_bytes + DESCRIPTOR_OVERHEAD_BYTES) / at_saturation)


def _is_hbm(buffer: str) -> bool:
    return "hbm" in buffer


def _is_fp32(dtype: str) -> bool:
    return dtype in ("float32", "fp32")


def _streamed(instr: Instruction) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(dtypes, buffers) of the two streamed inputs of a tensor_tensor-like instruction.

    A [P, 1] scalar operand (scalar_tensor_tensor's operand0, listed between the two) is read once per partition,
    so it does not decide the fast paths.
    """
    if len(instr.in_dtypes) > 2:
        return (instr.in_dtypes[0], instr.in_dtypes[-1]), (instr.in_buffers[0], instr.in_buffers[-1])
    return instr.in_dtypes, instr.in_buffers


def _all_bf16(dtypes: Sequence[str]) -> bool:
    return bool(dtypes) and all(d in ("bfloat16", "bf16") for d in dtypes)


@dataclass
class Profile:
    """What one kernel run cost, **estimated** (see the module docstring for the assumptions)."""

    target: str
    instructions: dict[str, int]  # op name -> count
    engine_busy_ns: dict[str, float]  # engine -> busy time ("dma" = all DMA queues together)
    dma_bytes: int  # bytes moved by all DMA transfers
    estimated_ns: float  # calibrated: the dependency-aware schedule, kept within the two bounds below
    serial_ns: float  # upper bound: no overlap at all (sum of every instruction's duration)
    matmul_flops: int
    tensor_utilisation: float  # useful matmul FLOPs / (TensorE peak * estimated time)
    hbm_roofline_fraction: float  # (HBM bytes / HBM bandwidth) / estimated time
    hbm_bytes: int = 0  # HBM traffic: both sides of every DMA touching HBM
    sbuf_dma_bytes: int = 0  # on-chip SBUF<->SBUF DMA bytes
    dma_transfers: int = 0
    engine_instructions: dict[str, int] = field(default_factory=dict)  # engine -> instruction count
    op_busy_ns: dict[str, float] = field(default_factory=dict)  # op name -> summed own durations (serial breakdown)
    tensor_ideal_ns: float = 0.0  # the useful matmul FLOPs at TensorE peak
    cores: int = 1  # program instances combined into this profile
    perfect_overlap_ns: float = 0.0  # lower bound: perfect overlap between engines (max of engine busy times)
    schedule_ns: float = 0.0  # the schedule's own makespan, before it is kept within the bounds

    @property
    def bottleneck(self) -> str:
        """The engine whose busy time sets the estimated time ("" for an empty run)."""
        busy = {e: t for e, t in self.engine_busy_ns.items() if t > 0}
        return max(busy, key=busy.get) if busy else ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["bottleneck"] = self.bottleneck
        return d

    def __str__(self) -> str:
        cores = "1 core" if self.cores == 1 else f"{self.cores} cores in parallel"
        lines = [
            f"Estimated device time on {self.target} ({cores}): {self.estimated_ns / 1e3:.2f} us calibrated "
            f"(bounds: {self.perfect_overlap_ns / 1e3:.2f} us with perfect overlap, {self.serial_ns / 1e3:.2f} us "
            "serial)",
            f"{'engine':<8} {'instrs':>8} {'busy us':>10} {'of est.':>8}",
        ]
        for engine, busy in self.engine_busy_ns.items():
            share = busy / self.estimated_ns if self.estimated_ns else 0.0
            count = self.engine_instructions.get(engine, 0)
            lines.append(f"{engine:<8} {count:>8} {busy / 1e3:>10.2f} {share:>8.0%}")
        lines.append(
            f"TensorE utilisation {self.tensor_utilisation:.1%}, HBM roofline {self.hbm_roofline_fraction:.1%} "
            f"(estimated); bottleneck: {self.bottleneck or '-'}"
        )
        top_ops = sorted(self.op_busy_ns.items(), key=lambda kv: kv[1], reverse=True)[:4]
        if top_ops:
            lines.append("serial time by op: " + ", ".join(f"{op} {ns / 1e3:.2f} us" for op, ns in top_ops))
        lines.append(
            f"DMA: {self.dma_transfers} transfers, {self.hbm_bytes / 2**20:.2f} MiB HBM traffic, "
            f"{self.sbuf_dma_bytes / 2**20:.2f} MiB SBUF<->SBUF"
        )
        return "\n".join(lines)


def _overlaps(a: tuple, b: tuple) -> bool:
    """Do two (first partition, last partition, first byte, last byte) regions share a byte?"""
    return a[0] <= b[1] and b[0] <= a[1] and a[2] <= b[3] and b[2] <= a[3]


def _contains(outer: tuple, inner: tuple) -> bool:
    return outer[0] <= inner[0] and inner[1] <= outer[1] and outer[2] <= inner[2] and inner[3] <= outer[3]


class _Storage:
    """What the timeline remembers of one storage: when each region was last written (finished, and visible to a
    dependent compute instruction after the semaphore) and last read."""

    __slots__ = ("writes", "reads")

    def __init__(self) -> None:
        self.writes: dict[tuple, tuple[float, float]] = {}  # region -> (end, end + dependency latency)
        self.reads: dict[tuple, float] = {}  # region -> end

    def last_use(self) -> float:
        ends = [end for end, _ in self.writes.values()] + list(self.reads.values())
        return max(ends, default=0.0)


class Timeline:
    """List schedule of one program instance's instructions in program order: the calibrated estimate.

    Each compute engine runs its instructions in order; a DMA is triggered in program order from one in-order
    queue and streams on the DMA engines its partitions map to. An instruction starts when its engine (or its
    DMA engines) is free and its dependencies are met: true dependencies (it reads a region an earlier
    instruction wrote) wait for the producer plus the semaphore latency; anti and output dependencies wait for
    the earlier access to finish. A fresh PSUM tile takes the next of the 8 banks and waits until the tile that
    held it was evacuated.
    """

    def __init__(self, spec: TargetSpec) -> None:
        self.spec = spec
        self.engine_free = dict.fromkeys(COMPUTE_ENGINES, 0.0)
        self.dma_engine_free = [0.0] * DMA_ENGINES
        self.next_dma_engine = 0
        self.last_trigger = 0.0
        self.storages: dict[int, _Storage] = {}
        self.psum_owner: list[int | None] = [None] * PSUM_BANKS
        self.psum_banks: dict[int, int] = {}  # psum storage id -> first bank
        self.next_bank = 0
        self.makespan = 0.0
        self.latency_ns = 0.0  # the dependency latencies paid, each once: they belong to the serial bound too

    def add(self, instr: Instruction, duration_ns: float | None) -> None:
        """Schedule one instruction; `duration_ns` is a compute instruction's own duration (None for a DMA)."""
        is_dma = duration_ns is None
        ready, latency_ns = self._ready(instr, visible=not is_dma)
        self.latency_ns += latency_ns
        if is_dma:
            start, end = self._schedule_dma(instr, ready)
        else:
            start = max(self.engine_free[instr.engine], ready)
            end = start + duration_ns
            self.engine_free[instr.engine] = end
        clock = self.spec.clock_ghz["sync" if is_dma else instr.engine]
        self._remember(instr, end, end + DEPENDENCY_LATENCY_CYCLES / clock)
        self.makespan = max(self.makespan, end)

    def _ready(self, instr: Instruction, visible: bool) -> tuple[float, float]:
        """(when the instruction's dependencies allow it to start, the semaphore latency of its true dependencies);
        `visible`: a compute instruction waits out that latency, a DMA's trigger latency covers it."""
        ready, latency = 0.0, 0.0
        for sid, region in instr.reads:
            storage = self.storages.get(sid)
            if storage is None:
                continue
            for written, (end, seen) in storage.writes.items():
                if _overlaps(written, region):
                    ready = max(ready, seen if visible else end)
                    latency = max(latency, seen - end if visible else 0.0)
        for sid, region in instr.writes:
            if instr.out_buffer == "psum" and sid not in self.psum_banks:
                ready = max(ready, self._take_psum_banks(sid, region))
            storage = self.storages.get(sid)
            if storage is None:
                continue
            for accessed, (end, _) in storage.writes.items():
                if _overlaps(accessed, region):
                    ready = max(ready, end)
            for accessed, end in storage.reads.items():
                if _overlaps(accessed, region):
                    ready = max(ready, end)
        return ready, latency

    def _take_psum_banks(self, sid: int, region: tuple) -> float:
        """Give a fresh PSUM tile the next banks; it may start once their previous tiles are done."""
        banks = min(PSUM_BANKS, max(1, math.ceil((region[3] + 1) / PSUM_BANK_BYTES)))
        free_at = 0.0
        for i in range(banks):
            bank = (self.next_bank + i) % PSUM_BANKS
            owner = self.psum_owner[bank]
            if owner is not None and owner in self.storages:
                free_at = max(free_at, self.storages[owner].last_use())
            self.psum_owner[bank] = sid
        self.psum_banks[sid] = self.next_bank
        self.next_bank = (self.next_bank + banks) % PSUM_BANKS
        return free_at

    def _remember(self, instr: Instruction, end: float, seen: float) -> None:
        for sid, region in instr.reads:
            reads = self.storages.setdefault(sid, _Storage()).reads
            reads[region] = max(reads.get(region, 0.0), end)
        for sid, region in instr.writes:
            storage = self.storages.setdefault(sid, _Storage())
            # Accesses the new write covers are ordered before it: later instructions need only wait for it.
            for old in [r for r in storage.writes if _contains(region, r)]:
                del storage.writes[old]
            for old in [r for r in storage.reads if _contains(region, r)]:
                del storage.reads[old]
            storage.writes[region] = (end, seen)

    def _schedule_dma(self, instr: Instruction, ready: float) -> tuple[float, float]:
        """Trigger in program order, wait the fixed semaphore-to-start latency, stream on the DMA engines."""
        trigger = max(self.last_trigger, ready)
        self.last_trigger = trigger
        engines, per_engine_ns = self._dma_engine_time(instr)
        used = [(self.next_dma_engine + i) % DMA_ENGINES for i in range(engines)]
        self.next_dma_engine = (self.next_dma_engine + engines) % DMA_ENGINES
        start = max(trigger + _dma_fixed_ns(instr, self.spec), *(self.dma_engine_free[e] for e in used))
        end = start + per_engine_ns
        for e in used:
            self.dma_engine_free[e] = end
        return start, end

    def _dma_engine_time(self, instr: Instruction) -> tuple[int, float]:
        """(engines used, time on each): its share of the descriptors and of the bytes at the engine's rate."""
        nbytes = instr.dma_bytes
        partitions = max(1, instr.partitions)
        engines = _dma_engines(instr)
        chunk = instr.extra.get("contiguous_bytes") or nbytes / partitions
        descriptors = math.ceil(nbytes / chunk / engines) if nbytes and chunk else 1
        hbm_sides = sum(_is_hbm(b) for b in (*instr.in_buffers, instr.out_buffer))
        rate = self.spec.dma_engine_bytes_per_ns
        if hbm_sides:
            rate = min(rate, self.spec.hbm_bytes_per_ns / (DMA_ENGINES * hbm_sides))
        if instr.op == "dma_transpose":
            rate *= _transpose_factor(instr)
        static = self.spec.name == "trn1" and instr.extra.get("dge_mode", "unknown") != "swdge"
        rate_per_byte = 1.0 / self.spec.dma_engine_bytes_per_ns
        descriptor_ns = STATIC_DESCRIPTOR_NS if static else DESCRIPTOR_OVERHEAD_BYTES * rate_per_byte
        return engines, descriptors * descriptor_ns + nbytes / engines / rate


def _dma_engines(instr: Instruction) -> int:
    """DMA engines a transfer fans out over: 8 SBUF partitions per engine; HBM->HBM uses all 16 (§2.4)."""
    on_chip_side = any(not _is_hbm(b) for b in (*instr.in_buffers, instr.out_buffer))
    if not on_chip_side:
        return DMA_ENGINES
    return min(DMA_ENGINES, math.ceil(max(1, instr.partitions) / PARTITIONS_PER_DMA_ENGINE))


def _transpose_factor(instr: Instruction) -> float:
    """dma_transpose reaches 90% (from HBM) or 50% (SBUF->SBUF) of copy throughput (§2.4)."""
    return 0.9 if any(_is_hbm(b) for b in instr.in_buffers) else 0.5


def _dma_fixed_ns(instr: Instruction, spec: TargetSpec) -> float:
    """Semaphore-to-start of a transfer: 1.3 us for software DGE and trn1, the target's figure otherwise."""
    return SWDGE_FIXED_NS if instr.extra.get("dge_mode", "unknown") == "swdge" else spec.dma_fixed_ns


class CostModel:
    """Accumulates the estimated cost of the instructions of one program instance on one target."""

    def __init__(self, target: str = "trn2") -> None:
        self.spec = resolve_target(target)
        self.target = self.spec.name
        self._instructions: dict[str, int] = {}
        self._engine_instructions: dict[str, int] = {}
        self._engine_ns: dict[str, float] = dict.fromkeys(COMPUTE_ENGINES, 0.0)
        self._op_ns: dict[str, float] = {}
        self._queue_ns = [0.0] * DMA_QUEUES
        self._next_queue = 0
        self._dma_pool_ns = 0.0  # the 16 DMA engines' occupancy at their aggregate bandwidth
        self._dma_serial_ns = 0.0
        self._dma_bytes = 0
        self._hbm_bytes = 0
        self._sbuf_dma_bytes = 0
        self._dma_transfers = 0
        self._flops = 0
        self._tensor_ideal_ns = 0.0
        self._approximated: set[str] = set()
        self._timeline = Timeline(self.spec)

    def record(self, instr: Instruction) -> None:
        """Charge one executed instruction to its engine (or to the DMA queues)."""
        op = instr.op
        if op in DMA_OPS or instr.engine == "dma":
            ns = self._record_dma(instr)
            engine = "dma"
            self._timeline.add(instr, None)
        else:
            engine = instr.engine
            clock = self.spec.clock_ghz.get(engine)
            if clock is None:
                raise CostModelError(
                    f"instruction {op!r} was reported on unknown engine {engine!r}; the cost model knows "
                    f"{list(COMPUTE_ENGINES) + ['dma']} (fix the Instruction the interpreter builds)"
                )
            ns = self.cycles(instr) / clock
            self._engine_ns[engine] += ns
            self._timeline.add(instr, ns)
            if op == "nc_matmul" and instr.flops and not instr.extra.get("is_transpose"):
                self._flops += instr.flops
                self._tensor_ideal_ns += instr.flops / self._peak_flops_per_ns(instr)
        self._instructions[op] = self._instructions.get(op, 0) + 1
        self._engine_instructions[engine] = self._engine_instructions.get(engine, 0) + 1
        self._op_ns[op] = self._op_ns.get(op, 0.0) + ns

    # ---- compute engines -------------------------------------------------------------------------------

    def cycles(self, instr: Instruction) -> float:
        """Engine cycles of one compute instruction (§2.4 formulas, §2.3 performance modes)."""
        op, n, extra = instr.op, instr.free_elems, instr.extra
        if op == "nc_matmul":
            m = extra.get("M", 64)
            cycles = max(min(64, m), n)
            return 4 * cycles if any(_is_fp32(d) for d in instr.in_dtypes) else cycles
        if op == "nc_transpose" and instr.engine == "tensor":
            return max(instr.partitions, min(64, n))
        if op == "iota" or op == "affine_select":
            return 150 + n
        stream = n * self._stride_penalty(instr)
        min_ii = MIN_II
        if op in ("tensor_copy", "tensor_scalar", "tensor_scalar_reduce", "tensor_scalar_cumulative"):
            stream /= self._copy_perf_factor(instr)
            if extra.get("dynamic_address"):
                min_ii = DYNAMIC_ADDRESS_MIN_II
        elif op in ("tensor_tensor", "scalar_tensor_tensor"):
            stream = stream if self._tensor_tensor_fast(instr) else 2 * stream
            stream /= self._tensor_tensor_perf_factor(instr)
        elif op == "tensor_tensor_scan":
            stream = 2 * stream
        elif op in ("activation", "activation_reduce", "activate2"):
            reduces = op == "activation_reduce" or extra.get("reduce") or extra.get("reduce_res")
            return max(MIN_II, stream) + (MIN_II if reduces else 0)
        elif op == "tensor_reduce":
            fast = _all_bf16(instr.in_dtypes) and extra.get("alu_op") in _FAST_REDUCE_OPS
            stream = stream / 2 if fast else stream
        elif op == "reciprocal":
            stream = 8 * stream
        elif op == "memset":
            zero_fill = extra.get("value", None) == 0 and instr.out_dtype in _FP16_CLASS
            stream = stream / 2 if zero_fill else stream
        elif op == "bn_aggr":
            stream = 13 * stream / 3
        elif op == "exponential":
            stream = stream / 4
        elif op not in ("nc_transpose", "bn_stats", "dropout") and op not in self._approximated:
            self._approximated.add(op)
            log.debug("no cost formula for %r: charging max(MIN_II, N) cycles on %s (estimated)", op, instr.engine)
        return max(min_ii, stream)

    def _stride_penalty(self, instr: Instruction) -> float:
        """A free-dim stride above 16 B halves the engine's read/write bandwidth (§2.4)."""
        return 2.0 if instr.extra.get("stride_bytes", 0) > 16 else 1.0

    def _fast_dtype(self, dtype: str) -> bool:
        return dtype in _FP16_CLASS or (self.spec.fp8_vector_fast and dtype.startswith("float8"))

    def _copy_perf_factor(self, instr: Instruction) -> float:
        """trn2+ VectorE / trn3 ScalarE performance mode of tensor_copy and tensor_scalar (§2.3)."""
        on_vector = instr.engine == "vector" and self.spec.vector_perf_mode
        on_scalar = instr.engine == "scalar" and self.spec.scalar_perf_mode
        if not (on_vector or on_scalar):
            return 1.0
        if not (self._fast_dtype(instr.in_dtypes[0]) and self._fast_dtype(instr.out_dtype)):
            return 1.0
        psum_sides = sum(b == "psum" for b in (instr.in_buffers[0], instr.out_buffer))
        if psum_sides == 2:
            return 1.0
        if psum_sides == 1 or not instr.extra.get("contiguous", True):
            return 2.0
        return 4.0 if on_vector else 2.0

    def _tensor_tensor_fast(self, instr: Instruction) -> bool:
        """The single-pass case of tensor_tensor (§2.4): one input in PSUM, or bf16 add/sub/mul contiguous."""
        dtypes, buffers = _streamed(instr)
        if "psum" in buffers:
            return True
        fast_op = instr.extra.get("alu_op") in _FAST_TT_OPS and instr.extra.get("contiguous", True)
        return fast_op and _all_bf16((*dtypes, instr.out_dtype))

    def _tensor_tensor_perf_factor(self, instr: Instruction) -> float:
        """trn2+ VectorE runs tensor_tensor 2x with all-16-bit SBUF inputs (§2.3)."""
        if instr.engine != "vector" or not self.spec.vector_perf_mode:
            return 1.0
        dtypes, buffers = _streamed(instr)
        sbuf_inputs = all(b == "sbuf" for b in buffers)
        return 2.0 if sbuf_inputs and all(self._fast_dtype(d) for d in dtypes) else 1.0

    def _peak_flops_per_ns(self, instr: Instruction) -> float:
        """TensorE peak for the instruction's dtype: bf16-class rate, /4 for fp32, x2 for fp8 double_row."""
        peak = PE_FLOPS_PER_CYCLE * self.spec.clock_ghz["tensor"]
        if any(_is_fp32(d) for d in instr.in_dtypes):
            return peak / 4
        if self.spec.double_row and instr.extra.get("perf_mode") == "double_row":
            return peak * 2
        return peak

    # ---- DMA ---------------------------------------------------------------------------------------------

    def _record_dma(self, instr: Instruction) -> float:
        """Queue one transfer; returns its own duration (fixed overhead + streaming)."""
        nbytes = instr.dma_bytes
        if nbytes < 0:
            raise CostModelError(f"DMA instruction {instr.op!r} reports {nbytes} bytes; dma_bytes must be >= 0")
        buffers = (*instr.in_buffers, instr.out_buffer)
        engines = _dma_engines(instr)
        chunk = instr.extra.get("contiguous_bytes") or nbytes / max(1, instr.partitions)
        rate = engines * self.spec.dma_engine_bytes_per_ns * dma_efficiency(chunk)
        if instr.op == "dma_transpose":
            rate *= _transpose_factor(instr)
        hbm_sides = sum(_is_hbm(b) for b in buffers)
        stream_ns = max(nbytes / rate, nbytes * hbm_sides / self.spec.hbm_bytes_per_ns)
        duration = _dma_fixed_ns(instr, self.spec) + stream_ns

        self._queue_ns[self._next_queue] += duration
        self._next_queue = (self._next_queue + 1) % DMA_QUEUES
        self._dma_pool_ns += stream_ns * engines / DMA_ENGINES
        self._dma_serial_ns += duration
        self._dma_transfers += 1
        self._dma_bytes += nbytes
        if instr.op == "dma_compute" and _is_hbm(instr.out_buffer):
            hbm_sides += 1  # read-modify-write reads the destination too
        self._hbm_bytes += nbytes * hbm_sides
        if hbm_sides == 0:
            self._sbuf_dma_bytes += nbytes
        return duration

    def _dma_busy_ns(self) -> float:
        hbm_ns = self._hbm_bytes / self.spec.hbm_bytes_per_ns
        return max(max(self._queue_ns), self._dma_pool_ns, hbm_ns)

    # ---- result ------------------------------------------------------------------------------------------

    def profile(self) -> Profile:
        """The estimated profile of everything recorded so far."""
        busy = {e: t for e, t in self._engine_ns.items() if t > 0 or self._engine_instructions.get(e)}
        busy["dma"] = self._dma_busy_ns()
        lower = max(busy.values())
        serial = sum(t for e, t in self._engine_ns.items()) + self._dma_serial_ns + self._timeline.latency_ns
        estimated = min(max(self._timeline.makespan, lower), max(serial, lower))
        return Profile(
            target=self.target,
            instructions=dict(self._instructions),
            engine_busy_ns=busy,
            dma_bytes=self._dma_bytes,
            estimated_ns=estimated,
            serial_ns=serial,
            matmul_flops=self._flops,
            tensor_utilisation=self._tensor_ideal_ns / estimated if estimated else 0.0,
            hbm_roofline_fraction=_hbm_fraction(self._hbm_bytes, self.spec, 1, estimated),
            hbm_bytes=self._hbm_bytes,
            sbuf_dma_bytes=self._sbuf_dma_bytes,
            dma_transfers=self._dma_transfers,
            engine_instructions=dict(self._engine_instructions),
            op_busy_ns=dict(self._op_ns),
            tensor_ideal_ns=self._tensor_ideal_ns,
            cores=1,
            perfect_overlap_ns=lower,
            schedule_ns=self._timeline.makespan,
        )


def _hbm_fraction(hbm_bytes: int, spec: TargetSpec, cores: int, estimated_ns: float) -> float:
    if not estimated_ns:
        return 0.0
    return hbm_bytes / (spec.hbm_bytes_per_ns * cores) / estimated_ns


def combine_profiles(profiles: Sequence[Profile]) -> Profile:
    """One profile for LNC program instances that ran in parallel, each on its own physical core.

    Counts, bytes and FLOPs add up; busy times do not (each core has its own engines): the combined busy time
    of an engine, the estimated time and the serial time are the largest instance's. Utilisation and the HBM
    roofline fraction are taken against the peak of all cores together.
    """
    if not profiles:
        raise CostModelError("combine_profiles needs at least one Profile (one per LNC program instance)")
    targets = {p.target for p in profiles}
    if len(targets) != 1:
        raise CostModelError(f"cannot combine profiles of different targets {sorted(targets)}; run one target")
    spec = resolve_target(profiles[0].target)

    def add(dicts: list[dict]) -> dict:
        out: dict = {}
        for d in dicts:
            for k, v in d.items():
                out[k] = out.get(k, 0) + v
        return out

    busy: dict[str, float] = {}
    for p in profiles:
        for engine, t in p.engine_busy_ns.items():
            busy[engine] = max(busy.get(engine, 0.0), t)
    cores = sum(p.cores for p in profiles)
    estimated = max(p.estimated_ns for p in profiles)
    lower = max(p.perfect_overlap_ns for p in profiles)
    ideal = sum(p.tensor_ideal_ns for p in profiles)
    hbm_bytes = sum(p.hbm_bytes for p in profiles)
    return Profile(
        target=spec.name,
        instructions=add([p.instructions for p in profiles]),
        engine_busy_ns=busy,
        dma_bytes=sum(p.dma_bytes for p in profiles),
        estimated_ns=estimated,
        serial_ns=max(p.serial_ns for p in profiles),
        matmul_flops=sum(p.matmul_flops for p in profiles),
        tensor_utilisation=ideal / (cores * estimated) if estimated else 0.0,
        hbm_roofline_fraction=_hbm_fraction(hbm_bytes, spec, cores, estimated),
        hbm_bytes=hbm_bytes,
        sbuf_dma_bytes=sum(p.sbuf_dma_bytes for p in profiles),
        dma_transfers=sum(p.dma_transfers for p in profiles),
        engine_instructions=add([p.engine_instructions for p in profiles]),
        op_busy_ns=add([p.op_busy_ns for p in profiles]),
        tensor_ideal_ns=ideal,
        cores=cores,
        perfect_overlap_ns=lower,
        schedule_ns=max(p.schedule_ns for p in profiles),
    )
