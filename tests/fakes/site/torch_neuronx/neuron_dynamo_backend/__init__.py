"""TorchNeuron's torch.compile backend package (faked): see :mod:`.backend`."""

from .backend import create_neuron_backend, neuron_backend


def get_dynamo_metrics() -> dict:
    from .._fake import record

    return {"compilations": len(record.handoffs)}


def reset_dynamo_metrics() -> None:
    from .._fake import record

    record.handoffs.clear()


__all__ = ["create_neuron_backend", "get_dynamo_metrics", "neuron_backend", "reset_dynamo_metrics"]
