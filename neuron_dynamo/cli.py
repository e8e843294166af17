"""`neuron-precompile`: fill the compile cache ahead of time, and look after it.

    neuron-precompile warm MODEL --batch-sizes 1,4 --seq-lens 128,512 [--train] [--workers 2]
    torchrun --nproc-per-node=2 -m neuron_dynamo.cli warm MODEL_DIR --tp-size 2 --seq-lens 128,512
    neuron-precompile ls | verify | prune --max-size 20G --older-than 30d | clear-locks
    neuron-precompile key [--json]                          # your cache key's file and id (made if missing)
    neuron-precompile selfcheck --json selfcheck.json      # on a Trainium host: device against simulator

`warm` compiles by *running* the model under the same backend, options and cache directory as the real run, so the
keys it stores are the keys the run looks up (the failure optimum-neuron #157/#271 describe is a warm-up tool with
its own key function). What to compile is `precompile.plan`; the runs are spread over `--workers` processes, and
the per-key lock makes processes that need one program compile it once. Under torchrun with `--tp-size`, each rank
loads its shard of a tensor-parallel model and runs the whole plan in step with the others (`precompile.
tensor_parallel_rank`); rank 0 shows the progress and the result, merged over the ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import multiprocessing
import os
import queue as queue_module
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from neuron_dynamo.cache import CompileCache, default_cache_dir
from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.precompile import (
    DYNAMIC,
    TOKEN_INPUTS,
    Loaded,
    PrecompileError,
    Run,
    Task,
    directory_kind,
    gather_ranks,
    load_model,
    merge_ranks,
    plan,
    process_group,
    record,
    run_plan,
    share,
    tensor_parallel_rank,
    warm_device,
)

DTYPES = ("float32", "bfloat16", "float16")


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


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """`64x64,128x96` → [(64, 64), (128, 96)]."""
    try:
        sizes = [tuple(int(side) for side in part.lower().split("x")) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(len(size) != 2 or min(size) < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: give sizes as HEIGHTxWIDTH, comma-separated, e.g. 64x64,128x96")
    return sizes


def parse_inputs(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in TOKEN_INPUTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: give input names from {','.join(TOKEN_INPUTS)}, e.g. "
                                         "input_ids,attention_mask")
    return names


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
        description="Compile every graph of MODEL for every batch size x sequence length (or HxW size), by running "
        "it under torch.compile(backend='neuron_dynamo') with the same options as the real run (forward under "
        "torch.no_grad(); with --train also forward+backward of a training step). Keys match the real run "
        "only if it uses the same options, dtype, dynamic setting and calling convention. The compiles are spread "
        "over --workers processes; a progress line on stderr shows shapes done / remaining / locked (keys other "
        "processes are compiling) / failed, and programs compiled / already cached. Exit status 1 if any shape "
        "failed (the others are still stored).",
    )
    warm.add_argument("model", help="`package.module:factory` (factory() returns (model, make_inputs), "
                      "make_inputs(batch_size, seq_len) returns the positional args or a dict of keyword args; "
                      "with --sizes, make_inputs(batch_size, height, width)), or a local Hugging Face model directory "
                      "as save_pretrained() writes it (config.json, weights optional): a Transformers model, or a "
                      "Diffusers FluxTransformer2DModel, SD3Transformer2DModel or UNet2DConditionModel")
    warm.add_argument("--seq-lens", type=parse_ints, help="sequence lengths, e.g. 128,512 (default 128)")
    warm.add_argument("--sizes", type=parse_sizes, help="for image models: latent sizes HxW as the model sees them "
                      "(Flux: packed tokens, i.e. the latent halved), e.g. 64x64,128x96 (default: the config's "
                      "sample_size, else 64x64)")
    warm.add_argument("--batch-sizes", type=parse_ints, default=[1], help="batch sizes as the model sees them "
                      "(with classifier-free guidance, twice the prompts), e.g. 1,4 (default 1)")
    warm.add_argument("--dtype", choices=DTYPES, default="float32", help="model dtype (default float32)")
    warm.add_argument("--train", action="store_true", help="also compile training steps (forward + backward)")
    warm.add_argument("--dynamic", choices=tuple(DYNAMIC), default="auto",
                      help="torch.compile's dynamic= of the real run. auto (Dynamo's default): each shape as a "
                      "process's first call (a static graph), and, for every set of dimensions that can change "
                      "between two calls, the dynamic graph that change makes and its buckets, so that the run may "
                      "call the shapes in any order; true: a dynamic compile starting from each shape; false: each "
                      "shape static")
    warm.add_argument("--inputs", type=parse_inputs, default=["input_ids"], metavar="NAMES",
                      help=f"for a Transformers directory: the keyword inputs the run passes, from "
                      f"{','.join(TOKEN_INPUTS)} (default input_ids; a tokenizer's output is "
                      "input_ids,attention_mask); with --train a causal LM also gets labels")
    warm.add_argument("--text-len", type=int, help="for a Diffusers model: the prompt embedding length its pipeline "
                      "passes (default: Flux 512, SD3 333, UNet 77)")
    warm.add_argument("--option", "-o", action="append", type=parse_option, default=[], metavar="NAME=VALUE",
                      help="a backend option, as in torch.compile(options={...}); repeatable, e.g. -o target=simulator")
    warm.add_argument("--random-weights", action="store_true",
                      help="for a Hugging Face directory: build the model from its config with random weights "
                      "(the default when the directory holds no weights)")
    warm.add_argument("--device", choices=("auto", "cpu", "neuron"), default="auto",
                      help="where the shapes run: neuron runs them on the Trainium device through TorchNeuron, which "
                      "fills TorchNeuron's NEFF cache as well as this cache; cpu runs them on the simulator; auto "
                      "(default): neuron where TorchNeuron has a device, else cpu")
    warm.add_argument("--workers", type=int, default=1, help="processes compiling in parallel (default 1)")
    warm.add_argument("--tp-size", type=int, metavar="N", help="warm a tensor-parallel model: run under `torchrun "
                      "--nproc-per-node=N -m neuron_dynamo.cli warm DIR --tp-size N`; each rank loads the "
                      "Transformers directory with from_pretrained(DIR, distributed_config=DistributedConfig("
                      "tp_size=N)) and compiles its own shard's graphs; rank 0 prints the progress, the result and "
                      "the summary, merged over the ranks")
    warm.add_argument("--summary", type=Path, help="write a JSON summary of the run to this file: the settings, "
                      "per shape its status, programs compiled and already cached, seconds and error, and the totals "
                      "(with --tp-size: summed over the ranks, and each rank's own under `ranks`)")

    ls = commands.add_parser("ls", help="list the entries: size, age, last use, target, model, shapes",
                             description="List the cache entries, least recently used first.")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")

    commands.add_parser("verify", help="check every entry's tag and checksum and quarantine the corrupt ones (exit "
                        "status 1 if any)",
                        description="Check every entry's tag (signed by your key or one in cache_trusted_keys), then "
                        "re-hash it; entries that fail either are moved to quarantine and listed as corrupt.")

    prune = commands.add_parser("prune", help="evict old entries, then least recently used ones above a size",
                                description="Evict entries unused for --older-than, then the least recently "
                                "used ones until the cache is at most --max-size.")
    prune.add_argument("--max-size", type=parse_size, help="size cap, e.g. 20G, 512M")
    prune.add_argument("--older-than", type=parse_age, help="age of last use, e.g. 30d, 12h")

    commands.add_parser("clear-locks", help="remove compile locks left behind (only while no process compiles)",
                        description="Remove every per-key compile lock. Locks of dead processes are released by "
                        "the kernel on local disks; this is for network file systems. Run it only while no "
                        "process uses the cache.")

    key = commands.add_parser(
        "key", help="show the file and id of your cache key (creating it, mode 0600, if missing)",
        description="Print the path and the key id of the secret key that signs your cache entries "
        "($XDG_CONFIG_HOME/neuron_dynamo/cache-key, else ~/.config/neuron_dynamo/cache-key), creating it if missing, "
        "and the ids of the key files listed in cache_trusted_keys. The id is public: compare it with the id the "
        "signer's `neuron-precompile key` shows before you trust a copy of their key.")
    key.add_argument("--json", action="store_true", help="print JSON instead of text")

    selfcheck = commands.add_parser(
        "selfcheck", help="on a Trainium host: run the kernel library and two tiny models on the device and on the "
        "simulator, compare them, and write a report to attach to a bug",
        description="Run each library kernel (fp32 and bf16, small shapes) and a tiny Llama and GPT-2 on the "
        "'neuron' device through TorchNeuron and on the simulator; print per check whether the values agree within "
        "the dtype's tolerance, the largest difference, the measured device time of a warm call and the cost "
        "model's estimate. Exit status 0 when every check passes, 1 when one fails, 2 on a machine without "
        "TorchNeuron and a Neuron device (nothing is run there).")
    selfcheck.add_argument("--json", type=Path, metavar="PATH", help="also write the report as JSON to PATH")
    return parser


# ------------------------------------------------------------------------------------------------- progress
class Progress:
    """Shapes done / remaining / failed, what was compiled or found cached, and compile locks other processes hold:
    on one refreshed line on a terminal, a line per change otherwise; always on stderr (stdout is the result)."""

    def __init__(self, tasks: list[Task], calls: int, cache: CompileCache, stream: Any = None,
                 rank: int | None = None) -> None:
        self.tasks, self.calls, self.called = tasks, calls, 0
        self.cache, self.stream = cache, stream or sys.stderr
        self.shown, self.prefix = not rank, "" if rank is None else f"rank {rank}: "  # under torchrun: rank 0 only
        self.tty = self.stream.isatty()

    def update(self, called: int = 0) -> None:
        self.called += called
        if not self.shown:
            return
        done = sum(task.status == "done" for task in self.tasks)
        failed = sum(task.status == "failed" and task.calls == 0 for task in self.tasks)
        width = 24
        bar = "#" * (width * self.called // max(self.calls, 1))
        line = (f"{self.prefix}[{bar:<{width}}] done {done} / remaining {len(self.tasks) - done - failed} / "
                f"locked {len(self.cache.locks())} / failed {failed} | compiled {_total(self.tasks, 'compiled')}, "
                f"already cached {_total(self.tasks, 'cached')}")
        self.stream.write(f"\r{line}\x1b[K" if self.tty else f"{line}\n")  # [K: clear what a longer line left
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.shown:
            self.stream.write("\n")


def _total(tasks: list[Task], counter: str) -> int:
    return sum(getattr(task, counter) for task in tasks)


def check_summary_path(path: Path, flag: str = "--summary") -> None:
    """Fail now, not after an hour of compiling, if the summary cannot be written to `path`."""
    path = path.expanduser()
    fix = f"give {flag} a file in an existing, writable directory"
    if path.is_dir():
        raise PrecompileError(f"{flag} {path} is a directory; {fix}, e.g. {flag} {path / 'summary.json'}")
    if not path.parent.is_dir():
        what = "is not a directory" if path.parent.exists() else "does not exist"
        raise PrecompileError(f"{flag} {path}: the directory {path.parent} {what}; create it or {fix}")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise PrecompileError(f"{flag} {path} cannot be written ({exc.strerror or exc}); {fix}") from exc
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
    rank = tensor_parallel_rank(ns.model, ns.tp_size, ns.workers, ns.random_weights)  # None: not under torchrun
    if ns.summary is not None and not rank:  # only rank 0 writes it
        check_summary_path(ns.summary)
    check_size_flags(ns, directory_kind(ns.model))
    if resolved.cache_dir:  # -o cache_dir=... is where the compiles store: show and summarise that one
        root = Path(resolved.cache_dir).expanduser()
    if rank is None:
        return _warm(ns, root, options, rank)
    with process_group():
        return _warm(ns, root, options, rank)


def _warm(ns: argparse.Namespace, root: Path, options: dict[str, str], rank: int | None) -> int:
    """Load, plan and run; then report (rank 0 of a tensor-parallel warm reports for all ranks)."""
    device = warm_device(ns.device)  # before anything loads: --device neuron without a device is a clear error
    loaded = load_model(ns.model, ns.random_weights, tuple(ns.inputs), ns.text_len, ns.tp_size)  # before any worker
    check_size_flags(ns, loaded.sizes)
    tasks = _tasks(ns, loaded)
    cache = CompileCache(root=root)  # created only now, once the arguments are known to be usable
    stored_before = {entry.key for entry in cache.stored()}
    runs = plan(tasks, ns.dynamic, ns.train)
    for run in runs:
        for index in run.tasks:
            tasks[index].calls += 1
    settings = {"options": options, "dtype": ns.dtype, "dynamic": ns.dynamic, "random_weights": ns.random_weights,
                "inputs": tuple(ns.inputs), "text_len": ns.text_len, "tp_size": ns.tp_size,
                "device": device}
    progress = Progress(tasks, sum(len(run.tasks) for run in runs), cache, rank=rank)
    progress.update()
    start = time.perf_counter()

    def report(event: dict[str, Any]) -> None:
        record(tasks[event["task"]], event)
        progress.update(1)

    errors = _execute(ns.model, loaded, tasks, runs, settings, ns.workers, report)
    progress.close()
    for task in tasks:
        if task.status == "pending":
            task.status, task.error = "failed", task.error or "the worker stopped before finishing it"
    per_rank = None if rank is None else gather_ranks(tasks)
    if per_rank is not None:
        tasks = merge_ranks(per_rank)
    summary = _summary(ns, cache, options, tasks, runs, errors, time.perf_counter() - start, per_rank)
    totals = summary["totals"]
    totals["stored"] = len({entry.key for entry in cache.stored()} - stored_before)
    unstored = max(0, totals["compiled"] - totals["stored"])
    if not rank:  # rank 0 of a tensor-parallel warm speaks for all ranks
        _print_result(ns, summary, tasks, runs, errors)
        if unstored:
            print(f"  {unstored} compiled program(s) were not stored in {cache.root} (a full disk or a read-only file "
                  "system? see the warnings above): a later run compiles them again")
        if ns.summary:
            ns.summary.expanduser().write_text(json.dumps(summary, indent=2))
    return 1 if totals["failed"] or errors or unstored else 0


def _print_result(ns: argparse.Namespace, summary: dict[str, Any], tasks: list[Task], runs: list[Run],
                  errors: list[str]) -> None:
    totals = summary["totals"]
    ranks = f" on {ns.tp_size} ranks" if ns.tp_size else ""
    print(f"warmed {totals['done']}/{len(tasks)} shape(s) of {ns.model}{ranks} in {summary['seconds']:.1f} s "
          f"({len(runs)} compile run(s), {totals['calls']} calls): {totals['compiled']} compiled, "
          f"{totals['cached']} already cached, {totals['not_storable']} not storable, {totals['failed']} failed")
    for task in tasks:
        print(f"  {task.name()}: {task.status}, {task.compiled} compiled, {task.cached} already cached"
              + (f": {task.error}" if task.error else ""))
    for error in errors:
        print(f"  worker error: {error}")


def check_size_flags(ns: argparse.Namespace, kind: str | None) -> None:
    """--seq-lens for language models, --sizes for image models (`kind`: "seq", "image", or None: not known yet)."""
    if ns.sizes and ns.seq_lens:
        raise PrecompileError("give --seq-lens (language models) or --sizes (image models), not both")
    if kind == "seq" and ns.sizes:
        raise PrecompileError(f"{ns.model} is a language model: give it --seq-lens, not --sizes")
    if kind == "image" and ns.seq_lens:
        raise PrecompileError(f"{ns.model} is a Diffusers model: give it --sizes HxW (its latent height x width, "
                              "e.g. 64x64), not --seq-lens")


def _tasks(ns: argparse.Namespace, loaded: Loaded) -> list[Task]:
    """One task per batch size x (sequence length or HxW size); inputs the model cannot take fail here."""
    if loaded.sizes == "image":
        default = getattr(loaded.model.config, "sample_size", None) or 64
        default = tuple(default) if isinstance(default, (tuple, list)) else (default, default)
        sizes = ns.sizes or [default]
    else:
        sizes = ns.sizes or [(seq,) for seq in ns.seq_lens or [128]]
    tasks = [Task(batch, tuple(size)) for batch in ns.batch_sizes for size in sizes]
    try:
        loaded.make_inputs(tasks[0].batch_size, *tasks[0].size)  # a model whose inputs cannot be built: now
    except PrecompileError:
        raise
    except Exception:  # a shape the model does not take is reported with that shape
        pass
    return tasks


def _execute(spec: str, loaded: Loaded, tasks: list[Task], runs: list[Run], settings: dict[str, Any], workers: int,
             report: Callable[[dict[str, Any]], None]) -> list[str]:
    """Run the plan here (one worker) or over `workers` processes; returns the workers' own errors."""
    if workers == 1:
        run_plan(loaded, tasks, runs, settings, report)
        return []
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_worker, args=(spec, tasks, share_, settings, queue, os.getpid()))
                 for share_ in share(runs, tasks, workers)]
    for process in processes:
        process.start()
    running, errors = len(processes), []
    while running:
        try:
            kind, value = queue.get(timeout=1.0)
        except queue_module.Empty:
            if not any(process.is_alive() for process in processes):
                break  # a worker died without a word (killed, crashed): its tasks are reported as failed
            continue
        if kind == "call":
            report(value)
        elif kind == "error":
            errors.append(value)
        else:
            running -= 1
    for process in processes:
        process.join()
    return errors


def _die_with_parent(parent: int) -> None:
    """A worker ends when `warm` does, even by `kill -9`: Linux's parent-death signal, and a watch on the parent
    (for other systems, and for a parent that died before the signal was armed)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="neuron-precompile-parent-watch").start()


def _worker(spec: str, tasks: list[Task], runs: list[Run], settings: dict[str, Any], queue: Any,
            parent: int) -> None:
    _die_with_parent(parent)
    try:
        loaded = load_model(spec, settings["random_weights"], settings["inputs"], settings["text_len"],
                            settings["tp_size"])
        run_plan(loaded, tasks, runs, settings, lambda event: queue.put(("call", event)))
    except BaseException as exc:  # the parent reports it; a worker must always say it is finished
        queue.put(("error", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        queue.put(("exit", None))


def _summary(ns: argparse.Namespace, cache: CompileCache, options: dict[str, str], tasks: list[Task],
             runs: list[Run], errors: list[str], seconds: float,
             per_rank: list[list[Task]] | None = None) -> dict[str, Any]:
    """The JSON summary: the settings, one entry per shape, and the totals; with tensor parallel, `tasks` and
    `totals` are summed over the ranks and `ranks` holds each rank's own tasks."""
    totals = {"shapes": len(tasks), "done": sum(task.status == "done" for task in tasks),
              "failed": sum(task.status == "failed" for task in tasks), "runs": len(runs),
              "calls": sum(len(run.tasks) for run in runs),
              **{counter: _total(tasks, counter) for counter in ("compiled", "cached", "not_storable")}}
    ranks = {} if per_rank is None else {"ranks": [[task.summary() for task in shard] for shard in per_rank]}
    return {"model": ns.model, "cache_dir": str(cache.root), "options": options, "dtype": ns.dtype, "train": ns.train,
            "dynamic": ns.dynamic, "workers": ns.workers, "tp_size": ns.tp_size, "seconds": round(seconds, 3),
            "tasks": [task.summary() for task in tasks], "totals": totals, "errors": errors, **ranks}


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
    return CompileCache(root=root, mode=mode, trusted_keys=_trusted_keys())


def _trusted_keys() -> tuple[str, ...]:
    """The key files listed in $NEURON_DYNAMO_CACHE_TRUSTED_KEYS (the option cache_trusted_keys)."""
    from neuron_dynamo.options import resolve_options

    return resolve_options().cache_trusted_keys


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
    hidden = len(cache.stored()) - len(entries)
    if hidden:
        print(f"{hidden} entry file(s) not shown: they do not verify under your key or cache_trusted_keys (planted, "
              "damaged, or of an older format); `neuron-precompile verify` quarantines them")
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


def selfcheck(ns: argparse.Namespace, root: Path) -> int:
    from neuron_dynamo.toolchain import torchneuron

    if not torchneuron.runtime_available():
        print(f"neuron-precompile selfcheck: no Trainium here ({torchneuron.unavailable_reason()}); run it on a "
              "Trn2/Trn3 host with torch-neuronx installed. Nothing was run.", file=sys.stderr)
        return 2
    if ns.json is not None:
        check_summary_path(ns.json, "--json")
    from neuron_dynamo import selfcheck as checks

    report = checks.run()
    summary = report["summary"]
    print(f"selfcheck: {summary['passed']}/{summary['checks']} checks passed"
          + (f"; failed: {', '.join(summary['failed'])}" if summary["failed"] else ""))
    if ns.json is not None:
        ns.json.expanduser().write_text(json.dumps(report, indent=2))
        print(f"report written to {ns.json}")
    return 0 if not summary["failed"] else 1


def show_key(ns: argparse.Namespace, root: Path) -> int:
    from neuron_dynamo.cache_auth import key_id, read_key, user_key

    path, own, created = user_key(create=True)
    trusted = [{"path": str(Path(p).expanduser()), "key_id": key_id(read_key(Path(p).expanduser(),
                "trusted cache key file"))} for p in _trusted_keys()]
    if ns.json:
        print(json.dumps({"path": str(path), "key_id": key_id(own), "created": created, "trusted": trusted}, indent=2))
        return 0
    print(f"key file: {path}" + (" (created now, mode 0600)" if created else ""))
    print(f"key id:   {key_id(own)}")
    for item in trusted:
        print(f"trusted:  {item['key_id']}  {item['path']}")
    return 0


COMMANDS = {"warm": warm, "ls": ls, "verify": verify, "prune": prune, "clear-locks": clear_locks,
            "key": show_key, "selfcheck": selfcheck}


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
