"""Nothing the backend raises reaches the user where eager would have run (unless fallback="error").

Each test breaks one stage of the backend on purpose (fault injection) and checks that the model still gives eager's
answer, that the failure is counted and reported, and that fallback="error" raises it instead.
"""

import logging

import pytest
import torch

import neuron_dynamo


def _model(x):
    return torch.softmax(x @ x.transpose(-1, -2), dim=-1).sum(-1)


def _explode(*args, **kwargs):
    raise RuntimeError("stage exploded")


STAGES = {
    "padding proof": ("neuron_dynamo.bucket_dispatch.prove_padding", True),
    "specialisation": ("neuron_dynamo.bucket_dispatch.specialize", True),
    "cache key": ("neuron_dynamo.program_cache.key_parts", False),
    "partition": ("neuron_dynamo.compiler.partition", False),
}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_failing_stage_runs_the_graph_eagerly_with_a_warning(stage, monkeypatch, caplog):
    where, dynamic = STAGES[stage]
    monkeypatch.setattr(where, _explode)
    compiled = torch.compile(_model, backend="neuron", dynamic=dynamic)
    neuron_dynamo.reset_stats()
    with caplog.at_level(logging.WARNING, logger="neuron_dynamo"):
        for length in (5, 9):
            x = torch.randn(2, length, 8)
            torch.testing.assert_close(compiled(x), _model(x))
    assert "stage exploded" in caplog.text


def test_a_kernel_failing_at_run_time_reruns_the_graph_eagerly_and_reports_it(monkeypatch):
    monkeypatch.setattr("neuron_dynamo.toolchain.simulator.SimulatorRegion.forward", _explode)
    x = torch.randn(3, 8)
    neuron_dynamo.reset_stats()
    report = neuron_dynamo.explain(_model, x)
    torch.testing.assert_close(report.output, _model(x))
    assert neuron_dynamo.stats()["graphs_failed"] == 1
    eager = [graph for graph in report.graphs if graph.target == "eager"]
    assert eager and eager[0].ops_lowered == 0
    assert all(entry["reason"].startswith("backend failed (RuntimeError: stage exploded")
               for entry in eager[0].fallback_ops)


@pytest.mark.parametrize("stage", ["padding proof", "partition"])
def test_fallback_error_raises_the_stage_failure(stage, monkeypatch):
    where, dynamic = STAGES[stage]
    monkeypatch.setattr(where, _explode)
    compiled = torch.compile(_model, backend="neuron", dynamic=dynamic, options={"fallback": "error"})
    with pytest.raises(Exception, match="stage exploded"):
        compiled(torch.randn(2, 5, 8))


def test_requested_errors_still_reach_the_user():
    """A size beyond max_bucket is an error the user asked for, not a backend failure to hide."""
    compiled = torch.compile(_model, backend="neuron", dynamic=True, options={"max_bucket": 128})
    compiled(torch.randn(2, 5, 8))
    with pytest.raises(Exception, match="larger than the largest bucket"):
        compiled(torch.randn(2, 300, 8))
