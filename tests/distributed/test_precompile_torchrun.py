"""`neuron-precompile warm --tp-size 2` under torchrun: each rank warms its shard of a tensor-parallel Llama (the
ranks' graphs differ: a vocab-parallel embedding bakes the rank's vocab offset into its graph), then a fresh torchrun
of the user's compiled forward compiles nothing on any rank. Settings torchrun cannot serve are refused up front."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from launch import torchrun, torchrun_module

from neuron_dynamo.cli import main

sys.path.insert(0, str(Path(__file__).parents[1] / "hf"))
from tiny_models import tiny_llama  # noqa: E402

JOB_TIMEOUT = 400  # seconds; a job costs about 70 s of CPU over its two ranks (about 35 s on 2 idle cores)
REFERENCE = {"target": "reference"}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_llama")
    tiny_llama().eval().save_pretrained(path)
    return path


@pytest.mark.slow
def test_tp_warm_under_torchrun_then_a_fresh_torchrun_compiles_nothing(llama_dir, tmp_path, pinned_sources):
    cache, summary_path = tmp_path / "cache", tmp_path / "warm.json"
    env = {"NEURON_DYNAMO_CACHE_DIR": str(cache)}
    output = torchrun_module("neuron_dynamo.cli", tmp_path / "warm", "warm", str(llama_dir), "--tp-size", "2",
                             "--seq-lens", "5,9", "-o", "target=reference", "--summary", str(summary_path),
                             timeout=JOB_TIMEOUT, env=env)
    summary = json.loads(summary_path.read_text())
    totals = summary["totals"]
    assert summary["tp_size"] == 2 and totals["failed"] == 0 and totals["done"] == 2, summary
    ranks_compiled = [sum(task["compiled"] for task in rank) for rank in summary["ranks"]]
    assert min(ranks_compiled) >= 1  # each rank stores its own shard's programs...
    assert totals["compiled"] == sum(ranks_compiled) == len(list(cache.glob("v1/entries/*/*.entry")))  # ...once
    assert output.count(f"warmed 2/2 shape(s) of {llama_dir} on 2 ranks") == 1  # rank 0 speaks for all
    assert output.count("rank 0: [") == totals["calls"] + 1 and "rank 1: [" not in output  # rank 0's progress

    ranks = torchrun("tp_forward.py", tmp_path / "run", str(llama_dir), json.dumps(REFERENCE), "9", "5",
                     timeout=JOB_TIMEOUT, env=env)
    for rank in ranks:
        assert rank["cache"].get("cache.misses", 0) == 0 and rank["cache"]["cache.hits"] >= 2, rank["cache"]


@pytest.mark.parametrize(("world_size", "argv", "message"), [
    (None, ["--tp-size", "2"], "run it under torchrun, `torchrun --nproc-per-node=2 -m neuron_dynamo.cli warm"),
    ("4", ["--tp-size", "2"], "--tp-size 2 does not match torchrun's world size 4"),
    ("2", [], "under torchrun (WORLD_SIZE=2) without --tp-size"),
    ("2", ["--tp-size", "2", "--workers", "2"], "--workers does not combine with --tp-size"),
    ("2", ["--tp-size", "2", "--random-weights"], "drop --random-weights"),
], ids=["no-torchrun", "other-world-size", "torchrun-without-tp", "workers", "random-weights"])
def test_tp_settings_torchrun_cannot_serve_are_refused_before_anything_loads(llama_dir, cache_dir, monkeypatch, capsys,
                                                                             world_size, argv, message):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if world_size:  # what torchrun sets
        monkeypatch.setenv("WORLD_SIZE", world_size)
        monkeypatch.setenv("RANK", "0")
    assert main(["warm", str(llama_dir), "--seq-lens", "5", *argv, "-o", "target=reference"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("neuron-precompile: error: ") and message in err, err
    assert not cache_dir.exists()
