"""Tensor parallel with backend="neuron": a tiny Llama loaded with `DistributedConfig(tp_size=N)`, run by torchrun.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 examples/distributed_tp.py

Each rank compiles its own graph (its shard of the weights); the collectives in it (the all_reduce of row-parallel
layers, the all_gather of the output) run through torch.distributed, everything else on the target. Every rank
checks its logits and greedy tokens against the unsharded model run eagerly; rank 0 prints the explain report.
Offline (random weights, saved to a temporary directory), about a minute on 2 CPU cores.
"""

import shutil
import tempfile

import torch
import torch.distributed as dist
import transformers
from transformers.distributed import DistributedConfig

import neuron_dynamo


def tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config).eval()


def saved_model() -> str:
    """Rank 0 saves the model; every rank loads it from there (one directory, shared through a broadcast)."""
    path = [tempfile.mkdtemp(prefix="tiny_llama_") if dist.get_rank() == 0 else None]
    if dist.get_rank() == 0:
        tiny_llama().save_pretrained(path[0])
    dist.broadcast_object_list(path)
    return path[0]


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    path = saved_model()
    reference = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, distributed_config=DistributedConfig(tp_size=world))
    compiled = torch.compile(model.eval(), backend="neuron")

    prompt = torch.randint(1, 128, (1, 7), generator=torch.Generator().manual_seed(1))
    with neuron_dynamo.explaining() as report, torch.no_grad():
        logits = compiled(input_ids=prompt).logits
    difference = (logits - reference(input_ids=prompt).logits).abs().max().item()

    config = transformers.CompileConfig(backend="neuron")
    config._compile_all_devices = True  # CPU tensors: Transformers auto-compiles only on allow-listed devices
    tokens = model.generate(prompt, max_new_tokens=8, do_sample=False, cache_implementation="static",
                            compile_config=config)
    expected = reference.generate(prompt, max_new_tokens=8, do_sample=False)
    print(f"rank {rank}/{world}: logits max difference to eager {difference:.1e}; "
          f"greedy tokens same as eager: {torch.equal(tokens, expected)}", flush=True)
    dist.barrier()
    if rank == 0:
        print(report)
        shutil.rmtree(path)
    dist.destroy_process_group()
    if difference > 1e-4 or not torch.equal(tokens, expected):
        raise SystemExit(f"rank {rank}: tensor parallel under backend='neuron' differs from eager")


if __name__ == "__main__":
    main()
