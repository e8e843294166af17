"""NKI dtypes: their names (NKI 0.6 spells a dtype as a string), NumPy storage types and fp32 casts.

Low-precision floats are *stored* in their real format through ml_dtypes, so a bf16 or fp8 tile holds exactly the
values the hardware would hold (NKI_PRECISE_FP=1 semantics, the simulator default since NKI 0.4). tfloat32 has no
NumPy type: it is stored as float32 rounded to tf32's 10 mantissa bits. Engines compute in fp32; `to_dtype` casts
fp32 results to a destination dtype with round-to-nearest-even, and float -> int conversions round to nearest even
and saturate (NKI 0.6 simulator behaviour).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT_STORAGE = {
    "float32": np.dtype(np.float32),
    "tfloat32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3": np.dtype(ml_dtypes.float8_e4m3),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e8m0fnu": np.dtype(ml_dtypes.float8_e8m0fnu),
}
INT_STORAGE = {
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "bool": np.dtype(np.uint8),  # NKI stores bool_ as uint8
}
STORAGE = {**FLOAT_STORAGE, **INT_STORAGE}
ALL_NAMES = tuple(STORAGE)

_NUMPY_TO_NAME = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float16): "float16",
    np.dtype(ml_dtypes.bfloat16): "bfloat16",
    np.dtype(ml_dtypes.float8_e4m3): "float8_e4m3",
    np.dtype(ml_dtypes.float8_e5m2): "float8_e5m2",
    np.dtype(ml_dtypes.float8_e4m3fn): "float8_e4m3fn",
    np.dtype(ml_dtypes.float8_e8m0fnu): "float8_e8m0fnu",
    np.dtype(np.int8): "int8",
    np.dtype(np.int16): "int16",
    np.dtype(np.int32): "int32",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.uint16): "uint16",
    np.dtype(np.uint32): "uint32",
    np.dtype(np.bool_): "bool",
}
_TORCH_TO_NAME = {
    "torch.float32": "float32",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.float8_e4m3fn": "float8_e4m3fn",
    "torch.float8_e5m2": "float8_e5m2",
    "torch.float8_e8m0fnu": "float8_e8m0fnu",
    "torch.int8": "int8",
    "torch.int16": "int16",
    "torch.int32": "int32",
    "torch.uint8": "uint8",
    "torch.uint16": "uint16",
    "torch.uint32": "uint32",
    "torch.bool": "bool",
}
_ITEMSIZE = {name: (4 if name == "tfloat32" else STORAGE[name].itemsize) for name in STORAGE}


def dtype_name(dtype) -> str:
    """The NKI name of `dtype`, given as an NKI name, a NumPy/ml_dtypes dtype or a torch dtype."""
    if isinstance(dtype, str):
        if dtype in STORAGE:
            return dtype
        if dtype == "bool_":
            return "bool"
    elif type(dtype).__module__ == "torch":
        name = _TORCH_TO_NAME.get(str(dtype))
        if name is not None:
            return name
    else:
        try:
            name = _NUMPY_TO_NAME.get(np.dtype(dtype))
        except TypeError:
            name = None
        if name is not None:
            return name
    raise TypeError(f"{dtype!r} is not an NKI dtype; use one of nl.{', nl.'.join(ALL_NAMES)}")


def itemsize(name: str) -> int:
    return _ITEMSIZE[name]


def is_float(name: str) -> bool:
    return name in FLOAT_STORAGE


def is_int(name: str) -> bool:
    return name in INT_STORAGE


def fill_value(name: str):
    """What a fresh allocation holds: NaN for floats, 4 for integers (the NKI simulator's uninitialised marker)."""
    return np.nan if name in FLOAT_STORAGE else 4


_BF16 = np.dtype(ml_dtypes.bfloat16)


def as_f32(values: np.ndarray) -> np.ndarray:
    """Values as fp32, the engines' compute precision (no copy when they already are fp32).

    bf16 -> fp32 is exact and is done on the bit patterns (a bf16 is the top half of an fp32), several times
    faster than the generic ml_dtypes cast on the hot path of every bf16 kernel.
    """
    if values.dtype == np.float32:
        return values
    if values.dtype == _BF16:
        return (values.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)


def torch_view(values: np.ndarray):
    """A torch tensor sharing `values`' memory (copied first when NumPy cannot lend it writable)."""
    import torch

    if not values.flags.writeable:
        values = values.copy()
    return torch.from_numpy(values)


def _to_bf16(values: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 with round-to-nearest-even (torch's vectorised cast; same bits as ml_dtypes)."""
    import torch

    f32 = torch_view(as_f32(values))
    return f32.to(torch.bfloat16).view(torch.int16).numpy().view(_BF16)


def _round_tf32(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    finite = np.isfinite(values)
    lsb = (bits >> 13) & 1
    rounded = ((bits + np.uint32(0x0FFF) + lsb) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(finite, rounded, values)


def to_dtype(values: np.ndarray, name: str) -> np.ndarray:
    """Cast computed values (fp32, or integers for bit-vector ops) to the storage type of dtype `name`."""
    storage = STORAGE[name]
    if name in FLOAT_STORAGE:
        if name == "tfloat32":
            return _round_tf32(as_f32(values))
        if name == "bfloat16" and values.dtype != _BF16:
            return _to_bf16(values)
        return values.astype(storage, copy=False)
    if values.dtype.kind in "iu":
        info = np.iinfo(storage)
        if values.dtype == storage:
            return values
        return np.clip(values, info.min, info.max).astype(storage)
    info = np.iinfo(storage)
    wide = np.rint(values.astype(np.float64))  # float64 holds every int32/uint32 bound exactly
    np.clip(wide, info.min, info.max, out=wide)  # ±inf saturate to the bounds
    wide[np.isnan(wide)] = 0.0
    return wide.astype(storage)
