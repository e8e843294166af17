"""``torch.neuron``: the device module PyTorch, Transformers and Accelerate call for ``"neuron"``.

The names are the ones those libraries look up (``is_available``, ``device_count``,
``current_device``, ``set_device``, ``manual_seed_all``, ``is_bf16_supported``,
``get_amp_supported_dtype`` for autocast, memory counters, ``get_dynamo_metrics`` from the
torch.compile reference page). There is no hardware: RNG is the CPU generator (as TorchNeuron's
eager RNG falls back to the CPU), memory counters are zero.
"""

from __future__ import annotations

import os
import types

import torch

_state = {"device": 0}


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return int(os.environ.get("FAKE_NEURON_DEVICE_COUNT", "1"))


def current_device() -> int:
    return _state["device"]


def set_device(device) -> None:
    index = torch.device(device).index if not isinstance(device, int) else device
    index = 0 if index is None else index
    if not 0 <= index < device_count():
        raise RuntimeError(f"neuron device {index} out of range (device_count={device_count()})")
    _state["device"] = index


def synchronize(device=None) -> None:
    """Eager ops finish before they return here, so there is nothing to wait for."""


def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed() -> None:
    torch.default_generator.seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state, device=None) -> None:
    torch.set_rng_state(state)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype() -> list:
    return [torch.bfloat16, torch.float16]


def get_device_name(device=None) -> str:
    return "Trainium (fake, CPU-backed)"


def empty_cache() -> None:
    pass


def memory_allocated(device=None) -> int:
    return 0


def max_memory_allocated(device=None) -> int:
    return 0


def memory_reserved(device=None) -> int:
    return 0


def get_dynamo_metrics() -> dict:
    from ._fake import record

    return {"compilations": len(record.handoffs)}


def make_module() -> types.ModuleType:
    mod = types.ModuleType("torch.neuron", __doc__)
    for name, value in list(globals().items()):
        if callable(value) and not name.startswith("make_") and value.__module__ == __name__:
            setattr(mod, name, value)
    return mod
