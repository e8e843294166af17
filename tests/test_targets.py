"""A new target plugs in through the lowering registry and the Target interface, without touching the partitioner."""

import dataclasses

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_dynamo.compiler import compile_static
from neuron_dynamo.lowering import lowers
from neuron_dynamo.options import Options
from neuron_dynamo.toolchain import DEVICE_DTYPES, SIMULATOR, resolve_target

aten = torch.ops.aten
calls: list[str] = []


@lowers(aten.mm, family="matmul", target="plug-test")
@lowers(aten.relu, family="elementwise", target="plug-test")
def counting_kernel(op, *args, **kwargs):
    calls.append(str(op))
    return op(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class PlugTestTarget:
    """Takes only what has a plug-test kernel and no bfloat16; compiles regions to plain functions."""

    name: str = "plug-test"
    compiled: list = dataclasses.field(default_factory=list)

    def supports(self, node: fx.Node) -> str | None:
        if node.meta["val"].dtype == torch.bfloat16:
            return "unsupported dtype (bfloat16)"
        return None

    def compile_region(self, lowered_region, example_inputs):
        self.compiled.append([tuple(value.shape) for value in example_inputs])
        return lambda *args: lowered_region(*args)


def test_a_new_target_plugs_in_with_kernels_and_supports():
    fn = lambda a, b: torch.relu(a @ b).sin()
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    target = PlugTestTarget()
    program = compile_static(make_fx(fn)(a, b), [a, b], Options(), target)
    calls.clear()
    torch.testing.assert_close(program(a, b), fn(a, b))
    assert calls == ["aten.mm.default", "aten.relu.default"]
    assert target.compiled == [[(3, 4), (4, 5)]]
    assert program.report.fallback_ops == [
        {"op": "aten.sin.default", "reason": "unsupported op (no plug-test kernel yet)", "count": 1}]


def test_a_target_refuses_nodes_through_supports():
    fn = lambda a: torch.relu(a.to(torch.bfloat16)).float()
    a = torch.randn(3)
    program = compile_static(make_fx(fn)(a), [a], Options(), PlugTestTarget())
    torch.testing.assert_close(program(a), fn(a))
    assert {entry["op"]: entry["reason"] for entry in program.report.fallback_ops}["aten.relu.default"] == \
        "unsupported dtype (bfloat16)"


def test_auto_resolves_to_the_simulator_on_a_cpu_machine_with_the_device_dtypes():
    assert resolve_target("auto") is SIMULATOR  # no genuine NKI toolchain, no Neuron device here
    assert torch.float64 not in DEVICE_DTYPES and torch.bfloat16 in DEVICE_DTYPES
