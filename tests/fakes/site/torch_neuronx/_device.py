"""The fake ``neuron`` device: PyTorch's Python PrivateUse1 backend with CPU payloads kept per storage.

Why per *storage* and not per tensor: PyTorch makes many views in C++ (``alias``, ``detach``, the
views AOTAutograd replays) by sharing the StorageImpl without calling any Python kernel. If the CPU
data hung off each tensor, those views would have none. Here the bytes hang off the PrivateUse1
storage: the payload table *is* an attribute on the storage's Python object, which PyTorch keeps
alive exactly as long as the StorageImpl (PyObject preservation). Every view of a storage, however
it was made, therefore sees the same CPU bytes, and in-place writes through a view land there.

A neuron tensor's sizes, strides and offset are set through ``aten::set_``'s Meta kernel, which only
edits metadata (and grows the storage's recorded byte count) without allocating: the Python
PrivateUse1 storage has no allocator, and asking it to allocate crashes the process.

Every aten op without an explicit kernel goes through :func:`_fallback`: it checks devices the way
a real accelerator does, runs the op on CPU views of the payloads and hands back ``neuron`` tensors
(views keep sharing the input's storage, so aliasing looks right to autograd and AOTAutograd).
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

DEVICE = "neuron"
_PAYLOAD = "_fake_neuron_cpu_bytes"
_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_aten = torch.ops.aten

# Ops that legitimately read or write across devices (the host<->device copies themselves).
_CROSS_DEVICE_OK = {
    "aten::copy_",
    "aten::_copy_from",
    "aten::_copy_from_and_resize",
    "aten::_to_copy",
    "aten::to",
    "aten::_has_compatible_shallow_copy_type",
}

_library: list[torch.library.Library] = []  # the registrations live as long as this object


def is_neuron(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == DEVICE


def payload_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """The CPU bytes behind a neuron storage, created or grown on demand."""
    cpu = getattr(storage, _PAYLOAD, None)
    need = storage.nbytes()
    if cpu is None:
        cpu = torch.UntypedStorage(need)
        setattr(storage, _PAYLOAD, cpu)
    elif cpu.nbytes() < need:
        bigger = torch.UntypedStorage(need)
        bigger[: cpu.nbytes()].copy_(cpu)
        cpu = bigger
        setattr(storage, _PAYLOAD, cpu)
    return cpu


def cpu_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor with ``t``'s geometry over ``t``'s payload bytes (writes go through)."""
    cpu = payload_storage(t.untyped_storage())
    return torch.empty(0, dtype=t.dtype).set_(cpu, t.storage_offset(), t.size(), t.stride())


def _set_geometry(t, storage, offset, size, stride) -> None:
    _aten.set_.source_Storage_storage_offset.redispatch(
        _META, t, storage, int(offset), list(size), list(stride)
    )


def _blank(dtype: torch.dtype) -> torch.Tensor:
    return torch._C._acc.create_empty_tensor((0,), dtype)


def from_cpu(r: torch.Tensor, aliases: dict | None = None) -> torch.Tensor:
    """A neuron tensor over ``r``'s bytes.

    ``aliases`` maps a CPU payload storage (by its C pointer) to the neuron storage that owns it;
    a result that views one of them becomes a view of that neuron storage instead of a new one.
    """
    key = r.untyped_storage()._cdata
    t = _blank(r.dtype)
    owner = (aliases or {}).get(key)
    if owner is None:
        owner = t.untyped_storage()
        setattr(owner, _PAYLOAD, r.untyped_storage())
    _set_geometry(t, owner, r.storage_offset(), r.size(), r.stride())
    return t


def _to_cpu_arg(x, views: list):
    if is_neuron(x):
        v = cpu_view(x)
        views.append((x, v))
        return v
    if isinstance(x, torch.device) and x.type == DEVICE:
        return torch.device("cpu")
    if isinstance(x, str) and x.split(":")[0] == DEVICE:
        return "cpu"
    return x


def _check_devices(op, tensors) -> None:
    """Refuse a mix of neuron tensors and non-scalar CPU tensors, as a real device would."""
    if op.name() in _CROSS_DEVICE_OK:
        return
    on_device = any(is_neuron(t) for t in tensors)
    stray = [t for t in tensors if t.device.type == "cpu" and t.dim() > 0]
    if on_device and stray:
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"{DEVICE}:0 and cpu! (when running {op.name()} on the fake neuron device)"
        )


def _fallback(op, *args, **kwargs):
    flat, _ = pytree.tree_flatten((args, kwargs))
    _check_devices(op, [x for x in flat if isinstance(x, torch.Tensor)])
    views: list = []
    cargs, ckwargs = pytree.tree_map(lambda x: _to_cpu_arg(x, views), (args, kwargs))
    out = op(*cargs, **ckwargs)

    by_view = {id(v): t for t, v in views}
    aliases = {}
    for t, v in views:
        storage = v.untyped_storage()
        if storage._cdata != payload_storage(t.untyped_storage())._cdata:
            # The op reallocated this argument (an out= or resize): adopt the new bytes.
            setattr(t.untyped_storage(), _PAYLOAD, storage)
        if (v.size(), v.stride(), v.storage_offset()) != (t.size(), t.stride(), t.storage_offset()):
            _set_geometry(t, t.untyped_storage(), v.storage_offset(), v.size(), v.stride())
        aliases[storage._cdata] = t.untyped_storage()

    def back(x):
        if isinstance(x, torch.Tensor):
            if id(x) in by_view:  # in-place and out= ops return their argument itself
                return by_view[id(x)]
            return from_cpu(x, aliases)
        return x

    return pytree.tree_map(back, out)


# ---- explicit kernels: the ops PyTorch expects a backend to provide itself ----


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None,
                         memory_format=None):
    fmt = memory_format or torch.contiguous_format
    return from_cpu(torch.empty(size, dtype=dtype, memory_format=fmt))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return from_cpu(torch.empty_strided(size, stride, dtype=dtype))


def _copy_from(src, dst, non_blocking=False):
    s = cpu_view(src) if is_neuron(src) else src
    d = cpu_view(dst) if is_neuron(dst) else dst
    d.copy_(s)
    return dst


def _copy_from_and_resize(src, dst):
    if dst.shape != src.shape:
        dst.resize_(src.shape)
    return _copy_from(src, dst)


def _resize_(self, size, memory_format=None):
    size = list(size)
    stride, acc = [0] * len(size), 1
    for i in reversed(range(len(size))):
        stride[i] = acc
        acc *= max(size[i], 1)
    storage = self.untyped_storage()
    _set_geometry(self, storage, self.storage_offset(), size, stride)  # grows nbytes, no allocation
    payload_storage(storage)  # grows the CPU bytes to match
    return self


def _require_neuron_storage(source) -> None:
    if source.device.type != DEVICE:
        raise RuntimeError(
            f"Expected a storage on {DEVICE}, got one on {source.device} (set_ on the fake device)"
        )


def _set_storage(self, source):
    _require_neuron_storage(source)
    _set_geometry(self, source, 0, [source.nbytes() // self.element_size()], [1])
    return self


def _set_storage_offset(self, source, storage_offset, size, stride=()):
    _require_neuron_storage(source)
    if not stride:
        stride = torch.empty(list(size), device="meta").stride()
    _set_geometry(self, source, storage_offset, size, stride)
    return self


def _set_tensor(self, source):
    _require_neuron_storage(source)
    _set_geometry(self, source.untyped_storage(), source.storage_offset(), source.size(),
                  source.stride())
    return self


def _set_empty(self):
    fresh = _blank(self.dtype).untyped_storage()
    setattr(fresh, _PAYLOAD, torch.UntypedStorage(0))
    _set_geometry(self, fresh, 0, [0], [1])
    return self


_EXPLICIT = {
    "empty.memory_format": _empty_memory_format,
    "empty_strided": _empty_strided,
    "_copy_from": _copy_from,
    "_copy_from_and_resize": _copy_from_and_resize,
    "resize_": _resize_,
    "set_.source_Storage": _set_storage,
    "set_.source_Storage_storage_offset": _set_storage_offset,
    "set_.source_Tensor": _set_tensor,
    "set_": _set_empty,
}


def register(backend_module) -> None:
    """Rename PrivateUse1 to ``neuron`` and install the kernels. Safe to call more than once."""
    if _library:
        return
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", DEVICE):
        raise RuntimeError(f"PrivateUse1 is already taken by {current!r} in this process")
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(DEVICE, backend_module=backend_module)
    impl = torch.library.Library("aten", "IMPL")
    for name, fn in _EXPLICIT.items():
        impl.impl(name, fn, "PrivateUse1")
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_fallback, dispatch_key="PrivateUse1")
    _library.extend([impl, fallback])
