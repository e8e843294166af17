"""Transformers `Trainer` and TRL `SFTTrainer` with `torch_compile_backend="neuron"`, as users configure them.

Default `TrainingArguments` otherwise (`average_tokens_across_devices` left alone, so the loss is a sum divided by
a token count that reaches the graph as an input). A few steps on a tiny in-memory dataset, losses against an eager
run with the same seed, the saved checkpoint reloaded in eager, and every fallback op of the run named with its reason
by `neuron_dynamo.explaining()` and `stats()`. Transformers compiles with `dynamic=False` for the backend name
"neuron", so each padded batch length is one Dynamo graph: the data is padded to a multiple of 32 (one length), as
TRL's `pad_to_multiple_of` does on Neuron. The 20-step run is `examples/sft_trl.py`.
"""

import sys
import tempfile
from pathlib import Path

import pytest
import torch
import transformers
from tiny_models import VOCAB, tiny_gpt2, tiny_llama

import neuron_dynamo

STEPS = 3
EXAMPLES = Path(__file__).parents[2] / "examples"
PAD_TO = 32


def token_rows(count: int = 16, seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        length = int(torch.randint(8, PAD_TO, (1,), generator=generator))
        rows.append({"input_ids": torch.randint(1, VOCAB, (length,), generator=generator).tolist()})
    return rows


def collate(rows: list[dict]) -> dict:
    """Right padding to a multiple of PAD_TO, labels -100 on the padding (as DataCollatorForLanguageModeling does)."""
    length = -(-max(len(row["input_ids"]) for row in rows) // PAD_TO) * PAD_TO
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row["input_ids"])] = torch.tensor(row["input_ids"])
        mask[i, : len(row["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def train(build, out_dir: str, **compile_args) -> tuple[list[float], torch.nn.Module]:
    torch.manual_seed(0)
    model = build()
    args = transformers.TrainingArguments(output_dir=out_dir, max_steps=STEPS, per_device_train_batch_size=2,
                                          logging_steps=1, report_to=[], use_cpu=True, seed=0, **compile_args)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=token_rows(), data_collator=collate)
    trainer.train()
    trainer.save_model(out_dir)
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry], model


@pytest.mark.parametrize("build", (tiny_llama, tiny_gpt2), ids=("llama", "gpt2"))
def test_trainer_matches_eager_and_its_checkpoint_reloads(build):
    with tempfile.TemporaryDirectory() as eager_dir, tempfile.TemporaryDirectory() as compiled_dir:
        expected, _ = train(build, eager_dir)
        neuron_dynamo.reset_stats()
        with neuron_dynamo.explaining() as report:
            losses, model = train(build, compiled_dir, torch_compile=True, torch_compile_backend="neuron")
        torch.testing.assert_close(losses, expected, atol=1e-4, rtol=1e-4)
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(compiled_dir).eval()
        ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            torch.testing.assert_close(reloaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits)
    stats = neuron_dynamo.stats()
    assert stats.get("graphs_failed", 0) == 0 and stats.get("dynamo_graphs_eager", 0) == 0
    assert {graph.kind for graph in report.graphs} >= {"forward", "backward"}
    _assert_fallbacks_named(report, stats)


def _assert_fallbacks_named(report, stats):
    """Every fallback op of the run is in the report with its reason, and counted by op in stats()."""
    reported = {(entry["op"], entry["reason"]) for graph in report.graphs for entry in graph.fallback_ops}
    assert all(reason for _, reason in reported)
    assert sum(v for k, v in stats.items() if k.startswith("fallback_ops.")) == stats.get("fallback_ops", 0)
    for op, reason in reported:
        assert f"fallback_ops.{op} ({reason.split(' (', 1)[0]})" in stats
        assert op in str(report)


def test_sft_trainer_matches_eager_and_its_checkpoint_reloads():
    """TRL's SFTTrainer (bf16 autocast by default) on a tiny GPT-2; the tiny Llama is examples/sft_trl.py's run."""
    pytest.importorskip("trl")
    sys.path.insert(0, str(EXAMPLES))
    try:
        import sft_trl
    finally:
        sys.path.remove(str(EXAMPLES))
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as eager_dir, tempfile.TemporaryDirectory() as compiled_dir:
        expected, _ = sft_trl.sft(STEPS, eager_dir, compiled=False, build=tiny_gpt2)
        neuron_dynamo.reset_stats()
        with neuron_dynamo.explaining() as report:
            losses, trainer = sft_trl.sft(STEPS, compiled_dir, compiled=True, build=tiny_gpt2)
        trainer.save_model(compiled_dir)
        assert sft_trl.checkpoint_difference(trainer, compiled_dir) == 0
    torch.testing.assert_close(losses, expected, atol=1e-3, rtol=1e-3)  # bf16 autocast
    stats = neuron_dynamo.stats()
    assert stats.get("graphs_failed", 0) == 0 and stats.get("dynamo_graphs_eager", 0) == 0
    _assert_fallbacks_named(report, stats)


def test_accelerate_accepts_neuron_and_it_is_this_backend():
    """Accelerate validates `torch_compile_backend` against its `DynamoBackend` enum, which has NEURON but no
    NEURON_DYNAMO: Trainer users name the backend "neuron", which must resolve to this package."""
    from accelerate.utils import DynamoBackend

    assert DynamoBackend("NEURON").value == "NEURON"
    with pytest.raises(ValueError, match="NEURON_DYNAMO"):
        DynamoBackend("NEURON_DYNAMO")
    assert neuron_dynamo.backend_info()["neuron_is_neuron_dynamo"]
