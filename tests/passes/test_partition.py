import operator

import torch
import torch.fx as fx
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_dynamo.passes.partition import fallback_reason, matches_op_name, partition
from neuron_dynamo.toolchain import REFERENCE, SIMULATOR

aten = torch.ops.aten


def traced(fn, *inputs) -> fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*inputs)


def region_ops(parted, region: str) -> list[str]:
    return [node.target.__name__ for node in getattr(parted.module, region).graph.nodes if node.op == "call_function"]


def test_regions_never_create_a_cycle_through_an_eager_node():
    # relu and add are both supported, but add needs eager_only (eager) which needs relu: one region would be a cycle.
    gm = traced(lambda x: torch.relu(x) + torch.ops.neuron_tests.eager_only(torch.relu(x)), torch.rand(4))
    parted = partition(gm, REFERENCE)
    assert len(parted.regions) == 2
    assert [(f.op, f.reason) for f in parted.fallbacks] == [
        ("neuron_tests.eager_only.default", "unsupported op (no lowering registered)")]
    x = torch.rand(4)
    torch.testing.assert_close(parted.module(x), gm(x))


def test_independent_supported_nodes_share_one_region_and_getitem_follows_its_producer():
    norm = lambda x, weight, bias: torch.nn.functional.layer_norm(x, (8,), weight, bias) @ x.T
    gm = traced(norm, torch.randn(3, 8), torch.randn(8), torch.randn(8))
    parted = partition(gm, REFERENCE)
    assert list(parted.regions) == ["region_0"] and parted.fallbacks == []
    assert "getitem" in region_ops(parted, "region_0")
    top_level = [node for node in parted.module.graph.nodes if node.op == "call_function"]
    assert all(node.target is operator.getitem for node in top_level)


def test_min_region_size_and_reasons():
    gm = traced(lambda x: torch.ops.neuron_tests.eager_only(x.sin()).cos().exp(), torch.rand(5))
    parted = partition(gm, REFERENCE, min_region_size=2)
    assert list(parted.regions) == ["region_0"]  # cos → exp; sin alone is too small
    reasons = {f.op: f.reason for f in parted.fallbacks}
    assert reasons == {"aten.sin.default": "region too small (1 < min_region_size 2)",
                       "neuron_tests.eager_only.default": "unsupported op (no lowering registered)"}


def test_eager_ops_match_packets_and_overloads():
    assert matches_op_name(aten.mm.default, ["aten.mm"])
    assert matches_op_name(aten.add.Tensor, ["aten.add.Tensor"])
    assert not matches_op_name(aten.add.Scalar, ["aten.add.Tensor"])
    assert not matches_op_name(aten.addmm.default, ["aten.mm"])
    gm = traced(lambda a, b: (a @ b).relu(), torch.randn(2, 3), torch.randn(3, 2))
    parted = partition(gm, REFERENCE, eager_ops=["aten.mm"])
    assert [(f.op, f.reason) for f in parted.fallbacks] == [("aten.mm.default", "forced eager (eager_ops)")]


def test_unsupported_dtype_and_target_without_kernels():
    gm = traced(lambda x: (x.double() * 2).float().relu(), torch.randn(3))
    nodes = {node.name: node for node in gm.graph.nodes}
    assert fallback_reason(nodes["mul"], REFERENCE) == "unsupported dtype (float64)"
    assert fallback_reason(nodes["relu"], REFERENCE) is None
    assert fallback_reason(nodes["relu"], SIMULATOR) is None
    graph = fx.Graph()  # an op with a reference kernel only (make_fx would decompose it)
    rms = graph.call_function(torch.ops.aten._fused_rms_norm.default, (graph.placeholder("x"), [3], None, 1e-6))
    assert fallback_reason(rms, SIMULATOR) == "unsupported op (no simulator kernel yet)"


def test_input_graph_is_left_untouched():
    gm = traced(lambda x: torch.ops.neuron_tests.eager_only(x.sin()).cos(), torch.rand(5))
    before = gm.code
    partition(gm, REFERENCE)
    assert gm.code == before


UNARY = {"sin": torch.sin, "exp": torch.exp, "eager_only": torch.ops.neuron_tests.eager_only,  # no lowering
         "cumsum": lambda t: torch.cumsum(t, 0)}
BINARY = {"add": torch.add, "mul": torch.mul, "hypot": torch.hypot}


@st.composite
def op_dags(draw):
    """A random DAG of unary/binary ops over two inputs, as a list of (name, operand indices)."""
    steps = []
    for index in range(draw(st.integers(1, 10))):
        available = index + 2
        if draw(st.booleans()):
            steps.append((draw(st.sampled_from(sorted(UNARY))), (draw(st.integers(0, available - 1)),)))
        else:
            operands = (draw(st.integers(0, available - 1)), draw(st.integers(0, available - 1)))
            steps.append((draw(st.sampled_from(sorted(BINARY))), operands))
    return steps


def run_dag(steps, a, b):
    values = [a, b]
    for name, operands in steps:
        fn = UNARY.get(name) or BINARY[name]
        values.append(fn(*(values[i] for i in operands)))
    return tuple(values[2:])


@settings(max_examples=40, deadline=None)
@given(steps=op_dags(), min_region_size=st.integers(1, 3), force_exp=st.booleans())
def test_random_graphs_partition_into_an_equivalent_program(steps, min_region_size, force_exp):
    a, b = torch.rand(6) * 0.5, torch.rand(6) * 0.5
    gm = traced(lambda x, y: run_dag(steps, x, y), a, b)
    eager_ops = ["aten.exp"] if force_exp else []
    parted = partition(gm, REFERENCE, eager_ops=eager_ops, min_region_size=min_region_size)

    in_regions = [name for names in parted.regions.values() for name in names]
    fallback_nodes = [f.node for f in parted.fallbacks]
    compute = [node.name for node in gm.graph.nodes if node.op == "call_function"]
    assert sorted(in_regions + fallback_nodes) == sorted(compute)  # every op exactly once, regions or fallback
    nodes = {node.name: node for node in gm.graph.nodes}
    for name in in_regions:
        assert fallback_reason(nodes[name], REFERENCE, eager_ops) is None
    for fallback in parted.fallbacks:
        assert fallback.reason
    for ours, eager in zip(parted.module(a, b), gm(a, b), strict=True):
        torch.testing.assert_close(ours, eager, equal_nan=True)
