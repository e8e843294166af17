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

Graphs are written as JSON node lists by lowering/artifact.py, which decodes them as untrusted data: call targets
come from closed tables by name, so an entry can name the backend's own ops and kernels but cannot carry code or
reach anything else. A region artifact is the target's business (the in-process targets use the same codec).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves

from neuron_dynamo import counters
from neuron_dynamo.cache import CacheEntry, CompileCache, default_cache_dir, make_key
from neuron_dynamo.cache_key import PROGRAM_FORMAT, key_parts, structure_parts
from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.lowering import op_table
from neuron_dynamo.lowering.artifact import decode_graph, encode_graph
from neuron_dynamo.options import Options

log = logging.getLogger("neuron_dynamo.program_cache")

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


# A stored program may ask for tensors of at most this many times the live graph's largest (bucket padding,
# packed attention and layout copies stay well within it).
ELEMENT_MARGIN = 64


def element_bound(gm: fx.GraphModule) -> int:
    """What a stored program of `gm` may ask to allocate: a margin over the largest tensor `gm` itself holds
    (the ceiling `op_table.MAX_ELEMENTS` when a size is symbolic or the graph records none)."""
    largest = 0
    for node in gm.graph.nodes:
        for value in tree_leaves(node.meta.get("val")):
            if isinstance(value, torch.Tensor):
                try:
                    largest = max(largest, int(value.numel()))
                except (TypeError, ValueError, RuntimeError):  # symbolic
                    return op_table.MAX_ELEMENTS
    return max(ELEMENT_MARGIN * largest, 2**20) if largest else op_table.MAX_ELEMENTS


def decode_program(payload: bytes, gm: fx.GraphModule, target: Any, wrap: Callable[[Any], torch.nn.Module]):
    """The program module and report fields stored in `payload`, for the graph `gm` of this process."""
    with op_table.element_limit(element_bound(gm)):
        return _decode_program(payload, gm, target, wrap)


def _decode_program(payload: bytes, gm: fx.GraphModule, target: Any, wrap: Callable[[Any], torch.nn.Module]):
    document = json.loads(payload)
    if not isinstance(document, dict) or document.get("format") != PROGRAM_FORMAT:
        raise UncacheableError(f"not a program entry of format {PROGRAM_FORMAT}")
    regions, report = document.get("regions"), document.get("report")
    if not isinstance(regions, dict) or not isinstance(report, dict) or set(report) != set(REPORT_FIELDS):
        raise UncacheableError("a program entry without its regions or report")
    attr_targets = _attr_targets(gm)
    constants = {name: _get_attr(gm, name) for name in attr_targets}
    submodules: dict[str, Any] = {}
    for name, region in regions.items():
        if not name.isidentifier() or name in constants or not isinstance(region, dict):
            raise UncacheableError(f"a program entry with a malformed region {name!r}")
        if isinstance(region.get("artifact"), str):
            data = base64.b64decode(region["artifact"], validate=True)
            submodules[name] = wrap(_load_region(target, data, constants))
        else:
            submodules[name] = fx.GraphModule(constants, decode_graph(region.get("graph"), attr_targets))
    module = fx.GraphModule({**constants, **submodules}, decode_graph(document.get("graph"), attr_targets))
    called = {str(node.target) for node in module.graph.nodes if node.op == "call_module"}
    if not called <= set(submodules):
        raise UncacheableError(f"a program entry calls regions it does not hold: {sorted(called - set(submodules))}")
    return module, report


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
# Programs this process stored in or loaded from a cache, by structure (graph and input layout, not options).
_stored: dict[str, dict[str, CompileCache]] = {}  # structure -> {program key: its cache}
_stored_layouts: set[tuple] = set()  # their `input_layout`s: known before a graph is specialised


def cache_for(options: Options) -> CompileCache:
    """The process's store for these options (one per directory, mode and limits)."""
    root = Path(options.cache_dir).expanduser() if options.cache_dir else default_cache_dir()
    max_bytes = options.cache_max_mb * 2**20 if options.cache_max_mb else None
    spec = (str(root), options.cache, max_bytes, options.cache_failure_ttl, options.cache_lock_timeout,
            options.cache_trusted_keys)
    with _caches_lock:
        if spec not in _caches:
            _caches[spec] = CompileCache(
                root=root, mode=options.cache, max_bytes=max_bytes, failure_ttl=float(options.cache_failure_ttl),
                lock_timeout=float(options.cache_lock_timeout), strict=False, trusted_keys=options.cache_trusted_keys,
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
    """How one static program was obtained: `status` hit, miss, bypass (built, not storable), off or unusable."""

    status: str
    seconds_saved: float = 0.0  # on a hit: the stored compile time minus the time loading took
    key: str | None = None


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
    if not cache.active:
        counters.bump("cache.bypasses")
        if cache.unusable:  # warned once when the cache was opened; counted for every program it cost
            counters.bump("cache.errors")
        return build(), CacheOutcome("off" if cache.mode == "off" else "unusable")
    before = dataclasses.replace(cache.stats)
    start = time.perf_counter()
    structure = structure_parts(gm, example_inputs)  # once: the graph's canonical text costs most of the key
    key = make_key(key_parts(gm, example_inputs, options, target, structure))
    try:
        program, status, stored_seconds = _through_cache(cache, key, gm, options, target, build, wrap)
    finally:
        _publish(before, cache.stats)
    if status in ("hit", "miss"):
        _stored.setdefault(make_key(structure), {})[key] = cache
        _stored_layouts.add(input_layout(example_inputs))
    saved = max(0.0, stored_seconds - (time.perf_counter() - start)) if status == "hit" else 0.0
    counters.bump("cache.seconds_saved", saved)
    log.debug("compile cache %s for key %s… (%s)", status, key[:16], cache.root)
    return program, CacheOutcome(status, saved, key)


def has_stored_program(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether compiling `gm` at these inputs is likely a cache read: this process stored or loaded the program of an
    equal graph (`cache_key.semantic_graph`) at the same input layout, and its cache still holds it.

    Options are not compared (a different target or option is a miss, compiled as usual). Bucketed graphs ask this
    before compiling a new bucket: after sizes A then B, Dynamo's dynamic graph replaces the static graph of A, and
    at A again the program the static graph compiled serves it."""
    stored = _stored.get(make_key(structure_parts(gm, example_inputs)), {})
    return any(cache.active and cache.get(key) is not None for key, cache in stored.items())


def input_layout(example_inputs: Sequence[Any]) -> tuple:
    """The shapes and dtypes of the tensor inputs, in order: equal for any two programs `has_stored_program` finds
    equal, and known from a symbolic graph's input sizes without specialising it."""
    return tuple((tuple(x.shape), x.dtype) for x in example_inputs if isinstance(x, torch.Tensor))


def may_have_stored_program(layout: tuple) -> bool:
    """False when no program this process stored has this `input_layout`: `has_stored_program` would say no, and
    the graph need not be specialised to ask it."""
    return layout in _stored_layouts


def forget_stored_programs() -> None:
    """Forget which programs this process stored (`has_stored_program` then says no); for tests and long runs."""
    _stored.clear()
    _stored_layouts.clear()


def discard_program(options: Options, key: str, reason: str) -> None:
    """Quarantine the entry of a program that loaded but failed at run time, so that it is compiled again."""
    counters.bump("cache.runtime_failures")
    cache = cache_for(options)
    before = dataclasses.replace(cache.stats)
    cache.discard(key, reason)
    _publish(before, cache.stats)


def _through_cache(cache, key, gm, options, target, build, wrap) -> tuple[BuiltProgram, str, float]:
    built_now: list[BuiltProgram] = []

    def compile_fn() -> tuple[bytes | None, dict]:
        built = build()
        built_now.append(built)
        try:
            payload = encode_program(built, gm, target)
            decode_program(payload, gm, target, wrap)  # stored only if it reads back: an entry must be able to hit
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

    loaded: list[tuple[fx.GraphModule, dict]] = []

    def accept(entry: CacheEntry) -> bool:
        """A hit is an entry that decodes into a program, and whose failed regions (a cached failure) may wait.

        Whatever a stored program fails to decode with, it is not served and never a crash: it is quarantined and
        compiled again (in a read-only cache: compiled without it)."""
        if entry.meta.get("failed_regions") and (
                options.retry_failed or time.time() - entry.created >= options.cache_failure_ttl):
            return False
        try:
            loaded.append(decode_program(entry.payload, gm, target, wrap))
        except Exception as exc:
            cache.discard(key, f"{type(exc).__name__}: {exc}")
            return False
        return True

    # An exception out of `build` is a strict-mode error or a bug, raised fast: not worth caching. Toolchain
    # failures are caught per region (the region runs eagerly) and cached through `accept`.
    entry = cache.get_or_compile(key, compile_fn, options.retry_failed, accept=accept, record_failures=False)
    if built_now:
        return built_now[0], "miss" if entry.payload is not None else "bypass", 0.0
    module, report = loaded[-1]
    return BuiltProgram(module=module, compiled={}, report=report), "hit", float(entry.meta.get("compile_seconds", 0.0))


def _publish(before: Any, after: Any) -> None:
    for field in ("hits", "misses", "bypasses", "corrupt", "unauthenticated", "evicted", "lock_waits",
                  "lock_timeouts", "errors"):
        delta = getattr(after, field) - getattr(before, field)
        if delta:
            counters.bump(f"cache.{field}", delta)
