"""The NKI language for neuron-dynamo: the genuine `nki` package when installed, the CPU interpreter otherwise.

    from neuron_dynamo import nki
    import neuron_dynamo.nki.language as nl   # or: nki.language
    nki.toolchain_info()  # {'genuine': False, 'provider': 'interpreter', 'version': '0.6.0', 'target': 'trn2'}

The genuine package is detected without importing it: a top-level `nki` *package* with `language` and `isa`
subpackages, whose `__init__` is not PyPI's "WRONG PACKAGE" placeholder. Importing this module is cheap and has no
side effects: the interpreter (NumPy, ml_dtypes) loads on first attribute access. `make_importable()` registers the
interpreter as `nki`, `nki.language`, `nki.isa`, `nki.typing` in `sys.modules`, so kernel files that say `import nki`
run on it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys

INTERPRETER_VERSION = "0.6.0"  # the NKI API version the interpreter implements
_PLACEHOLDER_MARK = "WRONG PACKAGE"
_genuine_cache: list[bool] = []

__all__ = [
    "jit", "simulate", "language", "isa", "typing", "dtype", "Kernel", "NkiValidationError", "toolchain_info",
    "make_importable",
    "genuine_available",
]


def _looks_genuine(spec) -> bool:
    locations = list(spec.submodule_search_locations or [])
    if not locations:
        return False
    origin = spec.origin
    if origin and os.path.isfile(origin):
        try:
            with open(origin, encoding="utf-8", errors="replace") as fh:
                if _PLACEHOLDER_MARK in fh.read(200_000):
                    return False
        except OSError:
            return False
    return any(
        os.path.exists(os.path.join(loc, sub)) or os.path.exists(os.path.join(loc, sub + ".py"))
        for loc in locations
        for sub in ("language",)
    ) and any(
        os.path.exists(os.path.join(loc, "isa")) or os.path.exists(os.path.join(loc, "isa.py")) for loc in locations
    )


def genuine_available() -> bool:
    """True when the real AWS `nki` package (not the placeholder, not this interpreter) is installed."""
    if not _genuine_cache:
        spec = importlib.machinery.PathFinder.find_spec("nki")  # searches sys.path, ignoring sys.modules
        _genuine_cache.append(spec is not None and _looks_genuine(spec))
    return _genuine_cache[0]


def _backend():
    if genuine_available():
        return importlib.import_module("nki")
    return importlib.import_module("neuron_dynamo.nki.runtime")


def __getattr__(name: str):
    if name in ("language", "isa", "typing"):
        module = importlib.import_module(f"nki.{name}" if genuine_available() else f"neuron_dynamo.nki.{name}")
        globals()[name] = module
        return module
    if name in ("jit", "simulate"):
        return getattr(_backend(), name)
    if name == "dtype":  # `nki.dtype`: the type of a dtype in annotations (`compute_dtype: nki.dtype`); NKI spells
        return str  # dtypes as strings (`nl.DType = str`)
    if name == "Kernel":
        return importlib.import_module("neuron_dynamo.nki.runtime").Kernel
    if name == "NkiValidationError":
        return importlib.import_module("neuron_dynamo.nki.errors").NkiValidationError
    raise AttributeError(f"module 'neuron_dynamo.nki' has no attribute {name!r}")


def toolchain_info() -> dict:
    """Which NKI implementation runs kernels, its version, and the target generation."""
    from neuron_dynamo.nki.target import current_target

    if genuine_available():
        from importlib.metadata import PackageNotFoundError, version

        try:
            ver = version("nki")
        except PackageNotFoundError:
            ver = str(getattr(importlib.import_module("nki"), "__version__", "unknown"))
        return {"genuine": True, "provider": "nki", "version": ver, "target": current_target()}
    return {"genuine": False, "provider": "interpreter", "version": INTERPRETER_VERSION, "target": current_target()}


def make_importable() -> None:
    """Make `import nki`, `import nki.language`, `import nki.isa` resolve to the interpreter (idempotent).

    Does nothing when the genuine package is installed; replaces a placeholder `nki` already imported.
    """
    if genuine_available():
        return
    this = sys.modules[__name__]
    language = importlib.import_module("neuron_dynamo.nki.language")
    isa = importlib.import_module("neuron_dynamo.nki.isa")
    typing = importlib.import_module("neuron_dynamo.nki.typing")
    sys.modules["nki"] = this
    sys.modules["nki.language"] = language
    sys.modules["nki.isa"] = isa
    sys.modules["nki.typing"] = typing
