"""Tensor parallel under backend="neuron", with one compile cache shared by the ranks.

1. Collectives over a padded length (dynamic=True, target reference): the padding proof's rank-block rules give
   the eager answer on two ranks, where padded positions of one rank meet real ones of the other.
2. A tiny Llama saved with `save_pretrained`, reloaded with `DistributedConfig(tp_size=2)`, compiled with no option
   but the backend: logits at each prompt length of argv[2:], then greedy `generate()` (static cache, CompileConfig).

argv: the saved model directory, then the prompt lengths. Reports results, the explain report of the forward, and
the cache's counters (`NEURON_DYNAMO_CACHE_DIR` is shared: one compile per key across ranks).
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import transformers
from transformers.distributed import DistributedConfig

sys.path.insert(0, str(Path(__file__).parents[1]))
from launch import report  # noqa: E402

import neuron_dynamo  # noqa: E402

LENGTHS = (5, 9, 12)


def gathered_sum(x):
    """all_gather along the padded dim: the rank blocks of [2·s], each with its own pad, summed."""
    return funcol.all_gather_single(x.exp(), 0, dist.group.WORLD).sum(0)


def gather_scatter(x):
    """all_gather then reduce_scatter along the padded dim, then a scan over it (needs a tail pad again)."""
    gathered = funcol.all_gather_single(x * 2, 0, dist.group.WORLD)
    scattered = funcol.reduce_scatter_single(gathered, "sum", 0, dist.group.WORLD)
    return funcol.all_reduce(scattered.cumsum(0), "max", dist.group.WORLD)


def padded_collectives(rank: int) -> dict:
    differences, refusals = {}, []
    for fn in (gathered_sum, gather_scatter):
        compiled = torch.compile(fn, backend="neuron", dynamic=True, options={"target": "reference"})
        worst = 0.0
        for length in LENGTHS:
            x = torch.randn(length, 4, generator=torch.Generator().manual_seed(rank * 100 + length))
            worst = max(worst, (compiled(x) - fn(x)).abs().max().item())
        differences[fn.__name__] = worst
    stats = neuron_dynamo.stats()
    refusals = [key for key in stats if key.startswith("bucketing.refusals.")]
    padded_calls = sum(count for key, count in stats.items() if ".calls.bucket[" in key)
    return {"differences": differences, "refusals": refusals, "padded_calls": padded_calls}


def prompt(length: int, vocab: int) -> torch.Tensor:
    return torch.arange(length).remainder(vocab - 1).add(1).unsqueeze(0)


def main(model_dir: str, *lengths: str) -> None:
    dist.init_process_group("gloo")
    collectives = padded_collectives(dist.get_rank())
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, distributed_config=DistributedConfig(
        tp_size=dist.get_world_size()))
    model.eval()
    compiled = torch.compile(model, backend="neuron")
    with neuron_dynamo.explaining() as explanation, torch.no_grad():
        logits = [compiled(input_ids=prompt(int(n), model.config.vocab_size)).logits.tolist() for n in lengths]
    config = transformers.CompileConfig(backend="neuron")
    config._compile_all_devices = True  # CPU tensors: Transformers auto-compiles only on allow-listed devices
    tokens = model.generate(prompt(int(lengths[0]), model.config.vocab_size), max_new_tokens=6, do_sample=False,
                            cache_implementation="static", compile_config=config)
    cache = {key: value for key, value in neuron_dynamo.stats().items() if key.startswith("cache.")}
    report(collectives=collectives, logits=logits, tokens=tokens.tolist(), explain=str(explanation), cache=cache)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
