"""Decode time of Transformers `generate()` under the backend against eager, and where the compiled time goes.

    .venv/bin/python benchmarks/generate.py                 # a table and the breakdown
    .venv/bin/python benchmarks/generate.py --json          # the same figures as JSON
    .venv/bin/python benchmarks/generate.py --models llama --paths static --new-tokens 32

Per tiny model (Llama, GPT-2, random weights from their configs) and per path — `static`: a static cache and
`CompileConfig(backend="neuron")`; `dynamic`: the default dynamic cache with
`model.forward = torch.compile(model.forward, backend="neuron")` — on the default target (the simulator, unless
NEURON_DYNAMO_TARGET says otherwise):

* warm-up: two generations at prompt lengths 5 and 17 (the second makes Dynamo's graphs dynamic in the lengths, and
  the backend compiles its bucket programs), then the timed prompt once;
* decode time per step, steady state: the median gap between successive steps' logits (a logits processor notes
  the time), over `--repeats` generations of N tokens each, eager and compiled side by side in the same process,
  alternating;
* programs compiled and Dynamo graphs made during the timed runs (0: every step reused a program), whether the
  tokens equal eager's, and the cost model's estimated device time per decode step (an estimate for trn2);
* the breakdown: the decode steps of one compiled `generate(max_new_tokens=N)` under cProfile, self time summed by
  where the code lives (time in C functions goes to the Python code that called them).

Wall times are this CPU's: the simulator runs every NKI kernel on the interpreter, so they say nothing of Trainium.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

import neuron_dynamo

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "hf"))
from tiny_models import VOCAB, tiny_gpt2, tiny_llama  # noqa: E402

MODELS = {"llama": tiny_llama, "gpt2": tiny_gpt2}
PATHS = ("static", "dynamic")
WARM_UP = (5, 17)
PROMPT = 30

# Where code lives -> the category its self time counts for (first match wins).
CATEGORIES = (
    ("NKI interpreter (kernels)", ("neuron_dynamo/nki/",)),
    ("lowering glue (region -> kernel calls)", ("neuron_dynamo/lowering/", "neuron_dynamo/toolchain/",
                                                "neuron_dynamo/kernels/", "nki_kernels/")),
    ("backend per-call path (bucket, pad, slice, stats)", ("neuron_dynamo/",)),
    ("program graph (FX glue, fallback ops)", ("<eval_with_key>", "torch/fx/")),
    ("Dynamo (frame entry, guards)", ("torch/_dynamo/",)),
    ("AOTAutograd runtime wrappers", ("torch/_functorch/",)),
    ("Transformers (generate loop, cache, masks)", ("transformers/",)),
    ("other torch Python (eager modules, ops)", ("torch/",)),
    ("numpy", ("numpy/",)),
)


def generator(model: torch.nn.Module, path: str, compiled: bool) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """`generate(prompt, new_tokens)` as a user runs it: eager, or compiled the path's way (on a copy)."""
    if path == "dynamic":
        if compiled:
            model = copy.deepcopy(model)
            model.forward = torch.compile(model.forward, backend="neuron")
        return lambda prompt, new, processors=None: model.generate(prompt, max_new_tokens=new,
                                                                   logits_processor=processors)
    model = copy.deepcopy(model)  # its own static cache (Transformers keeps the longest length a model used)
    config = None
    if compiled:
        config = transformers.CompileConfig(backend="neuron")
        config._compile_all_devices = True  # CPU tensors: Transformers only auto-compiles on allow-listed devices
    return lambda prompt, new, processors=None: model.generate(prompt, max_new_tokens=new, logits_processor=processors,
                                                               cache_implementation="static", compile_config=config)


def prompt_of(length: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (1, length), generator=torch.Generator().manual_seed(length))


class StepClock(transformers.LogitsProcessor):
    """Notes the time at each step's logits: the gaps between them are the decode steps (forward, cache update,
    token choice), the prefill and the setup left out."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return scores

    def steps(self) -> list[float]:
        return [later - earlier for earlier, later in zip(self.times, self.times[1:], strict=False)]


class ProfileDecode(transformers.LogitsProcessor):
    """Starts the profiler at the first step's logits: what it records is the decode steps alone (the prefill, which
    the static path runs eagerly, and the setup left out)."""

    def __init__(self, profile: cProfile.Profile) -> None:
        self.profile = profile
        self.started = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not self.started:
            self.started = True
            self.profile.enable()
        return scores


def decode_seconds(generate: Callable, prompt: torch.Tensor, new_tokens: int) -> list[float]:
    """The wall time of each decode step of one generation."""
    clock = StepClock()
    generate(prompt, new_tokens, transformers.LogitsProcessorList([clock]))
    return clock.steps()


def breakdown(profile: cProfile.Profile) -> dict[str, float]:
    """Self time per category; a C function's time goes to the categories of its callers, pro rata."""
    totals = dict.fromkeys([name for name, _ in CATEGORIES] + ["other"], 0.0)
    for (filename, _, _), (_, _, self_time, _, callers) in pstats.Stats(profile).stats.items():
        if filename == "~" and callers:  # a built-in: charged to who called it
            for (caller_file, _, _), (_, _, time_for, _) in callers.items():
                totals[category(caller_file)] += time_for
        else:
            totals[category(filename)] += self_time
    return {name: value for name, value in totals.items() if value > 0}


def category(filename: str) -> str:
    filename = filename.replace("\\", "/")
    return next((name for name, places in CATEGORIES if any(p in filename for p in places)), "other")


def measure(name: str, path: str, new_tokens: int, repeats: int) -> dict:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    eager, compiled = generator(model, path, False), generator(model, path, True)
    prompt = prompt_of(PROMPT)
    start = time.perf_counter()
    for length in (*WARM_UP, PROMPT):
        compiled(prompt_of(length), new_tokens)
    warm_up = time.perf_counter() - start
    before = neuron_dynamo.stats()
    eager_steps, compiled_steps = [], []
    for _ in range(repeats):  # side by side, alternating: the machine's load hits both alike
        eager_steps += decode_seconds(eager, prompt, new_tokens)
        compiled_steps += decode_seconds(compiled, prompt, new_tokens)
    after = neuron_dynamo.stats()
    same = torch.equal(compiled(prompt, new_tokens), eager(prompt, new_tokens))
    device_ns = after.get("estimated_device_ns", 0) - before.get("estimated_device_ns", 0)
    calls = after.get("calls", 0) - before.get("calls", 0)
    profile = cProfile.Profile()
    compiled(prompt, new_tokens, transformers.LogitsProcessorList([ProfileDecode(profile)]))
    profile.disable()
    eager_ms, compiled_ms = 1e3 * statistics.median(eager_steps), 1e3 * statistics.median(compiled_steps)
    return {
        "model": name, "path": path, "new_tokens": new_tokens, "repeats": repeats,
        "warm_up_seconds": round(warm_up, 2),
        "eager_ms_per_step": round(eager_ms, 2), "compiled_ms_per_step": round(compiled_ms, 2),
        "ratio": round(compiled_ms / eager_ms, 2),
        "programs_compiled_after_warm_up": after.get("programs_compiled", 0) - before.get("programs_compiled", 0),
        "dynamo_graphs_after_warm_up": after.get("dynamo_graphs", 0) - before.get("dynamo_graphs", 0),
        "tokens_equal_eager": same,
        "estimated_device_us_per_call": round(device_ns / calls / 1e3, 1) if device_ns and calls else None,
        "breakdown_seconds": {k: round(v, 4) for k, v in breakdown(profile).items()},
    }


def table(rows: list[dict]) -> str:
    header = ("model", "path", "eager ms/step", "compiled ms/step", "ratio", "compiled after warm-up",
              "tokens = eager", "est. device us/call", "warm-up s")
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    for row in rows:
        lines.append(" | ".join(str(v) for v in (
            row["model"], row["path"], row["eager_ms_per_step"], row["compiled_ms_per_step"], f"{row['ratio']}x",
            f"{row['programs_compiled_after_warm_up']} programs, {row['dynamo_graphs_after_warm_up']} graphs",
            row["tokens_equal_eager"], row["estimated_device_us_per_call"], row["warm_up_seconds"])))
    for row in rows:
        total = sum(row["breakdown_seconds"].values())
        lines += ["", f"{row['model']} {row['path']}: the {row['new_tokens'] - 1} decode steps of one compiled "
                      f"generate under cProfile, {total:.2f} s of self time"]
        for name, value in sorted(row["breakdown_seconds"].items(), key=lambda kv: -kv[1]):
            lines.append(f"  {name:<52} {value:7.3f} s  {100 * value / total:5.1f}%")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS, reverse=True))
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens per timed generation (>= 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed generations per way (median over their steps)")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    rows = [measure(name, path, args.new_tokens, args.repeats) for name in args.models for path in args.paths]
    print(json.dumps(rows, indent=2) if args.json else table(rows))


if __name__ == "__main__":
    main()
