"""FSDP2 training under backend="neuron": a tiny Llama sharded with `fully_shard`, 5 AdamW steps, each rank on its
half of the batch. Rank 0 also trains an unsharded copy eagerly on the whole batch (the single-process reference).

argv: the target option. Reports the losses (this rank's half, and the reference's) and the max weight difference.

Run after `crash_mid_compile.py` on the same cache, it must not be blocked by the lock the dead rank left: rank 0
reports the lock files it found on disk at its start.
"""

import copy
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).parents[1]))
from launch import report  # noqa: E402

import neuron_dynamo  # noqa: E402

STEPS = 5


def tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config)


def train(model, batches) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def stale_locks() -> int:
    return len(list(Path(os.environ["NEURON_DYNAMO_CACHE_DIR"]).glob("v1/locks/*.lock")))


def main(target: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    locks_at_start = stale_locks()
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(1, 128, (2 * world, 12), generator=generator) for _ in range(STEPS)]
    model = tiny_llama()
    reference = copy.deepcopy(model)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    compiled = torch.compile(model, backend="neuron", options={"target": target})
    with neuron_dynamo.explaining() as explanation:
        losses = train(compiled, [ids.chunk(world)[rank] for ids in batches])
    full = {name: param.full_tensor() for name, param in model.named_parameters()}  # a collective: every rank
    values = {"losses": losses, "explain": str(explanation), "stats": neuron_dynamo.stats(),
              "locks_at_start": locks_at_start}
    if rank == 0:
        values["reference_losses"] = train(reference, batches)
        values["weight_difference"] = max((full[name] - param).abs().max().item()
                                          for name, param in reference.named_parameters())
    report(**values)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
