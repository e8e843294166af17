"""``wrap_nki`` and ``nki_op``, as the "How to work with NKI kernels from torch-neuronx" page describes.

Documented behaviour kept here:

- ``wrap_nki(kernel)`` returns a caller; ``caller(*args)`` or ``caller[grid](*args)`` runs the
  kernel on ``neuron`` tensors. Eager: the first call compiles for the input shapes, dtypes and
  non-tensor argument values; later calls with the same inputs reuse it (one
  ``record.kernel_compiles`` entry per new signature).
- ``nki_op("ns::name", mutates_args=...)`` over a type-annotated function registers a
  ``torch.library.custom_op`` and returns it (so ``register_fake``/``register_autograd`` work and
  ``torch.ops.ns.name`` exists). Its fake implementation is the function itself run on fake
  tensors, as TorchNeuron's is; inside ``torch.compile`` the op stays one node in the graph.

Not a HigherOrderOperator, unlike TorchNeuron's: call kernels inside ``torch.compile`` through an
``nki_op``. The kernel is whatever callable it is handed (here: a CPU-runnable ``@nki.jit``
object); it receives CPU views of the device tensors' bytes, so in-place writes show on the device.
"""

from __future__ import annotations

import inspect
import threading

import torch
from torch._subclasses.fake_tensor import FakeTensor, maybe_get_fake_mode, unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import optimization_hint

from . import _device
from ._fake import record

_compiled: set = set()
_graph = threading.local()  # set while a compiled graph runs: its kernels compiled with the graph


def _hint(d) -> int:
    return d if isinstance(d, int) else optimization_hint(d)


def _kernel_name(kernel) -> str:
    fn = getattr(kernel, "func", kernel)
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", type(kernel).__name__)


def _arg_names(kernel, count: int) -> list:
    try:
        params = list(inspect.signature(getattr(kernel, "func", kernel)).parameters)
    except (TypeError, ValueError):
        params = []
    return params[:count] + [f"arg{i}" for i in range(len(params), count)]


class _NKICaller:
    def __init__(self, kernel, grid=()):
        self.kernel = kernel
        self.grid = tuple(grid)
        self.__name__ = _kernel_name(kernel)

    def __getitem__(self, grid) -> _NKICaller:
        grid = grid if isinstance(grid, tuple | list) else (grid,)
        return _NKICaller(self.kernel, tuple(int(g) for g in grid))

    def _launch(self, args, kwargs):
        kernel = self.kernel
        if self.grid and hasattr(kernel, "__getitem__"):
            kernel = kernel[self.grid]
        return kernel(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        values = list(args) + list(kwargs.values())
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        if any(isinstance(t, FakeTensor) or t.device.type == "meta" for t in tensors):
            return self._shapes_only(args, kwargs, tensors)
        names = _arg_names(self.kernel, len(args)) + list(kwargs)
        for name, v in zip(names, values, strict=True):
            if isinstance(v, torch.Tensor) and not _device.is_neuron(v):
                raise RuntimeError(
                    f"NKI kernel {self.__name__}: argument {name!r} is on {v.device}; kernels "
                    f"called from torch-neuronx take tensors on the neuron device "
                    f"(move it with .to('neuron'))"
                )
        self._note_compile(values)
        views = {}

        def to_cpu(v):
            if isinstance(v, torch.Tensor):
                view = _device.cpu_view(v)
                views[view.untyped_storage()._cdata] = v.untyped_storage()
                return view
            return v

        out = self._launch([to_cpu(a) for a in args], {k: to_cpu(v) for k, v in kwargs.items()})
        return torch.utils._pytree.tree_map_only(
            torch.Tensor, lambda r: _device.from_cpu(r, views), out
        )

    def _note_compile(self, values) -> None:
        signature = (self.grid,) + tuple(
            (tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else repr(v)
            for v in values
        )
        key = (id(getattr(self.kernel, "func", self.kernel)), signature)
        if key in _compiled or getattr(_graph, "active", False):
            return
        _compiled.add(key)
        record.kernel_compiles.append({"kernel": self.__name__, "signature": signature})

    def _shapes_only(self, args, kwargs, tensors):
        """Output shapes/dtypes from a CPU run on zeros, returned as fake (or meta) tensors."""
        mode = next((m for m in map(maybe_get_fake_mode, tensors) if m is not None), None)
        device = tensors[0].device
        # A symbolic size (Dynamo's automatic dynamic) runs at its hint; an output size equal to
        # a symbolic input size's hint is given that symbol back. A heuristic, as NKI itself
        # needs concrete shapes.
        symbols = {_hint(d): d for t in tensors for d in t.shape if isinstance(d, torch.SymInt)}

        def zeros(v):
            if not isinstance(v, torch.Tensor):
                return v
            return torch.zeros([_hint(d) for d in v.shape], dtype=v.dtype)

        with unset_fake_temporarily():
            out = self._launch([zeros(a) for a in args], {k: zeros(v) for k, v in kwargs.items()})

        def empty(r):
            return torch.empty([symbols.get(d, d) for d in r.shape], dtype=r.dtype, device=device)

        if mode is None:
            return torch.utils._pytree.tree_map_only(torch.Tensor, empty, out)
        with mode:
            return torch.utils._pytree.tree_map_only(torch.Tensor, empty, out)


def wrap_nki(nki_kernel, **kwargs) -> _NKICaller:
    """A torch-callable for an ``@nki.jit`` kernel (see the module docstring)."""
    return _NKICaller(nki_kernel)


def nki_op(name: str, fn=None, mutates_args=()):
    """Register ``fn`` (which calls NKI kernels) as the custom op ``name``; return the op."""

    def register(fn):
        op = torch.library.custom_op(name, fn, mutates_args=mutates_args)
        op.register_fake(fn)
        record.nki_ops.append(name)
        return op

    return register if fn is None else register(fn)
