"""Tests of the fake TorchNeuron itself (tests/fakes/site/torch_neuronx).

Each fixture runs one subprocess (the device rename is once per process) that performs several
checks and prints them as one JSON object; the tests below assert on its parts.
"""

from __future__ import annotations

import os
import stat
import textwrap
from pathlib import Path

import pytest

BASICS = r"""
import json, importlib, importlib.metadata as md, sys, torch
autoloaded = "torch_neuronx" in sys.modules  # through the torch.backends entry point
import torch_neuronx
importlib.reload(torch_neuronx)
import torch_neuronx as again
out = {"autoloaded": autoloaded, "version": again.__version__, "dist_version": md.version("torch-neuronx")}

a = torch.arange(12.0).reshape(3, 4)
n = a.to("neuron")
out["device"] = str(n.device)
out["roundtrip"] = torch.equal(n.cpu(), a)
v = n[1:, ::2]                      # a strided view
v.mul_(10)                          # in place through the view
a[1:, ::2] *= 10
out["view_write"] = torch.equal(n.cpu(), a)
out["view_shares_storage"] = v.untyped_storage()._cdata == n.untyped_storage()._cdata
d = n.detach()                      # a view PyTorch makes in C++
d[0, 0] = -1.0
out["detach_shares"] = n[0, 0].item() == -1.0
t = n.t()
out["transpose"] = torch.equal(t.contiguous().cpu(), n.cpu().t())
r = n.reshape(2, 6).clone()
r.resize_(4, 4)
out["resize"] = list(r.shape) == [4, 4] and torch.equal(r.flatten()[:12].cpu(), n.cpu().flatten())
out["scalar_ok"] = torch.equal((n + torch.tensor(1.0)).cpu(), n.cpu() + 1)
try:
    n + torch.ones(3, 4)
    out["mix_error"] = None
except RuntimeError as e:
    out["mix_error"] = str(e)
out["factories"] = [torch.zeros(2, device="neuron").cpu().tolist(), torch.arange(3, device="neuron").cpu().tolist()]
out["torch_neuron"] = {
    "is_available": torch.neuron.is_available(), "device_count": torch.neuron.device_count(),
    "current_device": torch.neuron.current_device(), "is_initialized": torch.neuron.is_initialized(),
}
torch.neuron.set_device(0); torch.neuron.synchronize(); torch.manual_seed(0)
x1 = torch.randn(3, device="neuron").cpu()
torch.neuron.manual_seed_all(0); torch.manual_seed(0)
out["seeded"] = torch.equal(torch.randn(3, device="neuron").cpu(), x1)
out["entry_points"] = sorted(
    (ep.value, ep.dist.name if ep.dist else None) for ep in md.entry_points(group="torch_dynamo_backends")
    if ep.name == "neuron"
)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def basics(fake_device):
    return fake_device(BASICS, env={"FAKE_NEURON_DEVICE_COUNT": "2"})


def test_import_is_idempotent_and_versioned(basics):
    assert basics["autoloaded"] is True
    assert basics["version"] == basics["dist_version"] == "2.14.0"


def test_tensors_round_trip_and_views_keep_data(basics):
    assert basics["device"] == "neuron:0"
    for check in ("roundtrip", "view_write", "view_shares_storage", "detach_shares", "transpose", "resize",
                  "scalar_ok"):
        assert basics[check] is True, check
    assert basics["factories"] == [[0.0, 0.0], [0, 1, 2]]


def test_mixing_cpu_and_neuron_raises(basics):
    assert basics["mix_error"] and "Expected all tensors to be on the same device" in basics["mix_error"]


def test_torch_neuron_module(basics):
    assert basics["torch_neuron"] == {"is_available": True, "device_count": 2, "current_device": 0,
                                      "is_initialized": True}
    assert basics["seeded"] is True


def test_entry_point_lists_both_providers(basics):
    providers = dict(basics["entry_points"])
    assert providers["torch_neuronx.neuron_dynamo_backend.backend:neuron_backend"] == "torch-neuronx"
    assert len(providers) == 2, providers  # the project's own `neuron` backend is the other one


HF = r"""
import json, tempfile, torch, torch_neuronx
from transformers import AutoModelForCausalLM, LlamaConfig
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
cpu = AutoModelForCausalLM.from_config(cfg).eval()
ids = torch.randint(0, 64, (2, 7))
mask = torch.ones_like(ids)
out = {}
with torch.no_grad():
    ref = cpu(ids).logits
    dev = AutoModelForCausalLM.from_config(cfg)
    dev.load_state_dict(cpu.state_dict())
    dev = dev.eval().to("neuron")
    logits = dev(ids.to("neuron")).logits
out["logits_device"] = str(logits.device)
out["logits_err"] = (logits.cpu() - ref).abs().max().item()
g_cpu = cpu.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
g_dev = dev.generate(ids.to("neuron"), attention_mask=mask.to("neuron"), max_new_tokens=6, do_sample=False,
                     pad_token_id=0)
out["generate_equal"] = torch.equal(g_dev.cpu(), g_cpu)
path = tempfile.mkdtemp()
cpu.save_pretrained(path)
loaded = AutoModelForCausalLM.from_pretrained(path, device_map="neuron")
out["device_map_device"] = str(next(loaded.parameters()).device)
with torch.no_grad():
    out["device_map_err"] = (loaded(ids.to("neuron")).logits.cpu() - ref).abs().max().item()
print(json.dumps(out))
"""


def test_tiny_llama_eager_generate_and_device_map(fake_device):
    res = fake_device(HF)
    assert res["logits_device"] == "neuron:0" and res["logits_err"] < 1e-5
    assert res["generate_equal"] is True
    assert res["device_map_device"] == "neuron:0" and res["device_map_err"] < 1e-5


TRAIN = r"""
import copy, json, torch, torch_neuronx
from transformers import AutoModelForCausalLM, LlamaConfig
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)
cpu = AutoModelForCausalLM.from_config(cfg)
dev = copy.deepcopy(cpu).to("neuron")
ids = torch.randint(0, 64, (2, 7))

def step(model, ids):
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = compiled(input_ids=ids, labels=ids).loss
    loss.backward()
    grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
    opt.step()
    with torch.no_grad():
        after = compiled(input_ids=ids).logits
    return [loss.detach().cpu(), grad.cpu(), model.lm_head.weight.detach().cpu(), after.cpu()]

errs = [(a - b).abs().max().item() for a, b in zip(step(cpu, ids), step(dev, ids.to("neuron")))]
print(json.dumps({"errs": errs, "param_device": str(next(dev.parameters()).device)}))
"""


def test_aot_eager_training_step_matches_cpu(fake_device):
    res = fake_device(TRAIN)
    assert res["param_device"] == "neuron:0"
    assert max(res["errs"]) < 1e-5, res["errs"]


NKI = r"""
import json, os, torch, torch_neuronx
from torch_neuronx import nki_op, wrap_nki
from torch_neuronx._fake import record
from torch_neuronx.neuron_dynamo_backend.backend import neuron_backend

def add_kernel(a, b):          # stands in for an @nki.jit kernel: runs on CPU tensors
    return a + b

def scale_into(out, x, factor):  # writes its output argument, like kernels that take one
    out.copy_(x * factor)

@nki_op("fake_tests::add", mutates_args={})
def nki_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return wrap_nki(add_kernel)(x, y)

out = {"nki_ops": list(record.nki_ops)}
x, y = torch.ones(4, 8, device="neuron"), torch.full((4, 8), 2.0, device="neuron")
r = nki_add(x, y)
r2 = torch.ops.fake_tests.add(x, y)
out["eager"] = [str(r.device), torch.equal(r.cpu(), torch.full((4, 8), 3.0)), torch.equal(r2.cpu(), r.cpu())]
out["compiles_same_shape"] = len(record.kernel_compiles)
nki_add(torch.ones(2, 2, device="neuron"), torch.ones(2, 2, device="neuron"))
out["compiles_two_shapes"] = len(record.kernel_compiles)
o = torch.zeros(3, device="neuron")
wrap_nki(scale_into)(o, torch.ones(3, device="neuron"), 5.0)
wrap_nki(scale_into)(o, torch.ones(3, device="neuron"), 6.0)   # a new constant: a new compile
out["inplace"] = o.cpu().tolist()
out["constant_compiles"] = [c["signature"][-1] for c in record.kernel_compiles[-2:]]
try:
    wrap_nki(add_kernel)(torch.ones(2), torch.ones(2))
    out["cpu_error"] = None
except RuntimeError as e:
    out["cpu_error"] = str(e)

def _setup(ctx, inputs, output):
    pass
def _backward(ctx, grad):
    return grad, grad
nki_add.register_autograd(_backward, setup_context=_setup)
ga, gb = torch.ones(4, 8, device="neuron", requires_grad=True), torch.ones(4, 8, device="neuron", requires_grad=True)
nki_add(ga, gb).sum().backward()
out["autograd"] = [str(ga.grad.device), torch.equal(ga.grad.cpu(), torch.ones(4, 8))]

from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode() as mode:
    f = nki_add(mode.from_tensor(x), mode.from_tensor(torch.ones(4, 1).to("neuron")))
out["fake"] = [list(f.shape), str(f.device)]

record.reset()
def fn(a, b):
    return nki_add(a, b).sin() * 2
compiled = torch.compile(fn, backend=neuron_backend, dynamic=False)
res = compiled(x, y)
compiled(x, y)
compiled(torch.ones(2, 8, device="neuron"), torch.ones(2, 8, device="neuron"))
out["compiled_matches"] = torch.allclose(res.cpu(), (torch.full((4, 8), 3.0).sin() * 2))
out["handoffs"] = [[h["kind"], h["input_shapes"], h["targets"]] for h in record.handoffs]
out["kernel_compiles_in_graph"] = len(record.kernel_compiles)
try:
    torch.compile(lambda a: a * 2, backend=neuron_backend, dynamic=True)(x)
    out["dynamic_error"] = None
except Exception as e:
    out["dynamic_error"] = str(e)

record.reset()
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to("neuron")
loss = torch.compile(model, backend=neuron_backend)(x).sum()
loss.backward()
out["train_kinds"] = [h["kind"] for h in record.handoffs]
out["grad_device"] = str(model[0].weight.grad.device)
out["neuronx_cc_ran"] = os.path.exists(os.environ["NEURONX_CC_MARKER"])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def nki(tmp_path_factory, fake_device):
    bin_dir = tmp_path_factory.mktemp("bin")
    marker = bin_dir / "neuronx-cc.ran"
    tool = bin_dir / "neuronx-cc"  # a decoy: the fake must never start the compiler
    tool.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    path = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
    return fake_device(NKI, env={"PATH": path, "NEURONX_CC_MARKER": str(marker)})


def test_nki_op_registers_a_custom_op_that_runs_on_neuron(nki):
    assert nki["nki_ops"] == ["fake_tests::add"]
    assert nki["eager"] == ["neuron:0", True, True]
    assert nki["fake"] == [[4, 8], "neuron:0"]
    assert nki["autograd"] == ["neuron:0", True]  # register_autograd on the returned op


def test_wrap_nki_compiles_once_per_signature(nki):
    assert nki["compiles_same_shape"] == 1
    assert nki["compiles_two_shapes"] == 2
    assert nki["inplace"] == [6.0, 6.0, 6.0]
    assert nki["constant_compiles"] == ["5.0", "6.0"]


def test_wrap_nki_rejects_cpu_tensors(nki):
    assert nki["cpu_error"] and "neuron device" in nki["cpu_error"]


def test_backend_hands_off_once_per_static_shape(nki):
    assert nki["compiled_matches"] is True
    shapes = [h[1] for h in nki["handoffs"]]
    assert shapes == [[[4, 8], [4, 8]], [[2, 8], [2, 8]]]
    assert all(h[0] == "inference" and "fake_tests.add.default" in h[2] for h in nki["handoffs"])
    assert nki["kernel_compiles_in_graph"] == 0  # the kernel compiles with its graph


def test_backend_rejects_dynamic_shapes(nki):
    assert nki["dynamic_error"] and "dynamic shapes are not supported" in nki["dynamic_error"]


def test_backend_training_hands_off_forward_and_backward(nki):
    assert nki["train_kinds"] == ["forward", "backward"]
    assert nki["grad_device"] == "neuron:0"


def test_no_neuronx_cc_subprocess(nki):
    assert nki["neuronx_cc_ran"] is False


def test_harness_reports_a_failing_subprocess(fake_device):
    with pytest.raises(pytest.fail.Exception, match="boom"):
        fake_device("raise SystemExit('boom')")


def test_site_has_only_the_fake_package():
    site = (Path(__file__).parent / "site")
    assert sorted(p.name for p in site.iterdir() if not p.name.startswith("__")) == [
        "torch_neuronx", "torch_neuronx-2.14.0.dist-info"]
    entry_points = (site / "torch_neuronx-2.14.0.dist-info" / "entry_points.txt").read_text()
    assert "neuron = torch_neuronx.neuron_dynamo_backend.backend:neuron_backend" in textwrap.dedent(entry_points)
