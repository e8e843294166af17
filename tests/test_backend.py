import os
import subprocess
import sys
import textwrap

import pytest
import torch

import neuron_dynamo
from neuron_dynamo.compiler import FallbackError
from neuron_dynamo.toolchain import TargetUnavailableError


def _original_error(error: BaseException) -> BaseException:
    """Dynamo wraps a backend's exception in BackendCompilerFailed; tests look at the original."""
    return getattr(error, "inner_exception", None) or error


def _run_fresh(code: str) -> str:
    """Run `code` in a fresh interpreter, outside the repository (so only the installed package is visible)."""
    env = {**os.environ, "NEURON_DYNAMO_LOG": ""}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            cwd="/", env=env, timeout=240)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_entry_points_register_both_names_in_a_fresh_interpreter():
    out = _run_fresh("""
        import sys
        import torch
        assert "neuron_dynamo" not in sys.modules
        assert {"neuron", "neuron_dynamo"} <= set(torch._dynamo.list_backends())
        x = torch.randn(4, 8)
        for name in ("neuron", "neuron_dynamo"):
            torch._dynamo.reset()
            compiled = torch.compile(lambda t: torch.softmax(t @ t.T, dim=-1), backend=name)
            torch.testing.assert_close(compiled(x), torch.softmax(x @ x.T, dim=-1))
        import neuron_dynamo
        print(neuron_dynamo.stats()["dynamo_graphs"], neuron_dynamo.backend_info()["neuron_is_neuron_dynamo"])
    """)
    assert out.split() == ["2", "True"]


def test_import_has_no_global_side_effects():
    out = _run_fresh("""
        import logging
        import torch
        import torch._dynamo
        from torch._dynamo.backends.registry import _COMPILER_FNS
        before = (torch._dynamo.config.get_config_copy(), logging.getLogger("neuron_dynamo").level,
                  set(_COMPILER_FNS))
        import neuron_dynamo
        after = (torch._dynamo.config.get_config_copy(), logging.getLogger("neuron_dynamo").level,
                 set(_COMPILER_FNS))
        print(before == after, "neuron" in _COMPILER_FNS)
    """)
    assert out.split() == ["True", "False"]


def test_backend_info_says_who_owns_the_name():
    info = neuron_dynamo.backend_info()
    assert info["backend_names"] == ["neuron", "neuron_dynamo"]
    assert info["neuron_resolves_to"] == "neuron_dynamo.backend:neuron_backend"
    assert info["neuron_is_neuron_dynamo"] is True
    assert any("neuron-dynamo" in provider for provider in info["neuron_providers"])
    assert info["version"] == "0.1.0"
    assert info["target"] == "simulator"  # what `auto` resolves to on a machine without a Neuron device
    assert isinstance(info["genuine_nki"], bool)


def test_reduce_overhead_mode_is_accepted():
    x = torch.randn(3, 5)
    compiled = torch.compile(lambda t: torch.relu(t) * 2, backend="neuron", mode="reduce-overhead")
    torch.testing.assert_close(compiled(x), torch.relu(x) * 2)


class EagerOnlyThenLinear(torch.nn.Module):
    """An op with no lowering (nor a decomposition): it must run eagerly, correctly, and show up in the report."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(10, 5)

    def forward(self, x):
        return torch.softmax(self.linear(torch.ops.neuron_tests.eager_only(x)), dim=-1)


def test_op_without_lowering_runs_eagerly_matches_and_is_reported():
    torch.manual_seed(0)
    model, x = EagerOnlyThenLinear(), torch.randn(2, 4, 10)
    with torch.no_grad():
        report = neuron_dynamo.explain(model, x)
        expected = model(x)
    torch.testing.assert_close(report.output, expected, atol=1e-6, rtol=1e-6)
    (graph,) = report.graphs
    unsupported = "unsupported op (no lowering registered)"
    assert {"op": "neuron_tests.eager_only.default", "reason": unsupported, "count": 1} in graph.fallback_ops
    assert graph.ops_lowered == graph.ops_total - 1
    assert "neuron_tests.eager_only.default" in str(report)


def test_fallback_error_raises_naming_the_op():
    compiled = torch.compile(EagerOnlyThenLinear(), backend="neuron", options={"fallback": "error"})
    with pytest.raises(Exception) as error:
        compiled(torch.randn(2, 4, 10))
    original = _original_error(error.value)
    assert isinstance(original, FallbackError)
    assert "neuron_tests.eager_only.default" in str(original)
    assert "eager_ops" in str(original)


def test_forced_eager_ops_do_not_trip_fallback_error():
    x = torch.randn(4, 4)
    options = {"fallback": "error", "eager_ops": ["aten.mm"]}
    report = neuron_dynamo.explain(lambda t: torch.relu(t @ t), x, options=options)
    torch.testing.assert_close(report.output, torch.relu(x @ x))
    (graph,) = report.graphs
    assert graph.fallback_ops == [{"op": "aten.mm.default", "reason": "forced eager (eager_ops)", "count": 1}]
    assert graph.flops_lowered == 0 and graph.flops_total == 2 * 4 * 4 * 4


def test_min_region_size_sends_small_regions_eager():
    x = torch.randn(4, 4)
    fn = lambda t: torch.cumsum(t, 0).sin().double().exp()  # region {cumsum, sin} of 2 ops, then float64
    report = neuron_dynamo.explain(fn, x, options={"min_region_size": 3, "target": "reference"})
    torch.testing.assert_close(report.output, fn(x))
    (graph,) = report.graphs
    assert graph.regions == 0 and graph.ops_lowered == 0
    reasons = {entry["op"]: entry["reason"] for entry in graph.fallback_ops}
    assert reasons["aten.sin.default"] == "region too small (2 < min_region_size 3)"
    assert reasons["aten.exp.default"] == "unsupported dtype (float64)"


def test_lowering_failure_falls_back_with_its_reason(monkeypatch):
    def broken(region, target):
        raise RuntimeError("kernel generator exploded")

    monkeypatch.setattr("neuron_dynamo.compiler.lower_region", broken)
    x = torch.randn(3, 3)
    report = neuron_dynamo.explain(lambda t: (t * 2).exp(), x)
    torch.testing.assert_close(report.output, (x * 2).exp())
    (graph,) = report.graphs
    assert graph.regions == 0 and graph.ops_lowered == 0
    assert {entry["reason"] for entry in graph.fallback_ops} == {
        "lowering failed (RuntimeError: kernel generator exploded)"}

    compiled = torch.compile(lambda t: (t * 3).exp(), backend="neuron", options={"fallback": "error"})
    with pytest.raises(Exception, match="kernel generator exploded"):
        compiled(x)


def test_simulator_target_runs_regions_as_nki_kernels_and_says_what_falls_back():
    x = torch.randn(3, 3)
    fn = lambda t: torch.ops.neuron_tests.eager_only(torch.tanh(t @ t))  # noqa: E731
    report = neuron_dynamo.explain(fn, x, options={"target": "simulator"})
    # eager_only runs eagerly on the interpreter's tanh(x @ x), which may differ from eager's in the last bits
    torch.testing.assert_close(report.output, fn(x), rtol=1e-5, atol=1e-5)
    (graph,) = report.graphs
    assert graph.target == "simulator" and graph.ops_lowered == 2 and graph.ops_total == 3
    assert graph.estimated_device_ns > 0  # the cost model's figure for the NKI kernels that ran
    assert graph.fallback_ops == [
        {"op": "neuron_tests.eager_only.default", "reason": "unsupported op (no lowering registered)", "count": 1}]


def test_neuron_target_without_torchneuron_is_a_clear_error():
    """No torch_neuronx here: asking for target 'neuron' says why and what to use instead, before anything runs."""
    compiled = torch.compile(lambda t: t + 1, backend="neuron", options={"target": "neuron"})
    with pytest.raises(Exception) as error:
        compiled(torch.ones(2))
    original = _original_error(error.value)
    assert isinstance(original, TargetUnavailableError)
    assert "torch_neuronx does not import" in str(original) and "target='simulator' or 'reference'" in str(original)


def test_symbolic_graph_without_bucketing_gets_one_static_program_per_shape():
    neuron_dynamo.reset_stats()
    fn = lambda t: torch.softmax(t @ t.transpose(-1, -2), dim=-1).sum(-1)
    compiled = torch.compile(fn, backend="neuron", dynamic=True, options={"bucketing": False})
    for length in (3, 5, 3, 8):
        x = torch.randn(2, length, 4)
        torch.testing.assert_close(compiled(x), fn(x))
    counters = neuron_dynamo.stats()
    assert counters["dynamo_graphs"] == 1
    assert counters["programs_compiled"] == 3  # lengths 3, 5 and 8; the second 3 reuses its program
    assert counters["calls"] == 4


def test_stats_reset():
    torch.compile(lambda t: t * 2, backend="neuron")(torch.ones(2))
    assert neuron_dynamo.stats()["calls"] >= 1
    neuron_dynamo.reset_stats()
    assert neuron_dynamo.stats() == {}


def test_training_step_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 3))
    twin.load_state_dict(model.state_dict())
    x, y = torch.randn(5, 8), torch.randint(0, 3, (5,))
    compiled = torch.compile(model, backend="neuron")
    for net, run in ((model, compiled), (twin, twin)):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(run(x), y).backward()
            optimizer.step()
    for ours, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_neuron_dynamo_log_env_turns_on_our_logger_only():
    env = {**os.environ, "NEURON_DYNAMO_LOG": "info"}
    code = "import torch; torch.compile(lambda t: t.exp() @ t, backend='neuron')(torch.ones(3, 3))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=env,
                            timeout=240)
    assert result.returncode == 0, result.stderr
    assert "[neuron_dynamo.compiler] INFO graph_0 inference: 2/2 ops lowered in 1 region(s)" in result.stderr


def test_weights_are_runtime_inputs_not_constants():
    model = torch.nn.Linear(4, 3)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        model.weight.mul_(-2.0)  # a weight update after compiling must show in the next call
        torch.testing.assert_close(compiled(x), model(x))


def test_compiled_outputs_can_be_modified_in_place_as_trainer_does():
    """Trainer scales the loss in place (`loss *= scale`): an output must not be a view made inside the graph."""
    x, weight = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    loss_fn = lambda x, w: torch.tanh(x @ w).mean(0)  # noqa: E731
    loss = torch.compile(loss_fn, backend="neuron")(x, weight)
    loss *= 2.0
    loss.sum().backward()
    expected = torch.autograd.grad((loss_fn(x, weight) * 2.0).sum(), weight)[0]
    torch.testing.assert_close(weight.grad, expected, atol=1e-5, rtol=1e-4)
