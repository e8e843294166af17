"""A fake ``torch_neuronx`` (TorchNeuron, torch-neuronx 2.14 / Neuron SDK 2.33) for CPU-only tests.

Written from AWS's documentation, not from TorchNeuron's code. Put ``tests/fakes/site`` on
``PYTHONPATH`` (see ``run_on_fake_device`` in ``tests/conftest.py``); importing this package (or just ``import torch``,
through the ``torch.backends`` autoload entry point the real package also declares) gives:

- the ``neuron`` device (:mod:`._device`): PyTorch's Python PrivateUse1 backend, every aten op
  run on CPU bytes kept per storage; mixing ``neuron`` with non-scalar CPU tensors raises
  "Expected all tensors to be on the same device ...".
- ``torch.neuron`` (:mod:`._device_module`): ``is_available``, ``device_count`` (env
  ``FAKE_NEURON_DEVICE_COUNT``, default 1), ``current_device``, ``set_device``, ``synchronize``,
  ``is_initialized``, ``manual_seed``/``manual_seed_all``, ``is_bf16_supported``, ...
- ``nki_op(name, fn=None, mutates_args=())`` and ``wrap_nki(kernel)`` (:mod:`.nki_hop`).
- the torch.compile backend ``torch_neuronx.neuron_dynamo_backend.backend:neuron_backend``,
  declared as the ``torch_dynamo_backends`` entry point ``neuron``.
- ``torch_neuronx._fake.record``: what happened (kernel compiles, nki_op registrations, backend
  hand-offs) and ``record.reset()``; see :mod:`._fake`.

Nothing here starts ``neuronx-cc`` or any other process.
"""

from __future__ import annotations

from . import _device, _device_module
from ._fake import record
from .nki_hop import nki_op, wrap_nki

__version__ = "2.14.0"

if not _device._library:
    _device.register(_device_module.make_module())


def _autoload() -> None:
    """``torch.backends`` entry point: importing the package is the whole job."""


def neuron_backend(gm, example_inputs, **kwargs):
    """Shortcut to :func:`torch_neuronx.neuron_dynamo_backend.backend.neuron_backend`."""
    from .neuron_dynamo_backend.backend import neuron_backend as backend

    return backend(gm, example_inputs, **kwargs)


__all__ = ["__version__", "neuron_backend", "nki_op", "record", "wrap_nki"]
