"""The warm-up behind `neuron-precompile warm`: load a model, plan the compiles a real run makes, run them.

A real run compiles by what Dynamo sees, in the order it sees it: its first call is a static graph, and under
`dynamic=None` (auto) a later call that changes some dimensions recompiles a graph dynamic in exactly those. So the
plan is a list of *runs*, each a sequence of shapes through one fresh `torch.compile`, as one process of the real run
would call them; together they produce every graph × bucket any order of the given shapes can produce. Each call's
cache counters are attributed to its shape, which is what the progress line and the summary report.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_dynamo.errors import NeuronDynamoError

DYNAMIC = {"auto": None, "true": True, "false": False}
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
COUNTERS = {"cache.misses": "compiled", "cache.hits": "cached", "cache.bypasses": "not_storable"}


class PrecompileError(NeuronDynamoError):
    """A command-line argument the tool cannot use."""


# ------------------------------------------------------------------------------------------------ the model
@dataclass
class Loaded:
    """A model and how to call it: `make_inputs(batch_size, *size)` gives positional args or a dict of kwargs."""

    model: Any
    make_inputs: Callable[..., Any]
    label: str
    sizes: str  # "seq" (size = (seq_len,)) or "image" (size = (height, width))


FACTORY_CONTRACT = ("a factory must return (model, make_inputs): the model (a torch.nn.Module) and a function "
                    "make_inputs(batch_size, seq_len) giving its positional args or a dict of keyword args")


def load_model(spec: str, random_weights: bool = False, inputs: tuple[str, ...] = ("input_ids",),
               text_len: int | None = None, tp_size: int | None = None) -> Loaded:
    """The model of a factory, a Transformers directory or a Diffusers model directory; errors say what to fix.
    With `tp_size` (under torchrun, see `tensor_parallel_rank`) a Transformers directory loads sharded."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PrecompileError(f"{path} holds no config.json, so it is no Hugging Face model directory; give the "
                                  "directory of a saved model (config.json, weights optional) or "
                                  "`package.module:factory`")
        if _diffusers_class_name(path):
            return _load_diffusers(path, random_weights, text_len)
        return _load_transformers(path, random_weights, inputs, tp_size)
    module_name, sep, factory_name = spec.partition(":")
    if not sep or not factory_name:
        looks_like_a_path = "/" in spec or spec.startswith(".")
        raise PrecompileError(f"model {spec!r} is neither a directory nor `package.module:factory`"
                              + (f" (there is no {path}: check the path)" if looks_like_a_path else ""))
    return _load_factory(spec, module_name, factory_name)


def _load_factory(spec: str, module_name: str, factory_name: str) -> Loaded:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: a factory next to the user's script
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
    except (ImportError, AttributeError) as exc:
        raise PrecompileError(f"cannot load the model factory {spec!r}: {one_line(exc)}") from exc
    except Exception as exc:  # the module itself raised while importing
        raise PrecompileError(f"importing {module_name!r} for the model factory {spec!r} raised "
                              f"{one_line(exc)}; fix the module so that it imports") from exc
    if not callable(factory):
        raise PrecompileError(f"{spec!r} is not a function (it is of type {type(factory).__name__}): "
                              f"{FACTORY_CONTRACT}")
    try:
        made = factory()
    except Exception as exc:
        raise PrecompileError(f"the model factory {spec!r} raised {one_line(exc)}; fix the factory (it is "
                              "called with no arguments and must return (model, make_inputs))") from exc
    problem = _factory_result_problem(made)
    if problem:
        raise PrecompileError(f"the model factory {spec!r} returned {problem}: {FACTORY_CONTRACT}")
    model, make_inputs = made
    return Loaded(model, make_inputs, spec, "any")


def one_line(exc: BaseException) -> str:
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


def _has_weights(path: Path) -> bool:
    return any(path.glob("*.safetensors")) or any(path.glob("*.bin"))


def _build(path: Path, random_weights: bool, from_config: Callable[[], Any], from_pretrained: Callable[[], Any]):
    """The model from its config (no weights, or --random-weights) or from its weights, with an error that helps."""
    use_config = random_weights or not _has_weights(path)
    try:
        return from_config() if use_config else from_pretrained()
    except Exception as exc:
        how = "from its config" if use_config else "from its weights"
        raise PrecompileError(f"cannot build the model of {path} {how}: {one_line(exc)}"
                              + ("" if use_config else "; pass --random-weights to build it from config.json alone")
                              ) from exc


def _load_transformers(path: Path, random_weights: bool, inputs: tuple[str, ...], tp_size: int | None) -> Loaded:
    import torch

    try:
        import transformers
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    except ImportError as exc:
        raise PrecompileError(f"warming a Hugging Face directory needs transformers: {one_line(exc)}; "
                              "`pip install transformers`, or give a `package.module:factory`") from exc
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as exc:  # malformed JSON, no or an unknown model_type, a transformers too old for it
        raise PrecompileError(f"cannot read the model config {path / 'config.json'}: {one_line(exc)}. It must be "
                              "valid JSON with a `model_type` this transformers knows (see AutoConfig), as written "
                              "by save_pretrained()") from exc
    # The class that saved the directory (config.architectures), as from_pretrained's user gets it; BertModel's
    # directory must not become a BertLMHeadModel because BERT also has a causal-LM head.
    saved = next(iter(getattr(config, "architectures", None) or ()), None)
    auto = getattr(transformers, saved, None) if saved else None
    if auto is None:
        auto = AutoModelForCausalLM if type(config) in AutoModelForCausalLM._model_mapping else AutoModel
    from_config = auto.from_config if hasattr(auto, "from_config") else auto  # an Auto class, or the saved class
    # As the real tensor-parallel run loads it: each rank builds its shard (tensor_parallel_rank checked the weights)
    sharded = {"distributed_config": transformers.DistributedConfig(tp_size=tp_size)} if tp_size else {}
    model = _build(path, random_weights, lambda: from_config(config), lambda: auto.from_pretrained(path, **sharded))
    causal = type(model) in AutoModelForCausalLM._model_mapping.values()

    def make_inputs(batch_size: int, seq_len: int) -> dict[str, Any]:
        ids = torch.randint(0, config.vocab_size, (batch_size, seq_len))
        given = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
                 "position_ids": torch.arange(seq_len).expand(batch_size, seq_len)}
        return {**{name: given[name] for name in inputs}, **({"labels": ids} if causal and model.training else {})}

    return Loaded(model, make_inputs, getattr(config, "_name_or_path", "") or path.name, "seq")


def directory_kind(spec: str) -> str | None:
    """"image" or "seq" for a model directory, read from its config.json alone (so that flags meant for the other
    kind of model are refused before any weights load); None for a factory, known once it is called."""
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        return None
    return "image" if _diffusers_class_name(path) else "seq"


# --------------------------------------------------------------------------------------------- Diffusers
def _diffusers_class_name(path: Path) -> str:
    """The Diffusers model class a config.json names (`_class_name`), or '' for a Transformers config."""
    import json

    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return ""  # Transformers' reader reports the broken file
    return config.get("_class_name", "") if isinstance(config, dict) and "_diffusers_version" in config else ""


def _flux_inputs(config: Any, batch: int, height: int, width: int, text_len: int, dtype: Any) -> dict[str, Any]:
    """As FluxPipeline calls its transformer: packed latents of height x width tokens and their ids."""
    import torch

    img_ids = torch.zeros(height * width, 3, dtype=dtype)
    img_ids[:, 1] = torch.arange(height).repeat_interleave(width)
    img_ids[:, 2] = torch.arange(width).repeat(height)
    inputs = dict(
        hidden_states=torch.randn(batch, height * width, config.in_channels, dtype=dtype),
        encoder_hidden_states=torch.randn(batch, text_len, config.joint_attention_dim, dtype=dtype),
        pooled_projections=torch.randn(batch, config.pooled_projection_dim, dtype=dtype),
        timestep=torch.full((batch,), 0.5, dtype=dtype), img_ids=img_ids,
        txt_ids=torch.zeros(text_len, 3, dtype=dtype), return_dict=False)
    if config.guidance_embeds:
        inputs["guidance"] = torch.full((batch,), 3.5)
    return inputs


def _sd3_inputs(config: Any, batch: int, height: int, width: int, text_len: int, dtype: Any) -> dict[str, Any]:
    """As StableDiffusion3Pipeline calls its transformer: latents (batch, channels, height, width)."""
    import torch

    return dict(hidden_states=torch.randn(batch, config.in_channels, height, width, dtype=dtype),
                encoder_hidden_states=torch.randn(batch, text_len, config.joint_attention_dim, dtype=dtype),
                pooled_projections=torch.randn(batch, config.pooled_projection_dim, dtype=dtype),
                timestep=torch.full((batch,), 500.0), return_dict=False)


def _unet_inputs(config: Any, batch: int, height: int, width: int, text_len: int, dtype: Any) -> dict[str, Any]:
    """As StableDiffusionPipeline calls its UNet: latents, a scalar timestep, the text encoder's states."""
    import torch

    if config.addition_embed_type is not None:
        raise PrecompileError(f"a UNet with addition_embed_type={config.addition_embed_type!r} (SDXL-like) needs "
                              "added_cond_kwargs that this tool does not build; warm it with a "
                              "`package.module:factory`")
    return dict(sample=torch.randn(batch, config.in_channels, height, width, dtype=dtype), timestep=torch.tensor(500),
                encoder_hidden_states=torch.randn(batch, text_len, config.cross_attention_dim, dtype=dtype),
                return_dict=False)


# class name -> (inputs, the text length its pipeline passes by default)
DIFFUSERS_INPUTS = {"FluxTransformer2DModel": (_flux_inputs, 512), "SD3Transformer2DModel": (_sd3_inputs, 333),
                    "UNet2DConditionModel": (_unet_inputs, 77)}


def _load_diffusers(path: Path, random_weights: bool, text_len: int | None) -> Loaded:
    name = _diffusers_class_name(path)
    if name not in DIFFUSERS_INPUTS:
        raise PrecompileError(f"{path} holds a Diffusers {name}, whose inputs this tool cannot build (it knows "
                              f"{', '.join(DIFFUSERS_INPUTS)}); warm it with a `package.module:factory`")
    try:
        model_class = getattr(importlib.import_module("diffusers"), name)
    except (ImportError, AttributeError) as exc:
        raise PrecompileError(f"warming the Diffusers model in {path} needs diffusers with {name}: {one_line(exc)}; "
                              "`pip install diffusers`, or give a `package.module:factory`") from exc
    model = _build(path, random_weights, lambda: model_class.from_config(model_class.load_config(path)),
                   lambda: model_class.from_pretrained(path))
    inputs, default_text_len = DIFFUSERS_INPUTS[name]

    def make_inputs(batch_size: int, height: int, width: int) -> dict[str, Any]:
        return inputs(model.config, batch_size, height, width, text_len or default_text_len, model.dtype)

    return Loaded(model, make_inputs, path.name, "image")


# -------------------------------------------------------------------------------------------------- the plan
@dataclass
class Task:
    """One input shape, and what warming it did: compiled, found already cached, failed."""

    batch_size: int
    size: tuple[int, ...]  # (seq_len,) or (height, width)
    status: str = "pending"  # pending, done, failed
    compiled: int = 0
    cached: int = 0
    not_storable: int = 0
    calls: int = 0  # calls of this shape still to run, over all runs
    seconds: float = 0.0
    error: str = ""

    def name(self) -> str:
        size = f"seq {self.size[0]}" if len(self.size) == 1 else "x".join(map(str, self.size))
        return f"batch {self.batch_size} x {size}"

    def summary(self) -> dict[str, Any]:
        size = {"seq_len": self.size[0]} if len(self.size) == 1 else dict(zip(("height", "width"), self.size,
                                                                              strict=True))
        return {"batch_size": self.batch_size, **size, "status": self.status, "compiled": self.compiled,
                "cached": self.cached, "not_storable": self.not_storable, "seconds": round(self.seconds, 3),
                "error": self.error}


@dataclass
class Run:
    """Shapes (indices into the tasks) called in order through one fresh torch.compile, in one mode."""

    train: bool
    tasks: list[int] = field(default_factory=list)


def plan(tasks: list[Task], dynamic: str, train: bool) -> list[Run]:
    """The runs that compile what any real run over these shapes compiles (see the module docstring)."""
    modes = [False, True] if train else [False]
    every = list(range(len(tasks)))
    if dynamic == "false":
        sequences = [[i] for i in every]
    elif dynamic == "true":  # each shape as the first call: Dynamo traces the graph at it (see below)
        sequences = [[i] + [j for j in every if j != i] for i in every]
    else:  # each shape as a first call, unless a changing sequence already starts with it (the same static graph)
        changing = list(_changing_sequences(tasks))
        sequences = [[i] for i in every if all(sequence[0] != i for sequence in changing)] + changing
    return [Run(mode, sequence) for mode in modes for sequence in sequences]


def _changing_sequences(tasks: list[Task]) -> Iterator[list[int]]:
    """For each set of dimensions a run can see change (with the others fixed at some value), and each shape of that
    group as the call that makes the change: a first call that differs from it in every dimension of the set, that
    shape (Dynamo traces the dynamic graph at it: some models trace differently at another size), then every shape
    of the group, so that the dynamic graph serves each (in its bucket)."""
    values = [task_dims(task) for task in tasks]
    varying = [d for d in range(len(values[0])) if len({v[d] for v in values}) > 1]
    for count in range(1, len(varying) + 1):
        for changing in itertools.combinations(varying, count):
            groups: dict[tuple, list[int]] = {}
            for i, v in enumerate(values):
                groups.setdefault(tuple(x for d, x in enumerate(v) if d not in changing), []).append(i)
            for group in groups.values():
                for second in group:
                    first = next((i for i in group if all(values[i][d] != values[second][d] for d in changing)), None)
                    if first is not None:
                        yield [first, second] + [i for i in group if i != second]


def task_dims(task: Task) -> tuple[int, ...]:
    return (task.batch_size, *task.size)


# ---------------------------------------------------------------------------------------------- running it
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


def cache_counters() -> dict[str, float]:
    import neuron_dynamo

    return {name: value for name, value in neuron_dynamo.stats().items() if name.startswith("cache.")}


def run_plan(loaded: Loaded, tasks: list[Task], runs: list[Run], settings: dict[str, Any],
             report: Callable[[dict[str, Any]], None]) -> None:
    """Run `runs` in this process; `report` gets one event per call: the task, its counters, seconds and error."""
    import torch

    from neuron_dynamo.bucket_dispatch import forget_generalized_graphs
    from neuron_dynamo.program_cache import labelled

    device = settings.get("device", "cpu")
    model = loaded.model.to(getattr(torch, settings["dtype"])).to(device)
    dynamic = DYNAMIC[settings["dynamic"]]
    with labelled(loaded.label):
        for run in runs:
            # What a fresh process would compile, not what an earlier run left in Dynamo or in the backend (the
            # programs a bucketed graph may take instead of compiling its bucket are those of this run only)
            torch._dynamo.reset()
            forget_generalized_graphs()
            compiled = torch.compile(model, backend="neuron_dynamo", options=dict(settings["options"]),
                                     dynamic=dynamic)
            model.train(run.train)
            for index in run.tasks:
                report(_one_call(compiled, model, loaded, tasks[index], run.train, device) | {"task": index})


def warm_device(choice: str) -> str:
    """`--device`: auto is the `neuron` device where TorchNeuron has one (its NEFF cache fills too), else the CPU."""
    from neuron_dynamo.toolchain import torchneuron

    if choice == "auto":
        return "neuron" if torchneuron.runtime_available() else "cpu"
    if choice == "neuron":
        torchneuron.runtime()  # raises, saying why, where TorchNeuron has no device
    return choice


def _one_call(compiled: Any, model: Any, loaded: Loaded, task: Task, train: bool, device: str = "cpu"
              ) -> dict[str, Any]:
    """One call of the compiled model at the task's shape; a failure is reported, not raised (the others go on)."""
    import torch
    from torch.utils._pytree import tree_map

    before, start, error = cache_counters(), time.perf_counter(), ""
    try:
        torch.manual_seed(0)
        inputs = loaded.make_inputs(task.batch_size, *task.size)
        if device != "cpu":
            inputs = tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, inputs)
        if train:
            _loss(_call(compiled, inputs)).backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                _call(compiled, inputs)
    except Exception as exc:  # one failed shape must not stop the others: it is reported in the summary
        error = f"{type(exc).__name__}: {exc}"
    after = cache_counters()
    counts = {short: after.get(name, 0) - before.get(name, 0) for name, short in COUNTERS.items()}
    return {**counts, "seconds": time.perf_counter() - start, "error": error}


def record(task: Task, event: dict[str, Any]) -> None:
    """Add one call's outcome to its task; the task is finished when its last call is in."""
    for short in COUNTERS.values():
        setattr(task, short, getattr(task, short) + event[short])
    task.seconds += event["seconds"]
    task.calls -= 1
    if event["error"] and not task.error:
        task.status, task.error = "failed", event["error"]
    if task.calls == 0 and task.status == "pending":
        task.status = "done"


def share(runs: list[Run], tasks: list[Task], workers: int) -> list[list[Run]]:
    """Runs over `workers` processes, longest first onto the least loaded: a run's calls stay in one process."""
    shares: list[list[Run]] = [[] for _ in range(min(workers, len(runs)))]
    loads = [0] * len(shares)
    for run in sorted(runs, key=lambda run: -len(run.tasks)):
        least = loads.index(min(loads))
        shares[least].append(run)
        loads[least] += len(run.tasks)
    return shares


# ------------------------------------------------------------------------------------------- tensor parallel
def tensor_parallel_rank(spec: str, tp_size: int | None, workers: int, random_weights: bool) -> int | None:
    """This process's rank when warming a tensor-parallel model under torchrun (`--tp-size`), else None.

    Each rank traces its own shard, and the shards' graphs differ (a vocab-parallel embedding bakes its rank's vocab
    offset into the graph as constants), so every rank warms its own keys, running the same plan in step with the
    others: the graphs' collectives need every rank. Refused here, before anything loads: a setting that would warm
    graphs the real run never compiles."""
    world = os.environ.get("WORLD_SIZE")
    if tp_size is None:
        if world is not None and int(world) > 1:
            raise PrecompileError(f"this runs under torchrun (WORLD_SIZE={world}) without --tp-size, so every rank "
                                  "would warm the same unsharded model: for a tensor-parallel model pass --tp-size "
                                  f"{world}; otherwise run neuron-precompile without torchrun (--workers N spreads "
                                  "the compiles over processes)")
        return None
    command = f"torchrun --nproc-per-node={tp_size} -m neuron_dynamo.cli warm {spec} --tp-size {tp_size} ..."
    if world is None:
        raise PrecompileError(f"--tp-size {tp_size} warms the graphs of {tp_size} ranks, one process each: run it "
                              f"under torchrun, `{command}`")
    if int(world) != tp_size:
        raise PrecompileError(f"--tp-size {tp_size} does not match torchrun's world size {world}: the model is "
                              f"sharded over all ranks; start `{command}`")
    if workers != 1:
        raise PrecompileError("--workers does not combine with --tp-size: under torchrun each rank is the worker "
                              "that warms its own shard; drop --workers")
    if directory_kind(spec) != "seq":
        raise PrecompileError(f"--tp-size loads a Transformers model directory with DistributedConfig(tp_size=N), "
                              f"and {spec} is not one; warm a directory written by save_pretrained()")
    if random_weights or not _has_weights(Path(spec).expanduser()):
        raise PrecompileError(f"--tp-size loads {spec} as the tensor-parallel run does, with from_pretrained(..., "
                              "distributed_config=...), which needs its weights: "
                              + ("drop --random-weights" if random_weights else "save them there with "
                                 "save_pretrained()"))
    return int(os.environ["RANK"])


@contextlib.contextmanager
def process_group() -> Iterator[None]:
    """torch.distributed's default group over torchrun's ranks (gloo on CPU), as the real run has it."""
    import torch.distributed as dist

    dist.init_process_group()
    try:
        yield
    finally:
        dist.destroy_process_group()


def gather_ranks(tasks: list[Task]) -> list[list[Task]]:
    """Every rank's tasks, by rank (on every rank: all of them exit with the same status)."""
    import torch.distributed as dist

    per_rank: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, tasks)
    return per_rank


def merge_ranks(per_rank: list[list[Task]]) -> list[Task]:
    """One task per shape over all ranks: counters summed (each rank stores its own shard's programs), the slowest
    rank's seconds, failed if it failed on any rank (with the first failed rank's error)."""
    merged = []
    for shards in zip(*per_rank, strict=True):
        task = Task(shards[0].batch_size, shards[0].size, status="done", seconds=max(s.seconds for s in shards))
        for rank, shard in enumerate(shards):
            for counter in COUNTERS.values():
                setattr(task, counter, getattr(task, counter) + getattr(shard, counter))
            if shard.status != "done" and task.status == "done":
                task.status, task.error = "failed", f"rank {rank}: {shard.error}"
        merged.append(task)
    return merged
