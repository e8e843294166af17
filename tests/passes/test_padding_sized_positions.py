"""Positions computed from a dynamic size, under bucketing: slices and pads that name a place in the real data.

Diffusers blocks join the image tokens (length n, padded to a bucket) with text or memory tokens of fixed length and
cut them apart again at positions computed from n:

- `x[:, -n:]` of `n + c` tokens (memory tokens in front) starts at c at any n: a plain slice;
- `x[:, n:]` of `n + k` tokens (JoyImage's text after the image), and `t[-n:]` of a table whose length is a size of
  its own (Stable Audio 3's RoPE table of memory and audio tokens), are read where they begin at the real sizes;
- `F.pad(mask, (n, 0), value=True)` (HunyuanVideo 1.5's text mask, in front of which the image's n are all True) is
  `cat([full(n), mask])`: the mask is moved up to the real end of the fill, as a cat moves up what follows a padded
  operand;
- `repeat` tiles as `expand` copies: an unpadded dim tiled n times (the square mask) fills the pad with real data.

Near misses are refused: a slice of a merged dim (`[8, n]` flattened: padding sits between the rows, so the last n
real elements are not a tail), a slice from a computed start that does not run to the end of the dim, `buffer[n:]`
of a fixed buffer (a bucket's larger n would read fewer elements than the real one), a pad as wide as n in front of
a dim that is itself padded and a padded dim tiled twice (padding would sit between real data).
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from neuron_dynamo.bucket_dispatch import BucketedGraph
from neuron_dynamo.passes.bucketing import BucketConfig
from neuron_dynamo.passes.padding import prove_padding

from .symbolic import dynamo_graph

TEXT_MASK = [True, True, True, False, True]


def _memory_then_rope(x, memory):
    """Memory tokens in front, the rotation table of the whole sequence cut to the last n (Stable Audio 3)."""
    length = x.shape[1]
    tokens = torch.cat([memory, x], 1)
    table = torch.cos(torch.arange(tokens.shape[1], dtype=torch.float32))[:, None] * torch.ones(8)
    return (tokens[:, -length:] * table[-length:]).softmax(1)


def _table_of_its_own_length(x, table):
    """The table passed in, its length a size of its own (n plus the memory tokens, which the graph cannot know):
    its last n rows, gathered at its real end."""
    return (x * torch.cos(table[-x.shape[1]:])).softmax(1)


def _last_half(x, memory):
    """The last half of the image, after memory tokens: read where it begins at the real sizes."""
    half = x.shape[1] // 2
    return torch.cat([memory, x], 1)[:, -half:] * 2


def _joint_attention_split(x, text):
    """Image then text tokens attend jointly; the text is cut out after the image (JoyImage)."""
    joint = torch.cat([x, text], 1)
    mixed = F.scaled_dot_product_attention(joint[:, None], joint[:, None], joint[:, None])[:, 0]
    return mixed[:, :x.shape[1]], mixed[:, x.shape[1]:]


def _mask_padded_in_front(x, text):
    """The text mask padded in front by the image length, made a square mask over image and text (HunyuanVideo 1.5)."""
    joint = torch.cat([x, text], 1)
    seq_len = joint.shape[1]
    text_mask = torch.tensor(TEXT_MASK).expand(x.shape[0], -1)
    mask = F.pad(text_mask, (seq_len - text_mask.shape[1], 0), value=True)
    square = mask.view(x.shape[0], 1, 1, seq_len).repeat(1, 1, seq_len, 1)
    square = square & square.transpose(2, 3)
    mixed = F.scaled_dot_product_attention(joint[:, None], joint[:, None], joint[:, None], attn_mask=square)[:, 0]
    return mixed[:, :-text.shape[1]], mixed[:, -text.shape[1]:]


def _inputs(n: int) -> list[torch.Tensor]:
    """n image tokens, and 5 memory or text tokens."""
    generator = torch.Generator().manual_seed(n)
    return [torch.randn(2, n, 8, generator=generator), torch.randn(2, 5, 8, generator=generator)]


def _table_inputs(n: int) -> list[torch.Tensor]:
    """n image tokens, and a table of n + 5 rows."""
    generator = torch.Generator().manual_seed(n)
    return [torch.randn(2, n, 8, generator=generator), torch.randn(n + 5, 8, generator=generator)]


ACCEPTED = {
    "memory_then_rope": (_memory_then_rope, _inputs, {0: [1]}),
    "table_of_its_own_length": (_table_of_its_own_length, _table_inputs, {0: [1], 1: [0]}),
    "last_half": (_last_half, _inputs, {0: [1]}),
    "joint_attention_split": (_joint_attention_split, _inputs, {0: [1]}),
    "mask_padded_in_front": (_mask_padded_in_front, _inputs, {0: [1]}),
}


@functools.cache
def _bucketed(name: str) -> BucketedGraph:
    fn, inputs, dynamic = ACCEPTED[name]
    return BucketedGraph(dynamo_graph(fn, inputs(6), dynamic), BucketConfig.from_options(multiple=16))


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_positions_from_a_size_are_proven_and_a_bucket_serves_every_length(name):
    fn, inputs, _ = ACCEPTED[name]
    bucketed = _bucketed(name)
    assert bucketed.proof.safe, bucketed.proof.reason
    for length in (3, 17, 26, 5):
        want = fn(*inputs(length))
        want = list(want) if isinstance(want, tuple) else [want]
        for got, expected in zip(bucketed.run(*inputs(length)), want, strict=True):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(bucketed.stats.programs) == 2  # lengths 3 and 5 in the bucket of 16, 17 and 26 in the bucket of 32


def _proof(fn):
    graph = dynamo_graph(fn, _inputs(6), {0: [1]})
    sizes = [size for n in graph.graph.nodes if n.op == "placeholder" for size in n.meta["val"].shape]
    return prove_padding(graph, [next(size.node.expr for size in sizes if isinstance(size, torch.SymInt))])


@pytest.mark.parametrize("fn, reason", [
    (lambda x, memory: x.transpose(1, 2).reshape(2, -1)[:, -x.shape[1]:] * 2, "merged padded dim"),
    (lambda x, text: torch.cat([x, text], 1)[:, x.shape[1] // 2:x.shape[1]] * 2, "slice start"),
    (lambda x, text: text.reshape(-1)[x.shape[1]:] * x.sum(), "slice start"),
    (lambda x, text: F.pad(x, (0, 0, x.shape[1], 0), value=1.0) + text.sum(), "pad width"),
    (lambda x, text: x.repeat(1, 2, 1) + text.sum(), "tiling a padded dim"),
], ids=["last_n_of_a_merged_dim", "not_to_the_end", "fewer_with_a_larger_n", "pad_in_front_of_a_padded_dim",
        "tiling_a_padded_dim"])
def test_positions_that_move_with_the_padding_are_refused(fn, reason):
    proof = _proof(fn)
    assert not proof.safe and reason in proof.reason, proof.reason
