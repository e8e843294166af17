"""neuron-dynamo: a torch.compile backend for AWS Trainium.

    torch.compile(model, backend="neuron", options={"target": "reference"})

The public API is small: `explain()` reports what ran where (`explaining()` over a whole run, a Trainer's),
`stats()`/`reset_stats()` read and clear the process-wide counters, `backend_info()` says which provider the name
`neuron` resolves to. Importing the package registers nothing (the backend names come from entry points) and
changes no global configuration.
"""

from neuron_dynamo.backend import backend_info, neuron_backend
from neuron_dynamo.counters import reset_stats, stats
from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.explain import ExplainReport, explain, explaining
from neuron_dynamo.options import Options

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
