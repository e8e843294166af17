"""Diffusers regional compilation at several resolutions: per class, bucketed or exact, and what the return costs.

    .venv/bin/python benchmarks/diffusers_resolutions.py                           # every class: ~15 min, 2 workers
    .venv/bin/python benchmarks/diffusers_resolutions.py --classes Wan,QwenImage   # names containing these
    .venv/bin/python benchmarks/diffusers_resolutions.py --json out.json

Every class of tests/hf/test_diffusers_classes.py's cases (tiny config, random weights, nothing downloaded) is run by
a worker process of its own with an empty compile cache: eagerly, then under
`model.compile_repeated_blocks(backend="neuron", fullgraph=True)` on the default target with Dynamo's default
`recompile_limit`, at the sizes A, B, C of tests/hf/tiny_diffusers_resolutions.py and at A again. A's image tokens
need a bucket above 128, B and C share the bucket of 128. Per class: the largest difference from eager, the programs
compiled by each call (compile-cache hits included), how each block class's graphs ran once a size changed
(`bucketed`; `exact` with the reason, the padding proof's or a bucket's failure; `eager` when the backend failed; or
`static` when its sizes do not depend on the resolution) and the compile cache's hits and misses on the return to A
(no miss: nothing compiled).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARKER = "DIFFUSERS_RESOLUTIONS_RESULT "
TOLERANCE = 1e-4
TESTS_HF = Path(__file__).resolve().parents[1] / "tests" / "hf"


# --- worker: one class, in its own process ----------------------------------------------------------------------------


class _Recorder(logging.Handler):
    """Which block class each Dynamo graph is (the backend names a graph when Dynamo hands it over, while Dynamo's
    translator still holds the block's frame), and every reason the backend gives for exact shapes."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.block_of: dict[str, str] = {}
        self.refusals: dict[str, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        message = record.getMessage()
        graph, _, rest = message.partition(": ")
        if record.name == "neuron_dynamo.backend" and rest.startswith("Dynamo graph"):
            tx = InstructionTranslator.current_tx()
            block = tx.f_locals.get("self") if tx is not None else None
            self.block_of[graph] = type(block).__name__ if block is not None else "?"
        elif "running at exact shapes" in rest or "running it eagerly" in rest:
            reason = rest.split(": ", 1)[1] if ": " in rest else rest
            prefix = "ran eagerly: " if "running it eagerly" in rest else ""
            self.refusals.setdefault(graph.split(".")[0], []).append(prefix + reason)


def _record() -> _Recorder:
    recorder = _Recorder()
    for name in ("neuron_dynamo.backend", "neuron_dynamo.bucket_dispatch", "neuron_dynamo.compiler"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.DEBUG if name.endswith("backend") else logging.INFO)
        logger.addHandler(recorder)
    return recorder


def _blocks(stats: dict, recorder: _Recorder) -> dict[str, dict]:
    """Per block class: its graphs' buckets, and whether they ran bucketed, exact (with the reasons) or static."""
    blocks: dict[str, dict] = {}
    for graph, block in recorder.block_of.items():
        entry = blocks.setdefault(block, {"graphs": 0, "buckets": set(), "exact_calls": 0, "reasons": []})
        entry["graphs"] += 1
        for key, count in stats.items():
            if key.startswith(f"bucketing.{graph}.") and ".calls." in key:
                program = key.split(".calls.", 1)[1]
                if program.startswith("bucket["):
                    entry["buckets"].add(program[len("bucket["):-1])
                else:
                    entry["exact_calls"] += count
        for reason in recorder.refusals.get(graph, []):
            if reason not in entry["reasons"]:
                entry["reasons"].append(reason)
    for entry in blocks.values():
        eager = any(reason.startswith("ran eagerly") for reason in entry["reasons"])
        refused = "exact" if entry["reasons"] else "bucketed" if entry["buckets"] else "static"
        entry["mode"] = "eager" if eager else refused
        entry["buckets"] = sorted(entry["buckets"])
    return blocks


def _summary(blocks: dict[str, dict]) -> str:
    modes = {entry["mode"] for entry in blocks.values()} - {"static"}
    if not modes:
        return "static"
    return modes.pop() if len(modes) == 1 else "partly bucketed"


def run_class(name: str) -> dict:
    import torch

    import neuron_dynamo

    sys.path.insert(0, str(TESTS_HF))
    from test_diffusers_classes import _tensors
    from tiny_diffusers_resolutions import RESOLUTIONS, tiny_model

    resolutions = RESOLUTIONS[name]
    sizes = [*resolutions.sizes, resolutions.sizes[0]]
    model = tiny_model(name)
    with torch.no_grad():
        expected = [_tensors(model(**resolutions.inputs(*size))) for size in sizes[:3]]
    expected.append(expected[0])
    recorder = _record()
    neuron_dynamo.reset_stats()
    model.compile_repeated_blocks(backend="neuron", fullgraph=True)
    calls = []
    start = time.perf_counter()
    for size, want in zip(sizes, expected, strict=True):
        before = dict(neuron_dynamo.stats())
        with torch.no_grad():
            got = _tensors(model(**resolutions.inputs(*size)))
        after = neuron_dynamo.stats()
        delta = {key: after.get(key, 0) - before.get(key, 0)
                 for key in ("programs_compiled", "cache.hits", "cache.misses", "dynamo_graphs")}
        pairs = [(g.double(), w.double()) for g, w in zip(got, want, strict=True)] if len(got) == len(want) else []
        equal = bool(pairs) and all(g.shape == w.shape and torch.allclose(g, w, rtol=TOLERANCE, atol=TOLERANCE)
                                    for g, w in pairs)
        worst = max(((g - w).abs().max().item() for g, w in pairs if g.shape == w.shape and g.numel()), default=0.0)
        calls.append({"size": list(size), "max_abs_diff": worst, "equal": equal, **delta})
    stats = neuron_dynamo.stats()
    blocks = _blocks(stats, recorder)
    return {
        "class": name, "calls": calls, "blocks": blocks, "mode": _summary(blocks),
        "equal": all(call["equal"] for call in calls), "max_abs_diff": max(call["max_abs_diff"] for call in calls),
        "eager_graphs": stats.get("dynamo_graphs_eager", 0), "compiled_seconds": round(time.perf_counter() - start, 1),
    }


# --- parent: one worker per class, the table --------------------------------------------------------------------------


def _worker(name: str, timeout: float) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NEURON_DYNAMO_CACHE_DIR": tempfile.mkdtemp(prefix="ndres-"),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, __file__, "--worker", name], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"class": name, "error": f"timeout after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"class": name, "error": tail[:300]}
    result = json.loads(lines[-1][len(MARKER):])
    result["wall_seconds"] = round(time.perf_counter() - start, 1)
    return result


def _row(result: dict) -> tuple[str, ...]:
    if "error" in result:
        return (result["class"], "ERROR", "-", "-", "-", "-", result["error"][:80])
    calls = result["calls"]
    programs = ",".join(str(call["programs_compiled"]) for call in calls)
    back = calls[-1]
    buckets = sorted({b for entry in result["blocks"].values() for b in entry["buckets"]},
                     key=lambda b: int(b.rsplit("=", 1)[-1]) if b.rsplit("=", 1)[-1].isdigit() else 0)
    equal = f"yes {result['max_abs_diff']:.1e}" if result["equal"] else f"NO {result['max_abs_diff']:.1e}"
    return (result["class"], equal, programs, result["mode"], f"{back['cache.hits']}/{back['cache.misses']}",
            f"{result['wall_seconds']:.0f}", "; ".join(buckets[:3]) + (" ..." if len(buckets) > 3 else ""))


def _table(results: list[dict]) -> list[str]:
    header = ("class", "equal (max|diff|)", "programs per call A,B,C,A", "block graphs", "return to A hits/misses",
              "s", "buckets")
    rows = [_row(result) for result in results]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    render = lambda row: "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
    lines = [render(header), render(tuple("-" * w for w in widths)), *map(render, rows), ""]
    for result in results:
        for block, entry in result.get("blocks", {}).items():
            if entry["mode"] != "bucketed":
                reasons = " | ".join(entry["reasons"]) or "its inputs do not depend on the resolution"
                lines.append(f"{result['class']}.{block}: {entry['mode']}: {reasons}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", help="comma-separated parts of class names (default: every class with a case)")
    parser.add_argument("--jobs", type=int, default=2, help="workers in parallel (one class each)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per class")
    parser.add_argument("--json", dest="json_out", help="write every figure as JSON here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(MARKER + json.dumps(run_class(args.worker)), flush=True)
        return
    sys.path.insert(0, str(TESTS_HF))
    from test_diffusers_classes import ALL_CASES
    from tiny_diffusers_resolutions import RESOLUTIONS

    names = sorted(ALL_CASES)
    if args.classes:
        wanted = [part.strip().lower() for part in args.classes.split(",") if part.strip()]
        names = [name for name in names if any(part in name.lower() for part in wanted)]
    missing = [name for name in names if name not in RESOLUTIONS]
    names = [name for name in names if name in RESOLUTIONS]
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(_worker, name, args.timeout): name for name in names}
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            results.append(result)
            print(f"{result['class']}: {result.get('mode', result.get('error'))}", file=sys.stderr, flush=True)
    results.sort(key=lambda result: result["class"])
    print("\n".join(_table(results)))
    if missing:
        print(f"\nno sizes in tiny_diffusers_resolutions.py (not run): {', '.join(missing)}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"results": results, "not_run": missing}, indent=1))


if __name__ == "__main__":
    main()
