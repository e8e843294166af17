import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_dynamo.lowering import LoweringError, kernel_for, lower_region, lowering_for, registered_ops
from neuron_dynamo.lowering.registry import RegistryError, lowers

aten = torch.ops.aten


def test_every_family_the_nki_issues_lower_is_registered():
    families = registered_ops()
    assert set(families) == {"attention", "convolution", "creation", "elementwise", "linalg", "loss", "matmul",
                             "norm", "pooling", "reduction", "resample", "softmax", "sorting", "views"}
    for op in ("aten.mm", "aten.addmm", "aten.bmm", "aten.linear", "aten.t", "aten.permute"):
        assert op in families["matmul"]
    for op in ("aten._scaled_dot_product_flash_attention_for_cpu",
               "aten._scaled_dot_product_flash_attention_for_cpu_backward",
               "aten._scaled_dot_product_efficient_attention",
               "aten._scaled_dot_product_efficient_attention_backward"):
        assert op in families["attention"]
    assert {"aten._softmax", "aten._log_softmax", "aten._softmax_backward_data"} <= set(families["softmax"])
    assert {"aten.native_layer_norm", "aten._fused_rms_norm"} <= set(families["norm"])
    assert {"aten._to_copy", "prims.convert_element_type"} <= set(families["elementwise"])
    assert families["loss"] == ["aten.nll_loss_backward", "aten.nll_loss_forward"]


def test_lookup_by_overload_falls_back_to_packet():
    assert lowering_for(aten.add.Tensor).family == "elementwise"
    assert kernel_for(aten.mm.default, "reference").family == "matmul"
    assert kernel_for(aten.mm.default, "simulator").family == "matmul"
    assert kernel_for(aten._fused_rms_norm.default, "simulator") is None  # falls back on the NKI targets
    assert lowering_for(torch.ops.neuron_tests.eager_only.default) is None
    assert lowering_for(torch.relu) is None  # not an aten overload


def test_registering_twice_or_a_non_op_is_an_error():
    with pytest.raises(RegistryError, match="already has a 'reference' lowering"):
        lowers(aten.mm, family="matmul")(lambda op, *args: op(*args))
    with pytest.raises(RegistryError, match="family 'matmul'"):
        lowers(aten.mm, family="views", target="elsewhere")(lambda op, *args: op(*args))
    with pytest.raises(RegistryError, match="aten ops"):
        lowers(torch.relu, family="elementwise")(lambda op, *args: op(*args))


def test_lowered_region_calls_reference_kernels_and_matches_eager():
    fn = lambda x, w: torch.softmax(torch.nn.functional.gelu(x @ w), dim=-1).sum(0)
    x, w = torch.randn(4, 6), torch.randn(6, 5)
    region = make_fx(fn)(x, w)
    lowered = lower_region(region, "reference")
    assert "reference_aten_mm_default" in lowered.code
    assert "torch.ops.aten" not in lowered.code
    torch.testing.assert_close(lowered(x, w), fn(x, w))


def test_lowering_an_op_without_a_kernel_is_an_error():
    region = make_fx(lambda x: torch.ops.neuron_tests.eager_only(x))(torch.rand(3))
    with pytest.raises(LoweringError, match="neuron_tests.eager_only.default"):
        lower_region(region, "reference")
