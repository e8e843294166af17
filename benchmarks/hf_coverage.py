"""Coverage sweep: the backend on every Transformers causal-LM architecture, with tiny random weights.

    .venv/bin/python benchmarks/hf_coverage.py --jobs 2                       # all 196: about an hour or two
    .venv/bin/python benchmarks/hf_coverage.py --models llama,gpt2,mpt        # a few
    .venv/bin/python benchmarks/hf_coverage.py --jobs 2 --json-out cov.json   # the table, and every figure as JSON

Every key of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES is built from its default config, shrunk (`tiny_causal_lm` in
tests/hf/tiny_models.py; nothing is downloaded), and run by a worker process of its own, so that a crash or a hang
costs one architecture only (`--timeout`, 600 s by default). The worker runs the model eagerly (logits at lengths 37
and 50, greedy generate of 8 tokens), then with `torch.compile(backend="neuron")` and no options at all, as a user
would: the logits must match eager's within 1e-3, and generate with the compiled forward must give the same tokens.
It also times the first compiled call against `backend="aot_eager"`'s, both after a warm-up on a trivial function,
with an empty compile cache per worker (cold compiles, run after run; the user's cache is left alone).

Goal: forward passes on >= 97% and generate on >= 95% of the architectures whose eager run works, no mismatch (a
wrong answer is worse than an error), and a median first call (compile + one run) at most 2x aot_eager's. Harness
failures (no tiny model, or eager itself fails) are counted apart: they say nothing about the backend. Progress, one
line per architecture, goes to stderr.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

MARKER = "HF_COVERAGE_RESULT "
LENGTHS = (37, 50)
NEW_TOKENS = 8
TOLERANCE = 1e-3
VOCAB = 256  # tiny_models.VOCAB_LM, without importing it in the parent
PASS = "pass"
GOALS = {"forward_pass_pct": 97.0, "generate_pass_pct": 95.0, "mismatches": 0, "first_call_ratio": 2.0}
TINY_MODELS_DIR = Path(__file__).resolve().parents[1] / "tests" / "hf"


# --- worker: one architecture, in its own process ---------------------------------------------------------------------


def describe(error: BaseException) -> str:
    """An exception as one short table cell: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:200]


def logits_of(output) -> torch.Tensor:
    """The logits of a causal LM's output (a ModelOutput almost always, a tuple for a few old models)."""
    logits = output.logits if hasattr(output, "logits") else output[0]
    return logits.float()


def make_inputs() -> dict[int, torch.Tensor]:
    """Token ids of batch 1 at each test length, the same in every run."""
    generator = torch.Generator().manual_seed(0)
    return {length: torch.randint(0, VOCAB, (1, length), generator=generator) for length in LENGTHS}


def generate(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)


def run_eager(model: torch.nn.Module, inputs: dict[int, torch.Tensor]) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """The reference: eager logits at each length, and the greedy tokens from the shortest input."""
    with torch.no_grad():
        logits = {length: logits_of(model(ids)) for length, ids in inputs.items()}
        tokens = generate(model, inputs[LENGTHS[0]])
    return logits, tokens


def first_call_seconds(compiled, ids: torch.Tensor) -> float:
    """Wall time of one call: on a fresh compiled model, Dynamo + the backend's compile + one run."""
    start = time.perf_counter()
    with torch.no_grad():
        compiled(ids)
    return time.perf_counter() - start


def warm_up() -> None:
    """Pay the process's one-time costs (Dynamo's first trace, the backends' imports) on a trivial function, so that
    the first-call times compare the two backends' work on the model only."""
    for backend in ("aot_eager", "neuron"):
        torch._dynamo.reset()
        torch.compile(lambda x: x * 2 + 1, backend=backend)(torch.ones(4))


def time_aot_eager(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """The yardstick for the backend's compile time: the same first call with backend="aot_eager"."""
    torch._dynamo.reset()
    return first_call_seconds(torch.compile(model, backend="aot_eager"), ids)


def check_forward(model: torch.nn.Module, inputs: dict[int, torch.Tensor], eager: dict[int, torch.Tensor]) -> dict:
    """The backend with no options at both lengths (the second one exercises the recompile for a new shape)."""
    import neuron_dynamo

    torch._dynamo.reset()
    neuron_dynamo.reset_stats()
    compiled = torch.compile(model, backend="neuron")
    first, *rest = LENGTHS
    try:
        with torch.no_grad():
            start = time.perf_counter()
            got = {first: logits_of(compiled(inputs[first]))}
            first_call_s = time.perf_counter() - start
            got.update({length: logits_of(compiled(inputs[length])) for length in rest})
    except Exception as error:
        return {"forward": "fail: forward", "forward_error": describe(error), **counters()}
    result = {"first_call_s": first_call_s, **compare(got, eager), **counters()}
    return hidden_failure(result, "forward", result)


def compare(got: dict[int, torch.Tensor], eager: dict[int, torch.Tensor]) -> dict:
    """Compiled logits against eager's at every length: the largest difference, and whether all are close."""
    same_shapes = all(got[n].shape == eager[n].shape for n in LENGTHS)
    if not same_shapes:
        return {"forward": "MISMATCH: forward", "max_diff": None, "forward_error": "logits of another shape"}
    diff = max(float((got[n] - eager[n]).abs().max()) for n in LENGTHS)
    close = all(torch.allclose(got[n], eager[n], atol=TOLERANCE, rtol=TOLERANCE) for n in LENGTHS)
    return {"forward": PASS if close else "MISMATCH: forward", "max_diff": diff}


def check_generate(model: torch.nn.Module, ids: torch.Tensor, eager_tokens: torch.Tensor) -> dict:
    """Greedy generate with the compiled forward, as `model.forward = torch.compile(model.forward)` users do: the
    prefill and every decode step (growing cache, new lengths) go through the backend; tokens must equal eager's."""
    import neuron_dynamo

    torch._dynamo.reset()
    neuron_dynamo.reset_stats()
    model.forward = torch.compile(model.forward, backend="neuron")
    try:
        with torch.no_grad():
            tokens = generate(model, ids)
    except Exception as error:
        return {"generate": "fail: generate", "generate_error": describe(error), "generate_counters": counters()}
    finally:
        del model.forward  # the class's forward again
    same = tokens.shape == eager_tokens.shape and torch.equal(tokens, eager_tokens)
    result = {"generate": PASS if same else "MISMATCH: generate", "generate_counters": counters()}
    return hidden_failure(result, "generate", result["generate_counters"])


# The counters of a backend error that the backend survived by running the graph eagerly (a warning, not a raise).
FAILURE_COUNTERS = ("graphs_failed", "dynamo_graphs_eager")


def hidden_failure(result: dict, stage: str, counted: dict) -> dict:
    """A pass that ran some graph eagerly because the backend broke is a backend failure, not a pass: the answer is
    eager's own. The first warning the backend logged says why."""
    if result[stage] == PASS and any(counted.get(name) for name in FAILURE_COUNTERS):
        failures = [message for message in BACKEND_WARNINGS if "failed" in message] or ["a backend error"]
        result = {**result, stage: f"fail: {stage} ran eagerly", f"{stage}_error": failures[0][:200]}
    return result


class _Warnings(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        BACKEND_WARNINGS.append(record.getMessage())


BACKEND_WARNINGS: list[str] = []


def counters() -> dict:
    """The backend's counters the table shows, those that exist in this version."""
    import neuron_dynamo

    stats = neuron_dynamo.stats()
    names = ("fallback_ops", "programs_compiled", "estimated_device_ns", *FAILURE_COUNTERS)
    return {name: stats[name] for name in names if name in stats}


def emit(result: dict) -> None:
    """One marked JSON line on stdout; the parent keeps the last, so a worker that dies later still reports the
    stages it finished."""
    print(MARKER + json.dumps(result, default=str), flush=True)


def build(model_type: str) -> torch.nn.Module:
    sys.path.insert(0, str(TINY_MODELS_DIR))
    import tiny_models

    return tiny_models.tiny_causal_lm(model_type)


def harness_failure(result: dict, status: str, error: Exception) -> dict:
    return {**result, "complete": True, "forward": status, "generate": status, "note": describe(error)}


def run_worker(model_type: str) -> dict:
    """Every stage for one architecture; each stage's outcome lands in the result, which is emitted as it grows."""
    torch.set_num_threads(1)
    logging.getLogger("neuron_dynamo").addHandler(_Warnings(logging.WARNING))
    result: dict = {"model_type": model_type, "complete": False}
    try:
        model = build(model_type)
    except Exception as error:
        return harness_failure(result, "harness: tiny config", error)
    inputs = make_inputs()
    try:
        eager_logits, eager_tokens = run_eager(model, inputs)
    except Exception as error:
        return harness_failure(result, "harness: eager", error)
    try:
        warm_up()
        result["aot_eager_first_s"] = time_aot_eager(model, inputs[LENGTHS[0]])
    except Exception as error:
        result["aot_eager_error"] = describe(error)
    emit(result)
    result.update(check_forward(model, inputs, eager_logits))
    emit(result)
    result.update(check_generate(model, inputs[LENGTHS[0]], eager_tokens))
    result["complete"] = True
    return result


# --- parent: one worker per architecture, then the figures -----------------------------------------------------------


def all_model_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def last_result(stdout: str) -> dict | None:
    lines = [line for line in stdout.splitlines() if line.startswith(MARKER)]
    return json.loads(lines[-1][len(MARKER):]) if lines else None


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def unfinished(result: dict | None, model_type: str, status: str, note: str) -> dict:
    """A worker that timed out or died: the stages it reported stand, the others get `status`."""
    result = dict(result or {"model_type": model_type})
    for stage in ("forward", "generate"):
        result.setdefault(stage, status)
    result.setdefault("note", note)
    result["complete"] = True
    return result


def run_one(model_type: str, timeout: float) -> dict:
    """One worker process; a timeout kills its whole process group (it may have started compilers). Each worker
    gets an empty compile cache of its own: first calls are cold compiles run after run, as on a user's first run,
    and the sweep leaves the user's cache alone."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", model_type]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hf_coverage_cache_") as cache_dir:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "NEURON_DYNAMO_CACHE_DIR": cache_dir}
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                   start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            result = unfinished(last_result(stdout), model_type, "fail: timeout", f"no result after {timeout:.0f} s")
        else:
            result = last_result(stdout)
            if result is None or not result.get("complete"):
                note = f"exit {process.returncode}: {last_line(stderr)}"
                result = unfinished(result, model_type, "fail: crashed", note)
    result["wall_s"] = time.perf_counter() - start
    return result


def progress(done: int, total: int, result: dict) -> None:
    print(f"[{done}/{total}] {result['model_type']}: forward {result.get('forward')}, "
          f"generate {result.get('generate', '-')} ({result['wall_s']:.0f} s)", file=sys.stderr, flush=True)


def sweep(model_types: list[str], jobs: int, timeout: float) -> list[dict]:
    """Every architecture, `jobs` workers at a time; results in the order asked."""
    results: dict[str, dict] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_one, model_type, timeout): model_type for model_type in model_types}
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            progress(len(results), len(model_types), result)
    return [results[model_type] for model_type in model_types]


def is_harness_failure(result: dict) -> bool:
    return str(result.get("forward", "")).startswith("harness")


def percent(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 1) if whole else None


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(results: list[dict]) -> dict:
    """Pass rates over the architectures whose eager run works; compile time over those whose forward passes."""
    harness = [r for r in results if is_harness_failure(r)]
    runnable = [r for r in results if not is_harness_failure(r)]
    forward_ok = [r for r in runnable if r.get("forward") == PASS]
    generate_ok = [r for r in runnable if r.get("generate") == PASS]
    mismatches = [r for r in runnable for stage in ("forward", "generate") if "MISMATCH" in str(r.get(stage))]
    timed = [r for r in forward_ok if r.get("first_call_s") is not None and r.get("aot_eager_first_s") is not None]
    backend_first = median([r["first_call_s"] for r in timed])
    aot_first = median([r["aot_eager_first_s"] for r in timed])
    summary = {
        "architectures": len(results),
        "harness_failures": len(harness),
        "harness_tiny_config": sum(r["forward"] == "harness: tiny config" for r in harness),
        "harness_eager": sum(r["forward"] == "harness: eager" for r in harness),
        "eager_works": len(runnable),
        "forward_pass": len(forward_ok),
        "forward_pass_pct": percent(len(forward_ok), len(runnable)),
        "generate_pass": len(generate_ok),
        "generate_pass_pct": percent(len(generate_ok), len(runnable)),
        "backend_failures": sum("fail" in f"{r.get('forward')} {r.get('generate')}" for r in runnable),
        "mismatches": len(mismatches),
        "harness_failed": [r["model_type"] for r in harness],
        "backend_failed": [r["model_type"] for r in runnable if "fail" in f"{r.get('forward')} {r.get('generate')}"],
        "mismatched": [r["model_type"] for r in mismatches],
        "first_call_median_s": backend_first,
        "aot_eager_first_median_s": aot_first,
        "first_call_ratio": backend_first / aot_first if backend_first and aot_first else None,
    }
    summary["goals_met"] = goals_met(summary)
    return summary


def goals_met(summary: dict) -> dict[str, bool]:
    def at_least(name):
        return summary[name] is not None and summary[name] >= GOALS[name]

    def at_most(name):
        return summary[name] is not None and summary[name] <= GOALS[name]

    return {"forward_pass_pct": at_least("forward_pass_pct"), "generate_pass_pct": at_least("generate_pass_pct"),
            "mismatches": at_most("mismatches"), "first_call_ratio": at_most("first_call_ratio")}


def cell(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def note_of(result: dict) -> str:
    for key in ("note", "forward_error", "generate_error", "aot_eager_error"):
        if result.get(key):
            return str(result[key]).replace("|", "/")
    return ""


def table(results: list[dict]) -> str:
    rows = ["| model type | forward | generate | max diff | first call s | aot_eager first s | fallback ops | note |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        diff = f"{r['max_diff']:.1e}" if r.get("max_diff") is not None else "-"
        rows.append(f"| {r['model_type']} | {r.get('forward', '-')} | {r.get('generate', '-')} | {diff} "
                    f"| {cell(r.get('first_call_s'))} | {cell(r.get('aot_eager_first_s'))} "
                    f"| {cell(r.get('fallback_ops'))} | {note_of(r)} |")
    return "\n".join(rows)


def report(summary: dict) -> str:
    s = summary
    met = s["goals_met"]
    return "\n".join([
        f"architectures: {s['architectures']}; harness failures: {s['harness_failures']} "
        f"(tiny config {s['harness_tiny_config']}, eager {s['harness_eager']}); eager works: {s['eager_works']}",
        f"forward pass: {s['forward_pass']}/{s['eager_works']} = {cell(s['forward_pass_pct'], 1)}% "
        f"(goal >= {GOALS['forward_pass_pct']}%: {'met' if met['forward_pass_pct'] else 'NOT met'})",
        f"generate pass: {s['generate_pass']}/{s['eager_works']} = {cell(s['generate_pass_pct'], 1)}% "
        f"(goal >= {GOALS['generate_pass_pct']}%: {'met' if met['generate_pass_pct'] else 'NOT met'})",
        f"backend failures (architectures): {s['backend_failures']}; mismatches (forward + generate): "
        f"{s['mismatches']} (goal 0: {'met' if met['mismatches'] else 'NOT met'})",
        f"first call, median over passing architectures: neuron {cell(s['first_call_median_s'])} s, aot_eager "
        f"{cell(s['aot_eager_first_median_s'])} s, ratio {cell(s['first_call_ratio'])} "
        f"(goal <= {GOALS['first_call_ratio']}: {'met' if met['first_call_ratio'] else 'NOT met'})",
        f"harness failed: {', '.join(s['harness_failed']) or '-'}",
        f"backend failed: {', '.join(s['backend_failed']) or '-'}",
        f"mismatched: {', '.join(s['mismatched']) or '-'}",
    ])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", help="comma-separated model types (default: every causal-LM architecture)")
    parser.add_argument("--jobs", type=int, default=1, help="workers at once (default 1)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per architecture (default 600)")
    parser.add_argument("--json", action="store_true", help="print every figure as JSON instead of the table")
    parser.add_argument("--json-out", type=Path, help="also write every figure as JSON to this file")
    parser.add_argument("--worker", metavar="MODEL_TYPE", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        warnings.simplefilter("default")  # warnings go to stderr, the result line alone to stdout
        emit(run_worker(args.worker))
        return 0
    model_types = args.models.split(",") if args.models else all_model_types()
    start = time.perf_counter()
    results = sweep(model_types, max(1, args.jobs), args.timeout)
    figures = {"summary": summarize(results), "results": results, "wall_s": time.perf_counter() - start}
    if args.json_out:
        args.json_out.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    if args.json:
        print(json.dumps(figures, indent=2, default=str))
    else:
        print(table(results))
        print()
        print(report(figures["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
