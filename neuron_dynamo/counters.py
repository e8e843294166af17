"""Process-wide counters and the per-graph reports they come from.

`stats()` is a flat `{name: number}` dict so later features add counters (cache hits, bucket calls, estimated
device time) by bumping a new name, without reshaping anything. Graph reports are published here too, so that
`explain()` can collect the reports of the programs that ran while it was listening.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_counters: Counter[str] = Counter()
_report_sinks: list[list[Any]] = []


def bump(name: str, amount: int | float = 1) -> None:
    """Add `amount` to the counter `name` (created at zero)."""
    with _lock:
        _counters[name] += amount


def stats() -> dict[str, int | float]:
    """A snapshot of the process-wide counters, sorted by name."""
    with _lock:
        return dict(sorted(_counters.items()))


def reset_stats() -> None:
    """Set every counter back to zero (by forgetting it)."""
    with _lock:
        _counters.clear()


def reporting() -> bool:
    """Whether some `collect_reports()` block is listening (a cheap check for the hot path)."""
    return bool(_report_sinks)


def publish_report(report: Any) -> None:
    """Hand a graph report to every active `collect_reports()` block."""
    with _lock:
        for sink in _report_sinks:
            sink.append(report)


@contextlib.contextmanager
def collect_reports() -> Iterator[list[Any]]:
    """Collect the graph reports published inside the `with` block (nested blocks each get all of them)."""
    sink: list[Any] = []
    with _lock:
        _report_sinks.append(sink)
    try:
        yield sink
    finally:
        with _lock:
            _report_sinks.remove(sink)
