"""Target `neuron` on a fake TorchNeuron: regions run as `nki_op` kernels on `neuron`-device tensors.

There is no Trainium here. Each test runs in a subprocess with the fake `neuron` device and fake `torch_neuronx` of
tests/fakes (written from AWS's documentation, not from this package); the oracle for values is eager PyTorch on
the CPU. Models are called as users call them: `torch.compile` with no options, several lengths.
"""

import json
import textwrap

import pytest
import torch

from neuron_dynamo.toolchain import DEVICE_DTYPES
from neuron_dynamo.toolchain.torchneuron import TorchNeuronTarget

# Code every subprocess starts with: tiny Transformers models from configs, and a watch on subprocesses.
PRELUDE = textwrap.dedent("""
    import json, subprocess, warnings
    import torch, transformers, neuron_dynamo, torch_neuronx
    from torch_neuronx._fake import record

    spawned = []
    _popen = subprocess.Popen.__init__
    def _watch(self, args, *a, **k):
        spawned.append(" ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args))
        return _popen(self, args, *a, **k)
    subprocess.Popen.__init__ = _watch

    def llama():
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256))

    def gpt2():
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0))
        model.loss_type = "ForCausalLM"
        return model

    def bert():
        return transformers.BertModel(transformers.BertConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=256))

    def ours(prefix=("neuron.", "dynamo_graphs", "regions", "programs_compiled")):
        return {k: v for k, v in neuron_dynamo.stats().items() if k.startswith(prefix)}
""")


@pytest.fixture
def run(fake_device):
    """Run a body after PRELUDE on the fake device; its JSON result."""
    return lambda body, **kwargs: fake_device(PRELUDE + textwrap.dedent(body), **kwargs)


def test_auto_picks_neuron_for_device_inputs_and_the_simulator_for_cpu_inputs(run):
    result = run("""
        from neuron_dynamo.toolchain import resolve_target, TargetUnavailableError
        cpu, dev = torch.ones(4), torch.ones(4).to("neuron")
        errors = []
        for name, inputs in (("simulator", [dev]), ("neuron", [cpu])):
            try:
                resolve_target(name, None, inputs)
            except TargetUnavailableError as exc:
                errors.append(str(exc))
        fn = lambda x: torch.softmax(x @ x.T, -1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            on_cpu = neuron_dynamo.explain(fn, torch.randn(8, 8))
            on_device = neuron_dynamo.explain(fn, torch.randn(8, 8).to("neuron"))
        info = neuron_dynamo.backend_info()
        print(json.dumps({
            "auto_cpu": resolve_target("auto", None, [cpu]).name,
            "auto_device": resolve_target("auto", None, [dev]).name,
            "errors": errors, "cpu_report": str(on_cpu), "device_report": str(on_device),
            "device_targets": [g.target for g in on_device.graphs], "output_device": str(on_device.output.device),
            "name_warnings": [str(w.message) for w in caught if "claimed by more than one package" in str(w.message)],
            "providers": info["neuron_providers"], "resolves_to": info["neuron_resolves_to"],
            "torchneuron": info["torchneuron"]}))
    """)
    assert result["auto_cpu"] == "simulator" and result["auto_device"] == "neuron"
    assert "runs on CPU tensors" in result["errors"][0] and ".to('neuron')" in result["errors"][1]
    assert "target simulator: CPU inputs run on the NKI interpreter" in result["cpu_report"]
    assert result["device_targets"] == ["neuron"] and result["output_device"] == "neuron:0"
    assert "target neuron: TorchNeuron runs the regions' NKI kernels" in result["device_report"]
    # Both packages claim `neuron`: said once, naming the winner; `backend_info()` lists both.
    assert len(result["name_warnings"]) == 1 and "torch-neuronx" in result["name_warnings"][0]
    assert len(result["providers"]) == 2 and result["resolves_to"].startswith("torch_neuronx")
    assert result["torchneuron"]["available"] and result["torchneuron"]["torch_neuronx"] == "2.14.0"


def test_tiny_models_on_the_device_give_cpu_eager_outputs_with_each_kernel_registered_once(run):
    result = run("""
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        class HostTrips(TorchDispatchMode):
            # every op of a steady compiled call that makes a CPU tensor (0-dim scalars aside)
            def __init__(self):
                super().__init__()
                self.ops = []
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if any(isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() for t in tree_leaves(out)):
                    self.ops.append(str(func))
                return out

        torch.manual_seed(0)
        found, trips = {}, []
        for name, build in (("llama", llama), ("gpt2", gpt2), ("bert", bert)):
            model = build().eval()
            compiled = torch.compile(model.to("neuron"), backend="neuron_dynamo")
            worst, devices = 0.0, set()
            for length in (5, 17, 40, 17):
                ids = torch.randint(0, 128, (2, length))
                with torch.no_grad():
                    out = compiled(ids.to("neuron"))[0]
                    want = model.to("cpu")(ids)[0]
                    model.to("neuron")
                devices.add(str(out.device))
                worst = max(worst, (out.cpu() - want).abs().max().item())
            with torch.no_grad(), HostTrips() as watch:
                compiled(ids.to("neuron"))
            trips += watch.ops
            found[name] = {"worst": worst, "devices": sorted(devices)}
        compiles = [json.dumps([c["kernel"], repr(c["signature"])]) for c in record.kernel_compiles]
        print(json.dumps({"models": found, "stats": ours(), "host_trips": trips,
                          "eager": neuron_dynamo.stats().get("dynamo_graphs_eager", 0),
                          "nki_ops": record.nki_ops, "compiles": compiles,
                          "neuronx_cc": [cmd for cmd in spawned if "neuronx-cc" in cmd]}))
    """)
    for name, model in result["models"].items():
        assert model["devices"] == ["neuron:0"], name
        assert model["worst"] < 1e-4, (name, model["worst"])
    stats = result["stats"]
    assert result["eager"] == 0 and stats.get("regions_failed", 0) == 0
    assert result["host_trips"] == []  # the glue between kernels stays on the device
    assert stats["neuron.kernel_calls"] > 0 and stats.get("neuron.unplanned_calls", 0) == 0
    assert len(result["nki_ops"]) == len(set(result["nki_ops"])) == stats["neuron.kernel_ops_registered"]
    assert all(name.startswith("neuron_dynamo::") for name in result["nki_ops"])
    assert len(result["compiles"]) == len(set(result["compiles"]))  # TorchNeuron compiled each signature once
    assert result["neuronx_cc"] == []


def test_graph_mode_hands_each_region_and_bucket_to_torchneurons_compiler_once(run):
    result = run("""
        def fn(x, w):
            return torch.softmax(torch.relu(x @ w) * 2, -1).sum(-1)
        w = torch.randn(16, 16)
        compiled = torch.compile(fn, backend="neuron_dynamo", dynamic=True, options={"device_mode": "graph"})
        worst, handed = 0.0, []
        for length in (5, 17, 200, 130, 17, 5):
            x = torch.randn(length, 16)
            out = compiled(x.to("neuron"), w.to("neuron"))
            worst = max(worst, (out.cpu() - fn(x, w)).abs().max().item())
            handed.append(len([h for h in record.handoffs if any("neuron_dynamo." in t for t in h["targets"])]))
        toy = ours()
        torch.manual_seed(0)
        model = llama().eval()  # a real model: its index range checks become assertions inside the graph
        ids = torch.randint(0, 128, (2, 17))
        with torch.no_grad():
            want = model(ids).logits
            got = torch.compile(model.to("neuron"), backend="neuron_dynamo", options={"device_mode": "graph"})(
                ids.to("neuron")).logits
        print(json.dumps({"worst": worst, "handed": handed, "stats": toy, "llama": ours(),
                          "llama_worst": (got.cpu() - want).abs().max().item()}))
    """)
    assert result["worst"] < 1e-4
    stats = result["stats"]
    assert stats.get("neuron.graph_handoff_failed", 0) == 0
    # One hand-off per region of each program (the first length exactly, then the buckets of 128 and 256 rows):
    # lengths that fall in a bucket already compiled hand nothing over again.
    handed = result["handed"]
    assert handed[-1] == stats["neuron.graph_handoffs"] == stats["regions_compiled"]
    assert stats["programs_compiled"] == 3 and handed[3:] == [handed[2]] * 3
    llama = result["llama"]
    assert result["llama_worst"] < 1e-4 and llama.get("neuron.graph_handoff_failed", 0) == 0
    assert llama["neuron.graph_handoffs"] > stats["neuron.graph_handoffs"]


def test_static_cache_generate_from_device_map_neuron_runs_the_user_code_unchanged(run, tmp_path):
    """The seed's code: `device_map="neuron"`, then `generate()` with `CompileConfig(backend="neuron")`, both
    packages installed. Which `neuron` torch takes follows install order, so both orders run; the tokens are CPU
    eager's either way, and the one that ran is the one `backend_info()` names."""
    save = f"""
        torch.manual_seed(0)
        llama().save_pretrained({str(tmp_path / 'tiny')!r})
        print("{{}}")
    """
    run(save)
    user_code = f"""
        path = {str(tmp_path / 'tiny')!r}
        torch.manual_seed(0)
        prompts = [torch.randint(0, 128, (1, n)) for n in (5, 17)]
        model = transformers.AutoModelForCausalLM.from_pretrained(path, device_map="neuron")
        config = transformers.CompileConfig(backend="neuron")
        tokens = [model.generate(p.to("neuron"), max_new_tokens=6, do_sample=False, cache_implementation="static",
                                 compile_config=config).cpu().tolist() for p in prompts]
        reference = transformers.AutoModelForCausalLM.from_pretrained(path)
        expected = [reference.generate(p, max_new_tokens=6, do_sample=False).tolist() for p in prompts]
        print(json.dumps({{"same": tokens == expected, "stats": ours(),
                          "resolves_to": neuron_dynamo.backend_info()["neuron_resolves_to"],
                          "torchneuron_handoffs": len(record.handoffs)}}))
    """
    ours_first = run(user_code, fake_last=True)
    assert ours_first["same"] and ours_first["resolves_to"] == "neuron_dynamo.backend:neuron_backend"
    assert ours_first["stats"]["dynamo_graphs"] >= 1 and ours_first["stats"]["neuron.kernel_calls"] > 0
    theirs_first = run(user_code)
    assert theirs_first["same"] and theirs_first["resolves_to"].startswith("torch_neuronx")
    assert theirs_first["stats"].get("dynamo_graphs", 0) == 0 and theirs_first["torchneuron_handoffs"] >= 1


def test_training_step_on_the_device_matches_cpu(run):
    result = run("""
        torch.manual_seed(0)
        model = llama().train()
        ids = torch.randint(0, 128, (2, 19))
        model(input_ids=ids, labels=ids).loss.backward()
        want = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        model.to("neuron")
        loss = torch.compile(model, backend="neuron_dynamo")(input_ids=ids.to("neuron"), labels=ids.to("neuron")).loss
        loss.backward()
        worst = max((p.grad.cpu() - want[n]).abs().max().item() for n, p in model.named_parameters())
        print(json.dumps({"worst": worst, "stats": ours(), "device": str(loss.device),
                          "eager": neuron_dynamo.stats().get("dynamo_graphs_eager", 0)}))
    """)
    assert result["device"] == "neuron:0" and result["eager"] == 0
    assert result["worst"] < 1e-4 and result["stats"]["neuron.kernel_calls"] > 0


def test_selfcheck_compares_the_device_with_the_simulator(run, tmp_path):
    report = tmp_path / "selfcheck.json"
    result = run(f"""
        from neuron_dynamo.cli import main
        status = main(["selfcheck", "--json", {str(report)!r}])
        print(json.dumps({{"status": status}}))
    """)
    assert result["status"] == 0
    written = json.loads(report.read_text())
    assert written["summary"]["failed"] == [] and written["summary"]["checks"] >= 20
    assert {row["kind"] for row in written["rows"]} == {"kernel", "model"}
    assert {row["dtype"] for row in written["rows"]} >= {"float32", "bfloat16"}
    assert all(row["device_us"] > 0 for row in written["rows"])
    assert written["host"]["torch_neuronx"] == "2.14.0"


def test_selfcheck_without_trainium_says_so_and_runs_nothing(capsys):
    from neuron_dynamo.cli import main

    assert main(["selfcheck"]) == 2
    assert "no Trainium here" in capsys.readouterr().err


def test_the_cache_key_carries_torchneurons_version_facts(monkeypatch):
    target = TorchNeuronTarget(lambda node: None)
    monkeypatch.setenv("NEURON_CC_FLAGS", "--model-type transformer")
    facts = target.cache_facts()
    assert {"torch_neuronx", "nki", "neuronx_cc", "platform", "lnc", "flags", "mode", "sources"} <= set(facts)
    assert facts["flags"] == ["--model-type", "transformer"] and facts["lnc"] == 1
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    assert target.cache_facts()["lnc"] == 2
    assert TorchNeuronTarget(lambda node: None, mode="graph").cache_facts()["mode"] == "graph"


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64])
def test_the_device_takes_only_what_trainium_stores(dtype):
    assert dtype not in DEVICE_DTYPES


def test_warm_on_the_device_then_a_device_run_compiles_nothing(run, tmp_path, cache_dir, pinned_sources):
    """`neuron-precompile warm` where TorchNeuron has a device runs the shapes there (on Trainium that fills
    TorchNeuron's NEFF cache too); a later process with the model on `neuron` finds every program."""
    model_dir = tmp_path / "tiny-llama"
    result = run(f"""
        from neuron_dynamo.cli import main
        torch.manual_seed(0)
        llama().save_pretrained({str(model_dir)!r})
        status = main(["warm", {str(model_dir)!r}, "--seq-lens", "8", "--dynamic", "false",
                       "--summary", {str(tmp_path / 'summary.json')!r}])
        print(json.dumps({{"status": status, "stats": ours(), "ops": record.nki_ops}}))
    """)
    assert result["status"] == 0 and result["stats"]["neuron.kernel_calls"] > 0 and result["ops"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["totals"]["done"] == 1 and summary["totals"]["compiled"] >= 1
    later = run(f"""
        model = transformers.AutoModelForCausalLM.from_pretrained({str(model_dir)!r}, device_map="neuron")
        with torch.no_grad():
            out = torch.compile(model, backend="neuron_dynamo")(input_ids=torch.randint(0, 128, (1, 8)).to("neuron"))
        print(json.dumps({{"cache": {{k: v for k, v in neuron_dynamo.stats().items() if k.startswith("cache.")}},
                          "device": str(out.logits.device), "stats": ours()}}))
    """)
    assert later["device"] == "neuron:0" and later["stats"]["neuron.kernel_calls"] > 0
    assert later["cache"].get("cache.misses", 0) == 0 and later["cache"]["cache.hits"] >= 1
