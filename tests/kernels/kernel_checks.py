"""Shared checks of the kernel tests: inputs per dtype and a dtype-aware comparison with the torch reference.

(conftest.py puts this folder on sys.path, so the test modules next to it import it by name.)
"""

import torch

DTYPES = (torch.float32, torch.bfloat16)

# (rtol, atol relative to the reference's magnitude): fp32 kernels round like fp32 math in another order;
# bf16 kernels round their inputs, intermediates and outputs to 8 mantissa bits (2^-8 ≈ 0.4%), fp16 to 11.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (5e-3, 5e-3)}


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    """Deterministic normal input in the given dtype."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def assert_close(out, ref, dtype, factor=1.0):
    """The kernel output equals the fp32 reference within the dtype's tolerance (times `factor`)."""
    rtol, atol = TOLERANCES[dtype]
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert out.dtype == dtype, f"dtype {out.dtype} != {dtype}"
    scale = max(1.0, ref.abs().max().item()) if ref.numel() else 1.0
    torch.testing.assert_close(out.float(), ref.float(), rtol=rtol * factor, atol=atol * factor * scale)
