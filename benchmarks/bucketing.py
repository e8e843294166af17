"""Bucketing figures: programs compiled, padding waste and wall time for many random lengths, per bucket policy.

    .venv/bin/python benchmarks/bucketing.py            # a table
    .venv/bin/python benchmarks/bucketing.py --json     # the same figures as JSON

For N lengths drawn uniformly from 1..max_length (default 2,048 from 1..2,048, fixed seed), a small causal
attention model (embedding, QKV projections, causal SDPA, MLP, mean over the sequence) is compiled once with
`dynamic` lengths and called at every length on the `reference` target, under three policies: multiples of 128
(the default), powers of two, and exact shapes (one program per distinct length). The wall time covers the whole
run (compiles included; `compile_seconds` is the part spent specialising and compiling the static programs),
measured on this machine's CPU: it is not a Trainium figure. Padding waste is the share of
processed input elements that were padding.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
from torch.fx.experimental import _config as fx_config

import neuron_dynamo

POLICIES = {
    "multiple-128": {"bucket_policy": "multiple", "bucket_multiple": 128},
    "pow2": {"bucket_policy": "pow2"},
    "exact": {"bucket_policy": "exact"},
}


class TinyCausalEncoder(torch.nn.Module):
    def __init__(self, vocab: int = 256, hidden: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(hidden, 2 * hidden), torch.nn.GELU(), torch.nn.Linear(2 * hidden, hidden)
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        batch, length, hidden = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + attended.transpose(1, 2).reshape(batch, length, hidden)
        return (x + self.mlp(x)).mean(dim=1)


def run_policy(model: torch.nn.Module, lengths: list[int], options: dict) -> dict:
    torch._dynamo.reset()
    neuron_dynamo.reset_stats()
    compiled = torch.compile(model, backend="neuron", options={"target": "reference", **options})
    max_error = 0.0
    start = time.perf_counter()
    with torch.no_grad(), fx_config.patch(backed_size_oblivious=True):
        for index, length in enumerate(lengths):
            ids = torch.randint(0, 256, (1, length))
            if index == 0:
                torch._dynamo.mark_dynamic(ids, 1)
            out = compiled(ids)
            if index % 64 == 0:  # spot-check against eager (not timed separately: part of the run)
                max_error = max(max_error, (out - model(ids)).abs().max().item())
    wall = time.perf_counter() - start
    stats = neuron_dynamo.stats()
    padded, real = stats.get("bucketing.padded_elements", 0), stats.get("bucketing.real_elements", 0)
    return {
        "programs_compiled": int(stats.get("bucketing.programs", 0)),
        "dynamo_graphs": int(stats.get("dynamo_graphs", 0)),
        "padding_waste": round(1 - real / padded, 4) if padded else 0.0,
        "padded_over_real": round(padded / real, 4) if real else 1.0,
        "wall_seconds": round(wall, 2),
        "compile_seconds": round(float(stats.get("bucketing.compile_seconds", 0.0)), 2),
        "max_abs_error_vs_eager": max_error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, default=2048, help="how many random lengths (default 2048)")
    parser.add_argument("--max-length", type=int, default=2048, help="lengths are drawn from 1..max_length")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated, from: " + ", ".join(POLICIES))
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TinyCausalEncoder().eval()
    lengths = random.Random(0).choices(range(1, args.max_length + 1), k=args.lengths)
    results = {name: run_policy(model, lengths, POLICIES[name]) for name in args.policies.split(",")}
    report = {
        "lengths": args.lengths,
        "distinct_lengths": len(set(lengths)),
        "max_length": args.max_length,
        "target": "reference",
        "torch": torch.__version__,
        "policies": results,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.lengths} lengths uniform in 1..{args.max_length} ({report['distinct_lengths']} distinct), "
          "reference target, wall time on this CPU")
    header = ("policy", "programs", "padding waste", "padded/real", "wall s", "compile s", "max |err|")
    rows = [
        (name, str(r["programs_compiled"]), f"{100 * r['padding_waste']:.1f}%", f"{r['padded_over_real']:.2f}",
         f"{r['wall_seconds']:.1f}", f"{r['compile_seconds']:.1f}", f"{r['max_abs_error_vs_eager']:.1e}")
        for name, r in results.items()
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


if __name__ == "__main__":
    main()
