"""Generalising a static graph whose attention mask is an input: the mask's length is tied to the keys'.

`generalize` makes the last dim of integer and bool inputs symbolic (token ids, masks) and keeps float inputs static.
The CPU attention op's meta function accepts any mask, so a bool mask over keys that come from float inputs (image
and text tokens, NucleusMoEImage) became a free symbol: its bucket program padded the mask alone and failed to run.
The mask must broadcast to `[..., queries, keys]`, as eager checks: such a graph keeps its exact shapes, while a mask
over keys built from the ids keeps its symbol, and its buckets run and match eager.
"""

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_dynamo.bucket_dispatch import BucketedGraph
from neuron_dynamo.passes.specialize import generalize

aten = torch.ops.aten


def _attention_ops(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function" and "attention" in str(n.target)]


def test_a_mask_over_keys_of_float_inputs_keeps_the_graph_exact():
    def image_and_text(image, text, mask):
        keys = torch.cat([image, text], dim=2)
        return F.scaled_dot_product_attention(image, keys, keys, attn_mask=mask[:, None, None, :])

    inputs = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 3, 8), torch.ones(1, 9, dtype=torch.bool)
    static = make_fx(image_and_text)(*inputs)
    assert aten._scaled_dot_product_flash_attention_for_cpu.default in _attention_ops(static)
    assert generalize(static) is None


def test_a_mask_over_keys_of_the_ids_keeps_its_symbol_and_buckets_match_eager():
    table = torch.randn(32, 2, 8)

    def embedded(ids, mask):
        x = table[ids].transpose(1, 2)  # [1, heads, length, head dim]
        return F.scaled_dot_product_attention(x, x, x, attn_mask=mask[:, None, None, :])

    ids, mask = torch.randint(0, 32, (1, 5)), torch.tensor([[True, True, True, False, True]])
    symbolic = generalize(make_fx(embedded)(ids, mask))
    assert symbolic is not None
    graph = BucketedGraph(symbolic)
    assert graph.proof.safe, graph.proof.reason
    for length in (5, 7):
        ids, mask = torch.randint(0, 32, (1, length)), torch.rand(1, length) > 0.3
        mask[0, 0] = True
        torch.testing.assert_close(graph.run(ids, mask)[0], embedded(ids, mask), rtol=1e-5, atol=1e-5)
    (program,) = graph.stats.calls  # one bucket program served both lengths
    assert program.startswith("bucket[") and program.endswith("=128]"), program
