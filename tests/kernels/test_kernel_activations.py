"""activation_kernel / gated_activation_kernel against torch over shapes with and without a 128 factor."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_checks import DTYPES, assert_close, randn
from neuron_dynamo.kernels.activations import activation_kernel, gated_activation_kernel

F = torch.nn.functional
TORCH_OPS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "none": lambda x: x,
}

shapes = st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple) | st.sampled_from([(256, 48), (3, 128, 70)])


@settings(max_examples=12, deadline=None)
@given(shape=shapes, dtype=st.sampled_from(DTYPES), op=st.sampled_from(sorted(TORCH_OPS)), gated=st.booleans())
def test_activations(shape, dtype, op, gated):
    a = randn(*shape, dtype=dtype, seed=1, scale=3.0)
    if gated:
        b = randn(*shape, dtype=dtype, seed=2)
        out = gated_activation_kernel(a, b, op)
        ref = (TORCH_OPS[op](a.float()).to(dtype).float() * b.float()).to(dtype)
    else:
        out = activation_kernel(a, op)
        ref = TORCH_OPS[op](a.float()).to(dtype)
    assert_close(out, ref, dtype)
