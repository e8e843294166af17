"""compile_graph: one AOTAutograd graph (forward, backward or inference) → a CompiledGraph.

A graph may carry symbolic dims; Trainium needs static shapes, so `compile_graph` only prepares, and each static
specialisation is built lazily at its first call by `compile_static`: partition for the target, lower and compile
each region, and report what happened. Bucketing plugs in between the two (choose the static shapes to build).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from neuron_dynamo import counters
from neuron_dynamo.bucket_dispatch import bucket_config, bucketed_graph, generalized_bucketed_graph
from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.lowering import lower_region, op_name
from neuron_dynamo.options import OptionError, Options
from neuron_dynamo.output_layout import EagerLayout
from neuron_dynamo.passes.bucketing import BucketingError
from neuron_dynamo.passes.decompose_fallbacks import decompose_fallbacks
from neuron_dynamo.passes.flops import node_flops
from neuron_dynamo.passes.partition import (
    LOWERING_FAILED,
    UNSUPPORTED_DTYPE,
    UNSUPPORTED_OP,
    Fallback,
    is_compute_op,
    partition,
)
from neuron_dynamo.program_cache import REPORT_FIELDS, BuiltProgram, cached_program, discard_program
from neuron_dynamo.runtime import CompiledGraph, EagerFallback, StaticProgram
from neuron_dynamo.toolchain import Target, resolve_target

log = logging.getLogger("neuron_dynamo.compiler")

_graph_ids = itertools.count()


class FallbackError(NeuronDynamoError):
    """With fallback="error": an op the target cannot run, or a region whose lowering failed."""


@dataclasses.dataclass
class GraphReport:
    """What happened to one static program: coverage, FLOPs, regions, fallbacks and the time it took."""

    name: str
    kind: str
    target: str
    input_shapes: list[list[int]]
    ops_total: int
    ops_lowered: int
    flops_total: int
    flops_lowered: int
    regions: int
    fallback_ops: list[dict[str, Any]]  # {"op", "reason", "count"}, in order of first appearance
    compile_seconds: float
    bucket: str = ""  # bucketing: the bucket this program serves, e.g. "bucket[s0=128]" ("" when not bucketed)
    bucket_stats: Any = None  # bucketing: the live BucketStats of the graph (calls per bucket, waste, refusals)
    cache: str = ""  # compile cache: hit, miss, bypass (not storable) or off
    cache_seconds_saved: float = 0.0  # compile cache: on a hit, the stored compile time minus the load time
    estimated_device_ns: float | None = None  # lowering: the cost model's device time of the last run (simulator)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def next_graph_name() -> str:
    """A process-unique name for one Dynamo graph; its forward and backward share it."""
    return f"graph_{next(_graph_ids)}"


def _is_symbolic(value: Any) -> bool:
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(size, torch.SymInt) for size in value.shape)
    return False


def is_static(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """No symbolic dim anywhere in the inputs (Dynamo's `dynamic=False`, or shapes it chose to specialise)."""
    placeholders = [node.meta.get("val") for node in gm.graph.nodes if node.op == "placeholder"]
    return not any(_is_symbolic(value) for value in [*example_inputs, *placeholders])


def specialize(gm: fx.GraphModule, args: Sequence[Any]) -> fx.GraphModule:
    """Retrace `gm` for the concrete shapes and integer values of `args`: a static aten graph with `val` metadata."""
    with torch.no_grad():
        # Graph constants (get_attr) are real tensors: allow them next to the fake inputs.
        return make_fx(fx.Interpreter(gm).run, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)


def _ensure_metadata(gm: fx.GraphModule, args: Sequence[Any]) -> None:
    """Hand-built graphs lack the `val` metadata that AOTAutograd records; propagate fake tensors to add it."""
    if all("val" in node.meta for node in gm.graph.nodes if node.op == "call_function"):
        return
    with torch.no_grad():
        FakeTensorProp(gm, mode=FakeTensorMode(allow_non_fake_inputs=True)).propagate(*args)


def _decomposed(gm: fx.GraphModule, target: Target, options: Options) -> fx.GraphModule:
    """A copy of `gm` where the ops the target cannot run whole but can run as their decomposition are decomposed
    (`passes/decompose_fallbacks.py`); `gm` itself when there are none."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, val_map={}))
    copy = fx.GraphModule(gm, graph)
    return copy if decompose_fallbacks(copy, target, options.eager_ops) else gm


def _check_strict(fallbacks: list[Fallback], options: Options, name: str) -> None:
    blocking = [f for f in fallbacks if f.reason.startswith((UNSUPPORTED_OP, UNSUPPORTED_DTYPE))]
    if options.fallback == "error" and blocking:
        details = "; ".join(f"{f.op} ({f.reason}, node {f.node})" for f in blocking)
        raise FallbackError(
            f"{name}: the target {options.target!r} cannot run {details}. With fallback='error' nothing runs "
            "eagerly: use fallback='eager', or list the op in eager_ops to run it with PyTorch on purpose."
        )


def _region_inputs(region: fx.GraphModule) -> list[Any]:
    return [node.meta.get("val") for node in region.graph.nodes if node.op == "placeholder"]


def compile_static(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Options,
    target: Target,
    *,
    name: str = "graph",
    kind: str = "inference",
) -> StaticProgram:
    """Compile ONE static specialisation, or load it from the persistent compile cache (program_cache.py)."""
    start = time.perf_counter()
    build = lambda: _build_static(gm, example_inputs, options, target, name)  # noqa: E731 - runs on a miss only
    built, outcome = cached_program(gm, example_inputs, options, target, build, _as_module)
    report = GraphReport(
        name=name, kind=kind, **{field: built.report[field] for field in REPORT_FIELDS},
        compile_seconds=time.perf_counter() - start, cache=outcome.status, cache_seconds_saved=outcome.seconds_saved,
    )
    _count(report)
    _watch_device_time(built.module, report)
    if outcome.status != "hit":
        return StaticProgram(built.module, report)

    # The caller lets go of the inputs after the call (boxed calling convention): keep their layout, not them.
    layouts = [(x.shape, x.stride(), x.dtype, x.device) if isinstance(x, torch.Tensor) else x for x in example_inputs]

    def recover(reason: str) -> StaticProgram:
        discard_program(options, outcome.key, f"failed at run time: {reason}")
        inputs = [torch.empty_strided(*spec[:2], dtype=spec[2], device=spec[3]) if isinstance(spec, tuple) else spec
                  for spec in layouts]
        return compile_static(gm, inputs, options, target, name=name, kind=kind)

    return StaticProgram(built.module, report, recover)


def _watch_device_time(module: fx.GraphModule, report: GraphReport) -> None:
    """Regions that estimate their device time (the simulator's) refresh the report's figure after each run."""
    regions = [child for child in module.children() if hasattr(child, "last_device_ns")]
    if not regions:
        return

    def refresh(ran: Any) -> None:
        report.estimated_device_ns = sum(region.last_device_ns for region in regions)
        counters.bump(f"estimated_device_ns.{report.name}.{report.kind}", ran.last_device_ns)

    for region in regions:
        region.on_run = refresh


def _build_static(
    gm: fx.GraphModule, example_inputs: Sequence[Any], options: Options, target: Target, name: str
) -> BuiltProgram:
    """Partition `gm`, lower and compile each region, and work out the report's coverage figures."""
    _ensure_metadata(gm, example_inputs)
    gm = _decomposed(gm, target, options)
    parted = partition(gm, target, eager_ops=options.eager_ops, min_region_size=options.min_region_size)
    _check_strict(parted.fallbacks, options, name)

    fallbacks = list(parted.fallbacks)
    lowered_nodes: set[str] = set()
    compiled_regions: dict[str, tuple[Any, fx.GraphModule]] = {}
    for region_name, node_names in parted.regions.items():
        region = getattr(parted.module, region_name)
        try:
            lowered = lower_region(region, target.name)
            compiled = target.compile_region(lowered, _region_inputs(region))
        except Exception as exc:  # a lowering failure is a fallback with its reason, unless fallback="error"
            if options.fallback == "error":
                raise FallbackError(f"{name}: lowering {region_name} for {target.name!r} failed: {exc}") from exc
            log.warning("%s: lowering %s failed, running it eagerly: %s", name, region_name, exc)
            counters.bump("regions_failed")
            reason = f"{LOWERING_FAILED} ({type(exc).__name__}: {exc})"
            fallbacks.extend(_region_fallbacks(gm, node_names, reason))
            continue
        parted.module.add_submodule(region_name, _as_module(compiled))
        lowered_nodes.update(node_names)
        compiled_regions[region_name] = (compiled, lowered)
    parted.module.recompile()

    report = _report(gm, example_inputs, target.name, fallbacks, lowered_nodes, name, "")
    report.regions = len(compiled_regions)
    return BuiltProgram(parted.module, compiled_regions, report.to_dict())


def _as_module(compiled: Any) -> torch.nn.Module:
    """A compiled region as a submodule of the program graph."""
    return compiled if isinstance(compiled, torch.nn.Module) else _CallableModule(compiled)


class _CallableModule(torch.nn.Module):
    """Lets a compiled region that is a plain callable sit in the graph as a submodule."""

    def __init__(self, run: Any) -> None:
        super().__init__()
        self.run = run

    def forward(self, *args: Any) -> Any:
        return self.run(*args)


def _region_fallbacks(gm: fx.GraphModule, node_names: list[str], reason: str) -> list[Fallback]:
    nodes = {node.name: node for node in gm.graph.nodes}
    return [Fallback(n, op_name(nodes[n].target), reason) for n in node_names if is_compute_op(nodes[n])]


def _report(gm, example_inputs, target_name, fallbacks, lowered_nodes, name, kind) -> GraphReport:
    ops_total = ops_lowered = flops_total = flops_lowered = 0
    for node in gm.graph.nodes:
        if not is_compute_op(node):
            continue
        flops = node_flops(node)
        ops_total += 1
        flops_total += flops
        if node.name in lowered_nodes:
            ops_lowered += 1
            flops_lowered += flops
    counts = Counter((f.op, f.reason) for f in fallbacks)
    return GraphReport(
        name=name,
        kind=kind,
        target=target_name,
        input_shapes=[list(arg.shape) for arg in example_inputs if isinstance(arg, torch.Tensor)],
        ops_total=ops_total,
        ops_lowered=ops_lowered,
        flops_total=flops_total,
        flops_lowered=flops_lowered,
        regions=0,
        fallback_ops=[{"op": op, "reason": reason, "count": count} for (op, reason), count in counts.items()],
        compile_seconds=0.0,
    )


def _count(report: GraphReport) -> None:
    counters.bump("programs_compiled")
    counters.bump("regions_compiled", report.regions)
    counters.bump("ops_total", report.ops_total)
    counters.bump("ops_lowered", report.ops_lowered)
    counters.bump("fallback_ops", sum(entry["count"] for entry in report.fallback_ops))
    for entry in report.fallback_ops:  # by op and kind of reason: stats() names every op that ran eagerly
        counters.bump(f"fallback_ops.{entry['op']} ({entry['reason'].split(' (', 1)[0]})", entry["count"])
    counters.bump("compile_seconds", report.compile_seconds)
    log.info(
        "%s %s: %d/%d ops lowered in %d region(s), %d fallback op(s)%s, %.3f s",
        report.name, report.kind, report.ops_lowered, report.ops_total, report.regions,
        sum(entry["count"] for entry in report.fallback_ops),
        "".join(f"; {entry['op']}: {entry['reason']}" for entry in report.fallback_ops), report.compile_seconds,
    )


def compile_graph(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Options,
    *,
    name: str | None = None,
    kind: str = "inference",
) -> EagerFallback:
    """Prepare an aten graph (possibly symbolic) for running; static programs are compiled lazily per shape.

    Whatever fails in the backend on the way (bucketing, compiling, running) makes the graph run eagerly, with a
    warning and a report, unless fallback="error".
    """
    target = resolve_target(options.target, options, example_inputs)
    name = name or next_graph_name()
    counters.bump(f"graphs_compiled.{kind}")
    strict = options.fallback == "error"
    static = is_static(gm, example_inputs)
    compiled = _bucketed(gm, static, options, target, name, kind, strict) if options.bucketing else None
    if compiled is None:
        compiled = _per_shape(gm, static, options, target, name, kind)

    def on_failure(reason: str, inputs: Sequence[Any]) -> None:
        report = _report(gm, inputs, "eager", _eager_fallbacks(gm, reason), set(), name, kind)
        if counters.reporting():
            counters.publish_report(report)

    return EagerFallback(EagerLayout(compiled, gm), gm, f"{name}.{kind}", strict=strict, passthrough=ASKED_FOR,
                         on_failure=on_failure)


# Errors the user asked for: bad options, a size beyond max_bucket, an unsupported op under fallback="error".
ASKED_FOR = (OptionError, BucketingError, FallbackError)
BACKEND_FAILED = "backend failed"


def _eager_fallbacks(gm: fx.GraphModule, reason: str) -> list[Fallback]:
    detail = f"{BACKEND_FAILED} ({reason})"
    return [Fallback(n.name, op_name(n.target), detail) for n in gm.graph.nodes if is_compute_op(n)]


def _bucketed(gm, static, options, target, name, kind, strict):
    """A BucketedGraph for `gm`, or None (no dynamic size, the proof refused, or the setup failed: exact shapes)."""

    def compile_bucket(static_gm: fx.GraphModule, inputs: Sequence[Any]) -> StaticProgram:
        return compile_static(static_gm, inputs, options, target, name=name, kind=kind)

    try:
        if static:
            key = f"{kind} {options}"
            return generalized_bucketed_graph(gm, bucket_config(options), compile_bucket, f"{name}.{kind}", key)
        return bucketed_graph(gm, bucket_config(options), compile_bucket, name=f"{name}.{kind}")
    except ASKED_FOR:
        raise
    except Exception as exc:
        if strict:
            raise
        log.warning("%s.%s: bucketing failed, running at exact shapes: %s", name, kind, exc)
        counters.bump("bucketing.setup_failed")
        return None


def _per_shape(gm, static, options, target, name, kind) -> CompiledGraph:
    """One static program per exact set of input shapes."""

    def compile_program(args: Sequence[Any]) -> StaticProgram:
        static_gm = gm if static else specialize(gm, args)
        return compile_static(static_gm, args, options, target, name=name, kind=kind)

    return CompiledGraph(f"{name}.{kind}", compile_program, static=static)
