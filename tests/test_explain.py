import operator

import torch
import torch.fx as fx

import neuron_dynamo
from neuron_dynamo.compiler import compile_static
from neuron_dynamo.options import Options
from neuron_dynamo.report import ExplainReport
from neuron_dynamo.toolchain import REFERENCE

aten = torch.ops.aten

MM_FLOPS = 2 * 8 * 16 * 32  # (8x16) @ (16x32)
BMM_FLOPS = 2 * 2 * 8 * 16 * 4  # 2 x (8x16) @ (16x4)
CONV_FLOPS = 2 * (4 * 6 * 6) * (3 * 3 * 3)  # every output element is a 3x3x3 dot product
ATTENTION_FLOPS = 2 * (2 * 1 * 2 * 8 * 8 * 16)  # Q @ K^T and P @ V, each 2*B*H*L*S*D


def hand_built_graph() -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """mm → relu, bmm, conv (no lowering), attention → getitem: five compute ops with known FLOPs."""
    graph = fx.Graph()
    a, b, x, y, image, weight, q, k, v = (graph.placeholder(name) for name in "a b x y image weight q k v".split())
    relu = graph.call_function(aten.relu.default, (graph.call_function(aten.mm.default, (a, b)),))
    bmm = graph.call_function(aten.bmm.default, (x, y))
    conv = graph.call_function(
        aten.convolution.default, (image, weight, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1))
    attention = graph.call_function(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v))
    graph.output((relu, bmm, conv, graph.call_function(operator.getitem, (attention, 0))))
    shapes = [(8, 16), (16, 32), (2, 8, 16), (2, 16, 4), (1, 3, 8, 8), (4, 3, 3, 3), (1, 2, 8, 16), (1, 2, 8, 16),
              (1, 2, 8, 16)]
    return fx.GraphModule({}, graph), [torch.randn(shape) for shape in shapes]


def test_report_numbers_on_a_hand_built_graph():
    gm, inputs = hand_built_graph()
    # the convolution is run eagerly on purpose (it has a kernel): its FLOPs count as not lowered
    program = compile_static(gm, inputs, Options(eager_ops=("aten.convolution",)), REFERENCE, name="hand",
                             kind="inference")
    report = program.report
    assert (report.ops_total, report.ops_lowered, report.regions) == (5, 4, 1)
    assert report.flops_total == MM_FLOPS + BMM_FLOPS + CONV_FLOPS + ATTENTION_FLOPS
    assert report.flops_lowered == MM_FLOPS + BMM_FLOPS + ATTENTION_FLOPS
    assert report.fallback_ops == [
        {"op": "aten.convolution.default", "reason": "forced eager (eager_ops)", "count": 1}]
    assert report.compile_seconds > 0
    for ours, eager in zip(program(*inputs), gm(*inputs), strict=True):
        torch.testing.assert_close(ours, eager)


def test_explain_report_table_and_dict():
    torch.manual_seed(0)
    a, b = torch.randn(8, 16), torch.randn(16, 32)
    report = neuron_dynamo.explain(lambda p, q: torch.softmax(p @ q, dim=-1).cumsum(-1).to(torch.float64), a, b,
                                   options={"target": "reference"})
    assert isinstance(report, ExplainReport)
    torch.testing.assert_close(report.output, torch.softmax(a @ b, dim=-1).cumsum(-1).to(torch.float64))
    data = report.to_dict()
    (graph,) = data["graphs"]
    assert set(graph) >= {"ops_total", "ops_lowered", "flops_total", "flops_lowered", "regions", "fallback_ops",
                          "compile_seconds"}
    assert (graph["ops_total"], graph["ops_lowered"], graph["regions"]) == (4, 3, 1)  # mm, _softmax, cumsum | cast
    assert graph["flops_total"] == graph["flops_lowered"] == MM_FLOPS
    assert graph["fallback_ops"] == [
        {"op": "aten._to_copy.default", "reason": "unsupported dtype (float64)", "count": 1}]
    assert data["totals"]["graphs"] == 1 and data["totals"]["fallback_ops"] == 1
    text = str(report)
    assert "ops run eagerly" in text and "aten._to_copy.default" in text and "unsupported dtype (float64)" in text


def test_explain_counts_forward_and_backward_of_a_training_step():
    model = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)

    def step(inputs):
        loss = model(inputs).square().mean()
        loss.backward()
        return loss

    report = neuron_dynamo.explain(step, x)
    kinds = sorted(graph.kind for graph in report.graphs)
    assert kinds == ["backward", "forward"]
    forward = next(graph for graph in report.graphs if graph.kind == "forward")
    assert forward.flops_total == 2 * 3 * 8 * 4
    assert model.weight.grad is not None


def test_explain_says_so_when_no_graph_ran():
    report = neuron_dynamo.explain(lambda n: n + 1, 3)  # no tensors: Dynamo has nothing to hand the backend
    assert report.graphs == [] and report.output == 4
    assert "no graph ran under the backend" in str(report)
