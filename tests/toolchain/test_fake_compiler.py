"""Fake-compiler tests of the `neuron` toolchain: a fake `neuronx-cc` on PATH stands in for the real compiler.

The genuine toolchain is simulated by pretending `nki` is genuine (`nki_toolchain_info`) and putting
tests/toolchain/fake_neuronx_cc.py on PATH as `neuronx-cc`; the kernels themselves still run on the interpreter.
"""

import json
import tempfile
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_dynamo
from neuron_dynamo.compiler import FallbackError
from neuron_dynamo.lowering import lower_region
from neuron_dynamo.toolchain import TargetUnavailableError, resolve_target
from neuron_dynamo.toolchain.neuronx_cc import NeuronTarget, compiler_flags


@pytest.fixture
def fake_compiler(fake_neuronx_cc, monkeypatch):
    """`neuronx-cc` on PATH is the fake (tests/conftest.py); returns the path of its JSON-lines log."""
    monkeypatch.setenv("NEURON_CC_FLAGS", "--cache_dir=/somewhere --retry_failed_compilation -O1")
    return fake_neuronx_cc


def calls(log):
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def leftovers():
    return sorted(p.name for p in Path(tempfile.gettempdir()).glob("neuron_dynamo_cc_*"))


def fn(x, w):
    return torch.softmax(x @ w, dim=-1) * 2


ARGS = (torch.randn(16, 8), torch.randn(8, 12))
NEURON = {"target": "neuron", "cache": "off", "compiler_flags": ("--enable-saturate-infinity",), "lnc": 1}


def test_fake_compiler_gets_the_documented_command_line_and_the_region_runs(fake_compiler):
    before = leftovers()
    torch._dynamo.reset()
    report = neuron_dynamo.explain(fn, *ARGS, options=NEURON)
    torch.testing.assert_close(report.output, fn(*ARGS), atol=1e-5, rtol=1e-5)
    (graph,) = report.graphs
    assert graph.target == "neuron" and graph.ops_lowered == graph.ops_total and graph.regions == 1
    (call,) = calls(fake_compiler)
    argv = call["argv"]
    assert argv[0] == "compile" and argv[1].endswith("kernels.py")
    assert argv[argv.index("--target") + 1] == "trn2"
    assert argv[argv.index("--logical-nc-config") + 1] == "1"
    assert argv[argv.index("--framework") + 1] == "XLA"
    assert "-O1" in argv and "--enable-saturate-infinity" in argv  # NEURON_CC_FLAGS, then the options' flags
    assert not any(a.startswith(("--cache_dir", "--retry_failed")) for a in argv)  # wrapper-only flags dropped
    assert "@nki.jit" in call["input"] and "matmul_kernel" in call["input"]  # the region's NKI kernels
    assert leftovers() == before  # the private work directory is gone


@pytest.mark.parametrize("mode", ["fail", "empty"])
def test_fake_compiler_failure_sends_the_region_to_eager_with_a_counted_reason(fake_compiler, monkeypatch, mode):
    monkeypatch.setenv("FAKE_NEURONX_CC_MODE", mode)
    before = leftovers()
    torch._dynamo.reset()
    neuron_dynamo.reset_stats()
    report = neuron_dynamo.explain(fn, *ARGS, options=NEURON)
    torch.testing.assert_close(report.output, fn(*ARGS))
    (graph,) = report.graphs
    assert graph.ops_lowered == 0 and graph.regions == 0
    assert all(entry["reason"].startswith("lowering failed (CompilerError") for entry in graph.fallback_ops)
    stats = neuron_dynamo.stats()
    assert stats["regions_failed"] == 1 and stats["neuronx_cc.failures"] == 1
    assert leftovers() == before  # the half-written NEFF went with its directory


def test_fake_compiler_that_hangs_is_killed_after_the_timeout(fake_compiler, monkeypatch, caplog):
    monkeypatch.setenv("FAKE_NEURONX_CC_MODE", "hang")
    torch._dynamo.reset()
    neuron_dynamo.reset_stats()
    report = neuron_dynamo.explain(fn, *ARGS, options={**NEURON, "compile_timeout": 1})
    torch.testing.assert_close(report.output, fn(*ARGS))
    assert "timed out after 1 s" in report.graphs[0].fallback_ops[0]["reason"]
    assert neuron_dynamo.stats()["neuronx_cc.timeouts"] == 1
    assert any("running it eagerly" in record.message for record in caplog.records)


def test_fake_compiler_failure_raises_under_fallback_error(fake_compiler, monkeypatch):
    monkeypatch.setenv("FAKE_NEURONX_CC_MODE", "fail")
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron", options={**NEURON, "fallback": "error"})
    with pytest.raises(Exception) as error:
        compiled(*ARGS)
    chain = [error.value]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    assert any(isinstance(e, FallbackError) for e in chain)
    assert "internal compiler error" in str(error.value)


def test_fake_compiler_target_resolution_and_lnc_defaults(fake_compiler, monkeypatch):
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    target = resolve_target("neuron", neuron_dynamo.options.resolve_options({"target": "neuron"}))
    assert isinstance(target, NeuronTarget) and target.lnc == 2  # trn2's default
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    assert resolve_target("neuron").lnc == 1
    assert resolve_target("auto").name == "simulator"  # no Neuron device visible here
    assert compiler_flags(["-O3"], {"NEURON_CC_FLAGS": "--no_cache --log_level=INFO --model-type transformer"}) == [
        "--model-type", "transformer", "-O3"]
    assert set(target.cache_facts()) == {"target", "compiler", "flags", "platform", "lnc"}


def test_neuron_target_without_the_genuine_toolchain_is_a_clear_error():
    with pytest.raises(TargetUnavailableError, match="needs a Trainium host"):
        resolve_target("neuron")


def test_fake_compiler_region_round_trips_through_its_artifact(fake_compiler):
    torch._dynamo.reset()
    target = resolve_target("neuron", neuron_dynamo.options.resolve_options(NEURON))
    region = make_fx(fn)(*ARGS)
    lowered = lower_region(region, "neuron")
    compiled = target.compile_region(lowered, ARGS)
    loaded = target.load_region(target.serialize_region(compiled, lowered))
    assert loaded.neff == compiled.neff and loaded.neff.startswith(b"NEFF")
    assert len(calls(fake_compiler)) == 1  # loading ran no compiler
    torch.testing.assert_close(loaded(*ARGS), fn(*ARGS), atol=1e-5, rtol=1e-5)
