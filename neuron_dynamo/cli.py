"""`neuron-precompile`: fill the compile cache ahead of time, and look after it.

    neuron-precompile warm MODEL --batch-sizes 1,4 --seq-lens 128,512 [--train] [--workers 2]
    neuron-precompile ls | verify | prune --max-size 20G --older-than 30d | clear-locks

`warm` compiles by *running* the model under the same backend, options and cache directory as the real run, so the
keys it stores are the keys the run looks up (the failure optimum-neuron #157/#271 describe is a warm-up tool with
its own key function). Each (batch size, sequence length) is one task; tasks are spread over `--workers` processes,
and the per-key lock makes processes that need one program compile it once.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import queue as queue_module
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from neuron_dynamo.cache import CompileCache, default_cache_dir
from neuron_dynamo.errors import NeuronDynamoError

DTYPES = ("float32", "bfloat16", "float16")
DYNAMIC = {"auto": None, "true": True, "false": False}


class PrecompileError(NeuronDynamoError):
    """A command-line argument the tool cannot use."""


# --------------------------------------------------------------------------------------------------- parsing
def parse_size(text: str) -> int:
    """`20G`, `512M`, `64k` or plain bytes → bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write e.g. 20G, 512M or 1048576")
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def parse_age(text: str) -> float:
    """`30d`, `12h`, `45m`, `90s` or plain seconds → seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age; write e.g. 30d, 12h, 45m or 3600")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[match.group(2)]
    return float(match.group(1)) * scale


def parse_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more positive integers, e.g. 128,256")
    return values


def parse_option(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: write backend options as NAME=VALUE, e.g. target=simulator")
    return name.strip(), value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neuron-precompile",
        description="Fill and maintain the neuron-dynamo compile cache. The cache directory is --cache-dir, else "
        "$NEURON_DYNAMO_CACHE_DIR, else ~/.cache/neuron_dynamo: the same one the backend uses.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `neuron-precompile COMMAND --help` for the options of each command.",
    )
    parser.add_argument("--cache-dir", help="the cache directory (default: $NEURON_DYNAMO_CACHE_DIR or "
                        "~/.cache/neuron_dynamo)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    warm = commands.add_parser(
        "warm", help="compile every graph x shape of a model into the cache",
        description="Compile every graph of MODEL for every batch size x sequence length, by running it under "
        "torch.compile(backend='neuron_dynamo') with the same options as the real run (forward under "
        "torch.no_grad(); with --train also forward+backward of a training step). Keys match the real run "
        "only if it uses the same options, dtype, dynamic setting and calling convention. Shapes are spread over "
        "--workers processes; a progress line shows done / remaining / locked (keys other processes are "
        "compiling) / failed. Exit status 1 if any shape failed (the others are still stored).",
    )
    warm.add_argument("model", help="`package.module:factory` (factory() returns (model, make_inputs), "
                      "make_inputs(batch_size, seq_len) returns the positional args or a dict of keyword args), "
                      "or a local Hugging Face model directory (config.json, weights optional)")
    warm.add_argument("--seq-lens", type=parse_ints, default=[128], help="sequence lengths, e.g. 128,512 "
                      "(default 128)")
    warm.add_argument("--batch-sizes", type=parse_ints, default=[1], help="batch sizes, e.g. 1,4 (default 1)")
    warm.add_argument("--dtype", choices=DTYPES, default="float32", help="model dtype (default float32)")
    warm.add_argument("--train", action="store_true", help="also compile training steps (forward + backward)")
    warm.add_argument("--dynamic", choices=tuple(DYNAMIC), default="auto",
                      help="torch.compile's dynamic= of the real run. auto (Dynamo's default): each shape is "
                      "compiled as a process's first call (a static graph), then all shapes go through one compile "
                      "whose first two calls change every dimension given 2+ values (the dynamic graph and its "
                      "buckets); true: one dynamic compile over all shapes; false: each shape static")
    warm.add_argument("--option", "-o", action="append", type=parse_option, default=[], metavar="NAME=VALUE",
                      help="a backend option, as in torch.compile(options={...}); repeatable, e.g. -o target=simulator")
    warm.add_argument("--random-weights", action="store_true",
                      help="for a Hugging Face directory: build the model from its config with random weights "
                      "(the default when the directory holds no weights)")
    warm.add_argument("--workers", type=int, default=1, help="processes compiling in parallel (default 1)")
    warm.add_argument("--summary", type=Path, help="write a JSON summary of the run to this file")

    ls = commands.add_parser("ls", help="list the entries: size, age, last use, target, model, shapes",
                             description="List the cache entries, least recently used first.")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")

    commands.add_parser("verify", help="re-hash every entry and quarantine the corrupt ones (exit status 1 if any)",
                        description="Re-hash every entry; corrupt ones are moved to quarantine and listed.")

    prune = commands.add_parser("prune", help="evict old entries, then least recently used ones above a size",
                                description="Evict entries unused for --older-than, then the least recently "
                                "used ones until the cache is at most --max-size.")
    prune.add_argument("--max-size", type=parse_size, help="size cap, e.g. 20G, 512M")
    prune.add_argument("--older-than", type=parse_age, help="age of last use, e.g. 30d, 12h")

    commands.add_parser("clear-locks", help="remove compile locks left behind (only while no process compiles)",
                        description="Remove every per-key compile lock. Locks of dead processes are released by "
                        "the kernel on local disks; this is for network file systems. Run it only while no "
                        "process uses the cache.")
    return parser


# ------------------------------------------------------------------------------------------------ the model
@dataclass
class Task:
    batch_size: int
    seq_len: int
    status: str = "pending"  # pending, done, failed
    seconds: float = 0.0
    error: str = ""


def load_model(spec: str, random_weights: bool = False) -> tuple[Any, Callable[[int, int], Any], str]:
    """(model, make_inputs(batch, seq), a label for the cache entries) from a factory or a Hugging Face dir."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return _load_hf(path, random_weights)
    module_name, sep, factory_name = spec.partition(":")
    if not sep or not factory_name:
        raise PrecompileError(f"model {spec!r} is neither a directory nor `package.module:factory`")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: a factory next to the user's script
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
    except (ImportError, AttributeError) as exc:
        raise PrecompileError(f"cannot load the model factory {spec!r}: {_one_line(exc)}") from exc
    except Exception as exc:  # the module itself raised while importing
        raise PrecompileError(f"importing {module_name!r} for the model factory {spec!r} raised "
                              f"{_one_line(exc)}; fix the module so that it imports") from exc
    if not callable(factory):
        raise PrecompileError(f"{spec!r} is not a function (it is of type {type(factory).__name__}): "
                              f"{FACTORY_CONTRACT}")
    try:
        made = factory()
    except Exception as exc:
        raise PrecompileError(f"the model factory {spec!r} raised {_one_line(exc)}; fix the factory (it is "
                              "called with no arguments and must return (model, make_inputs))") from exc
    problem = _factory_result_problem(made)
    if problem:
        raise PrecompileError(f"the model factory {spec!r} returned {problem}: {FACTORY_CONTRACT}")
    model, make_inputs = made
    return model, make_inputs, spec


FACTORY_CONTRACT = ("a factory must return (model, make_inputs): the model (a torch.nn.Module) and a function "
                    "make_inputs(batch_size, seq_len) giving its positional args or a dict of keyword args")


def _one_line(exc: BaseException) -> str:
    """`Type: the first line of the message` (an error report stays on one line)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300].rstrip('.')}" if text else type(exc).__name__


def _factory_result_problem(made: Any) -> str:
    """Why `made` is not (model, make_inputs), or ''."""
    if not isinstance(made, (tuple, list)) or len(made) != 2:
        what = f"a {len(made)}-tuple" if isinstance(made, (tuple, list)) else f"a {type(made).__name__}"
        return f"{what} instead of a pair"
    model, make_inputs = made
    if not callable(model):
        return f"a {type(model).__name__} as the model, which cannot be called"
    if not callable(make_inputs):
        return f"a {type(make_inputs).__name__} as make_inputs, which is not a function"
    return ""


def _load_hf(path: Path, random_weights: bool) -> tuple[Any, Callable[[int, int], Any], str]:
    import torch

    if not (path / "config.json").is_file():
        raise PrecompileError(f"{path} holds no config.json, so it is no Hugging Face model directory; give the "
                              "directory of a saved model (config.json, weights optional) or `package.module:factory`")
    try:
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    except ImportError as exc:
        raise PrecompileError(f"warming a Hugging Face directory needs transformers: {_one_line(exc)}; "
                              "`pip install transformers`, or give a `package.module:factory`") from exc
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as exc:  # malformed JSON, no or an unknown model_type, a transformers too old for it
        raise PrecompileError(f"cannot read the model config {path / 'config.json'}: {_one_line(exc)}. It must be "
                              "valid JSON with a `model_type` this transformers knows (see AutoConfig), as written "
                              "by save_pretrained()") from exc
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    auto = AutoModelForCausalLM if type(config) in AutoModelForCausalLM._model_mapping else AutoModel
    try:
        model = auto.from_config(config) if random_weights or not has_weights else auto.from_pretrained(path)
    except Exception as exc:
        how = "from its config" if random_weights or not has_weights else "from its weights"
        raise PrecompileError(f"cannot build the model of {path} {how}: {_one_line(exc)}"
                              + ("" if random_weights or not has_weights else
                                 "; pass --random-weights to build it from config.json alone")) from exc
    causal = auto is AutoModelForCausalLM

    def make_inputs(batch_size: int, seq_len: int) -> dict[str, Any]:
        ids = torch.randint(0, config.vocab_size, (batch_size, seq_len))
        return {"input_ids": ids, **({"labels": ids} if causal and model.training else {})}

    return model, make_inputs, getattr(config, "_name_or_path", "") or path.name


def _loss(output: Any) -> Any:
    import torch
    from torch.utils._pytree import tree_leaves

    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    return sum(leaf.float().sum() for leaf in tree_leaves(output) if isinstance(leaf, torch.Tensor) and
               leaf.requires_grad)


def _call(model: Any, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def _run_tasks(loaded: tuple, tasks: list[Task], args: dict[str, Any], report: Callable[[Task], None]) -> dict:
    """Compile `tasks` in this process; returns this process's cache counters."""
    import torch

    import neuron_dynamo
    from neuron_dynamo.program_cache import labelled

    model, make_inputs, label = loaded
    model = model.to(getattr(torch, args["dtype"]))
    dynamic = DYNAMIC[args["dynamic"]]
    modes = [False, True] if args["train"] else [False]

    def compile_model() -> Any:
        torch._dynamo.reset()  # what a fresh process would compile, not what an earlier task left in Dynamo
        return torch.compile(model, backend="neuron_dynamo", options=dict(args["options"]), dynamic=dynamic)

    def step(compiled: Any, task: Task) -> None:
        start = time.perf_counter()
        try:
            for train in modes:
                model.train(train)
                torch.manual_seed(0)
                inputs = make_inputs(task.batch_size, task.seq_len)
                if train:
                    _loss(_call(compiled, inputs)).backward()
                    model.zero_grad(set_to_none=True)
                else:
                    with torch.no_grad():
                        _call(compiled, inputs)
            task.status = "done"
        except Exception as exc:  # one failed shape must not stop the others: it is reported in the summary
            task.status, task.error = "failed", f"{type(exc).__name__}: {exc}"
        task.seconds += time.perf_counter() - start

    with labelled(label):
        if dynamic is not True:  # each shape as the first call of a process: a static graph
            for task in tasks:
                step(compile_model(), task)
                if dynamic is False:
                    report(task)
        if dynamic is not False:  # all shapes through one compile: the dynamic graph and its buckets
            compiled = compile_model()
            if dynamic is None:  # Dynamo makes dynamic the dims that changed: prime with all of them changing
                for primer in args["primers"]:
                    step(compiled, Task(**primer))
            for task in tasks:
                if task.status != "failed":
                    step(compiled, task)
                report(task)
    return {name: value for name, value in neuron_dynamo.stats().items() if name.startswith("cache.")}


def _worker(spec: str, tasks: list[Task], args: dict[str, Any], queue: Any) -> None:
    try:
        loaded = load_model(spec, args["random_weights"])
        stats = _run_tasks(loaded, tasks, args, lambda task: queue.put(("task", asdict(task))))
        queue.put(("stats", stats))
    except BaseException as exc:  # the parent reports it; a worker must always say it is finished
        queue.put(("error", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        queue.put(("exit", None))


class Progress:
    """done / remaining / locked / failed, on one refreshed line on a terminal, a line per change otherwise."""

    def __init__(self, total: int, cache: CompileCache, stream: Any = sys.stderr) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.cache, self.stream = cache, stream
        self.tty = stream.isatty()

    def update(self, task: Task | None = None) -> None:
        if task is not None:
            self.done += task.status == "done"
            self.failed += task.status == "failed"
        finished = self.done + self.failed
        width = 24
        bar = "#" * (width * finished // max(self.total, 1))
        line = (f"[{bar:<{width}}] done {self.done} / remaining {self.total - finished} / "
                f"locked {len(self.cache.locks())} / failed {self.failed}")
        self.stream.write(f"\r{line}" if self.tty else f"{line}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


def check_summary_path(path: Path) -> None:
    """Fail now, not after an hour of compiling, if the summary cannot be written to `path`."""
    path = path.expanduser()
    fix = "give --summary a file in an existing, writable directory"
    if path.is_dir():
        raise PrecompileError(f"--summary {path} is a directory; {fix}, e.g. --summary {path / 'summary.json'}")
    if not path.parent.is_dir():
        what = "is not a directory" if path.parent.exists() else "does not exist"
        raise PrecompileError(f"--summary {path}: the directory {path.parent} {what}; create it or {fix}")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise PrecompileError(f"--summary {path} cannot be written ({exc.strerror or exc}); {fix}") from exc
    if not existed:
        path.unlink()  # the real summary is written at the end; leave nothing behind if the run fails before


def warm(ns: argparse.Namespace, root: Path) -> int:
    from neuron_dynamo.options import ENV_PREFIX, resolve_options

    options = dict(ns.option)
    resolved = resolve_options(options)  # a wrong option fails here, before anything is compiled
    if resolved.cache != "on":
        source = "-o cache=" + resolved.cache if "cache" in options else f"{ENV_PREFIX}CACHE={resolved.cache}"
        raise PrecompileError(
            f"the compile cache is {'off' if resolved.cache == 'off' else 'read-only'} ({source}), so warming would "
            "compile and store nothing; warm with the cache on: "
            + ("drop that -o option" if "cache" in options else f"unset {ENV_PREFIX}CACHE or pass -o cache=on")
        )
    if ns.workers < 1:
        raise PrecompileError("--workers must be at least 1")
    if ns.summary is not None:
        check_summary_path(ns.summary)
    loaded = load_model(ns.model, ns.random_weights)  # a wrong model spec fails here, before any worker starts
    if resolved.cache_dir:  # -o cache_dir=... is where the compiles store: show and summarise that one
        root = Path(resolved.cache_dir).expanduser()
    cache = CompileCache(root=root)  # created only now, once the arguments are known to be usable
    tasks = [Task(batch, seq) for batch in ns.batch_sizes for seq in ns.seq_lens]
    # With dynamic=auto every worker primes its dynamic compile with the smallest then the largest shape, so that
    # all workers (and a run whose batch size and length both vary) build the same dynamic graph.
    primers = [Task(min(ns.batch_sizes), min(ns.seq_lens)), Task(max(ns.batch_sizes), max(ns.seq_lens))]
    args = {"options": options, "dtype": ns.dtype, "train": ns.train, "dynamic": ns.dynamic,
            "random_weights": ns.random_weights, "primers": [asdict(task) for task in primers]}
    progress = Progress(len(tasks), cache)
    progress.update()
    start = time.perf_counter()
    finished: dict[tuple[int, int], Task] = {}
    stats: dict[str, float] = {}
    errors: list[str] = []
    if ns.workers == 1:
        def report(task: Task) -> None:
            finished[(task.batch_size, task.seq_len)] = task
            progress.update(task)

        stats = _run_tasks(loaded, tasks, args, report)
    else:
        shares = [tasks[i :: ns.workers] for i in range(ns.workers)]
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        processes = [context.Process(target=_worker, args=(ns.model, share, args, queue)) for share in shares if share]
        for process in processes:
            process.start()
        running = len(processes)
        while running:
            try:
                kind, value = queue.get(timeout=1.0)
            except queue_module.Empty:
                if not any(process.is_alive() for process in processes):
                    break  # a worker died without a word (killed, crashed): its tasks are reported as failed
                continue
            if kind == "task":
                task = Task(**value)
                finished[(task.batch_size, task.seq_len)] = task
                progress.update(task)
            elif kind == "stats":
                for name, amount in value.items():
                    stats[name] = stats.get(name, 0) + amount
            elif kind == "error":
                errors.append(value)
            else:
                running -= 1
        for process in processes:
            process.join()
    progress.close()
    results = [finished.get((task.batch_size, task.seq_len), task) for task in tasks]
    for task in results:
        if task.status == "pending":
            task.status, task.error = "failed", "the worker stopped before finishing it"
    summary = {
        "model": ns.model, "cache_dir": str(cache.root), "options": options, "dtype": ns.dtype, "train": ns.train,
        "dynamic": ns.dynamic, "workers": ns.workers, "seconds": time.perf_counter() - start,
        "tasks": [asdict(task) for task in results], "cache": stats, "errors": errors,
        "done": sum(task.status == "done" for task in results),
        "failed": sum(task.status == "failed" for task in results),
    }
    print(f"warmed {summary['done']}/{len(results)} shape(s) of {ns.model} in {summary['seconds']:.1f} s: "
          f"{stats.get('cache.misses', 0)} compiled, {stats.get('cache.hits', 0)} already cached, "
          f"{stats.get('cache.bypasses', 0)} not storable")
    for task in results:
        if task.status == "failed":
            print(f"  failed: batch {task.batch_size} x seq {task.seq_len}: {task.error}")
    if ns.summary:
        ns.summary.expanduser().write_text(json.dumps(summary, indent=2))
    return 1 if summary["failed"] or errors else 0


# --------------------------------------------------------------------------------------------- maintenance
def _age(seconds: float) -> str:
    for unit, scale in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= scale:
            return f"{seconds / scale:.1f}{unit}"
    return f"{seconds:.0f}s"


def _size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _existing_cache(root: Path, mode: str, what: str, stream: Any = None) -> CompileCache | None:
    """The cache at `root`, or None (after saying so) if there is none: a maintenance command creates nothing."""
    if root.exists() and not root.is_dir():
        raise PrecompileError(f"the cache directory {root} is a file; point --cache-dir or $NEURON_DYNAMO_CACHE_DIR "
                              "at the cache directory")
    if not root.exists():
        print(f"no compile cache at {root} (missing): nothing to {what}. The first compile or `neuron-precompile "
              "warm` creates it; --cache-dir or $NEURON_DYNAMO_CACHE_DIR choose another one", file=stream)
        return None
    return CompileCache(root=root, mode=mode)


def ls(ns: argparse.Namespace, root: Path) -> int:
    cache = _existing_cache(root, "readonly", "list", sys.stderr if ns.json else None)
    if cache is None:
        if ns.json:
            print("[]")
        return 0
    now = time.time()
    entries = cache.entries()
    if ns.json:
        print(json.dumps([{"key": e.key, "size": e.size, "created": e.created, "last_used": e.last_used,
                           "meta": e.meta} for e in entries], indent=2))
        return 0
    rows = [("key", "size", "age", "last used", "target", "model", "input shapes")]
    for e in entries:
        shapes = ", ".join("x".join(map(str, shape)) for shape in e.meta.get("input_shapes", [])[:4])
        more = len(e.meta.get("input_shapes", [])) - 4
        rows.append((e.key[:16], _size(e.size), _age(now - e.created), _age(now - e.last_used),
                     str(e.meta.get("target", "-")), str(e.meta.get("label") or "-"),
                     shapes + (f", +{more}" if more > 0 else "")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    locks = cache.locks()
    print(f"{len(entries)} entries, {_size(sum(e.size for e in entries))} in {cache.root}"
          + (f"; {len(locks)} compile lock(s) held" if locks else ""))
    return 0


def verify(ns: argparse.Namespace, root: Path) -> int:
    cache = _existing_cache(root, "on", "verify")
    if cache is None:
        return 0
    corrupt = list(dict.fromkeys(cache.verify()))
    for key in corrupt:
        print(f"corrupt: {key} (moved to quarantine)")
    # The healthy entries are those left; counting entries() *before* verify() would count a corrupt entry whose
    # header still reads twice (once there, once in the corrupt list).
    healthy = [entry for entry in cache.entries() if entry.key not in set(corrupt)]
    print(f"verified {len(healthy) + len(corrupt)} entries: {len(corrupt)} corrupt")
    return 1 if corrupt else 0


def prune(ns: argparse.Namespace, root: Path) -> int:
    if ns.max_size is None and ns.older_than is None:
        raise PrecompileError("prune needs --max-size and/or --older-than, e.g. prune --max-size 20G")
    cache = _existing_cache(root, "on", "prune")
    if cache is None:
        return 0
    evicted = cache.prune(max_bytes=ns.max_size, older_than=ns.older_than)
    remaining = cache.entries()
    print(f"evicted {evicted} entries; {len(remaining)} left, {_size(sum(e.size for e in remaining))}")
    return 0


def clear_locks(ns: argparse.Namespace, root: Path) -> int:
    cache = _existing_cache(root, "on", "clear")
    if cache is None:
        return 0
    print(f"removed {cache.clear_locks()} lock(s) from {cache.root}")
    return 0


COMMANDS = {"warm": warm, "ls": ls, "verify": verify, "prune": prune, "clear-locks": clear_locks}


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.cache_dir:
        os.environ["NEURON_DYNAMO_CACHE_DIR"] = str(Path(ns.cache_dir).expanduser())  # workers and options see it
    try:  # each command opens the cache itself: a maintenance command never creates it
        return COMMANDS[ns.command](ns, default_cache_dir())
    except NeuronDynamoError as exc:
        print(f"neuron-precompile: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
