"""The Trainium generation the interpreter checks kernels against, and its per-generation limits.

Figures come from reference/nki.md §1.10 and §2.1–2.2. The target is read from NEURON_PLATFORM_TARGET_OVERRIDE
(`trn1 | trn2 | trn3`, or the SDK aliases `gen2 | gen3 | gen4`); the default is trn2, the generation the project
ships for (the real simulator defaults to trn3, which would hide the tighter trn2 matmul limits).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from neuron_dynamo.nki.errors import NkiTargetError

ENV_VAR = "NEURON_PLATFORM_TARGET_OVERRIDE"
DEFAULT_TARGET = "trn2"
_ALIASES = {"trn1": "trn1", "gen2": "trn1", "trn2": "trn2", "gen3": "trn2", "trn3": "trn3", "gen4": "trn3"}


@dataclass(frozen=True)
class TargetLimits:
    """Hardware limits of one NeuronCore generation that kernels must respect."""

    name: str
    nc_version: int  # 2 (trn1), 3 (trn2), 4 (trn3)
    pmax: int = 128
    sbuf_partition_bytes: int = 192 * 1024
    psum_partition_bytes: int = 16 * 1024
    psum_bank_bytes: int = 2048
    psum_num_banks: int = 8
    gemm_stationary_fmax: int = 128
    gemm_moving_fmax: int = 512  # fp32 dst; trn3 allows more (see matmul_moving_fmax)
    bn_stats_fmax: int = 512

    def matmul_moving_fmax(self, dst_dtype: str) -> int:
        if self.nc_version >= 4:
            return 8192 if dst_dtype == "bfloat16" else 4096
        return self.gemm_moving_fmax


LIMITS = {
    "trn1": TargetLimits("trn1", 2, sbuf_partition_bytes=192 * 1024),
    "trn2": TargetLimits("trn2", 3, sbuf_partition_bytes=224 * 1024),
    "trn3": TargetLimits("trn3", 4, sbuf_partition_bytes=256 * 1024),
}


def current_target() -> str:
    """The target named by NEURON_PLATFORM_TARGET_OVERRIDE (default trn2)."""
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    if not raw:
        return DEFAULT_TARGET
    try:
        return _ALIASES[raw]
    except KeyError:
        raise NkiTargetError(
            f"{ENV_VAR}={raw!r} is not a Trainium target; set it to one of trn1, trn2, trn3 (or gen2, gen3, gen4), "
            f"or unset it for the default {DEFAULT_TARGET}"
        ) from None


def current_limits() -> TargetLimits:
    return LIMITS[current_target()]


class _TileSize:
    """`nl.tile_size`: the tile-size constants of the current target (read at access time, so the env var counts)."""

    @property
    def pmax(self) -> int:
        return current_limits().pmax

    @property
    def psum_fmax(self) -> int:
        return current_limits().psum_bank_bytes // 4

    @property
    def psum_bank_fmax(self) -> int:
        return current_limits().psum_bank_bytes // 4

    @property
    def psum_bank_fmax_bytes(self) -> int:
        return current_limits().psum_bank_bytes

    @property
    def psum_num_banks(self) -> int:
        return current_limits().psum_num_banks

    @property
    def gemm_stationary_fmax(self) -> int:
        return current_limits().gemm_stationary_fmax

    @property
    def gemm_moving_fmax(self) -> int:
        return current_limits().gemm_moving_fmax

    @property
    def bn_stats_fmax(self) -> int:
        return current_limits().bn_stats_fmax

    @property
    def sbuf_size_bytes(self) -> int:
        """Total SBUF capacity over all partitions (nki.language.tile_size.rst), `pmax * sbuf_fmax_bytes`."""
        limits = current_limits()
        return limits.pmax * limits.sbuf_partition_bytes

    @property
    def sbuf_fmax_bytes(self) -> int:
        """Usable SBUF bytes per partition."""
        return current_limits().sbuf_partition_bytes

    total_available_sbuf_size = sbuf_fmax_bytes  # deprecated 0.4: per partition despite its name

    # byte alignment of free-dim addresses: the docs name these constants without values; one fp32 element (the
    # PSUM accumulation word) and 4 bytes of SBUF are what the interpreter assumes
    psum_min_align = 4
    sbuf_min_align = 4

    @property
    def sbuf_fmax(self) -> int:
        return current_limits().sbuf_partition_bytes // 4


tile_size = _TileSize()
