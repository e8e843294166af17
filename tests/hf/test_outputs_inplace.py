"""In-place ops on compiled outputs behave as in eager, on every target and at padded bucket sizes.

Trainer scales the loss in place (`loss *= scale`); users write `out.mul_(2)` or `out.add_(1)` and then call
backward. A compiled output must therefore be a tensor of its own (not a view of a kernel's or a bucket's buffer,
which AOTAutograd forbids modifying in place), and outputs that share memory in eager (`y` with `y[:, 1:]`) must share
it here too, or an in-place op on one would not show in the other. Lengths 37, 50 and 130: under `dynamic=None` the
second length makes the graph dynamic and the next ones run padded in buckets of 128.
"""

import pytest
import torch
from tiny_models import VOCAB, tiny_llama

import neuron_dynamo

TARGETS = ("reference", "simulator")
DYNAMIC = (False, True, None)
LENGTHS = (37, 50, 130)


def _scaled(fn, op):
    def run(x, w):
        out = fn(x, w)
        outs = out if isinstance(out, tuple) else (out,)
        for tensor in outs:
            op(tensor)
        return outs
    return run


# name -> (function of x [L, 8] and w [8, 8], the in-place op applied to each output)
CASES = {
    "loss *= s": (lambda x, w: torch.sin(x @ w).mean(), lambda t: t.mul_(0.5)),
    "out.mul_(2)": (lambda x, w: torch.sin(x @ w), lambda t: t.mul_(2)),
    "out.add_(1) on a slice": (lambda x, w: (x @ w)[:, :3], lambda t: t.add_(1)),
    "row sums": (lambda x, w: (x @ w).sum(-1), lambda t: t.add_(1)),
    "y and y[:, 1:]": (lambda x, w: (lambda y: (y, y[:, 1:]))(x @ w), lambda t: t.mul_(2)),
    "y.view(-1) and y": (lambda x, w: (lambda y: (y.view(-1), y))(x @ w), lambda t: t.add_(1)),
    "two overlapping views": (lambda x, w: (lambda y: (y[:, 2:], y[:, :5]))(x @ w), lambda t: t.add_(1)),
}


def _check(compiled_fn, eager_fn, requires_grad):
    for length in LENGTHS:
        x = torch.randn(length, 8, generator=torch.Generator().manual_seed(length))
        w = torch.randn(8, 8, generator=torch.Generator().manual_seed(1)).requires_grad_(requires_grad)
        want = eager_fn(x, w)
        if requires_grad:
            want_grad, = torch.autograd.grad(sum(t.sum() for t in want), w)
        got = compiled_fn(x, w)
        for g, e in zip(got, want, strict=True):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
        if requires_grad:
            got_grad, = torch.autograd.grad(sum(t.sum() for t in got), w)
            torch.testing.assert_close(got_grad, want_grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dynamic", DYNAMIC, ids=lambda d: f"dynamic={d}")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("requires_grad", (False, True), ids=("inference", "training"))
def test_in_place_ops_on_outputs_match_eager(target, dynamic, requires_grad):
    for name, (fn, op) in CASES.items():
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="neuron", options={"target": target}, dynamic=dynamic)
        try:
            _check(_scaled(compiled, op), _scaled(fn, op), requires_grad)
        except Exception as error:
            raise AssertionError(f"{name}: {error}") from error
    assert neuron_dynamo.stats().get("graphs_failed", 0) == 0


@pytest.mark.parametrize("dynamic", DYNAMIC, ids=lambda d: f"dynamic={d}")
def test_llama_loss_scaled_in_place_then_backward(dynamic):
    """Trainer's step on a tiny Llama, compiled as users do (default target): `loss *= scale`, then backward;
    gradients equal eager's at each length."""
    torch.manual_seed(0)
    model = tiny_llama()
    compiled = torch.compile(model, backend="neuron", dynamic=dynamic)
    for length in (37, 50, 70):
        ids = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(length))
        model.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss *= 0.5
        loss.backward()
        expected = {name: p.grad.clone() for name, p in model.named_parameters()}
        model.zero_grad()
        loss = compiled(input_ids=ids, labels=ids).loss
        assert loss._base is None
        loss *= 0.5
        loss.backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, expected[name], atol=1e-5, rtol=1e-4, msg=f"{name} at {length}")
    assert neuron_dynamo.stats().get("graphs_failed", 0) == 0
    assert neuron_dynamo.stats().get("dynamo_graphs_eager", 0) == 0
