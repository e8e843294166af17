"""A user's tensor-parallel forward: the saved Llama reloaded with `DistributedConfig(tp_size=world size)`, compiled
with `torch.compile(model, backend="neuron", options=...)` (Dynamo's default dynamic=None), called at each prompt
length. Reports the cache counters of this rank.

argv: the saved model directory, the backend options as JSON, then the prompt lengths in calling order.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import transformers

sys.path.insert(0, str(Path(__file__).parents[1]))
from launch import report  # noqa: E402

import neuron_dynamo  # noqa: E402


def main(model_dir: str, options: str, *lengths: str) -> None:
    dist.init_process_group("gloo")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, distributed_config=transformers.DistributedConfig(tp_size=dist.get_world_size())).eval()
    compiled = torch.compile(model, backend="neuron", options=json.loads(options))
    with torch.no_grad():
        for length in map(int, lengths):
            compiled(input_ids=torch.arange(length).remainder(model.config.vocab_size - 1).add(1).unsqueeze(0))
    report(cache={key: value for key, value in neuron_dynamo.stats().items() if key.startswith("cache.")})
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
