"""Region-level pattern matching: op chains that one library kernel computes better than fused element-wise code.

AOTAutograd hands the backend decomposed models: Hugging Face's RMSNorm is pow → mean → add → rsqrt → mul → mul,
SwiGLU is silu(a) · b, rotary embeddings are mul/slice/neg/cat/mul/add (their gradient mul/slice/neg/pad/add),
eager attention is bmm → softmax → bmm.
Before fusion, `rewrite` replaces each such chain, when its intermediate values are not needed elsewhere (a
training forward saves some of them for the backward, and then the chain stays as fused generated code), by one
call to the library kernel.

A chain over an empty tensor (a dim of size 0: an MLP 0 wide, no tokens) is never rewritten: the library kernels
need at least one element per dim, while the per-op lowerings the chain keeps give eager's answer without a launch.
"""

from __future__ import annotations

import heapq
import operator
from typing import Any

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen, loss, rmsnorm_backward
from neuron_dynamo.lowering.matching import is_call, private, val
from neuron_dynamo.lowering.registry import holds_empty_tensor
from neuron_dynamo.toolchain.simulator import launch

aten = torch.ops.aten


class PatternKernel:
    """A library-kernel call that replaces a matched chain (a call target of the lowered region)."""

    def __init__(self, name: str, run: Any) -> None:
        self.__name__ = name
        self.implementation = run
        self.__module__ = run.__module__

    def __call__(self, *args: Any) -> Any:
        return self.implementation(*args)

    def __repr__(self) -> str:
        return f"PatternKernel({self.__name__})"


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    from neuron_dynamo.kernels.norms import rmsnorm_kernel

    rows = x.contiguous().reshape(-1, x.shape[-1])
    return launch(rmsnorm_kernel, rows, None if weight is None else weight.contiguous(), eps).reshape(x.shape)


def _rmsnorm_saved(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    from neuron_dynamo.kernels.norms import rmsnorm_saved_kernel

    rows = x.contiguous().reshape(-1, x.shape[-1])
    y, xhat, rstd = launch(rmsnorm_saved_kernel, rows, weight.contiguous(), eps)
    return y.reshape(x.shape), xhat.reshape(x.shape), rstd.reshape(*x.shape[:-1], 1)


def _matmul_add(a: torch.Tensor, b: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """a @ b + residual, the sum taken by the matmul kernel on the product's way out of PSUM."""
    from neuron_dynamo.lowering.matmul import run_matmul

    product = run_matmul(a, b, residual=residual.reshape(a.shape[0], b.shape[1]))
    return product.reshape(residual.shape)


def _silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from neuron_dynamo.kernels.activations import gated_activation_kernel

    return launch(gated_activation_kernel, a.contiguous(), b.contiguous(), "silu")


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    from neuron_dynamo.kernels.rope import rope_kernel

    if cos.shape[0] != x.shape[0]:  # one table for the whole batch: the kernel's [S, D] form
        cos, sin = cos[0], sin[0]
    return launch(rope_kernel, x.contiguous(), cos.contiguous(), sin.contiguous())


def _rope_backward(g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The gradient of rope's x; cos/sin [B or 1, 1, S, D] as the graph broadcasts them over the heads."""
    from neuron_dynamo.kernels.rope import rope_backward_kernel

    cos, sin = (t[:, 0] if t.shape[0] == g.shape[0] else t[0, 0] for t in (cos, sin))
    return launch(rope_backward_kernel, g.contiguous(), cos.contiguous(), sin.contiguous())


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float):
    """softmax(scale · q kᵀ + mask) v for [N, S, D] operands: the flash kernel with N as the batch of one head
    (the rows it cannot compute, masked everywhere by a huge value, are this chain in torch, as eager runs it)."""
    from neuron_dynamo.lowering.attention import attend

    if mask is not None:
        mask = mask.expand(q.shape[0], q.shape[1], k.shape[1])[:, None]
    out, _ = attend(q[:, None], k[:, None], v[:, None], False, mask, scale, exact=_attention_chain)
    return out[:, 0]


def _attention_chain(q, k, v, mask, scale):
    """The matched chain itself on some query rows: (out, no lse)."""
    return torch.softmax(q @ k.transpose(-1, -2) * scale + mask, -1) @ v, None


PATTERN_KERNELS = {kernel.__name__: kernel for kernel in (
    PatternKernel("rmsnorm_kernel", _rmsnorm), PatternKernel("rmsnorm_saved_kernel", _rmsnorm_saved),
    PatternKernel("rmsnorm_backward_kernel", rmsnorm_backward.run),
    PatternKernel("silu_mul_kernel", _silu_mul), PatternKernel("matmul_add_kernel", _matmul_add),
    PatternKernel("rope_kernel", _rope), PatternKernel("rope_backward_kernel", _rope_backward),
    PatternKernel("attention_kernel", _attention),
    PatternKernel("cross_entropy_kernel", loss.cross_entropy),
    PatternKernel("log_softmax_from_lse", loss.log_softmax_from_lse),
    PatternKernel("cross_entropy_backward_kernel", loss.cross_entropy_backward),
)}


def _empty(*nodes: Any) -> bool:
    """Whether a node of the chain holds a tensor with no elements (the library kernels need at least one)."""
    return holds_empty_tensor([val(node) for node in nodes])


def _replace(graph: fx.Graph, last: fx.Node, name: str, args: tuple) -> bool:
    """`last` replaced by a call of the library kernel `name`, unless the chain's operands or result are empty."""
    if _empty(last, *args):
        return False
    with graph.inserting_before(last):
        call = graph.call_function(PATTERN_KERNELS[name], args)
    call.meta = dict(last.meta)
    last.replace_all_uses_with(call)
    graph.erase_node(last)
    return True


def _match_rmsnorm(graph: fx.Graph, rsqrt: fx.Node) -> str | None:
    """pow → mean → add → rsqrt → mul(x, ·) [→ mul(weight, ·)] → the RMSNorm kernel. A training forward also saves
    the rsqrt and x̂ = x · rsqrt for the backward: then the kernel that returns them too replaces the chain."""
    add = rsqrt.args[0]
    if not (is_call(add, aten.add) and isinstance(add.args[1], float) and is_call(add.args[0], aten.mean)):
        return None
    mean = add.args[0]
    power = mean.args[0]
    if not (is_call(power, aten.pow) and power.args[1] == 2 and list(mean.args[1]) in ([-1], [val(power).dim() - 1])
            and len(mean.args) > 2 and mean.args[2]):
        return None
    x = power.args[0]
    scale = next((u for u in rsqrt.users if is_call(u, aten.mul) and set(u.args) == {x, rsqrt}), None)
    if scale is None or not private(power, mean, add):
        return None
    last, weight = scale, None
    user = next((u for u in scale.users if is_call(u, aten.mul) and val(u).shape == val(scale).shape), None)
    if user is not None:
        other = user.args[0] if user.args[1] is scale else user.args[1]
        if val(other) is not None and val(other).dim() == 1 and val(other).dtype == val(x).dtype:
            last, weight = user, other
    if not (val(x).dtype in codegen.FLOAT_DTYPES and val(last).dtype == val(x).dtype):
        return None
    args = (x, weight, float(add.args[1]))
    if len(rsqrt.users) == 1 and (last is scale or len(scale.users) == 1):
        return "rmsnorm_kernel" if _replace(graph, last, "rmsnorm_kernel", args) else None
    if weight is None or _empty(last, x, weight):
        return None
    _replace_saved_rmsnorm(graph, (power, mean, add, rsqrt, scale, last), args)
    return "rmsnorm_saved_kernel"


def _stand_in(graph: fx.Graph, call: fx.Node, nodes: tuple) -> None:
    """Each of `nodes` replaced by its item of `call`'s tuple of results (the getitems go where the graph inserts)."""
    call.meta = {**nodes[0].meta, "val": tuple(val(node) for node in nodes)}
    for index, node in enumerate(nodes):
        part = graph.call_function(operator.getitem, (call, index))
        part.meta = dict(node.meta)
        node.replace_all_uses_with(part)


def _replace_saved_rmsnorm(graph: fx.Graph, chain: tuple, args: tuple) -> None:
    """The chain replaced by `rmsnorm_saved_kernel`, whose (y, x̂, rstd) stand for (last, scale, rsqrt)."""
    power, mean, add, rsqrt, scale, last = chain
    with graph.inserting_before(last):
        _stand_in(graph, graph.call_function(PATTERN_KERNELS["rmsnorm_saved_kernel"], args), (last, scale, rsqrt))
    for node in (last, scale, rsqrt, add, mean, power):
        graph.erase_node(node)
    _restore_topological_order(graph)  # readers of the rsqrt that came before the norm's end now follow the call


def _match_rmsnorm_backward(graph: fx.Graph, last: fx.Node) -> bool:
    """An RMSNorm's backward ending in `last` (see `rmsnorm_backward`) → one kernel call whose (grad_x, grad_w)
    replace `last` and the weight's gradient. The call goes right after the last of its operands (a region declares
    its inputs where they are first read), which must come before every reader of the two (else no rewrite)."""
    chain = rmsnorm_backward.match(last)
    if chain is None or _empty(last, *chain.operands):
        return False
    outputs = (last,) if chain.grad_w is None else (last, chain.grad_w)
    nodes = list(graph.nodes)
    order = {node: index for index, node in enumerate(nodes)}
    after = max(order[operand] for operand in chain.operands if operand is not None)
    if any(order[user] <= after for node in outputs for user in node.users):
        return False
    with graph.inserting_before(nodes[after + 1]):
        call = graph.call_function(PATTERN_KERNELS["rmsnorm_backward_kernel"], chain.operands)
        if chain.grad_w is None:
            call.meta = dict(last.meta)
            last.replace_all_uses_with(call)
        else:
            _stand_in(graph, call, outputs)
    for node in chain.nodes:
        graph.erase_node(node)
    return True


def _match_matmul_add(graph: fx.Graph, add: fx.Node) -> bool:
    """add(view(mm(a, b)), residual) → the matmul kernel adding the residual (a residual stream after a projection,
    or two products summed in a backward): one launch instead of two, the same additions in the same dtype."""
    if len(add.args) != 2 or add.kwargs:
        return False
    for product, residual in (add.args, add.args[::-1]):
        mm = product.args[0] if is_call(product, aten.view, aten._unsafe_view, aten.reshape) else product
        if not (is_call(mm, aten.mm) and private(mm) and (product is mm or private(product))):
            continue
        out, added, made = val(add), val(residual), val(mm)
        if (added is None or out is None or added.shape != out.shape or out.numel() != made.numel()
                or not out.dtype == added.dtype == made.dtype or out.dtype not in codegen.FLOAT_DTYPES):
            continue
        return _replace(graph, add, "matmul_add_kernel", (mm.args[0], mm.args[1], residual))
    return False


def _match_silu_mul(graph: fx.Graph, mul: fx.Node) -> bool:
    silu = next((a for a in mul.args[:2] if is_call(a, aten.silu)), None)
    if silu is None or not private(silu):
        return False
    other = mul.args[1] if mul.args[0] is silu else mul.args[0]
    a, b = val(silu.args[0]), val(other)
    if b is None or a.shape != b.shape or a.dtype != b.dtype or a.dtype not in codegen.FLOAT_DTYPES:
        return False
    return _replace(graph, mul, "silu_mul_kernel", (silu.args[0], other))


def _rotated_half(cat: fx.Node) -> fx.Node | None:
    """x when `cat` is rotate_half(x) = cat([-x[..., D/2:], x[..., :D/2]], -1)."""
    if not (is_call(cat, aten.cat) and len(cat.args[0]) == 2 and (cat.args[1] if len(cat.args) > 1 else 0) in (-1, 3)):
        return None
    neg, first = cat.args[0]
    if not (is_call(neg, aten.neg) and is_call(neg.args[0], aten.slice) and is_call(first, aten.slice)):
        return None
    second = neg.args[0]
    x = first.args[0]
    half = val(x).shape[-1] // 2
    if second.args[0] is not x or first.args[1:4] != (3, 0, half) or tuple(second.args[1:3]) != (3, half):
        return None
    return x if private(neg, cat) else None


def _unsqueezed_table(node: Any, x: fx.Node) -> fx.Node | None:
    """cos when `node` is cos.unsqueeze(1) with cos [B or 1, S, D] matching x [B, H, S, D] (dtype included)."""
    if not (is_call(node, aten.unsqueeze) and node.args[1] == 1):
        return None
    table, xv = val(node.args[0]), val(x)
    ok = (table.dim() == 3 and table.shape[0] in (1, xv.shape[0]) and tuple(table.shape[1:]) == tuple(xv.shape[2:])
          and table.dtype == xv.dtype)
    return node.args[0] if ok else None


def _match_rope(graph: fx.Graph, add: fx.Node) -> bool:
    if len(add.args) != 2 or not all(is_call(a, aten.mul) for a in add.args):
        return False
    for direct, rotated in (add.args, add.args[::-1]):
        cat = next((a for a in rotated.args if is_call(a, aten.cat)), None)
        if cat is None or _rotated_half(cat) is None:
            continue
        x = _rotated_half(cat)
        if x not in direct.args:
            continue
        cos = _unsqueezed_table(direct.args[1] if direct.args[0] is x else direct.args[0], x)
        sin = _unsqueezed_table(rotated.args[1] if rotated.args[0] is cat else rotated.args[0], x)
        if cos is None or sin is None or not private(direct, rotated) or val(x).dtype not in codegen.FLOAT_DTYPES:
            continue
        if val(x).shape[-1] % 2 or val(add).dtype != val(x).dtype:
            continue
        return _replace(graph, add, "rope_kernel", (x, cos, sin))
    return False


def _half_of(node: Any) -> tuple[fx.Node, int] | None:
    """(z, 0) when `node` is z[..., :D/2], (z, 1) when it is z[..., D/2:] (z 4-D, D even)."""
    if not (is_call(node, aten.slice) and not node.kwargs):
        return None
    z, dim, start, end, step = (*node.args, *(0, None, None, 1)[len(node.args) - 1 :])
    zv = val(z)
    if zv is None or zv.dim() != 4 or zv.shape[-1] % 2 or dim not in (3, -1) or step != 1:
        return None
    d = zv.shape[-1]
    if start in (0, None) and end == d // 2:
        return z, 0
    return (z, 1) if start == d // 2 and (end is None or end >= d) else None


def _transposed_rotation(add: Any) -> fx.Node | None:
    """z when `add` is Rᵀ(z) = cat(z[..., D/2:], -z[..., :D/2]) (rotate_half's transpose) as autograd writes it:
    the half z[..., :D/2] negated, each half zero-padded to D, the two added."""
    if not (is_call(add, aten.add) and len(add.args) == 2 and not add.kwargs):
        return None
    halves = {}
    for pad in add.args:
        if not (is_call(pad, aten.constant_pad_nd) and (pad.args[2] if len(pad.args) > 2 else 0) == 0):
            return None
        negated = is_call(pad.args[0], aten.neg)
        part = pad.args[0].args[0] if negated else pad.args[0]
        half = _half_of(part)
        if half is None or not private(pad, part, pad.args[0]):
            return None
        z, which = half
        h = val(z).shape[-1] // 2
        if (negated, which, list(pad.args[1])) not in ((True, 0, [h, 0]), (False, 1, [0, h])):
            return None
        halves[negated] = z
    z = halves.get(True)
    return z if len(halves) == 2 and halves[False] is z and len(z.users) == 2 else None


def _head_table(node: Any, g: fx.Node) -> fx.Node | None:
    """node when it is a cos/sin table [B or 1, 1, S, D] in g's dtype, broadcast over the heads of g [B, H, S, D]."""
    table, gv = val(node), val(g)
    ok = (isinstance(table, torch.Tensor) and table.dim() == 4 and table.shape[0] in (1, gv.shape[0])
          and table.shape[1] == 1 and tuple(table.shape[2:]) == tuple(gv.shape[2:]) and table.dtype == gv.dtype)
    return node if ok else None


def _match_rope_backward(graph: fx.Graph, add: fx.Node) -> bool:
    """Rᵀ(g · sin) + g · cos, autograd's gradient of rotate-half RoPE (five launches as fused code) → one kernel."""
    if len(add.args) != 2 or add.kwargs:
        return False
    for rotated, direct in (add.args, add.args[::-1]):
        product = _transposed_rotation(rotated)
        if not (is_call(product, aten.mul) and is_call(direct, aten.mul) and private(rotated, direct)):
            continue
        g = next((a for a in product.args if isinstance(a, fx.Node) and a in direct.args), None)
        gv = val(g)
        if not (isinstance(gv, torch.Tensor) and gv.dim() == 4 and gv.dtype in codegen.FLOAT_DTYPES
                and val(add).dtype == gv.dtype and val(add).shape == gv.shape):
            continue
        sin = _head_table(product.args[1] if product.args[0] is g else product.args[0], g)
        cos = _head_table(direct.args[1] if direct.args[0] is g else direct.args[0], g)
        if sin is not None and cos is not None:
            return _replace(graph, add, "rope_backward_kernel", (g, cos, sin))
    return False


def _match_attention(graph: fx.Graph, out: fx.Node) -> bool:
    """bmm(softmax(bmm(q, kᵀ) · scale + mask), v): the explicit attention chain (eager attention implementations)."""
    probs, v = out.args
    if not (is_call(probs, aten._softmax) and probs.args[1] in (-1, 2) and not probs.args[2] and private(probs)):
        return False
    scores, scale, mask = probs.args[0], 1.0, None
    if is_call(scores, aten.add) and private(scores) and val(scores.args[1]) is not None:
        scores, mask = scores.args
    if is_call(scores, aten.mul, aten.div) and isinstance(scores.args[1], float) and private(scores):
        scale = scores.args[1] if is_call(scores, aten.mul) else 1.0 / scores.args[1]
        scores = scores.args[0]
    if not (is_call(scores, aten.bmm) and private(scores)):
        return False
    q, k_t = scores.args
    qv, kv, vv = val(q), val(k_t), val(v)
    if qv.shape[-1] > 128 or len({qv.dtype, kv.dtype, vv.dtype}) != 1 or qv.dtype not in codegen.FLOAT_DTYPES:
        return False
    if mask is not None and (val(mask).dtype != qv.dtype or val(mask).dim() != 3) or _empty(q, k_t, v, mask, out):
        return False
    with graph.inserting_before(out):
        k = graph.call_function(aten.transpose.int, (k_t, 1, 2))
    k.meta["val"] = kv.transpose(1, 2)
    _replace(graph, out, "attention_kernel", (q, k, v, mask, float(scale)))
    return True


def _match_cross_entropy(graph: fx.Graph, nll: fx.Node) -> bool:
    """nll_loss_forward(_log_softmax(logits)) → the cross-entropy kernel (and logits - lse where the log-softmax
    is needed elsewhere: a training forward saves it for the backward)."""
    args = loss.nll_args(nll, 5)
    if args is None:
        return False
    log_softmax, target, _, reduction, ignore_index = args
    if not (is_call(log_softmax, aten._log_softmax) and log_softmax.args[1] in (1, -1) and not log_softmax.args[2]):
        return False
    logits = log_softmax.args[0]
    if _empty(logits, target, nll):
        return False
    with graph.inserting_before(nll):
        call = graph.call_function(PATTERN_KERNELS["cross_entropy_kernel"], (logits, target, reduction, ignore_index))
        lse_val = val(logits).new_empty((val(logits).shape[0],), dtype=torch.float32)
        call.meta = {**nll.meta, "val": (*val(nll), lse_val)}
        others = [user for user in log_softmax.users if user is not nll]
        if others:
            lse = graph.call_function(operator.getitem, (call, 2))
            lse.meta["val"] = lse_val
            rebuilt = graph.call_function(PATTERN_KERNELS["log_softmax_from_lse"], (logits, lse))
            rebuilt.meta = dict(log_softmax.meta)
    nll.replace_all_uses_with(call)
    graph.erase_node(nll)
    if others:
        log_softmax.replace_all_uses_with(rebuilt)
        _restore_topological_order(graph)  # readers of the log-softmax that came before the loss now follow it
    graph.erase_node(log_softmax)
    return True


def _restore_topological_order(graph: fx.Graph) -> None:
    """Reorder `graph` so that every node follows its inputs, moving as little as possible (Kahn's algorithm,
    always taking the ready node that came first). Placeholders keep their order: they are the signature."""
    order = {node: position for position, node in enumerate(graph.nodes)}
    waiting = {node: len(node.all_input_nodes) for node in graph.nodes}
    ready = [(order[node], node.name) for node, count in waiting.items() if count == 0]
    by_name = {node.name: node for node in graph.nodes}
    heapq.heapify(ready)
    placed: list[fx.Node] = []
    while ready:
        node = by_name[heapq.heappop(ready)[1]]
        placed.append(node)
        for user in node.users:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (order[user], user.name))
    if placed != list(graph.nodes):
        for before, node in zip(placed, placed[1:], strict=False):
            before.append(node)


def _match_cross_entropy_backward(graph: fx.Graph, backward: fx.Node) -> bool:
    """_log_softmax_backward_data(nll_loss_backward(grad, ...), log_probs) → the cross-entropy backward kernel."""
    operands = loss.cross_entropy_backward_operands(backward)
    if operands is None:
        return False
    nll = backward.args[0]
    if not _replace(graph, backward, "cross_entropy_backward_kernel", operands):
        return False
    graph.erase_node(nll)
    return True


def rewrite(gm: fx.GraphModule) -> dict[str, int]:
    """Replace the matched chains of `gm` (in place) by library-kernel calls; counts per pattern."""
    found = dict.fromkeys(PATTERN_KERNELS, 0)
    for node in list(gm.graph.nodes):
        if getattr(node, "_erased", False) or node.op != "call_function":
            continue
        if is_call(node, aten.rsqrt) and (norm := _match_rmsnorm(gm.graph, node)):
            found[norm] += 1
        elif is_call(node, aten.add) and _match_rmsnorm_backward(gm.graph, node):
            found["rmsnorm_backward_kernel"] += 1
        elif is_call(node, aten.mul) and _match_silu_mul(gm.graph, node):
            found["silu_mul_kernel"] += 1
        elif is_call(node, aten.add) and _match_matmul_add(gm.graph, node):
            found["matmul_add_kernel"] += 1
        elif is_call(node, aten.add) and _match_rope(gm.graph, node):
            found["rope_kernel"] += 1
        elif is_call(node, aten.add) and _match_rope_backward(gm.graph, node):
            found["rope_backward_kernel"] += 1
        elif is_call(node, aten.bmm) and _match_attention(gm.graph, node):
            found["attention_kernel"] += 1
        elif is_call(node, aten.nll_loss_forward) and _match_cross_entropy(gm.graph, node):
            found["cross_entropy_kernel"] += 1
        elif is_call(node, aten._log_softmax_backward_data) and _match_cross_entropy_backward(gm.graph, node):
            found["cross_entropy_backward_kernel"] += 1
    gm.graph.eliminate_dead_code()
    return found
