"""Property tests: random chains of element-wise ops, compiled as a user would, equal eager.

Hypothesis draws a dtype the registry claims, a shape (0-dim, empty, ragged beyond 128 / 512, broadcast operands),
a layout (contiguous, transposed, strided slice) and a chain: ops exact on every dtype first (comparisons, rounding,
sign bits, min/max, casts), then smooth float ops. Discontinuous ops only see exact inputs, so a last-bit difference
of a transcendental function cannot flip them. Set NEURON_PROPERTY_EXAMPLES to run more examples.
"""

import os

import hypothesis.strategies as st
import torch
import torch.nn.functional as F
from hypothesis import given, settings

EXAMPLES = int(os.environ.get("NEURON_PROPERTY_EXAMPLES", "15"))
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
INTEGERS = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}
SHAPES = ((), (0,), (3, 0), (1,), (7,), (130,), (3, 130), (2, 3, 5), (128, 4), (2, 129), (5, 513))

# exact on any real dtype, results bit-exact: (fn(x, other), kinds it takes)
EXACT = {
    "abs": (lambda x, y: torch.abs(x), "fi"), "neg": (lambda x, y: torch.neg(x), "fi"),
    "sign": (lambda x, y: torch.sign(x), "fi"), "round": (lambda x, y: torch.round(x), "fi"),
    "trunc": (lambda x, y: torch.trunc(x), "fi"), "floor": (lambda x, y: torch.floor(x), "fi"),
    "maximum": (lambda x, y: torch.maximum(x, y), "fib"), "minimum": (lambda x, y: torch.minimum(x, y), "fib"),
    "fmax": (lambda x, y: torch.fmax(x, y), "fi"), "fmin": (lambda x, y: torch.fmin(x, y), "fi"),
    "clamp": (lambda x, y: torch.clamp(x, -2, 3), "fi"), "where": (lambda x, y: torch.where(x > 0, x, y), "fib"),
    "isnan": (lambda x, y: torch.isnan(x), "fib"), "isinf": (lambda x, y: torch.isinf(x), "fib"),
    "signbit": (lambda x, y: torch.signbit(x), "fi"), "logical_xor": (lambda x, y: torch.logical_xor(x, y), "fib"),
    "lt": (lambda x, y: x < y, "fib"), "eq": (lambda x, y: x == y, "fib"),
    "copysign": (lambda x, y: torch.copysign(x, y), "f"), "frac": (lambda x, y: torch.frac(x), "f"),
    "round_2": (lambda x, y: torch.round(x, decimals=2), "f"),
}
# smooth float → float on the whole real line (arguments folded into each op's domain)
SMOOTH = {
    "atan": torch.atan, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "sin": torch.sin, "erf": torch.erf,
    "erfc": torch.erfc, "asinh": torch.asinh, "elu": F.elu, "leaky_relu": F.leaky_relu, "gelu": F.gelu,
    "silu": F.silu, "softplus": F.softplus, "relu": torch.relu,
    "sinh": lambda t: torch.sinh(t.clamp(-3, 3)), "cosh": lambda t: torch.cosh(t.clamp(-3, 3)),
    "expm1": lambda t: torch.expm1(t.clamp(-3, 2)), "log1p": lambda t: torch.log1p(t.abs()),
    "log10": lambda t: torch.log10(t.abs() + 1), "acos": lambda t: torch.acos(torch.tanh(t)),
    "asin": lambda t: torch.asin(torch.tanh(t)), "atanh": lambda t: torch.atanh(t.clamp(-0.9, 0.9)),
    "acosh": lambda t: torch.acosh(t.abs() + 1), "scale": lambda t: t * 1.5 - 0.25,
}
SMOOTH_BINARY = {"atan2": torch.atan2, "hypot": torch.hypot, "mul": torch.mul, "add": torch.add}


def _kind(dtype: torch.dtype) -> str:
    return "f" if dtype.is_floating_point else "b" if dtype is torch.bool else "i"


def _tensor(draw, shape, dtype, layout) -> torch.Tensor:
    """Values of `dtype` (floats with ±0, ±inf, NaN among them) in the drawn layout."""
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    full = (*shape[:-1], shape[-1] * 2) if layout == "sliced" and shape else shape
    full = (*shape[:-2], shape[-1], shape[-2]) if layout == "transposed" and len(shape) >= 2 else full
    values = torch.randn(full, generator=generator) * 3
    if dtype.is_floating_point:
        if values.numel() and draw(st.booleans()):
            specials = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 0.5, -2.5])
            index = torch.randint(0, values.numel(), (min(4, values.numel()),), generator=generator)
            values.view(-1)[index] = specials[torch.randint(0, 7, index.shape, generator=generator)]
        values = values.to(dtype)
    elif dtype is torch.bool:
        values = values > 0
    else:
        info = torch.iinfo(dtype)
        values = (values * 1000).clamp(info.min, info.max).to(dtype)
    if layout == "transposed" and len(shape) >= 2:
        values = values.transpose(-1, -2)
    elif layout == "sliced" and shape:
        values = values[..., ::2]
    return values


@st.composite
def chains(draw):
    dtype = draw(st.sampled_from(FLOATS + INTEGERS + (torch.bool,)))
    shape = draw(st.sampled_from(SHAPES))
    layout = draw(st.sampled_from(("contiguous", "transposed", "sliced")))
    other_shape = draw(st.sampled_from([shape, shape[-1:], ()]))
    x = _tensor(draw, shape, dtype, layout)
    y = _tensor(draw, other_shape, dtype, "contiguous")
    kind = _kind(dtype)
    exact = draw(st.lists(st.sampled_from(sorted(n for n, (_, kinds) in EXACT.items() if kind in kinds)),
                          max_size=2))
    smooth = draw(st.lists(st.sampled_from(sorted(SMOOTH) + sorted(SMOOTH_BINARY)), max_size=3))
    target = draw(st.sampled_from(FLOATS))
    return x, y, exact, smooth, target


def _program(exact, smooth, target):
    def fn(x, y):
        for name in exact:
            result = EXACT[name][0](x, y)
            x = result if result.dtype == x.dtype else result.to(x.dtype)  # comparisons back to the chain's dtype
        if not x.dtype.is_floating_point or x.dtype != target:
            x, y = x.to(target), y.to(target)  # the cast into the smooth part
        for name in smooth:
            x = SMOOTH_BINARY[name](x, y) if name in SMOOTH_BINARY else SMOOTH[name](x)
        return x

    return fn


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=chains())
def test_random_elementwise_chains_match_eager(case):
    x, y, exact, smooth, target = case
    fn = _program(exact, smooth, target)
    expected = fn(x, y)
    torch._dynamo.reset()
    actual = torch.compile(fn, backend="neuron", dynamic=False)(x, y)
    tolerance = TOLERANCE[target] * (1 + len(smooth))
    torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance, equal_nan=True)


def test_regression_sign_of_nan_is_zero_as_in_torch():
    """torch.sign(NaN) is 0 on CPU; the activation's sign gave NaN."""
    x = torch.tensor([float("nan"), -2.0, 0.0, 3.0])
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(torch.sign, backend="neuron")(x), torch.sign(x))


def test_regression_relu_keeps_negative_zero():
    """torch.relu(-0.0) is -0.0, which atan2 tells apart from 0.0 (-π against π)."""
    x, y = torch.tensor([-0.0, 0.0, -1.0]), torch.tensor([-1.0, -1.0, -1.0])
    fn = lambda a, b: torch.atan2(torch.relu(a), b)  # noqa: E731
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend="neuron")(x, y), fn(x, y))
