"""Training at many lengths: programs compiled for the forward and the backward, and gradients against eager.

    .venv/bin/python benchmarks/training_lengths.py                       # llama, gpt2, bert; 40 lengths in 1..600
    .venv/bin/python benchmarks/training_lengths.py --models llama --lengths 10 --json

Each tiny random-weight model (tests/hf/tiny_models.py, built from its Transformers config) is trained the way a
user calls it: `torch.compile(model, backend="neuron")` with no options, `model(input_ids=ids, labels=ids).loss
.backward()`, batch 2, at lengths drawn uniformly from 1..600 (fixed seed; the position table grown to 600).
Every step's parameter gradients are compared with eager's. The table gives the bucket programs the forward and the
backward graphs compiled, per graph (a model with graph breaks has several; the first call of a process is a static
graph: it is counted apart, as `static`),
refusals, graphs that failed and ran eagerly, and the largest gradient difference. Wall times are this CPU's.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

import neuron_dynamo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "hf"))
from hf_checks import training_gradients, training_model  # noqa: E402


def run(model_type: str, count: int, max_length: int, seed: int) -> dict:
    model = training_model(model_type, max_length, seed)
    config = model.config
    rng = random.Random(seed)
    lengths = [rng.randint(1, max_length) for _ in range(count)]
    torch._dynamo.reset()
    neuron_dynamo.reset_stats()
    compiled = torch.compile(model, backend="neuron")
    worst = 0.0
    start = time.perf_counter()
    for length in lengths:
        ids = torch.randint(0, min(config.vocab_size, 200), (2, length))
        for _, got, want in training_gradients(model, compiled, ids):
            worst = max(worst, (got - want).abs().max().item())
    stats = neuron_dynamo.stats()
    per_graph = lambda kind: [v for k, v in stats.items()  # noqa: E731
                              if k.startswith("bucketing.graph") and k.endswith(f".{kind}.programs")]
    return {
        "model": model_type, "lengths": len(lengths), "min_length": min(lengths), "max_length": max(lengths),
        "graphs": len(per_graph("forward")),
        "forward_programs_per_graph": max(per_graph("forward"), default=0),
        "backward_programs_per_graph": max(per_graph("backward"), default=0),
        "static_programs": stats.get("programs_compiled", 0) - stats.get("bucketing.programs", 0),
        "refused": stats.get("bucketing.graphs_refused", 0), "graphs_failed": stats.get("graphs_failed", 0),
        "max_grad_diff": worst, "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="llama,gpt2,bert")
    parser.add_argument("--lengths", type=int, default=40)
    parser.add_argument("--max-length", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [run(m, args.lengths, args.max_length, args.seed) for m in args.models.split(",")]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    columns = list(rows[0])
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(f"{row[c]:.1e}" if c == "max_grad_diff" else str(row[c]) for c in columns))


if __name__ == "__main__":
    main()
