"""PyTorch's OpInfo ops through the backend: how many are lowered, fall back, or fail.

    python benchmarks/opinfo_coverage.py                     # fp32 forward, 3 samples per op, simulator
    python benchmarks/opinfo_coverage.py --samples 0 --jobs 2 --json   # every sample
    python benchmarks/opinfo_coverage.py --dtype bfloat16 --backward --target reference

Each sample is compiled as a user would (`torch.compile(fn, backend="neuron", dynamic=False)`) and compared with
eager (tests/opinfo/opinfo_harness.py). Prints the split, the ops that fall back grouped by reason, and every
mismatch or error; `--json` prints the same as JSON. Wall time only; nothing here is a device time.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "opinfo"))


def _run_shard(args: tuple[int, int, str, bool, str | None, int | None, list[str] | None]) -> list[dict]:
    index, count, dtype_name, backward, target, limit, only = args
    import logging
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # the backend's per-fallback warnings would drown the table
    import opinfo_harness as harness

    dtype = getattr(torch, dtype_name)
    ops = harness.ops_for(dtype, backward)
    if only:
        ops = [op for op in ops if harness.op_name(op) in only or op.name in only]
    results = []
    for op in harness.shard(ops, index, count):
        start = time.perf_counter()
        outcome = harness.run_op(op, dtype, backward=backward, target=target, limit=limit)
        results.append({**outcome.to_dict(), "seconds": round(time.perf_counter() - start, 2)})
    return results


def _reason_group(reason: str) -> str:
    return reason.split(":")[0].split("(")[0].strip()[:90]


def summarize(results: list[dict]) -> dict:
    by_status = collections.Counter(r["status"] for r in results)
    tried = sum(by_status[s] for s in ("lowered", "fell back", "no graph", "mismatch", "error"))
    fallbacks: dict[str, list[str]] = collections.defaultdict(list)
    for r in results:
        if r["status"] == "fell back":
            for reason in sorted({_reason_group(reason) for reason in r["fallbacks"].values()}):
                fallbacks[reason].append(r["op"])
    return {
        "ops": len(results),
        "tried": tried,
        "by_status": dict(by_status),
        "lowered_share": round(by_status["lowered"] / tried, 4) if tried else 0.0,
        "fallbacks_by_reason": {k: sorted(v) for k, v in sorted(fallbacks.items(), key=lambda kv: -len(kv[1]))},
        "mismatches": {r["op"]: r["detail"] for r in results if r["status"] == "mismatch"},
        "errors": {r["op"]: r["detail"] for r in results if r["status"] == "error"},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--backward", action="store_true", help="forward + backward (ops that support autograd)")
    parser.add_argument("--target", default=None, help="simulator (default) or reference")
    parser.add_argument("--samples", type=int, default=3, help="samples per op (0 = all)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--ops", nargs="*", help="only these OpInfo names")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--results", type=Path, help="also write every op's outcome to this JSON file")
    args = parser.parse_args()
    limit = None if args.samples <= 0 else args.samples
    start = time.perf_counter()
    shards = [(i, args.jobs, args.dtype, args.backward, args.target, limit, args.ops) for i in range(args.jobs)]
    if args.jobs == 1:
        results = _run_shard(shards[0])
    else:
        with ProcessPoolExecutor(args.jobs) as pool:
            results = [r for part in pool.map(_run_shard, shards) for r in part]
    results.sort(key=lambda r: r["op"])
    summary = summarize(results)
    summary["config"] = {"dtype": args.dtype, "backward": args.backward, "target": args.target or "simulator",
                         "samples_per_op": args.samples or "all", "wall_seconds": round(time.perf_counter() - start)}
    if args.results:
        args.results.write_text(json.dumps(results, indent=1))
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    config = summary["config"]
    print(f"OpInfo ops through the backend: {config['dtype']} {'forward+backward' if args.backward else 'forward'}, "
          f"target {config['target']}, {config['samples_per_op']} samples per op, {config['wall_seconds']} s wall")
    print(f"{'status':<12} {'ops':>5}")
    for status, count in sorted(summary["by_status"].items(), key=lambda kv: -kv[1]):
        print(f"{status:<12} {count:>5}")
    print(f"lowered: {summary['lowered_share']:.1%} of the {summary['tried']} ops with samples eager runs")
    print("\nfalling back, by reason:")
    for reason, ops in summary["fallbacks_by_reason"].items():
        print(f"  {len(ops):>4}  {reason}: {', '.join(ops[:12])}{' …' if len(ops) > 12 else ''}")
    for title in ("mismatches", "errors"):
        print(f"\n{title}: {len(summary[title])}")
        for op, detail in summary[title].items():
            print(f"  {op}: {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
