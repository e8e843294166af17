"""Small helpers shared by the interpreter tests: run a kernel body on tiles, compare with tolerances."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from neuron_dynamo import nki

TOL = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 2e-3}


def rand(shape, dtype="float32", seed=0, low=-1.0, high=1.0):
    values = np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)
    return values.astype(np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype))


def f32(x):
    return np.asarray(x).astype(np.float32)


def run(fn, *args, lnc=1):
    """Run `fn` as an @nki.jit kernel (optionally under LNC)."""
    kernel = nki.jit(fn)
    return (kernel[lnc] if lnc != 1 else kernel)(*args)
