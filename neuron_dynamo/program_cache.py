"""Static programs through the persistent compile cache: store what a compile produced, load it in a fresh process.

`compile_static` (compiler.py) hands its work to `cached_program`. On a miss the program is built (partition, lower,
compile every region) and stored as one entry; on a hit in any process the stored program is loaded *without*
partitioning, lowering or compiling anything. The entry holds:

* the partitioned program graph: the ops that run eagerly, one `call_module` per region, in graph order;
* per region either the target's compiled artifact (`target.serialize_region(compiled, lowered)`; by default the
  lowered FX graph of an in-process target, written by `encode_graph`) or, for a region whose lowering failed and
  runs eagerly, its aten graph;
* the parts of the report that depend only on the key (coverage, FLOPs, fallbacks with their reasons).

Weights are never stored: Dynamo lifts parameters into graph inputs. Tensors the graph itself holds (`get_attr`
constants) are not stored either: the key covers their content (canonical.py), and a loaded program takes them
from the graph being compiled, matched by the position of their `get_attr` node, never by attribute name.

Graphs are written as JSON node lists, not pickles: a stored op is named (`aten.mm.default`, a registry kernel by
op and target, a function of `operator`/`torch`), and loading resolves names against an allow-list, so the
program part of an entry can name code but cannot carry any. A region artifact is the target's business.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import importlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from neuron_dynamo import counters
from neuron_dynamo.cache import CacheEntry, CompileCache, default_cache_dir
from neuron_dynamo.cache_key import PROGRAM_FORMAT, program_key
from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.lowering import Kernel, kernel_for, op_name
from neuron_dynamo.options import Options

log = logging.getLogger("neuron_dynamo.program_cache")

# Modules whose functions a stored graph may call (besides aten/prims ops and registry kernels).
_ALLOWED_MODULES = ("operator", "_operator", "math", "builtins", "torch")

# The report fields that depend on the key alone; the others (name, kind, bucket, time) belong to this process.
REPORT_FIELDS = ("target", "input_shapes", "ops_total", "ops_lowered", "flops_total", "flops_lowered", "regions",
                 "fallback_ops")


class UncacheableError(NeuronDynamoError):
    """A program holds something the cache cannot write or read back (the program then runs uncached)."""


@dataclasses.dataclass
class BuiltProgram:
    """What compiling a static program produced, in the form the cache stores."""

    module: fx.GraphModule  # the partitioned program, regions as call_module submodules
    compiled: dict[str, tuple[Any, Any]]  # region name → (what target.compile_region returned, the lowered region)
    report: dict[str, Any]  # at least REPORT_FIELDS

    def module_regions(self) -> list[str]:
        """The region submodules the program calls, compiled or not."""
        return [str(node.target) for node in self.module.graph.nodes if node.op == "call_module"]


# ------------------------------------------------------------------------------------------------- graph codec
def encode_graph(graph: fx.Graph, attr_index: dict[str, int]) -> list:
    """A JSON-serialisable node list for `graph`; `attr_index` maps get_attr targets to their stable position."""
    index: dict[fx.Node, int] = {}
    nodes = []
    for position, node in enumerate(graph.nodes):
        index[node] = position
        if node.op == "get_attr":
            if node.target not in attr_index:
                raise UncacheableError(f"get_attr {node.target!r} is not a constant of the compiled graph")
            target: Any = {"attr": attr_index[node.target]}
        elif node.op in ("call_function", "call_method"):
            target = _encode_target(node.target) if node.op == "call_function" else node.target
        else:  # placeholder, call_module, output: a plain name
            target = node.target
        nodes.append([node.op, node.name, target, _encode(node.args, index), _encode(node.kwargs, index)])
    return nodes


def decode_graph(nodes: list, attr_targets: list[str]) -> fx.Graph:
    """The inverse of `encode_graph`; `attr_targets[i]` is the attribute name of the i-th constant here."""
    graph = fx.Graph()
    built: list[fx.Node] = []
    for op, name, target, args, kwargs in nodes:
        if op == "get_attr":
            target = attr_targets[target["attr"]]
        elif op == "call_function":
            target = _decode_target(target)
        node = graph.create_node(op, target, _decode(args, built), _decode(kwargs, built), name=name)
        built.append(node)
    return graph


def _encode_target(target: Any) -> dict[str, str]:
    if isinstance(target, Kernel):
        return {"kernel": op_name(target.op), "target": target.target}
    if isinstance(target, torch._ops.OpOverload):
        return {"op": op_name(target)}
    if isinstance(target, torch._ops.HigherOrderOperator):
        return {"hop": target.name()}
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if module and qualname and module.split(".")[0] in _ALLOWED_MODULES and "<" not in qualname:
        return {"function": f"{module}:{qualname}"}
    raise UncacheableError(f"cannot name the call target {target!r} in a cache entry")


def _resolve_op(name: str) -> torch._ops.OpOverload:
    namespace, rest = name.split(".", 1)
    packet, overload = rest.rsplit(".", 1)
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def _decode_target(target: dict[str, str]) -> Any:
    if "kernel" in target:
        op = _resolve_op(target["kernel"])
        kernel = kernel_for(op, target["target"])
        if kernel is None:
            raise UncacheableError(f"no {target['target']!r} kernel is registered for {target['kernel']} any more")
        return kernel.for_overload(op)
    if "op" in target:
        return _resolve_op(target["op"])
    if "hop" in target:
        return getattr(torch.ops.higher_order, target["hop"])
    module, qualname = target["function"].split(":")
    if module.split(".")[0] not in _ALLOWED_MODULES:
        raise UncacheableError(f"a cache entry names {module}.{qualname}, outside the allowed modules")
    value: Any = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


_SCALAR_TYPES = {
    "dtype": torch.dtype, "device": torch.device, "memory_format": torch.memory_format, "layout": torch.layout,
}


def _encode(value: Any, index: dict[fx.Node, int]) -> Any:
    if isinstance(value, fx.Node):
        return {"node": index[value]}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return {"float": repr(value)}  # repr round-trips exactly, inf and nan included
    if isinstance(value, list | tuple):
        return {"list" if isinstance(value, list) else "tuple": [_encode(v, index) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise UncacheableError(f"cannot store a dict argument with non-string keys: {value!r}")
        return {"dict": {k: _encode(v, index) for k, v in value.items()}}
    if isinstance(value, slice):
        return {"slice": [_encode(part, index) for part in (value.start, value.stop, value.step)]}
    for kind, cls in _SCALAR_TYPES.items():
        if isinstance(value, cls):
            return {kind: str(value)}
    raise UncacheableError(f"cannot store the graph argument {value!r} ({type(value).__name__})")


def _decode(value: Any, built: list[fx.Node]) -> Any:
    if not isinstance(value, dict):
        return value
    (kind, inner), = value.items()
    if kind == "node":
        return built[inner]
    if kind == "float":
        return float(inner)
    if kind in ("list", "tuple"):
        items = [_decode(v, built) for v in inner]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _decode(v, built) for k, v in inner.items()}
    if kind == "slice":
        return slice(*(_decode(part, built) for part in inner))
    if kind == "device":
        return torch.device(inner)
    return getattr(torch, inner.removeprefix("torch."))  # dtype, memory_format, layout


# --------------------------------------------------------------------------------------------- program codec
def _attr_targets(gm: fx.GraphModule) -> list[str]:
    """The attribute names of `gm`'s constants, in the order of their first get_attr node."""
    targets: dict[str, None] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            targets.setdefault(str(node.target))
    return list(targets)


def encode_program(built: BuiltProgram, gm: fx.GraphModule, target: Any) -> bytes:
    """The entry payload of a built program (raises UncacheableError if some part cannot be stored)."""
    attr_index = {name: i for i, name in enumerate(_attr_targets(gm))}
    regions = {}
    for node in built.module.graph.nodes:
        if node.op != "call_module":
            continue
        name = str(node.target)
        if name in built.compiled:
            compiled, lowered = built.compiled[name]
            regions[name] = {"artifact": base64.b64encode(_serialize_region(target, compiled, lowered, attr_index))
                             .decode("ascii")}
        else:  # lowering failed: the region runs its aten graph eagerly
            regions[name] = {"graph": encode_graph(getattr(built.module, name).graph, attr_index)}
    document = {
        "format": PROGRAM_FORMAT,
        "graph": encode_graph(built.module.graph, attr_index),
        "regions": regions,
        "report": {field: built.report[field] for field in REPORT_FIELDS},
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode_program(payload: bytes, gm: fx.GraphModule, target: Any, wrap: Callable[[Any], torch.nn.Module]):
    """The program module and report fields stored in `payload`, for the graph `gm` of this process."""
    document = json.loads(payload)
    if document.get("format") != PROGRAM_FORMAT:
        raise UncacheableError(f"entry format {document.get('format')!r}, expected {PROGRAM_FORMAT}")
    attr_targets = _attr_targets(gm)
    constants = {name: _get_attr(gm, name) for name in attr_targets}
    submodules: dict[str, Any] = {}
    for name, region in document["regions"].items():
        if "artifact" in region:
            submodules[name] = wrap(_load_region(target, base64.b64decode(region["artifact"]), constants))
        else:
            submodules[name] = fx.GraphModule(constants, decode_graph(region["graph"], attr_targets))
    module = fx.GraphModule({**constants, **submodules}, decode_graph(document["graph"], attr_targets))
    return module, document["report"]


def _get_attr(gm: fx.GraphModule, name: str) -> Any:
    value: Any = gm
    for part in name.split("."):
        value = getattr(value, part)
    return value


def _serialize_region(target: Any, compiled: Any, lowered: Any, attr_index: dict[str, int]) -> bytes:
    serialize = getattr(target, "serialize_region", None)
    if serialize is not None:
        return serialize(compiled, lowered)
    if isinstance(compiled, fx.GraphModule):  # an in-process target: the lowered graph *is* the compiled form
        return json.dumps(encode_graph(compiled.graph, attr_index), separators=(",", ":")).encode()
    raise UncacheableError(f"target {target.name!r} cannot serialize a compiled region of type {type(compiled)}")


def _load_region(target: Any, data: bytes, constants: dict[str, Any]) -> Any:
    load = getattr(target, "load_region", None)
    if load is not None:
        return load(data)
    return fx.GraphModule(constants, decode_graph(json.loads(data), list(constants)))


# ------------------------------------------------------------------------------------------ the cached compile
_caches: dict[tuple, CompileCache] = {}
_caches_lock = threading.Lock()
_label = threading.local()


def cache_for(options: Options) -> CompileCache:
    """The process's store for these options (one per directory, mode and limits)."""
    root = Path(options.cache_dir).expanduser() if options.cache_dir else default_cache_dir()
    max_bytes = options.cache_max_mb * 2**20 if options.cache_max_mb else None
    spec = (str(root), options.cache, max_bytes, options.cache_failure_ttl)
    with _caches_lock:
        if spec not in _caches:
            _caches[spec] = CompileCache(
                root=root, mode=options.cache, max_bytes=max_bytes, failure_ttl=float(options.cache_failure_ttl)
            )
        return _caches[spec]


@contextlib.contextmanager
def labelled(label: str) -> Iterator[None]:
    """Record `label` (e.g. the model name, by neuron-precompile) in the metadata of entries written inside."""
    previous = getattr(_label, "value", None)
    _label.value = label
    try:
        yield
    finally:
        _label.value = previous


@dataclasses.dataclass(frozen=True)
class CacheOutcome:
    """How one static program was obtained: `status` hit, miss, bypass (built, not storable) or off."""

    status: str
    seconds_saved: float = 0.0  # on a hit: the stored compile time minus the time loading took


def cached_program(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Options,
    target: Any,
    build: Callable[[], BuiltProgram],
    wrap: Callable[[Any], torch.nn.Module],
) -> tuple[BuiltProgram, CacheOutcome]:
    """The program for `gm` at these inputs, from the cache or built now, and how it was obtained.

    A hit skips `build` entirely. Cache statistics go to the process-wide counters (`cache.*` in `stats()`).
    """
    cache = cache_for(options)
    if cache.mode == "off":
        counters.bump("cache.bypasses")
        return build(), CacheOutcome("off")
    before = dataclasses.replace(cache.stats)
    start = time.perf_counter()
    key = program_key(gm, example_inputs, options, target)
    try:
        program, status, stored_seconds = _through_cache(cache, key, gm, options, target, build, wrap)
    finally:
        _publish(before, cache.stats)
    saved = max(0.0, stored_seconds - (time.perf_counter() - start)) if status == "hit" else 0.0
    counters.bump("cache.seconds_saved", saved)
    log.debug("compile cache %s for key %s… (%s)", status, key[:16], cache.root)
    return program, CacheOutcome(status, saved)


def _through_cache(cache, key, gm, options, target, build, wrap) -> tuple[BuiltProgram, str, float]:
    built_now: list[BuiltProgram] = []

    def compile_fn() -> tuple[bytes | None, dict]:
        built = build()
        built_now.append(built)
        try:
            payload = encode_program(built, gm, target)
        except Exception as exc:  # a target's serializer may refuse too: the program then runs uncached
            log.info("program not cached: %s: %s", type(exc).__name__, exc)
            return None, {}
        meta = {
            "target": target.name,
            "input_shapes": built.report["input_shapes"],
            "ops": built.report["ops_total"],
            "label": getattr(_label, "value", None),
            "failed_regions": len(built.module_regions()) - len(built.compiled),
        }
        return payload, meta

    def accept(entry: CacheEntry) -> bool:
        """A program with regions whose compile failed is a cached failure: kept for the TTL, or until a retry."""
        if not entry.meta.get("failed_regions"):
            return True
        return not options.retry_failed and time.time() - entry.created < options.cache_failure_ttl

    # An exception out of `build` is a strict-mode error or a bug, raised fast: not worth caching. Toolchain
    # failures are caught per region (the region runs eagerly) and cached through `accept`.
    entry = cache.get_or_compile(key, compile_fn, options.retry_failed, accept=accept, record_failures=False)
    if built_now:
        return built_now[0], "miss" if entry.payload is not None else "bypass", 0.0
    try:
        module, report = decode_program(entry.payload, gm, target, wrap)
    except Exception as exc:  # whatever a stored program fails with, it is a miss: never a crash, never served
        cache.discard(key, f"{type(exc).__name__}: {exc}")
        if cache.mode == "on":
            entry = cache.get_or_compile(key, compile_fn, True, accept=accept, record_failures=False)
        if built_now:
            return built_now[0], "miss" if entry.payload is not None else "bypass", 0.0
        cache.stats.misses += 1  # read-only cache, or another process rewrote the entry meanwhile
        return build(), "miss", 0.0
    stored_seconds = float(entry.meta.get("compile_seconds", 0.0))
    return BuiltProgram(module=module, compiled={}, report=report), "hit", stored_seconds


def _publish(before: Any, after: Any) -> None:
    for field in ("hits", "misses", "bypasses", "corrupt", "evicted", "lock_waits"):
        delta = getattr(after, field) - getattr(before, field)
        if delta:
            counters.bump(f"cache.{field}", delta)
