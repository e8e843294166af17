"""End-to-end figures for a tiny Llama: forward and a training step, eager vs the backend's targets.

    .venv/bin/python benchmarks/e2e.py            # a table
    .venv/bin/python benchmarks/e2e.py --json     # the same figures as JSON
    .venv/bin/python benchmarks/e2e.py --threads 1  # every way on one torch thread (steadier on a loaded machine)

Per mode (forward under no_grad; training step = forward + backward + SGD step) and per way of running it
(eager; torch.compile with backend="aot_eager"; backend="neuron" with target="reference" and
target="simulator", persistent compile cache off so every run compiles), each in a fresh process:

* time to first output: the first call, i.e. Dynamo + AOTAutograd + (for neuron) our passes, lowering and
  compiling, plus one execution;
* steady wall time: the median of the following calls (on this CPU; the simulator runs every NKI kernel on the
  interpreter, so its wall time says nothing about Trainium);
* estimated device time per step: the cost model's sum over the kernels of one step (simulator only; an
  estimate for trn2, not a measurement);
* kernel launches per steady step (simulator only): each is one NKI kernel run on the interpreter, so the steady
  wall time is about launches x the time per launch plus the backend's glue around them;
* backend overhead ratio: (first call - steady call) of the neuron backend over the same for aot_eager. The issue's
  goal: the backend's own work adds at most 1x aot_eager's, so the ratio stays ≤ 2;
* steady ratio: the steady wall time over aot_eager's. On a shared machine torch's thread pool makes aot_eager's
  wall time swing by 10x and more (the simulator runs its kernels on one torch thread); `--threads 1` compares like
  with like. For the simulator the goal is ≤ 3: kernels replay their
  recorded instruction streams after the first call (`NEURON_DYNAMO_NKI_REPLAY=0` measures the full interpreter).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import transformers

import neuron_dynamo

VOCAB = 128


def tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, attention_dropout=0.0)
    return transformers.LlamaForCausalLM(config)


def loss_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def forward_step(run: Callable, model: torch.nn.Module, ids: torch.Tensor) -> None:
    with torch.no_grad():
        run(model, ids)


def training_step(run: Callable, model: torch.nn.Module, ids: torch.Tensor) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    run(model, ids).backward()
    optimizer.step()
    optimizer.zero_grad()


def measure(mode: str, way: str, ids: torch.Tensor, repeat: int, threads: int) -> dict:
    if threads:
        torch.set_num_threads(threads)
    torch._dynamo.reset()
    model = tiny_llama()
    model.train(mode == "training")
    if way == "eager":
        run = loss_of
    elif way == "aot_eager":
        run = torch.compile(loss_of, backend="aot_eager")
    else:
        run = torch.compile(loss_of, backend="neuron", options={"target": way, "cache": "off"})
    step = training_step if mode == "training" else forward_step
    neuron_dynamo.reset_stats()
    start = time.perf_counter()
    step(run, model, ids)
    first = time.perf_counter() - start
    first_stats = neuron_dynamo.stats()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step(run, model, ids)
        times.append(time.perf_counter() - start)
    launched = neuron_dynamo.stats().get("kernels_launched", 0) - first_stats.get("kernels_launched", 0)
    simulated = way == "simulator"
    return {"mode": mode, "way": way, "first_output_s": first, "steady_s": statistics.median(times),
            "estimated_device_us": first_stats.get("estimated_device_ns", 0.0) / 1e3 if simulated else None,
            "launches_per_step": launched / repeat if simulated else None,
            "compile_s": first_stats.get("compile_seconds", 0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=21, help="steady calls timed (their median is reported)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for every way (0: torch's default)")
    parser.add_argument("--one", nargs=2, metavar=("MODE", "WAY"), help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    ids = torch.randint(0, VOCAB, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    if args.one:
        print(json.dumps(measure(*args.one, ids, args.repeat, args.threads)))
        return
    rows = []
    for mode in ("forward", "training"):
        for way in ("eager", "aot_eager", "reference", "simulator"):  # each in a fresh process: no warm caches
            child = [sys.executable, __file__, "--one", mode, way, "--batch", str(args.batch), "--seq",
                     str(args.seq), "--repeat", str(args.repeat), "--threads", str(args.threads)]
            rows.append(json.loads(subprocess.run(child, check=True, capture_output=True, text=True).stdout))
    for mode in ("forward", "training"):
        by_way = {row["way"]: row for row in rows if row["mode"] == mode}
        base = by_way["aot_eager"]["first_output_s"] - by_way["aot_eager"]["steady_s"]
        steady = by_way["aot_eager"]["steady_s"]
        for way in ("reference", "simulator"):
            own = by_way[way]["first_output_s"] - by_way[way]["steady_s"]
            by_way[way]["overhead_ratio_vs_aot_eager"] = own / base if base > 0 else None
            by_way[way]["steady_ratio_vs_aot_eager"] = by_way[way]["steady_s"] / steady if steady > 0 else None
    if args.json:
        print(json.dumps({"model": "tiny llama (2 layers, hidden 64)", "batch": args.batch, "seq": args.seq,
                          "threads": args.threads or torch.get_num_threads(), "rows": rows}, indent=2))
        return
    header = ("mode", "way", "first output s", "steady s", "est. device us", "launches/step", "overhead ratio",
              "steady ratio")
    table = [header] + [
        (row["mode"], row["way"], f"{row['first_output_s']:.3f}", f"{row['steady_s']:.4f}",
         "-" if row["estimated_device_us"] is None else f"{row['estimated_device_us']:.1f}",
         "-" if row["launches_per_step"] is None else f"{row['launches_per_step']:.0f}",
         _ratio(row.get("overhead_ratio_vs_aot_eager")), _ratio(row.get("steady_ratio_vs_aot_eager")))
        for row in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    print(f"tiny Llama, batch {args.batch} x seq {args.seq}; wall times on this CPU, device time estimated (trn2)")
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
