"""Bugs found by the padding fuzzer (`test_padding_fuzz.py`), minimised to a few lines each.

Each is a strict xfail until its rule (or pass) is fixed; then remove the xfail here and the matching `KnownBug`
entry in `test_padding_fuzz.py`.
"""

import torch
import torch.nn.functional as F  # noqa: N812

import neuron_dynamo


def _compiled(fn, dynamic=True):
    torch._dynamo.reset()
    neuron_dynamo.reset_stats()
    return torch.compile(fn, backend="neuron", dynamic=dynamic, options={"target": "reference", "cache": "off"})


def _attend(x):
    q = x.reshape(x.shape[0], x.shape[1], 2, 4).transpose(1, 2)
    return F.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(x.shape)


def test_attention_output_reshaped_twice_keeps_its_buckets():
    """Found by the fuzzer: the attention output's reshape was recorded as a view valid at the traced strides; the
    mask the padding proof inserts before the second attention changes the layout at the bucket, so the bucket
    program was not traceable (every length ran exact). The retrace now copies where such a view cannot apply."""
    def fn(x):
        return _attend(_attend(x))

    compiled = _compiled(fn)
    with torch.no_grad():
        for length in (5, 7):
            x = torch.randn(2, length, 8)
            torch.testing.assert_close(compiled(x), fn(x))
    stats = neuron_dynamo.stats()
    assert stats.get("bucketing.refusals.bucket", 0) == 0, stats  # "bucket s27=128 not traceable, running exact"


def _one_hot_at(length):
    x = torch.zeros(2, length, 8)
    x[1, 2, 3] = 1.0
    return x


def test_argmax_over_all_dims_counts_in_real_positions():
    """Found by the fuzzer: the flat index of a padded [B, L, H] tensor was the bucket's (1*128*8 + 2*8 + 3 = 1043),
    not the real one (75). The proof now refuses indices numbered across a padded dim that is not the outermost."""
    def fn(x):
        return x.argmax()

    compiled = _compiled(fn)
    for length in (5, 7):  # 5 runs exact (the first call), 7 in the bucket 128
        x = _one_hot_at(length)
        assert compiled(x).item() == fn(x).item(), length


def test_argmax_over_a_merged_dim_counts_in_real_positions():
    """Found by the fuzzer: over a merged [H, L] dim (L padded, not the outer factor) the index was the bucket's
    (3*128 + 2 = 386), not the real one (3*7 + 2 = 23)."""
    def fn(x):
        return x.transpose(1, 2).reshape(x.shape[0], -1).argmax(-1)

    compiled = _compiled(fn)
    for length in (5, 7):
        x = _one_hot_at(length)
        assert torch.equal(compiled(x), fn(x)), length


def test_argmax_with_the_length_outermost_stays_bucketed():
    """The index is the real one when the padding comes after every real position: bucketing is kept."""
    def fn(x):
        return x.reshape(x.shape[0], -1).argmax(-1)  # [B, L*H]: L is the outer factor

    compiled = _compiled(fn)
    for length in (5, 7, 130):
        x = _one_hot_at(length)
        assert torch.equal(compiled(x), fn(x)), length
    assert neuron_dynamo.stats().get("bucketing.programs", 0) >= 1
    assert not neuron_dynamo.stats().get("bucketing.graphs_refused")
