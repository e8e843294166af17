"""Convolution, pooling and upsampling on the simulator match eager, NaN/inf placement and max indices included."""

import pytest
import torch
import torch.nn.functional as F

from neuron_dynamo.lowering import kernel_for
from neuron_dynamo.lowering.resample import nearest_taps

aten = torch.ops.aten
INF, NAN = float("inf"), float("nan")


def simulated(op, *args):
    return kernel_for(op, "simulator")(*args)


def assert_matches(got, expected, dtype=torch.float32):
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    if isinstance(expected, tuple):
        for g, e in zip(got, expected, strict=True):
            assert_matches(g, e, dtype)
        return
    if expected is None:  # a gradient convolution_backward was not asked for
        assert got is None
        return
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, equal_nan=True, **tolerance)


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", dynamic=False)


# ------------------------------------------------------------------------------------------------ convolution
CONVOLUTIONS = [  # x shape, weight shape, bias, stride, padding, dilation, transposed, output_padding, groups
    ((2, 4, 9), (6, 2, 3), True, [2], [1], [1], False, [0], 2),
    ((2, 4, 7, 8), (6, 4, 3, 2), True, [1, 2], [1, 0], [2, 1], False, [0, 0], 1),
    ((1, 4, 5, 6, 7), (4, 2, 2, 3, 2), False, [1, 2, 1], [1, 0, 1], [1, 1, 2], False, [0, 0, 0], 2),
    ((2, 4, 9), (4, 3, 3), True, [2], [1], [1], True, [1], 2),
    ((2, 4, 5, 6), (4, 3, 3, 2), False, [2, 3], [1, 2], [1, 2], True, [1, 0], 1),
    ((1, 2, 3, 4, 5), (2, 3, 2, 2, 3), True, [2, 1, 2], [0, 1, 1], [1, 1, 1], True, [1, 0, 0], 1),
]


@pytest.mark.parametrize("case", CONVOLUTIONS, ids=lambda c: f"{len(c[0]) - 2}d{'T' if c[6] else ''}")
def test_convolution_and_its_backward_match_eager(case):
    torch.manual_seed(0)
    x_shape, w_shape, has_bias, *geometry = case
    x, weight = torch.randn(x_shape), torch.randn(w_shape)
    bias = torch.randn(w_shape[1] * geometry[-1] if geometry[3] else w_shape[0]) if has_bias else None
    expected = aten.convolution.default(x, weight, bias, *geometry)
    assert_matches(simulated(aten.convolution.default, x, weight, bias, *geometry), expected)
    grad = torch.randn_like(expected)
    args = (grad, x, weight, None if bias is None else list(bias.shape), *geometry, [True, True, has_bias])
    assert_matches(simulated(aten.convolution_backward.default, *args), aten.convolution_backward.default(*args))


def test_convolution_multiplies_padding_zeros_but_a_transposed_one_never_multiplies_a_gap():
    x, weight = torch.ones(1, 1, 4), torch.tensor([[[1.0, INF, 1.0]]])
    for args in ([1], [2], [1], False, [0], 1), ([2], [0], [1], True, [0], 1), ([2], [2], [1], True, [1], 1):
        expected = aten.convolution.default(x, weight, None, *args)
        assert_matches(simulated(aten.convolution.default, x, weight, None, *args), expected)
    assert torch.isnan(expected).sum() == 0 and torch.isnan(F.conv1d(x, weight, padding=2)).any()


def test_compiled_conv_net_with_noncontiguous_input_and_bf16_matches_eager():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, groups=1), torch.nn.ReLU(),
                              torch.nn.ConvTranspose2d(8, 4, 2, stride=2, groups=2))
    x = torch.randn(2, 6, 5, 6).transpose(1, 3)[:, ::2]  # a strided view, 3 channels
    assert_matches(compiled(net)(x), net(x))
    net, x = net.bfloat16(), x.bfloat16()
    assert_matches(compiled(net)(x), net(x), torch.bfloat16)


def test_convolution_refusals_say_why():
    x, weight = torch.randn(1, 2, 5, dtype=torch.float64), torch.randn(2, 2, 3, dtype=torch.float64)
    node = _node(aten.convolution.default, x, weight, None, [1], [0], [1], False, [0], 1)
    assert "dtypes" in kernel_for(aten.convolution.default, "simulator").refusal(node)


# ------------------------------------------------------------------------------------------------ pooling
def _image(*shape):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    flat = x.view(-1)
    flat[3], flat[7], flat[11] = NAN, -INF, INF
    flat[12] = NAN  # two NaNs in a window: torch indexes the last
    return x


POOLINGS = [
    (aten.avg_pool2d.default, (2, 3, 7, 9), ([3, 3], [2, 2], [1, 1], True, False, None)),
    (aten.avg_pool2d.default, (3, 7, 9), ([3, 2], [2, 1], [1, 1], True, True, 5)),
    (aten.avg_pool3d.default, (2, 2, 5, 6, 7), ([2, 3, 2], [1, 2, 2], [1, 1, 0], True, False, None)),
    (aten.max_pool2d_with_indices.default, (2, 3, 7, 9), ([3, 3], [2, 2], [1, 1], [1, 1], True)),
    (aten.max_pool2d_with_indices.default, (3, 7, 9), ([2, 3], [1, 2], [1, 1], [2, 1], False)),
    (aten.max_pool3d_with_indices.default, (2, 2, 5, 6, 7), ([2, 3, 2], [1, 2, 2], [1, 1, 0], [1, 1, 2], True)),
    (aten._adaptive_avg_pool2d.default, (2, 3, 7, 9), ([4, 5],)),
    (aten._adaptive_avg_pool3d.default, (2, 2, 5, 6, 7), ([3, 4, 5],)),
    (aten.adaptive_max_pool2d.default, (2, 3, 7, 9), ([3, 11],)),
    (aten.adaptive_max_pool3d.default, (2, 5, 6, 7), ([3, 4, 5],)),
]


@pytest.mark.parametrize(("op", "shape", "args"), POOLINGS, ids=lambda v: str(v)[:40])
def test_pooling_matches_eager_values_and_indices(op, shape, args):
    x = _image(*shape)
    assert_matches(simulated(op, x, *args), op(x, *args))


def test_pooling_bf16_and_a_window_of_only_minus_inf():
    x = torch.full((1, 1, 4, 4), -INF)
    assert_matches(simulated(aten.max_pool2d_with_indices.default, x, [2, 2], [2, 2], [1, 1]),
                   aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2], [1, 1]))
    x = _image(2, 3, 6, 6).bfloat16()
    assert_matches(simulated(aten.avg_pool2d.default, x, [2, 2]), aten.avg_pool2d.default(x, [2, 2]), torch.bfloat16)


def test_compiled_pooling_matches_eager():
    x = _image(2, 3, 8, 10)[:, :, ::2]  # non-contiguous

    def pools(x):
        out, index = F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)
        return out, index, F.avg_pool1d(x[:, 0], 3), F.adaptive_avg_pool2d(x, (3, 2)), F.adaptive_max_pool1d(x[0], 3)

    assert_matches(compiled(pools)(x), pools(x))


def test_pooling_refusals_say_why():
    node = _node(aten.avg_pool2d.default, torch.zeros(1, 2, 4, 4, dtype=torch.int64), [2, 2])
    assert "int64" in kernel_for(aten.avg_pool2d.default, "simulator").refusal(node)


# ------------------------------------------------------------------------------------------------ upsampling
RESAMPLES = [
    (aten.upsample_nearest1d.default, (2, 3, 5), ([11],)),
    (aten.upsample_nearest2d.default, (2, 3, 5, 7), ([9, 4], 1.7, None)),
    (aten.upsample_nearest3d.default, (1, 2, 3, 4, 5), ([5, 6, 7],)),
    (aten._upsample_nearest_exact2d.default, (2, 3, 5, 7), ([9, 13],)),
    (aten._upsample_nearest_exact3d.default, (1, 2, 3, 4, 5), ([5, 3, 7],)),
    (aten.upsample_linear1d.default, (2, 3, 5), ([12], False)),
    (aten.upsample_linear1d.default, (2, 3, 5), ([12], True)),
    (aten.upsample_bilinear2d.default, (2, 3, 5, 7), ([9, 13], False)),
    (aten.upsample_bilinear2d.default, (2, 3, 5, 7), ([5, 7], True)),
    (aten.upsample_bilinear2d.default, (2, 3, 5, 7), ([3, 4], False, 0.6, 0.6)),
    (aten.upsample_bicubic2d.default, (2, 3, 5, 7), ([9, 13], False)),
    (aten.upsample_bicubic2d.default, (2, 3, 5, 7), ([4, 3], True)),
    (aten.upsample_trilinear3d.default, (1, 2, 3, 4, 5), ([5, 6, 7], False)),
]


@pytest.mark.parametrize(("op", "shape", "args"), RESAMPLES, ids=lambda v: str(v)[:40])
def test_upsampling_matches_eager_where_inf_and_nan_land(op, shape, args):
    x = _image(*shape)
    assert_matches(simulated(op, x, *args), op(x, *args))


def test_upsampling_bf16_and_uint8():
    x = _image(2, 3, 5, 7)
    assert_matches(simulated(aten.upsample_bilinear2d.default, x.bfloat16(), [9, 13], False),
                   aten.upsample_bilinear2d.default(x.bfloat16(), [9, 13], False), torch.bfloat16)
    image = torch.arange(35, dtype=torch.uint8).reshape(1, 1, 5, 7)
    assert_matches(simulated(aten.upsample_nearest2d.default, image, [9, 13]),
                   aten.upsample_nearest2d.default(image, [9, 13]))


def test_nearest_index_truncates_in_float32_and_stays_in_bounds():
    # scale 1/1.1 on a same-size output: torch computes floor(i · float(1/1.1)), not the identity, never above in - 1
    for in_size, out_size, scale in ((5, 5, 1.1), (3, 10, None), (7, 3, 0.4), (2, 41, None)):
        x = torch.arange(in_size, dtype=torch.float32).reshape(1, 1, in_size)
        expected = aten.upsample_nearest1d.default(x, [out_size], scale)[0, 0].long().numpy()
        sources = nearest_taps(in_size, out_size, scale, exact=False)[0][0]
        assert (sources == expected).all() and sources.max() < in_size


def test_resample_refusals_say_why():
    node = _node(aten.upsample_bilinear2d.default, torch.zeros(1, 1, 2, 2, dtype=torch.int32), [4, 4], False)
    assert "int32" in kernel_for(aten.upsample_bilinear2d.default, "simulator").refusal(node)


def _node(op, *args):
    """An FX node of op(*args) with the metadata the partitioner gives refusals."""
    from torch.fx.experimental.proxy_tensor import make_fx

    tensors = [a for a in args if isinstance(a, torch.Tensor)]

    def call(*inputs):
        supply = iter(inputs)
        return op(*[next(supply) if isinstance(a, torch.Tensor) else a for a in args])

    graph = make_fx(call, tracing_mode="fake")(*tensors).graph
    return next(n for n in graph.nodes if n.op == "call_function" and n.target is op)
