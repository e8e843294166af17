"""`explain()`: compile and run a function once under the backend, and report what ran where.

The report lists, per static program (forward, backward or inference graph at one set of shapes): how many aten
ops there were and how many were lowered, the matmul/convolution/attention FLOPs and how many of them were lowered,
the number of regions, each fallback op with its reason and count (collectives apart: torch.distributed runs them),
and the compile time. For graphs served from buckets it adds the programs, calls and padding waste per graph, and
per symbolic size: where it is read, the values it took, how it is bucketed (exact while it has one value under
dynamic=True) and the padding along it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Iterator
from typing import Any

import torch

from neuron_dynamo import counters
from neuron_dynamo.backend import neuron_backend
from neuron_dynamo.compiler import GraphReport
from neuron_dynamo.passes.partition import COLLECTIVE, HOST_CHECK
from neuron_dynamo.toolchain import target_note


def _si(value: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


@dataclasses.dataclass
class ExplainReport:
    """The graph reports of one `explain()` run; prints as a table, `.to_dict()` for programs."""

    graphs: list[GraphReport]
    output: Any = dataclasses.field(default=None, repr=False)

    def totals(self) -> dict[str, Any]:
        keys = ("ops_total", "ops_lowered", "flops_total", "flops_lowered", "regions", "compile_seconds")
        totals = {key: sum(getattr(graph, key) for graph in self.graphs) for key in keys}
        totals["graphs"] = len(self.graphs)
        entries = [entry for graph in self.graphs for entry in graph.fallback_ops]
        totals["fallback_ops"] = sum(entry["count"] for entry in entries if not _by_design(entry))
        totals["collectives"] = sum(entry["count"] for entry in entries if _by_design(entry, COLLECTIVE))
        totals["host_checks"] = sum(entry["count"] for entry in entries if _by_design(entry, HOST_CHECK))
        totals["cache"] = _cache_totals(self.graphs)
        estimates = [graph.estimated_device_ns for graph in self.graphs if graph.estimated_device_ns is not None]
        totals["estimated_device_ns"] = sum(estimates) if estimates else None
        return totals

    def to_dict(self) -> dict[str, Any]:
        return {"graphs": [graph.to_dict() for graph in self.graphs], "totals": self.totals()}

    def __str__(self) -> str:
        header = ("graph", "kind", "target", "ops", "lowered", "FLOPs", "lowered", "regions", "compile s",
                  "est. device us")
        rows = [
            (
                graph.name, graph.kind, graph.target, str(graph.ops_total),
                f"{graph.ops_lowered} ({_share(graph.ops_lowered, graph.ops_total)})", _si(graph.flops_total),
                f"{_si(graph.flops_lowered)} ({_share(graph.flops_lowered, graph.flops_total)})",
                str(graph.regions), f"{graph.compile_seconds:.3f}", _device_us(graph),
            )
            for graph in self.graphs
        ]
        lines = [f"neuron-dynamo explain: {len(self.graphs)} static program(s)"]
        if not self.graphs:
            lines.append("no graph ran under the backend: Dynamo captured nothing, or ran the code eagerly "
                         "(TORCH_LOGS=graph_breaks,recompiles says why)")
            return "\n".join(lines)
        lines += _table(header, rows)
        lines += [f"target {name}: {target_note(name)}" for name in dict.fromkeys(g.target for g in self.graphs)
                  if target_note(name)]
        fallbacks = [
            (f"{graph.name}.{graph.kind}", entry["op"], str(entry["count"]), entry["reason"])
            for graph in self.graphs
            for entry in graph.fallback_ops
            if not _by_design(entry)
        ]
        if fallbacks:
            lines += ["", "ops run eagerly (fallback):"]
            lines += _table(("graph", "op", "count", "reason"), fallbacks)
        else:
            entries = [entry for graph in self.graphs for entry in graph.fallback_ops]
            apart = [name for name, kind in (("collectives", COLLECTIVE), ("host checks", HOST_CHECK))
                     if any(_by_design(entry, kind) for entry in entries)]
            but = f" but the {' and '.join(apart)}" if apart else ""
            lines += ["", f"no fallback ops: every op{but} ran on the target"]
        lines += _by_design_lines(self.graphs, COLLECTIVE,
                                  "collectives (run by torch.distributed between the regions):")
        lines += _by_design_lines(self.graphs, HOST_CHECK, "host checks (raise eager's errors between the regions):")
        lines += _bucketing_lines(self.graphs)
        lines += _cache_lines(self.graphs)
        return "\n".join(lines)


def _by_design(entry: dict[str, Any], *kinds: str) -> bool:
    """Whether a fallback entry runs outside the target by design (a collective, a host check), not for lack of
    a kernel; with `kinds`, of those kinds only."""
    return entry["reason"].startswith(kinds or (COLLECTIVE, HOST_CHECK))


def _by_design_lines(graphs: list[GraphReport], kind: str, title: str) -> list[str]:
    """The entries of one by-design kind, apart from the fallback ops: nothing is missing there."""
    rows = [(f"{graph.name}.{graph.kind}", entry["op"], str(entry["count"]))
            for graph in graphs for entry in graph.fallback_ops if _by_design(entry, kind)]
    if not rows:
        return []
    return ["", title, *_table(("graph", "op", "count"), rows)]


def _device_us(graph: GraphReport) -> str:
    """The cost model's estimated device time of the graph's last run, in µs ("-" when the target has none)."""
    ns = getattr(graph, "estimated_device_ns", None)
    return "-" if ns is None else f"{ns / 1e3:.1f}"


def _cache_totals(graphs: list[GraphReport]) -> dict[str, Any]:
    """How the programs were obtained from the persistent compile cache (program_cache.py)."""
    statuses = [getattr(graph, "cache", "") for graph in graphs]
    return {
        "hits": statuses.count("hit"), "misses": statuses.count("miss"),
        "bypasses": statuses.count("bypass") + statuses.count("off"),
        "seconds_saved": sum(getattr(graph, "cache_seconds_saved", 0.0) for graph in graphs),
    }


def _cache_lines(graphs: list[GraphReport]) -> list[str]:
    """One summary line, and the cache status of each program."""
    totals = _cache_totals(graphs)
    per_graph = ", ".join(f"{graph.name}.{graph.kind}: {graph.cache}" for graph in graphs if graph.cache)
    return ["", f"compile cache: {totals['hits']} hit(s), {totals['misses']} miss(es), {totals['bypasses']} "
            f"bypass(es), {totals['seconds_saved']:.3f} s saved" + (f" ({per_graph})" if per_graph else "")]


def _bucketed(graphs: list[GraphReport]) -> list[tuple[GraphReport, object]]:
    """Each bucketed graph once (its specialisations share one BucketStats), with its stats."""
    seen, found = set(), []
    for graph in graphs:
        stats = getattr(graph, "bucket_stats", None)
        if stats is not None and id(stats) not in seen:
            seen.add(id(stats))
            found.append((graph, stats))
    return found


def _bucketing_lines(graphs: list[GraphReport]) -> list[str]:
    """One row per bucketed graph: programs, calls per bucket, padding waste, and why padding was refused."""
    rows = []
    for graph, stats in _bucketed(graphs):
        calls = ", ".join(f"{key}: {count}" for key, count in stats.calls.items())
        rows.append((f"{graph.name}.{graph.kind}", str(len(stats.programs)), calls or "-",
                     f"{100 * stats.padding_waste:.1f}%", "; ".join(stats.refusals) or "-"))
    if not rows:
        return []
    return ["", "bucketing (dynamic sizes served from static programs):",
            *_table(("graph", "programs", "calls per program", "padding waste", "refused because"), rows),
            *_symbol_lines(graphs)]


def _symbol_lines(graphs: list[GraphReport]) -> list[str]:
    """One row per symbolic size of each bucketed graph: where it is read, the values it took, how it is bucketed
    now, and the input elements in its padded region (with their share of every input element processed)."""
    rows = []
    for graph, stats in _bucketed(graphs):
        for name, symbol in getattr(stats, "symbols", {}).items():
            values = sorted(symbol.values)
            shown = "-" if not values else str(values[0]) if len(values) == 1 else (
                f"{values[0]}..{values[-1]} ({len(values)} distinct)")
            padding = f"{symbol.padding_elements} ({_share(symbol.padding_elements, stats.padded_elements)})"
            rows.append((f"{graph.name}.{graph.kind}", name, symbol.site, shown, symbol.mode, padding))
    if not rows:
        return []
    return ["", "padding by dynamic size (elements of the inputs in the padded region of that size's dims):",
            *_table(("graph", "size", "read from", "values", "bucketed as", "padding"), rows)]


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    render = lambda row: "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
    return [render(header), render(tuple("-" * width for width in widths)), *map(render, rows)]


@functools.cache
def _backend_for(options_key: str) -> Any:
    """One backend callable per set of options: Dynamo then reuses the code it compiled for an earlier explain()
    of the same function instead of compiling it again (and again, up to its recompile limit)."""
    return functools.partial(neuron_backend, options=json.loads(options_key))


def explain(fn_or_module: Any, *args: Any, options: dict[str, Any] | None = None, **kwargs: Any) -> ExplainReport:
    """Compile `fn_or_module` with the backend (and `options`), call it once with `args`/`kwargs`, report.

    The report covers every static program that ran during the call (compiled now, or by an earlier explain()
    with the same options); the function's return value is kept in `report.output`.
    """
    compiled = torch.compile(fn_or_module, backend=_backend_for(json.dumps(options or {}, sort_keys=True)))
    with counters.collect_reports() as reports:
        output = compiled(*args, **kwargs)
    unique = list({id(report): report for report in reports}.values())
    return ExplainReport(graphs=unique, output=output)


@contextlib.contextmanager
def explaining() -> Iterator[ExplainReport]:
    """Report on every static program that runs inside the block, whoever compiled it: for runs that call the model
    themselves (Transformers `Trainer`, TRL `SFTTrainer`, `generate()`), where `explain(fn, ...)` cannot.

        with neuron_dynamo.explaining() as report:
            trainer.train()
        print(report)  # the fallback ops of the run, each with its reason

    The report is filled when the block ends.
    """
    report = ExplainReport(graphs=[])
    with counters.collect_reports() as reports:
        try:
            yield report
        finally:
            report.graphs = list({id(graph): graph for graph in reports}.values())
