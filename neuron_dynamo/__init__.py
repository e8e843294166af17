"""neuron-dynamo: a torch.compile backend for AWS Trainium.

    torch.compile(model, backend="neuron", options={"target": "reference"})

The public API is small: `explain()` reports what ran where (`explaining()` over a whole run, a Trainer's),
`stats()`/`reset_stats()` read and clear the process-wide counters, `backend_info()` says which provider the name
`neuron` resolves to. Importing the package registers nothing (the backend names come from entry points) and
changes no global configuration.

Names are imported on first use, so that what needs no torch (the compile cache, `neuron-precompile ls`, `verify`,
`prune`) starts without importing it.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuron_dynamo.backend import backend_info, neuron_backend
    from neuron_dynamo.counters import reset_stats, stats
    from neuron_dynamo.errors import NeuronDynamoError
    from neuron_dynamo.options import Options
    from neuron_dynamo.report import ExplainReport, explain, explaining

_HOMES = {
    "ExplainReport": "report",
    "NeuronDynamoError": "errors",
    "Options": "options",
    "backend_info": "backend",
    "explain": "report",
    "explaining": "report",
    "neuron_backend": "backend",
    "reset_stats": "counters",
    "stats": "counters",
}
__all__ = [
    "ExplainReport",
    "NeuronDynamoError",
    "Options",
    "backend_info",
    "explain",
    "explaining",
    "neuron_backend",
    "reset_stats",
    "stats",
]


def __getattr__(name: str) -> Any:
    """A public name from its module, or a submodule (`neuron_dynamo.cache_key` after `import neuron_dynamo`)."""
    if name in _HOMES:
        value = getattr(importlib.import_module(f"neuron_dynamo.{_HOMES[name]}"), name)
    elif not name.startswith("__") and importlib.util.find_spec(f"neuron_dynamo.{name}") is not None:
        value = importlib.import_module(f"neuron_dynamo.{name}")
    else:
        raise AttributeError(f"module 'neuron_dynamo' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
