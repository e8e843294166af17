"""Pairwise distances (cdist, pdist) and the bilinear form (`_trilinear`) as plain torch code of lowered ops.

- `_cdist_forward(x1, x2, p, compute_mode)` follows torch's `cdist_impl`: for p = 2 with `compute_mode` 1
  ("use_mm_for_euclid_dist"), or 0 (the default, "if necessary") when either side has more than 25 rows, torch
  computes ‖a‖² + ‖b‖² - 2a·b by one matmul (`_euclidean_dist`), clamped at 0 and rooted, and so does the kernel:
  the same formula, so the same cancellation near 0. Otherwise it is the p-norm of every row difference, as
  `linalg.vector_norm` computes it (p = 0 counts non-zeros, p = inf takes the largest |difference|).
- `_pdist_forward(x, p)` is the p-norm of the differences of rows i < j, in torch's row-major order of pairs:
  the two sides are row gathers by host constants.
- `_trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim)` (behind `F.bilinear`) is the product of the three
  inputs, each unsqueezed at its `expand` dims, summed over `sumdim`, in fp32 and rounded once.

Row differences are materialized ([..., R1, R2, M] for cdist): calls above `MATERIALIZED_LIMIT` elements are
refused, as are integer inputs (torch refuses them too) and symbolic sizes.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen
from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten

MATERIALIZED_LIMIT = 2**22  # elements of the largest intermediate a call may materialize
EUCLID_MM_ROWS = 25  # torch's "use mm if necessary" threshold (`cdist_impl`)


@lowers(aten._cdist_forward, aten._pdist_forward, family="reduction")
def distance(op, *args, **kwargs):
    """Reference kernel: torch computes the distances."""
    return op(*args, **kwargs)


@lowers(aten._trilinear, family="matmul")
def trilinear_reference(op, *args, **kwargs):
    """Reference kernel: torch contracts the three inputs."""
    return op(*args, **kwargs)


def _float_refusal(node: fx.Node, tensors: list[torch.Tensor], largest: int) -> str | None:
    if any(t.dtype not in codegen.FLOAT_DTYPES for t in tensors):
        return f"{node.target.overloadpacket.__name__} of {', '.join(sorted({str(t.dtype) for t in tensors}))}"
    if largest > MATERIALIZED_LIMIT:
        return f"{node.target.overloadpacket.__name__} materializing {largest} elements (more than 2**22)"
    return None


def _static(*tensors: torch.Tensor) -> bool:
    try:
        return all(isinstance(int(t.numel()), int) for t in tensors)
    except (TypeError, ValueError, RuntimeError):
        return False


def _empty(shape, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def _zeros(shape, dtype: torch.dtype) -> torch.Tensor:
    """A norm over no features: zeros, as one memset kernel."""
    from neuron_dynamo.lowering.generated import run_single

    return run_single(aten.full.default, (list(shape), 0.0), {"dtype": dtype})


def _norm(diff: torch.Tensor, p: float) -> torch.Tensor:
    """The p-norm over the last dim, as `linalg.vector_norm` (and torch's distance kernels) define it."""
    return torch.linalg.vector_norm(diff, p, dim=-1)


# ------------------------------------------------------------------------------------------------ cdist
def _uses_mm(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: int | None) -> bool:
    mode = 0 if compute_mode is None else compute_mode
    return p == 2 and (mode == 1 or (mode == 0 and (x1.shape[-2] > EUCLID_MM_ROWS or x2.shape[-2] > EUCLID_MM_ROWS)))


def _cdist_refusal(node: fx.Node) -> str | None:
    x1, x2 = node.args[0].meta["val"], node.args[1].meta["val"]
    if not _static(x1, x2):
        return "cdist with symbolic sizes"
    out = node.meta["val"]
    largest = out.numel() * (x1.shape[-1] + 2 if _uses_mm(x1, x2, node.args[2], node.args[3]) else x1.shape[-1])
    return _float_refusal(node, [x1, x2], largest)


def _euclid_mm(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """torch's `_euclidean_dist`: [-2a, ‖a‖², 1] · [b, 1, ‖b‖²]ᵀ, clamped at 0, rooted (fp32 throughout)."""
    a, b = x1.to(torch.float32), x2.to(torch.float32)
    a_norm, b_norm = (a * a).sum(-1, keepdim=True), (b * b).sum(-1, keepdim=True)
    left = torch.cat([a * -2, a_norm, torch.ones_like(a_norm)], -1)
    right = torch.cat([b, torch.ones_like(b_norm), b_norm], -1)
    return torch.matmul(left, right.transpose(-1, -2)).clamp_min(0).sqrt().to(x1.dtype)


@lowers(aten._cdist_forward, family="reduction", target="simulator", accepts=_cdist_refusal, handles_empty=True)
def cdist(op, x1, x2, p, compute_mode=None):
    from neuron_dynamo.lowering.generated import run_traced

    out = op(x1.to("meta"), x2.to("meta"), p, compute_mode)
    if out.numel() == 0:
        return _empty(out.shape, out.dtype)
    if x1.shape[-1] == 0:
        return _zeros(out.shape, out.dtype)
    if _uses_mm(x1, x2, p, compute_mode):
        return run_traced("cdist_mm", _euclid_mm, [x1, x2])
    batch = list(out.shape[:-2])

    def direct(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        a, b = x1.expand(*batch, *x1.shape[-2:]), x2.expand(*batch, *x2.shape[-2:])
        return _norm(a.unsqueeze(-2) - b.unsqueeze(-3), float(p))

    return run_traced(f"cdist:{float(p)}:{batch}", direct, [x1, x2])


# ------------------------------------------------------------------------------------------------ pdist
def _pdist_refusal(node: fx.Node) -> str | None:
    x = node.args[0].meta["val"]
    if not _static(x):
        return "pdist with symbolic sizes"
    return _float_refusal(node, [x], node.meta["val"].numel() * max(x.shape[-1], 1))


@lowers(aten._pdist_forward, family="reduction", target="simulator", accepts=_pdist_refusal, handles_empty=True)
def pdist(op, x, p=2):
    from neuron_dynamo.lowering.generated import run_traced

    rows, features = x.shape
    pairs = rows * (rows - 1) // 2
    if pairs == 0:
        return _empty((0,), x.dtype)
    if features == 0:
        return _zeros((pairs,), x.dtype)
    first, second = torch.triu_indices(rows, rows, offset=1)

    def direct(x: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        return _norm(x[first] - x[second], float(p))

    return run_traced(f"pdist:{float(p)}", direct, [x, first, second])


# ------------------------------------------------------------------------------------------------ _trilinear
def _expanded(x: torch.Tensor, dims) -> torch.Tensor:
    for d in sorted(dims):
        x = x.unsqueeze(d)
    return x


def _trilinear_refusal(node: fx.Node) -> str | None:
    tensors = [arg.meta["val"] for arg in node.args[:3]]
    if not _static(*tensors):
        return "_trilinear with symbolic sizes"
    shapes = [_expanded(t.to("meta"), dims).shape for t, dims in zip(tensors, node.args[3:6], strict=True)]
    return _float_refusal(node, tensors, math.prod(torch.broadcast_shapes(*shapes)))


@lowers(aten._trilinear, family="matmul", target="simulator", accepts=_trilinear_refusal, handles_empty=True)
def trilinear(op, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    from neuron_dynamo.lowering.generated import run_traced

    out = op(i1.to("meta"), i2.to("meta"), i3.to("meta"), expand1, expand2, expand3, sumdim, unroll_dim)
    if out.numel() == 0:
        return _empty(out.shape, out.dtype)
    if 0 in (i1.numel(), i2.numel(), i3.numel()):
        return _zeros(out.shape, out.dtype)  # a sum over an empty dim
    expands = (list(expand1), list(expand2), list(expand3))
    summed = sorted(sumdim)

    def contract(*inputs: torch.Tensor) -> torch.Tensor:
        a, b, c = (_expanded(x.to(torch.float32), dims) for x, dims in zip(inputs, expands, strict=True))
        product = a * b * c
        total = product.sum(summed) if summed else product
        return total.reshape(out.shape).to(out.dtype)

    return run_traced(f"trilinear:{expands}:{summed}", contract, [i1, i2, i3])
