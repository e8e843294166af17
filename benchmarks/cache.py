"""Compile cache: time to first output of a tiny Llama in a fresh process, cold versus warm, against aot_eager.

    python benchmarks/cache.py [--json] [--targets reference,simulator] [--layers 2] [--seq-len 32] [--repeats 3]

Every measurement is a fresh Python process (imports, model build, torch.compile, first forward under no_grad):
`cold` starts with an empty cache directory, `warm` runs again on the directory `cold` filled, `aot_eager` is
torch.compile(backend="aot_eager") for scale (goal: warm <= 1.3x aot_eager). The time to first output is taken
from the torch.compile call to the first output; the process wall time is printed too.

Projection: a Trainium compile costs seconds to minutes per kernel. With the fake compiler set to
`--kernel-seconds` (30 s) per kernel, a cold start of a `--project-layers` (32) layer model costs its kernel count
times that, plus the cold overhead; a warm start compiles nothing. Kernels are the NKI kernel launches of the first
forward on the simulator (an upper bound: identical kernels would compile once), measured at 1 and `--layers`
layers and extrapolated linearly per layer, as are the cold overhead and the warm start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
started = time.perf_counter()
import torch, transformers
import neuron_dynamo
backend, target, layers, seq_len = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
model = transformers.LlamaForCausalLM(config).eval()
ids = torch.randint(0, 128, (1, seq_len))
options = {"options": {"target": target}} if backend == "neuron_dynamo" else {}
start = time.perf_counter()
compiled = torch.compile(model, backend=backend, **options)
with torch.no_grad():
    logits = compiled(ids).logits
first_output = time.perf_counter() - start
with torch.no_grad():
    torch.testing.assert_close(logits, model(ids).logits, atol=1e-4, rtol=1e-4)
stats = neuron_dynamo.stats()
print(json.dumps({"first_output_s": first_output, "process_s": time.perf_counter() - started,
                  "hits": stats.get("cache.hits", 0), "misses": stats.get("cache.misses", 0),
                  "bypasses": stats.get("cache.bypasses", 0), "regions": stats.get("regions_compiled", 0),
                  "kernels": stats.get("kernels_launched", 0),
                  "seconds_saved": stats.get("cache.seconds_saved", 0.0)}))
"""


def run_child(backend: str, target: str, layers: int, seq_len: int, cache_dir: str) -> dict:
    env = {**os.environ, "NEURON_DYNAMO_CACHE_DIR": cache_dir, "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", CHILD, backend, target, str(layers), str(seq_len)],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"benchmark child failed ({backend}, {target}):\n{result.stderr[-3000:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["wall_s"] = time.perf_counter() - start
    return figures


def median_run(runs: list[dict]) -> dict:
    """The run with the median time to first output (the machine may be shared: one run is noisy)."""
    ordered = sorted(runs, key=lambda run: run["first_output_s"])
    return {**ordered[len(ordered) // 2], "first_output_s_all": [run["first_output_s"] for run in runs]}


def cold_and_warm(target: str, layers: int, seq_len: int, repeats: int) -> tuple[dict, dict]:
    colds, warms = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="neuron_dynamo_cache_bench_") as cache_dir:
            colds.append(run_child("neuron_dynamo", target, layers, seq_len, cache_dir))
            warms.append(run_child("neuron_dynamo", target, layers, seq_len, cache_dir))
    return median_run(colds), median_run(warms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--targets", default="reference,simulator", help="comma-separated targets to measure")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the tiny Llama (>= 2)")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--kernel-seconds", type=float, default=30.0, help="fake compiler time per kernel")
    parser.add_argument("--project-layers", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the median is reported")
    args = parser.parse_args()
    if args.layers < 2:
        parser.error("--layers must be at least 2 (the projection needs two layer counts)")

    with tempfile.TemporaryDirectory() as unused:
        aot_eager = median_run([run_child("aot_eager", "reference", args.layers, args.seq_len, unused)
                                for _ in range(args.repeats)])
    rows = [{"run": "aot_eager", "target": "-", **aot_eager}]
    measured: dict[str, tuple[dict, dict]] = {}
    for target in args.targets.split(","):
        cold, warm = measured[target] = cold_and_warm(target, args.layers, args.seq_len, args.repeats)
        rows.append({"run": "cold", "target": target, **cold})
        rows.append({"run": "warm", "target": target, **warm,
                     "vs_aot_eager": warm["first_output_s"] / aot_eager["first_output_s"]})

    # Projection from the simulator partition (the NKI regions neuronx-cc would compile), 1 and N layers.
    projection_target = "simulator" if "simulator" in measured else args.targets.split(",")[0]
    small_cold, small_warm = cold_and_warm(projection_target, 1, args.seq_len, args.repeats)
    big_cold, big_warm = measured[projection_target]
    per_layer = args.layers - 1

    def extrapolate(small: float, big: float) -> float:
        return small + (big - small) / per_layer * (args.project_layers - 1)

    kernels = extrapolate(small_cold["kernels"], big_cold["kernels"])
    cold_overhead = extrapolate(small_cold["first_output_s"], big_cold["first_output_s"])
    warm_start = extrapolate(small_warm["first_output_s"], big_warm["first_output_s"])
    projection = {
        "target": projection_target, "layers": args.project_layers, "kernel_seconds": args.kernel_seconds,
        "kernels": round(kernels), "kernels_per_layer": (big_cold["kernels"] - small_cold["kernels"]) / per_layer,
        "regions": big_cold["regions"], "cold_start_s": kernels * args.kernel_seconds + cold_overhead,
        "warm_start_s": warm_start, "warm_hits": small_warm["hits"] + big_warm["hits"],
        "warm_misses": small_warm["misses"] + big_warm["misses"],
    }
    result = {"model": f"tiny Llama, {args.layers} layers, hidden 64, seq {args.seq_len}", "repeats": args.repeats,
              "runs": rows,
              "projection": projection}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"time to first output, fresh process each, median of {args.repeats} ({result['model']})")
    header = ("run", "target", "first output s", "process s", "hits", "misses", "bypasses", "vs aot_eager")
    table = [header] + [
        (row["run"], row["target"], f"{row['first_output_s']:.2f}", f"{row['process_s']:.2f}", str(row["hits"]),
         str(row["misses"]), str(row["bypasses"]), f"{row['vs_aot_eager']:.2f}x" if "vs_aot_eager" in row else "")
        for row in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    print(f"\nprojected {args.project_layers}-layer start with {args.kernel_seconds:.0f} s per kernel "
          f"({projection['kernels']} kernels, {projection['kernels_per_layer']:.1f} per layer, "
          f"{projection_target} partition): cold {projection['cold_start_s'] / 60:.1f} min, "
          f"warm {projection['warm_start_s']:.1f} s")


if __name__ == "__main__":
    main()
