"""The canonical graph text ignores names and metadata and keeps every constant."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_dynamo.cache import make_key
from neuron_dynamo.passes.canonical import canonical_graph_text, input_signature


def trace(fn, *shapes):
    return make_fx(fn)(*[torch.randn(s) for s in shapes])


def attention_like(query, key):
    return torch.softmax(query @ key.transpose(-1, -2) * 0.125, dim=-1)


def test_same_graph_same_text_whatever_the_names():
    def renamed(q, k):
        scores = q @ k.transpose(-1, -2)
        return torch.softmax(scores * 0.125, dim=-1)

    a, b = trace(attention_like, (2, 4, 8), (2, 4, 8)), trace(renamed, (2, 4, 8), (2, 4, 8))
    for node in b.graph.nodes:
        node.meta["stack_trace"] = "File user.py, line 99"
    assert canonical_graph_text(a) == canonical_graph_text(b)


def test_constants_change_the_text():
    base = canonical_graph_text(trace(attention_like, (2, 4, 8), (2, 4, 8)))
    other_scale = canonical_graph_text(
        trace(lambda q, k: torch.softmax(q @ k.transpose(-1, -2) * 0.25, dim=-1), (2, 4, 8), (2, 4, 8))
    )
    other_dim = canonical_graph_text(
        trace(lambda q, k: torch.softmax(q @ k.transpose(-1, -2) * 0.125, dim=-2), (2, 4, 8), (2, 4, 8))
    )
    cast = canonical_graph_text(trace(lambda x: x.to(torch.bfloat16), (4,)))
    assert len({base, other_scale, other_dim}) == 3
    assert "torch.bfloat16" in cast


def test_module_constants_are_hashed_by_content():
    class WithConstant(torch.nn.Module):
        def __init__(self, value):
            super().__init__()
            self.register_buffer("table", torch.full((4,), value))

        def forward(self, x):
            return x + self.table

    texts = {canonical_graph_text(torch.fx.symbolic_trace(WithConstant(v))) for v in (1.0, 1.0, 2.0)}
    assert len(texts) == 2


def test_input_signature_covers_shape_stride_dtype():
    x = torch.randn(4, 8)
    assert input_signature([x]) != input_signature([x.t().contiguous().t()])
    assert input_signature([x]) != input_signature([x.to(torch.bfloat16)])
    assert make_key({"sig": input_signature([x, 3])}) == make_key({"sig": input_signature([x.clone(), 3])})
