"""`nki.typing` (`import nki.typing as nt`): annotations of kernel tensor parameters, `X: nt.tensor[128, 512]`.

The NKI compiler reads them as declarations; the interpreter keeps them as plain objects (the argument's real shape
is checked by the instructions that use it), so annotated kernels run unchanged.
"""

from __future__ import annotations


class TensorType:
    """`nt.tensor[shape...]` or `nt.tensor[shape..., dtype]`: the declared shape (and dtype) of a tensor."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: tuple = (), dtype=None) -> None:
        self.shape = shape
        self.dtype = dtype

    def __getitem__(self, key) -> TensorType:
        key = key if isinstance(key, tuple) else (key,)
        dims = tuple(k for k in key if isinstance(k, int))
        dtype = next((k for k in key if not isinstance(k, int)), None)
        return TensorType(dims, dtype)

    def __repr__(self) -> str:
        return f"nt.tensor[{', '.join(map(str, self.shape))}{', ' + str(self.dtype) if self.dtype else ''}]"


tensor = TensorType()

__all__ = ["tensor", "TensorType"]
