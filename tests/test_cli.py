"""`neuron-precompile`: warm a model so a fresh run compiles nothing; ls, verify, prune, clear-locks; --help."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from neuron_dynamo.cache import CompileCache, make_key
from neuron_dynamo.cli import build_parser, main, parse_age, parse_size

# A user's run of a saved causal LM: built from its config, the lengths in the order given, compared with eager.
RUN = textwrap.dedent("""
    import json, sys, torch, transformers, neuron_dynamo
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(sys.argv[1])).eval()
    compiled = torch.compile(model, backend="neuron_dynamo", options={"target": "reference"})
    for seq in json.loads(sys.argv[2]):
        ids = torch.randint(0, 64, (1, seq))
        with torch.no_grad():
            torch.testing.assert_close(compiled(input_ids=ids).logits, model(input_ids=ids).logits)
    print(json.dumps({k: v for k, v in neuron_dynamo.stats().items() if k.startswith("cache.")}))
""")


def run_python(code, *args, cwd):
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd,
                            env=os.environ)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def save_tiny_gpt2(path):
    """A config and no weights: warm and run build the model from it (weights are inputs, not in the keys). GPT-2
    rather than Llama: Dynamo traces it faster."""
    import transformers

    transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=0,
                            eos_token_id=0).save_pretrained(path)


def test_warm_with_workers_then_a_fresh_run_has_no_miss(tmp_path, cache_dir, pinned_sources, capsys):
    """`--workers 2` on a causal LM directory under the default `--dynamic auto`: the plan's runs (one starting at
    each length) go to two processes, each run compiling as a fresh process would; a fresh process calling the
    lengths in another order afterwards compiles nothing."""
    model_dir = tmp_path / "tiny-gpt2"
    save_tiny_gpt2(model_dir)
    assert main(["warm", str(model_dir), "--seq-lens", "8,16", "--workers", "2", "-o", "target=reference",
                 "--summary", str(tmp_path / "summary.json")]) == 0  # the workers compile, with the pinned sources
    assert "done 2 / remaining 0" in capsys.readouterr().err
    summary = json.loads((tmp_path / "summary.json").read_text())
    totals = summary["totals"]
    assert totals["done"] == 2 and totals["failed"] == 0 and totals["runs"] >= 2, summary
    assert totals["compiled"] >= 3  # the static graph at each length, and the dynamic graph's bucket
    assert len({entry.meta["label"] for entry in CompileCache(root=cache_dir).entries()}) == 1

    stats = json.loads(run_python(RUN, str(model_dir), "[16, 8, 16]", cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert stats.get("cache.misses", 0) == 0 and stats["cache.hits"] >= 2, stats


def test_help_documents_every_command_and_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    top = capsys.readouterr().out
    for command in ("warm", "ls", "verify", "prune", "clear-locks", "--cache-dir"):
        assert command in top
    expected = {
        "warm": ("--seq-lens", "--batch-sizes", "--dtype", "--train", "--workers", "--summary", "--option",
                 "--dynamic", "--random-weights", "--tp-size", "module:factory", "Hugging Face"),
        "ls": ("--json",),
        "prune": ("--max-size", "--older-than"),
    }
    for command, words in expected.items():
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        for word in words:
            assert word in text, (command, word)


def test_ls_verify_prune_clear_locks(cache_dir, capsys):
    cache = CompileCache(root=cache_dir)
    keys = [make_key({"n": n}) for n in range(3)]
    for n, key in enumerate(keys):
        cache.put(key, bytes(1000), {"target": "reference", "label": "tiny", "input_shapes": [[2, 8]]})
        path = next(cache_dir.glob(f"v1/entries/*/{key}.entry"))
        os.utime(path, (time.time() - 3600 * (3 - n),) * 2)  # keys[0] is the least recently used

    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "3 entries" in out and keys[0][:16] in out and "tiny" in out and "2x8" in out
    assert main(["ls", "--json"]) == 0
    assert [entry["key"] for entry in json.loads(capsys.readouterr().out)] == keys

    assert main(["verify"]) == 0
    path = next(cache_dir.glob(f"v1/entries/*/{keys[2]}.entry"))
    path.write_bytes(path.read_bytes()[:-5])
    assert main(["verify"]) == 1
    assert f"corrupt: {keys[2]}" in capsys.readouterr().out

    assert main(["prune", "--older-than", "150m"]) == 0  # keys[0] was last used 3 h ago
    assert [entry.key for entry in cache.entries()] == [keys[1]]
    assert main(["prune"]) == 2 and "--max-size" in capsys.readouterr().err

    (cache_dir / "v1" / "locks").mkdir(parents=True, exist_ok=True)
    (cache_dir / "v1" / "locks" / f"{keys[1]}.lock").write_text('{"pid": 1, "host": "elsewhere"}')
    assert main(["clear-locks"]) == 0
    assert "removed 1 lock" in capsys.readouterr().out


def test_bad_arguments_are_clear_errors(tmp_path, cache_dir, capsys):
    assert main(["warm", "no_such_module:factory"]) == 2
    assert "cannot load the model factory" in capsys.readouterr().err
    assert main(["warm", "tiny_models:tiny_lm", "-o", "no_such_option=1"]) == 2
    assert "unknown option" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["prune", "--max-size", "lots"])
    assert "is not a size" in capsys.readouterr().err


def test_size_and_age_units():
    assert parse_size("20G") == 20 * 2**30 and parse_size("512M") == 512 * 2**20 and parse_size("100") == 100
    assert parse_age("30d") == 30 * 86400 and parse_age("90") == 90.0 and parse_age("2h") == 7200
    assert build_parser().parse_args(["warm", "m:f", "--seq-lens", "128,256"]).seq_lens == [128, 256]


def test_warm_a_hugging_face_directory_then_a_training_run_has_no_miss(tmp_path, cache_dir, pinned_sources):
    import transformers

    model_dir = tmp_path / "tiny-llama"
    transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64,
    ).save_pretrained(model_dir)  # a config and no weights: the model is built with random weights
    warm = "import sys; from neuron_dynamo.cli import main; sys.exit(main(sys.argv[1:]))"
    run_python(warm, "warm", str(model_dir), "--seq-lens", "8", "--train", "--dynamic", "false",
               "-o", "target=reference", "--summary", str(tmp_path / "summary.json"), cwd=tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["totals"]["done"] == 1 and summary["totals"]["failed"] == 0
    assert summary["totals"]["compiled"] >= 3  # inference, training forward, training backward
    assert len(CompileCache(root=cache_dir).entries()) == summary["totals"]["compiled"]

    train = textwrap.dedent("""
        import json, sys, torch, transformers, neuron_dynamo
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(sys.argv[1]))
        model.train()
        ids = torch.randint(0, 64, (1, 8))
        loss = torch.compile(model, backend="neuron_dynamo", options={"target": "reference"})(input_ids=ids,
                                                                                                labels=ids).loss
        loss.backward()
        print(json.dumps({k: v for k, v in neuron_dynamo.stats().items() if k.startswith("cache.")}))
    """)
    stats = json.loads(run_python(train, str(model_dir), cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert stats.get("cache.misses", 0) == 0 and stats["cache.hits"] >= 2


def test_a_failing_shape_is_reported_and_the_others_are_stored(tmp_path, cache_dir, monkeypatch, capsys):
    (tmp_path / "picky_models.py").write_text(textwrap.dedent("""
        import torch

        def picky():
            def make_inputs(batch, seq):
                if seq == 13:
                    raise ValueError("this model only takes even lengths")
                return (torch.randn(batch, seq, 4),)
            return torch.nn.Linear(4, 2), make_inputs
    """))
    monkeypatch.chdir(tmp_path)
    summary_path = tmp_path / "summary.json"
    status = main(["warm", "picky_models:picky", "--seq-lens", "8,13", "--dynamic", "false", "-o", "target=reference",
                   "--summary", str(summary_path)])
    assert status == 1
    assert "batch 1 x seq 13: failed, 0 compiled, 0 already cached: ValueError: this model only takes even lengths" \
        in capsys.readouterr().out
    summary = json.loads(summary_path.read_text())
    assert (summary["totals"]["done"], summary["totals"]["failed"]) == (1, 1)
    assert len(CompileCache(root=cache_dir).entries()) >= 1
