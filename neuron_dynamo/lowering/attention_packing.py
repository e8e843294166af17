"""Short attention packed into 128-row tiles: several (batch, head) slices share one tile of the flash kernels.

The kernels work on 128 query rows at a time, so a sequence of 64 fills half a tile and a decode step one row.
When the sequences are short, `plan` puts several slices into one tile instead: first the query heads that share
a kv head are stacked as rows against their one copy of K/V (`stacked` of them, a divisor of the group size),
then `per_tile` such units sit side by side, unit i's rows against unit i's keys only (a block-diagonal additive
mask; torch's top-left causal rule and the caller's mask apply inside each block, padded keys and rows are masked).
The kernel then sees [tiles, 1, 128, D] queries and [tiles, 1, per_tile · Sk (padded), D] keys and runs one
non-causal attention per tile. Padded units and rows are zero; in the backward their output gradient is zero,
so they add nothing to dk and dv. A plan exists only where it needs fewer tiles than one per (batch, head).
"""

import dataclasses
import functools

import torch
import torch.nn.functional as F

TILE = 128
MASKED = -30000.0  # exp() of this underflows to 0 in every float dtype, yet it is finite (the kernel's contract)


@dataclasses.dataclass(frozen=True)
class Packing:
    """Queries [batch, heads, sq, D] and keys [batch, kv_heads, sk, D] as `tiles` tiles of `per_tile` units,
    each unit `stacked` query heads of one kv head (stacked · sq rows) against that head's sk keys."""

    batch: int
    heads: int
    kv_heads: int
    sq: int
    sk: int
    stacked: int
    per_tile: int
    tiles: int
    width: int  # key columns per tile: per_tile · sk padded to a multiple of 128

    @property
    def unit_rows(self) -> int:
        return self.stacked * self.sq

    @property
    def units(self) -> int:
        return self.batch * self.heads // self.stacked

    @property
    def full_tiles(self) -> bool:
        """Whether the units fill the tiles exactly (no padded unit), each tile's 128 query rows included."""
        return self.units == self.tiles * self.per_tile and self.per_tile * self.unit_rows == TILE

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """[B, Hq, Sq, ...] (queries, outputs, their gradients, lse) → [tiles, 1, 128, ...]."""
        if self.full_tiles:  # nothing to pad: the rows in order are the tiles
            return x.reshape(self.tiles, 1, TILE, *x.shape[3:]).contiguous()
        x = self._units(x).reshape(self.tiles, self.per_tile * self.unit_rows, *x.shape[3:])
        return grow(x, 1, TILE).unsqueeze(1).contiguous()

    def keys(self, x: torch.Tensor) -> torch.Tensor:
        """[B, Hkv, Sk, D] → [tiles, 1, width, D]: each kv head once per unit that reads it."""
        b, hkv, sk, d = x.shape
        x = x.unsqueeze(2).expand(b, hkv, self.units // (b * hkv), sk, d)
        if self.units != self.tiles * self.per_tile:
            x = grow(x.reshape(self.units, sk, d), 0, self.tiles * self.per_tile)
        return grow(x.reshape(self.tiles, 1, self.per_tile * sk, d), 2, self.width).contiguous()

    def unpack_queries(self, y: torch.Tensor) -> torch.Tensor:
        """The inverse of `queries` (drops the padding)."""
        if self.full_tiles:
            return y.reshape(self.batch, self.heads, self.sq, *y.shape[3:])
        y = y[:, 0, : self.per_tile * self.unit_rows].reshape(self.tiles * self.per_tile, self.unit_rows,
                                                                *y.shape[3:])
        return y[: self.units].reshape(self.batch, self.heads, self.sq, *y.shape[2:])

    def unpack_keys(self, y: torch.Tensor) -> torch.Tensor:
        """[tiles, 1, width, D] gradients → [B, Hkv, Sk, D], summed over the units of each kv head (in fp32)."""
        d = y.shape[-1]
        if self.width != self.per_tile * self.sk:
            y = y[:, :, : self.per_tile * self.sk]
        if self.units != self.tiles * self.per_tile:
            y = y.reshape(self.tiles * self.per_tile, self.sk, d)[: self.units]
        y = y.reshape(self.batch, self.kv_heads, self.units // (self.batch * self.kv_heads), self.sk, d)
        return y[:, :, 0] if y.shape[2] == 1 else y.sum(2, dtype=torch.float32).to(y.dtype)

    def mask(self, mask: torch.Tensor | None, is_causal: bool, dtype: torch.dtype) -> torch.Tensor | None:
        """The block-diagonal additive mask [tiles or 1, 1, 128, width] the kernel reads (None if it needs none).
        Without a caller's mask it depends only on the shapes and is built once (`_shape_mask`)."""
        if mask is None:
            return _shape_mask(self, bool(is_causal), dtype)
        mask = additive(mask, dtype)
        if mask.shape[0] == mask.shape[1] == 1:  # one mask for every slice: one block for every tile
            blocks = mask[0, 0].expand(self.sq, self.sk).repeat(self.stacked, 1)[None, None]
            blocks = blocks.expand(1, self.per_tile, *blocks.shape[2:])
        else:
            blocks = self._units(mask.expand(self.batch, self.heads, self.sq, self.sk))
        return self.block_diagonal(blocks, is_causal)

    def _units(self, x: torch.Tensor) -> torch.Tensor:
        """[B, Hq, Sq, ...] → [tiles, per_tile, stacked · Sq, ...] (units padded with zeros)."""
        x = x.reshape(self.units, self.unit_rows, *x.shape[3:])
        return grow(x, 0, self.tiles * self.per_tile).reshape(self.tiles, self.per_tile, *x.shape[1:])

    def block_diagonal(self, blocks: torch.Tensor, is_causal: bool) -> torch.Tensor:
        """[T, per_tile, rows, Sk] unit blocks → [T, 1, 128, width], MASKED off the diagonal and in the padding;
        causal: query i of each stacked head sees keys j ≤ i only (torch's top-left alignment)."""
        if is_causal:
            allowed = torch.ones(self.sq, self.sk, dtype=torch.bool).tril().repeat(self.stacked, 1)
            blocks = blocks.masked_fill(~allowed, MASKED)
        t, n, rows, sk = blocks.shape
        full = blocks.new_full((t, n, rows, n, sk), MASKED)
        full.diagonal(0, 1, 3).copy_(blocks.permute(0, 2, 3, 1))
        full = full.reshape(t, n * rows, n * sk)
        return grow(grow(full, 1, TILE, MASKED), 2, self.width, MASKED).unsqueeze(1).contiguous()


@functools.lru_cache(maxsize=256)
def plan(q_shape: torch.Size, k_shape: torch.Size) -> Packing | None:
    """The packing of [B, Hq, Sq, D] queries against [B, Hkv, Sk, D] keys, or None where it saves no tile
    (cached: every call of a compiled region asks again)."""
    batch, heads, sq = q_shape[:3]
    kv_heads, sk = k_shape[1], k_shape[2]
    if not (batch and heads and sq and sk):
        return None
    group = heads // kv_heads
    stacked = max((g for g in range(1, group + 1) if group % g == 0 and g * sq <= TILE), default=0)
    if not stacked:
        return None
    per_tile = max(1, min(TILE // (stacked * sq), TILE // sk))
    tiles = -(-(batch * heads // stacked) // per_tile)
    if tiles >= batch * heads * -(-sq // TILE):
        return None
    width = -(-per_tile * sk // TILE) * TILE
    return Packing(batch, heads, kv_heads, sq, sk, stacked, per_tile, tiles, width)


@functools.lru_cache(maxsize=64)
def _shape_mask(packing: Packing, is_causal: bool, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask of a packing without a caller's mask: block diagonal, causal inside the blocks if asked."""
    if packing.per_tile == 1 and not is_causal and packing.width == packing.sk:
        return None
    return packing.block_diagonal(torch.zeros((1, packing.per_tile, packing.unit_rows, packing.sk), dtype=dtype),
                                  is_causal)


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A caller's bool or float mask as a 4-D additive mask in `dtype`, -inf (and False) clamped to MASKED."""
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, MASKED)
    mask = mask.to(dtype).clamp_min(MASKED)
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    return mask


def grow(x: torch.Tensor, dim: int, size: int, value: float = 0.0) -> torch.Tensor:
    """x padded with `value` at the end of `dim` up to `size`."""
    missing = size - x.shape[dim]
    return F.pad(x, (0, 0) * (x.dim() - 1 - dim) + (0, missing), value=value) if missing else x
