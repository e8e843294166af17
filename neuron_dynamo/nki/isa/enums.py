"""The enums of `nki.isa` (NKI spells them in lower case) and the target generation they describe."""

from __future__ import annotations

import enum

from neuron_dynamo.nki.context import current


class engine(enum.Enum):  # noqa: N801 - NKI spells its enums in lower case
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class reduce_cmd(enum.Enum):  # noqa: N801
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class oob_mode(enum.Enum):  # noqa: N801
    error = 0
    skip = 1


class dge_mode(enum.Enum):  # noqa: N801
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class matmul_perf_mode(enum.Enum):  # noqa: N801
    none = 0
    double_row = 1


class nc_version(enum.Enum):  # noqa: N801
    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.Enum):  # noqa: N801
    dma = 0
    gpsimd_dma = 1


tensor_engine = engine.tensor  # deprecated aliases, still used by many kernels
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown
# the enums under names the instruction parameters (engine=, dge_mode=, ...) do not shadow
_Engine, _DgeMode, _OobMode, _ReduceCmd = engine, dge_mode, oob_mode, reduce_cmd


def get_nc_version() -> nc_version:
    return nc_version(current().limits.nc_version)


def get_nc_sub_version() -> int:
    """The silicon revision within the generation (0 = first); the interpreter models first revisions."""
    current()
    return 0
