"""Regions lowered for target="simulator" run as NKI kernels on the interpreter and match eager.

`fallback="error"` makes every test prove that each op of the function ran inside an NKI region (a refused op
raises instead of running eagerly); `cache="off"` keeps the persistent compile cache out of the way.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_dynamo
from neuron_dynamo.lowering import codegen, lower_region
from neuron_dynamo.lowering.generated import FusedKernel

STRICT = {"target": "simulator", "fallback": "error", "cache": "off"}


def run_strict(fn, *args):
    """fn under the backend on the simulator, every op in an NKI region; also the explain report."""
    torch._dynamo.reset()
    report = neuron_dynamo.explain(fn, *args, options=STRICT)
    return report.output, report


def assert_matches(fn, *args, atol=1e-4, rtol=1e-4):
    expected = fn(*args)
    out, report = run_strict(fn, *args)
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    assert all(graph.ops_lowered == graph.ops_total for graph in report.graphs)
    return report


@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 200), cols=st.integers(1, 40))
def test_fused_chain_with_broadcasting_matches_eager_on_ragged_shapes(rows, cols):
    def chain(x, bias, scale):
        y = torch.nn.functional.silu(x * scale + bias)
        z = torch.where(x > 0, y, -y).clamp(-2.0, 2.0)
        return (z.exp() / (1.0 + x.abs())).to(torch.float32), (x >= bias).logical_not()

    torch.manual_seed(rows * cols)
    args = torch.randn(rows, cols), torch.randn(cols), torch.randn(rows, 1)
    region = make_fx(chain)(*args)
    lowered = lower_region(region, "simulator")
    fused = [node.target for node in lowered.graph.nodes if isinstance(node.target, FusedKernel)]
    assert len(fused) == 1  # one kernel for the whole chain: its values stay in SBUF
    for ours, theirs in zip(lowered(*args), chain(*args), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_generated_source_is_nki_and_cached_by_source():
    region = make_fx(lambda x: torch.tanh(x) * 2 + 1)(torch.randn(4, 4))
    first = [n.target for n in lower_region(region, "simulator").graph.nodes if isinstance(n.target, FusedKernel)]
    again = [n.target for n in lower_region(region, "simulator").graph.nodes if isinstance(n.target, FusedKernel)]
    source = first[0].source
    assert source.startswith("import nki\n") and "@nki.jit" in source and "nl.tanh" in source
    assert "torch" not in source  # a device kernel: nothing but NKI
    assert first[0].kernel is again[0].kernel


def test_shape_change_closes_a_fused_group():
    region = make_fx(lambda x: (x * 2).sum(-1, keepdim=True) + x)(torch.randn(3, 5))
    lowered = lower_region(region, "simulator")
    assert sum(isinstance(n.target, FusedKernel) for n in lowered.graph.nodes) == 2
    x = torch.randn(3, 5)
    torch.testing.assert_close(lowered(x), (x * 2).sum(-1, keepdim=True) + x)


def test_a_group_nothing_reads_is_dropped():
    """make_fx keeps dead nodes; a fused group without outputs used to become a kernel returning None."""
    def fn(x):
        (x * 2).exp()  # dead: no output reads it
        return x.sum(-1) + 1

    region = make_fx(fn)(torch.randn(3, 5))
    lowered = lower_region(region, "simulator")
    assert sum(isinstance(n.target, FusedKernel) for n in lowered.graph.nodes) == 1
    x = torch.randn(3, 5)
    torch.testing.assert_close(lowered(x), x.sum(-1) + 1)


@pytest.mark.parametrize("dims", [(-1,), (0,), (0, 1), (1,), ()])
@pytest.mark.parametrize("kind", ["sum", "mean", "amax"])
def test_reductions_over_any_dims(kind, dims):
    x = torch.randn(3, 130, 7)
    fn = {
        "sum": lambda t: t.sum(dims, keepdim=True) if dims else t.sum(),
        "mean": lambda t: t.mean(dims) if dims else t.mean(),
        "amax": lambda t: t.amax(dims) if dims else t.amax(),
    }[kind]
    assert_matches(fn, x)


def test_matmul_family_reads_transposed_weights_as_stored():
    x, w, b = torch.randn(130, 24), torch.randn(40, 24), torch.randn(40)
    a3, b3 = torch.randn(2, 9, 24), torch.randn(2, 24, 17)
    assert_matches(lambda x, w, b: F.linear(x, w, b), x, w, b)
    assert_matches(lambda x, w: x @ w.t(), x, w)
    assert_matches(lambda x, w, c: torch.addmm(c, x, w.t()), x, w, torch.randn(130, 40))
    assert_matches(lambda a, b: torch.bmm(a, b), a3, b3)
    assert_matches(lambda a, b: torch.bmm(b.transpose(1, 2), a.transpose(1, 2)), a3, b3)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_forward_and_backward(log):
    x = torch.randn(5, 3, 33, requires_grad=True)
    fn = (lambda t: F.log_softmax(t, -1)) if log else (lambda t: F.softmax(t, -1))
    compiled = torch.compile(fn, backend="neuron", options=STRICT)
    out = compiled(x)
    grad = torch.randn_like(out)
    (ours,) = torch.autograd.grad(out, x, grad)
    (theirs,) = torch.autograd.grad(fn(x), x, grad)
    torch.testing.assert_close(out, fn(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_layer_norm_forward_and_backward():
    norm = torch.nn.LayerNorm(48)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(3, 70, 48, requires_grad=True)
    compiled = torch.compile(norm, backend="neuron", options=STRICT)
    out = compiled(x)
    out.square().sum().backward()
    ours = [x.grad.clone(), norm.weight.grad.clone(), norm.bias.grad.clone()]
    for t in (x, norm.weight, norm.bias):
        t.grad = None
    expected = norm(x)
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    for a, t in zip(ours, (x, norm.weight, norm.bias), strict=True):
        torch.testing.assert_close(a, t.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("causal", "masked", "kv_heads", "seq"),
                         [(True, False, 4, 12), (False, True, 2, 130), (False, False, 1, 5)])
def test_attention_forward_and_backward_with_padding(causal, masked, kv_heads, seq):
    torch.manual_seed(seq)
    q = torch.randn(2, 4, seq, 16, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, seq, 16, requires_grad=True) for _ in range(2))
    mask = torch.rand(2, 1, seq, seq) > 0.3 if masked else None
    if mask is not None:
        mask[..., 0] = True  # every query sees at least one key

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=kv_heads != 4)

    compiled = torch.compile(attend, backend="neuron", options=STRICT)
    out = compiled(q, k, v)
    grad = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v), grad)
    expected = attend(q, k, v)
    theirs = torch.autograd.grad(expected, (q, k, v), grad)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_embedding_cat_and_views():
    table, ids = torch.randn(50, 8), torch.randint(0, 50, (3, 7))
    assert_matches(lambda t, i: torch.cat([F.embedding(i, t), F.embedding(i, t).transpose(0, 1).reshape(3, 7, 8)],
                                          -1).permute(2, 0, 1)[1:5], table, ids)


def test_int64_values_beyond_int32_are_refused_clearly():
    with pytest.raises(codegen.CodegenError, match="outside int32"):
        codegen.to_device(torch.tensor([2**40]))


def test_estimated_device_time_reaches_the_report_and_stats():
    neuron_dynamo.reset_stats()
    _, report = run_strict(lambda x, w: torch.softmax(x @ w, -1), torch.randn(64, 32), torch.randn(32, 48))
    (graph,) = report.graphs
    stats = neuron_dynamo.stats()
    assert graph.estimated_device_ns > 0
    assert stats["estimated_device_ns"] == pytest.approx(graph.estimated_device_ns)
    assert stats[f"estimated_device_ns.{graph.name}.{graph.kind}"] == pytest.approx(graph.estimated_device_ns)
    assert "est. device us" in str(report)


def test_slice_scatter_and_a_count_of_booleans():
    def fn(base, src, x):
        return torch.slice_scatter(base, src, 1, 2, 5), (x > 0).sum()

    assert_matches(fn, torch.randn(3, 7, 4), torch.randn(3, 3, 4), torch.randn(5, 5))


def test_index_ops_of_the_loss_and_the_embedding_backward():
    def fn(logits, labels, table, ids, grads):
        return (torch.gather(logits, 1, labels), torch.scatter(torch.zeros_like(logits), 1, labels, -1.0),
                torch.ops.aten.index_put(table, [ids], grads, True))

    args = (torch.randn(24, 130), torch.randint(0, 130, (24, 1)), torch.randn(50, 8), torch.randint(0, 50, (3, 7)),
            torch.randn(3, 7, 8))
    expected = fn(*args)
    torch._dynamo.reset()
    report = neuron_dynamo.explain(fn, *args, options={**STRICT, "bucketing": False})
    for ours, theirs in zip(report.output, expected, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_cumsum_as_a_scan():
    assert_matches(lambda x, m: (x.cumsum(1), m.cumsum(-1)), torch.randn(3, 40, 5), torch.rand(2, 30) > 0.5)
