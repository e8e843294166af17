"""Two ranks under torchrun on CPU (gloo): tensor parallel and FSDP2 under backend="neuron", against eager in one
process, and the compile cache the ranks share. Each job starts once per module; the tests read its reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from launch import TorchrunFailed, torchrun

sys.path.insert(0, str(Path(__file__).parents[1] / "hf"))
from tiny_models import tiny_llama  # noqa: E402

pytestmark = pytest.mark.slow  # two torchrun jobs: each rank imports torch and Transformers, then compiles
LENGTHS = (5, 9)
JOB_TIMEOUT = 400  # seconds; about 60 s each on an idle 2-core machine


def _prompt(length: int, vocab: int) -> torch.Tensor:
    return torch.arange(length).remainder(vocab - 1).add(1).unsqueeze(0)


def _entries(cache_dir: Path) -> int:
    return len(list(cache_dir.glob("v1/entries/*/*.entry")))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    torch.manual_seed(0)
    model = tiny_llama().eval()
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def tensor_parallel(llama, tmp_path_factory):
    cache = tmp_path_factory.mktemp("shared_cache_tp")
    ranks = torchrun("tensor_parallel.py", tmp_path_factory.mktemp("tp_out"), str(llama[1]), *map(str, LENGTHS),
                     timeout=JOB_TIMEOUT, env={"NEURON_DYNAMO_CACHE_DIR": str(cache)})
    return ranks, cache


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    """The FSDP2 job, run on the cache of a job whose rank 1 died holding a compile lock."""
    cache = tmp_path_factory.mktemp("shared_cache_fsdp")
    env = {"NEURON_DYNAMO_CACHE_DIR": str(cache), "NEURON_DYNAMO_CACHE_LOCK_TIMEOUT": "3600"}  # waits outlast the job
    with pytest.raises(TorchrunFailed, match="SIGKILL"):
        torchrun("crash_mid_compile.py", tmp_path_factory.mktemp("crash_out"), timeout=JOB_TIMEOUT, env=env)
    ranks = torchrun("fsdp_train.py", tmp_path_factory.mktemp("fsdp_out"), "reference", timeout=JOB_TIMEOUT, env=env)
    return ranks, cache


def test_tensor_parallel_forward_at_two_lengths_equals_single_process_eager(llama, tensor_parallel):
    model, _ = llama
    for rank in tensor_parallel[0]:
        for length, logits in zip(LENGTHS, rank["logits"], strict=True):
            with torch.no_grad():
                want = model(input_ids=_prompt(length, model.config.vocab_size)).logits
            torch.testing.assert_close(torch.tensor(logits), want, atol=1e-4, rtol=1e-4)


def test_tensor_parallel_greedy_generate_equals_single_process_eager(llama, tensor_parallel):
    model, _ = llama
    want = model.generate(_prompt(LENGTHS[0], model.config.vocab_size), max_new_tokens=6, do_sample=False)
    assert [rank["tokens"] for rank in tensor_parallel[0]] == [want.tolist()] * 2


def test_tensor_parallel_report_shows_the_collectives_apart_on_the_default_target(tensor_parallel):
    report = tensor_parallel[0][0]["explain"]
    assert "simulator" in report  # the default target: NKI kernels on the interpreter
    assert "collectives (run by torch.distributed between the regions):" in report
    assert "_c10d_functional.all_reduce.default" in report.split("collectives (run by")[1]
    assert "_c10d_functional" not in report.split("collectives (run by")[0]  # no collective among the fallbacks


def test_collectives_over_a_padded_length_equal_eager_on_two_ranks(tensor_parallel):
    for rank in tensor_parallel[0]:
        collectives = rank["collectives"]
        assert collectives["refusals"] == [] and collectives["padded_calls"] == 4, collectives
        assert max(collectives["differences"].values()) < 1e-5, collectives


def test_ranks_sharing_a_cache_compile_each_key_once(tensor_parallel, fsdp):
    for ranks, cache in (tensor_parallel, fsdp):
        # a rank that found every key compiled by the other has no miss counter at all
        misses = sum(rank.get("cache", rank.get("stats", {})).get("cache.misses", 0) for rank in ranks)
        assert misses == _entries(cache), "a key was compiled by more than one rank"
    fsdp_ranks = fsdp[0]
    assert sum(rank["stats"].get("cache.lock_waits", 0) for rank in fsdp_ranks) > 0  # one rank waited for the other


def test_fsdp2_training_equals_single_process_eager(fsdp):
    ranks, _ = fsdp
    mean_losses = [sum(step) / len(ranks) for step in zip(*(rank["losses"] for rank in ranks), strict=True)]
    torch.testing.assert_close(mean_losses, ranks[0]["reference_losses"], atol=1e-4, rtol=1e-4)
    assert ranks[0]["weight_difference"] < 1e-4


def test_a_rank_killed_mid_compile_leaves_no_lock_that_blocks_the_next_job(fsdp):
    ranks, _ = fsdp
    assert ranks[0]["locks_at_start"] >= 1  # the dead rank's lock file is still on disk: only its flock went away
    assert all(rank["stats"].get("cache.lock_timeouts", 0) == 0 for rank in ranks)
