"""SFT fine-tuning with TRL under the backend: a tiny Llama (random weights, offline), 20 steps.

`SFTConfig(torch_compile=True, torch_compile_backend="neuron")` is all it takes: Accelerate compiles the model with
`backend="neuron"` (Transformers adds `dynamic=False` for that name, so every padded batch length is one compiled
graph: `pad_to_multiple_of` keeps their number small, as TRL does by default on Neuron). The same run in eager gives
the reference losses; `neuron_dynamo.explaining()` collects the report of every program that ran during training:
which ops ran on the target and which ran eagerly, each with its reason.

    python examples/sft_trl.py [--steps 20]
"""

import argparse
import tempfile

import datasets
import tokenizers
import torch
import transformers
import trl

import neuron_dynamo

WORDS = [f"w{i}" for i in range(120)]


def word_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over WORDS, built in memory (nothing downloaded)."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{word: i + 3 for i, word in enumerate(WORDS)}}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>",
                                                unk_token="<unk>")


def texts(count: int = 48, seed: int = 0) -> datasets.Dataset:
    """Sentences of 6 to 30 random words: a text dataset as SFTTrainer takes it."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        length = int(torch.randint(6, 30, (1,), generator=generator))
        rows.append(" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (length,), generator=generator)))
    return datasets.Dataset.from_dict({"text": rows})


def tiny_llama() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config)


def sft(steps: int, out_dir: str, compiled: bool, build=tiny_llama) -> tuple[list[float], trl.SFTTrainer]:
    """Train `build()` with SFTTrainer for `steps` steps (seed 0), eager or under the backend; the losses and the
    trainer."""
    torch.manual_seed(0)
    compile_args = {"torch_compile": True, "torch_compile_backend": "neuron"} if compiled else {}
    config = trl.SFTConfig(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=2, logging_steps=1,
                           report_to=[], use_cpu=True, seed=0, pad_to_multiple_of=32, disable_tqdm=True,
                           **compile_args)
    trainer = trl.SFTTrainer(model=build(), args=config, train_dataset=texts(), processing_class=word_tokenizer())
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry], trainer


def checkpoint_difference(trainer: trl.SFTTrainer, saved_dir: str) -> float:
    """The largest logit difference between the saved checkpoint reloaded in eager and the trained model.

    SFTConfig trains in bf16 autocast by default (Accelerate wraps the model's forward in it), so the reloaded model
    runs under the same autocast.
    """
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved_dir).eval()
    model = trainer.accelerator.unwrap_model(trainer.model, keep_torch_compile=False).eval()
    ids = torch.randint(3, 123, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=trainer.args.bf16):
        return (reloaded(input_ids=ids).logits - model(input_ids=ids).logits).abs().max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    steps = parser.parse_args().steps
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as eager_dir, tempfile.TemporaryDirectory() as compiled_dir:
        expected, _ = sft(steps, eager_dir, compiled=False)
        with neuron_dynamo.explaining() as report:
            losses, trainer = sft(steps, compiled_dir, compiled=True)
        trainer.save_model(compiled_dir)
        reload_diff = checkpoint_difference(trainer, compiled_dir)
    worst = max(abs(a - b) for a, b in zip(losses, expected, strict=True))
    print("eager losses:   ", [round(loss, 4) for loss in expected])
    print("compiled losses:", [round(loss, 4) for loss in losses])
    print(f"largest loss difference: {worst:.2e}; reloaded checkpoint vs trained model, logits: {reload_diff:.2e}")
    print()
    print(report)
    print()
    print("stats:", {k: v for k, v in neuron_dynamo.stats().items() if k.startswith(("fallback_ops", "programs",
                                                                                       "graphs_failed"))})
    if worst > 1e-3 or reload_diff > 1e-5:
        raise SystemExit("the compiled run differs from eager, or its checkpoint does not reload")


if __name__ == "__main__":
    main()
