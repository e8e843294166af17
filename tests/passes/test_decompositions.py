import torch

from neuron_dynamo.lowering import lowering_for
from neuron_dynamo.passes.decompositions import decomposition_table

aten = torch.ops.aten


def test_ops_with_a_lowering_are_never_decomposed():
    table = decomposition_table()
    for op in (aten.silu.default, aten.t.default, aten._fused_rms_norm.default, aten.gelu_backward.default,
               aten._softmax_backward_data.default, aten.native_layer_norm_backward.default):
        assert op not in table
    assert all(lowering_for(op) is None for op in table if isinstance(op, torch._ops.OpOverload))


def test_ops_without_a_lowering_decompose_to_core_aten():
    table = decomposition_table()
    assert aten.embedding_dense_backward.default in table
    assert aten.addcmul.default in table
