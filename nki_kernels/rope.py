"""Rotary position embedding in the Hugging Face `rotate_half` layout, and its backward.

Layout contract (`rope_kernel`, `rope_backward_kernel`):
  x         [B, H, S, D] (queries or keys, D even; fp32, bf16 or fp16); the backward takes g, the gradient of
            the result, in its place
  cos, sin  [B, S, D] (what HF's rotary embedding returns) or [S, D] (shared by the batch), x's dtype
  returns   rope_kernel: x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2]);
            rope_backward_kernel: the gradient of x, g * cos + Rᵀ(g * sin) with Rᵀ(z) = concat(z[..., D/2:],
            -z[..., :D/2]) (the transpose of rotate_half). In x's shape and dtype; products and sums round to x's
            dtype in the order HF's eager code (and autograd's graph of it) computes them. Neither assumes that
            cos/sin repeat their halves.

Tiling: the rotation never mixes tokens, so any token may sit on any partition, and the heads of a token share its
cos/sin. Partition rows hold T consecutive tokens of one batch (T divides S: S/T rows per batch, one contiguous HBM
run per head and row); a block of partitions takes whole batches when S/T ≤ 128 (short sequences of several batches
fill the partitions together), else 128 rows of one batch. A tile is a block's rows × G heads × up to FREE/D of
their tokens × D (at most FREE elements per partition unless D alone exceeds it), so one cos/sin load serves every
head, read through a stride-0 view over the heads. Per tile one DMA brings x in, five element-wise products and
sums run over [rows, G, tokens, D/2] views (GpSimd the two rotate_half products, VectorE the rest: it runs bf16
twice as fast; the backward's four: GpSimd g * sin, VectorE the rest), and one DMA stores the result. T minimises
the bytes each partition streams plus RUN_COST per DMA run and per instruction: T = 1 for short sequences (the tiny
Llama's [2, 4, 64, 16] is one tile, 9 instructions; 8 for the backward), typically S/128 for long ones (S/128-token
runs).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from .contract import require, require_float
from .tiling import PMAX, cdiv, itemsize

FREE = 4096  # elements per partition of one x tile (heads × tokens × D): 32 tokens of D = 128
RUN_COST = 256  # bytes per partition that a DMA run (descriptor) or an instruction's fixed cost weighs


@nki.jit
def rope_kernel(x, cos, sin):
    """Apply rotary embeddings to x; see the module docstring."""
    return _stream("rope_kernel", x, cos, sin, _rotate)


@nki.jit
def rope_backward_kernel(g, cos, sin):
    """The gradient of rope_kernel's x, given the gradient g of its result; see the module docstring."""
    return _stream("rope_backward_kernel", g, cos, sin, _unrotate)


def _stream(name, x, cos, sin, compute):
    """Check the contract, then run `compute` (_rotate or _unrotate) over the tiles of x and store its results."""
    require(len(x.shape) == 4 and x.shape[3] % 2 == 0, name,
            f"x must be [B, H, S, D] with D even, got {tuple(x.shape)}")
    require_float(name, "x", x)
    batch, heads, seq, d = x.shape
    for label, t in (("cos", cos), ("sin", sin)):
        require(tuple(t.shape) in ((batch, seq, d), (seq, d)) and t.dtype == x.dtype, name,
                f"{label} must be [B, S, D] or [S, D] = {(batch, seq, d)} in x's dtype {x.dtype}, "
                f"got {tuple(t.shape)} {t.dtype}")
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    per_row = _tokens_per_row(batch, heads, seq, d, itemsize(x.dtype))
    rows, step = seq // per_row, _step(per_row, d)
    group = _group(heads, step, d)
    x_rows = x.reshape((batch, heads, rows, per_row * d))
    out_rows = out.reshape((batch, heads, rows, per_row * d))
    cos_rows, sin_rows = (t.reshape(((batch,) if len(t.shape) == 3 else (1,)) + (rows, per_row * d))
                          for t in (cos, sin))
    for b0, nb, r0, pr in _blocks(batch, rows):
        for t0 in range(0, per_row, step):
            tokens = min(step, per_row - t0)
            cols = slice(t0 * d, (t0 + tokens) * d)
            c = _load_table(cos_rows, b0, nb, r0, pr, cols)
            s = _load_table(sin_rows, b0, nb, r0, pr, cols)
            for h0 in range(0, heads, group):
                g = min(group, heads - h0)
                xt = nl.ndarray((PMAX, g, tokens * d), dtype=x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=xt[0 : nb * pr], src=_heads(x_rows, b0, nb, h0, g, r0, pr, cols))
                y = compute(xt, c, s, nb * pr, g, tokens, d)
                nisa.dma_copy(dst=_heads(out_rows, b0, nb, h0, g, r0, pr, cols), src=y[0 : nb * pr])
    return out


def _step(per_row, d):
    """Tokens per partition row in one tile."""
    return min(per_row, max(1, FREE // d))


def _group(heads, step, d):
    """Heads per tile."""
    return min(heads, max(1, FREE // (step * d)))


def _blocks(batch, rows):
    """(first batch, batches, first row, rows) per block of ≤ 128 partitions: whole batches, or 128 rows of one."""
    if rows <= PMAX:
        nb = min(batch, PMAX // rows)
        return [(b0, min(nb, batch - b0), 0, rows) for b0 in range(0, batch, nb)]
    return [(b, 1, r0, min(PMAX, rows - r0)) for b in range(batch) for r0 in range(0, rows, PMAX)]


def _tokens_per_row(batch, heads, seq, d, size):
    """T, the consecutive tokens per partition row (see the module docstring)."""
    best, best_cost = 1, None
    for t in range(1, seq + 1):
        if seq % t != 0:
            continue
        blocks = len(_blocks(batch, seq // t))
        step = _step(t, d)
        steps = cdiv(t, step)
        instructions = blocks * steps * (2 + 7 * cdiv(heads, _group(heads, step, d)))
        streamed = blocks * heads * (t * d * size + RUN_COST * steps)  # bytes per partition, plus one per run
        cost = streamed + RUN_COST * instructions
        if best_cost is None or cost < best_cost:
            best, best_cost = t, cost
    return best


def _heads(v, b0, nb, h0, g, r0, pr, cols):
    """The HBM view [B, H, rows, T·D] of a tile: partitions (batch, row), then heads, then columns."""
    if nb == 1:
        return v[b0, h0 : h0 + g, r0 : r0 + pr, cols].permute((1, 0, 2))
    return v[b0 : b0 + nb, h0 : h0 + g, r0 : r0 + pr, cols].permute((0, 2, 1, 3))


def _load_table(v, b0, nb, r0, pr, cols):
    """cos or sin ([B or 1, rows, T·D] in HBM) of a block's partitions; a shared table is read once per batch."""
    tile = nl.ndarray((PMAX, cols.stop - cols.start), dtype=v.dtype, buffer=nl.sbuf)
    if nb == 1:
        src = v[b0 if v.shape[0] > 1 else 0, r0 : r0 + pr, cols]
    elif v.shape[0] > 1:
        src = v[b0 : b0 + nb, r0 : r0 + pr, cols]
    else:
        src = v[0:1, r0 : r0 + pr, cols].broadcast(0, nb)
    nisa.dma_copy(dst=tile[0 : nb * pr], src=src)
    return tile


def _rotate(xt, c, s, pr, g, tokens, d):
    """y = x*cos + rotate_half(x)*sin over [pr, g heads, tokens, d] views (cos/sin repeated over the heads)."""
    x4, c4, s4, straight, rotated, y, y4, lo, hi = _tile_views(xt, c, s, pr, g, tokens, d)
    gp = nisa.engine.gpsimd
    nisa.tensor_tensor(dst=straight[0:pr], data1=x4, data2=c4, op=nl.multiply)
    nisa.tensor_tensor(dst=rotated[0:pr, :, :, lo], data1=x4[:, :, :, hi], data2=s4[:, :, :, lo], op=nl.multiply,
                       engine=gp)
    nisa.tensor_tensor(dst=rotated[0:pr, :, :, hi], data1=x4[:, :, :, lo], data2=s4[:, :, :, hi], op=nl.multiply,
                       engine=gp)
    nisa.tensor_tensor(dst=y4[:, :, :, lo], data1=straight[0:pr, :, :, lo], data2=rotated[0:pr, :, :, lo],
                       op=nl.subtract)
    nisa.tensor_tensor(dst=y4[:, :, :, hi], data1=straight[0:pr, :, :, hi], data2=rotated[0:pr, :, :, hi], op=nl.add)
    return y


def _unrotate(gt, c, s, pr, g, tokens, d):
    """dx = Rᵀ(g*sin) + g*cos over [pr, g heads, tokens, d] views, as autograd computes it: a = g*sin and
    b = g*cos rounded to g's dtype, then dx[:D/2] = a[D/2:] + b[:D/2] and dx[D/2:] = b[D/2:] - a[:D/2]."""
    g4, c4, s4, straight, rotated, y, y4, lo, hi = _tile_views(gt, c, s, pr, g, tokens, d)
    nisa.tensor_tensor(dst=rotated[0:pr], data1=g4, data2=s4, op=nl.multiply, engine=nisa.engine.gpsimd)
    nisa.tensor_tensor(dst=straight[0:pr], data1=g4, data2=c4, op=nl.multiply)
    nisa.tensor_tensor(dst=y4[:, :, :, lo], data1=rotated[0:pr, :, :, hi], data2=straight[0:pr, :, :, lo],
                       op=nl.add)
    nisa.tensor_tensor(dst=y4[:, :, :, hi], data1=straight[0:pr, :, :, hi], data2=rotated[0:pr, :, :, lo],
                       op=nl.subtract)
    return y


def _tile_views(xt, c, s, pr, g, tokens, d):
    """A tile's [pr, g, tokens, d] view, cos/sin repeated over the heads, the two product tiles, the result tile
    and its 4-D view, and the slices of the two halves."""
    x4 = xt.reshape((PMAX, g, tokens, d))[0:pr]
    c4, s4 = (t.reshape((PMAX, 1, tokens, d))[0:pr].broadcast(1, g) for t in (c, s))
    straight = nl.ndarray((PMAX, g, tokens, d), dtype=xt.dtype, buffer=nl.sbuf)
    rotated = nl.ndarray((PMAX, g, tokens, d), dtype=xt.dtype, buffer=nl.sbuf)
    y = nl.ndarray((PMAX, g, tokens * d), dtype=xt.dtype, buffer=nl.sbuf)
    half = d // 2
    return x4, c4, s4, straight, rotated, y, y.reshape((PMAX, g, tokens, d))[0:pr], slice(0, half), slice(half, d)
