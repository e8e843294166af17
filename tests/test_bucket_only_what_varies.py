"""Padding only where sizes vary: `torch.compile(fn, backend="neuron", dynamic=True)`, no options.

Under `dynamic=True` Dynamo makes every dim symbolic, the batch and the head dim included. A size under the default
policy runs at its exact value while it has had one value; from its second value on it is bucketed. A size whose
policy the user chose (`bucket_dims`, explicit `buckets`), and the sizes of graphs Dynamo made dynamic because they
changed, are bucketed from the first call. Every test runs on the default target.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import neuron_dynamo
from neuron_dynamo import counters
from neuron_dynamo.report import ExplainReport


@pytest.fixture(autouse=True)
def _fresh_stats():
    neuron_dynamo.reset_stats()


def attend(q, k, v):
    """Attention over `[batch, length, head_dim]` without weights: every dim stays symbolic under dynamic=True."""
    return torch.softmax(q @ k.transpose(1, 2) * 0.35, dim=-1) @ v


def _qkv(batch: int, length: int, head_dim: int = 8):
    return [torch.randn(batch, length, head_dim) for _ in range(3)]


def _run(compiled, fn, *args):
    """Call `compiled` like `fn`, check it against eager; return the reports and the tensor input shapes of the
    programs that ran (without the 0-d real sizes a padded program also takes)."""
    with counters.collect_reports() as reports:
        got = compiled(*args)
    torch.testing.assert_close(got, fn(*args), atol=1e-5, rtol=1e-5)
    return reports, [shape for report in reports for shape in report.input_shapes if shape]


def _symbol_stats(reports) -> dict:
    """The per-symbol stats of the (one) bucketed graph that ran, keyed by the input dim the symbol is read at."""
    (stats,) = {id(r.bucket_stats): r.bucket_stats for r in reports if r.bucket_stats is not None}.values()
    return {int(symbol.site.rsplit("dim ", 1)[1]): symbol for symbol in stats.symbols.values()}


def _padding_by_symbol() -> dict[str, int]:
    return {k.rsplit(".", 1)[1]: v for k, v in neuron_dynamo.stats().items() if ".padding_elements." in k}


def test_batch_and_head_dim_are_not_padded_while_only_the_length_varies():
    torch.manual_seed(0)
    compiled = torch.compile(attend, backend="neuron", dynamic=True)
    shapes = []
    for length in (5, 9, 20, 130):
        reports, ran = _run(compiled, attend, *_qkv(2, length))
        shapes.append(ran)
    # the first length runs exact (one value so far), then the length gets buckets of 128; batch 2, head dim 8 stay
    assert shapes == [[[2, 5, 8]] * 3, [[2, 128, 8]] * 3, [[2, 128, 8]] * 3, [[2, 256, 8]] * 3]
    stats = neuron_dynamo.stats()
    assert stats["bucketing.padded_elements"] == 3 * 2 * 8 * (5 + 128 + 128 + 256)
    assert stats["bucketing.real_elements"] == 3 * 2 * 8 * (5 + 9 + 20 + 130)
    assert stats["bucketing.sizes_varied"] == 1
    symbols = _symbol_stats(reports)
    assert symbols[0].padding_elements == 0 and symbols[0].values == {2} and symbols[0].mode.startswith("exact")
    assert symbols[2].padding_elements == 0 and symbols[2].values == {8}
    assert symbols[1].padding_elements == 3 * 2 * 8 * (128 - 9 + 128 - 20 + 256 - 130)
    assert symbols[1].mode == "multiple of 128 (since call 2)"
    assert sorted(_padding_by_symbol().values()) == [0, 0, symbols[1].padding_elements]
    text = str(ExplainReport(graphs=list({id(r): r for r in reports}.values())))
    assert "padding by dynamic size" in text and "exact while it has one value (then multiple of 128)" in text


def test_batch_is_bucketed_once_it_varies():
    torch.manual_seed(0)
    compiled = torch.compile(attend, backend="neuron", dynamic=True)
    shapes = [_run(compiled, attend, *_qkv(batch, length))[1][0] for batch, length in ((2, 5), (2, 9), (3, 9), (2, 9))]
    assert shapes == [[2, 5, 8], [2, 128, 8], [128, 128, 8], [128, 128, 8]]  # from the second batch size on
    assert neuron_dynamo.stats()["bucketing.sizes_varied"] == 2


def test_bucket_dims_pads_the_batch_from_the_first_call():
    torch.manual_seed(0)
    compiled = torch.compile(attend, backend="neuron", dynamic=True, options={"bucket_dims": ("0=pow2",)})
    shapes = [_run(compiled, attend, *_qkv(3, length))[1][0] for length in (5, 9)]
    assert shapes == [[4, 5, 8], [4, 128, 8]]  # batch 3 -> 4 at once; the length waits until it varies


def test_explicit_buckets_apply_from_the_first_call():
    torch.manual_seed(0)
    compiled = torch.compile(attend, backend="neuron", dynamic=True, options={"buckets": (16, 64)})
    assert _run(compiled, attend, *_qkv(2, 5))[1][0] == [16, 16, 16]


def test_graph_made_dynamic_by_a_size_change_is_bucketed_at_once():
    """Without dynamic=True Dynamo makes a dim symbolic only once it changed: it varies, so it is bucketed."""

    def scale(x):
        return torch.softmax(x, dim=1) * 3

    compiled = torch.compile(scale, backend="neuron")
    shapes = [_run(compiled, scale, torch.randn(2, length))[1] for length in (5, 9, 20)]
    assert shapes == [[[2, 5]], [[2, 128]], [[2, 128]]]


def test_static_graph_generalisation_buckets_the_length_from_the_first_call():
    """dynamic=False: the generalised graph makes only the length symbolic, because lengths vary."""

    def pool(ids, mask):
        return (ids * mask).sum(1)

    compiled = torch.compile(pool, backend="neuron", dynamic=False)
    ids, mask = torch.randint(0, 50, (2, 7)), torch.ones(2, 7, dtype=torch.long)
    assert _run(compiled, pool, ids, mask)[1] == [[2, 128], [2, 128]]


@pytest.mark.slow
def test_tiny_llama_dynamic_true_keeps_batch_two():
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).parent / "hf"))
    from tiny_models import tiny_causal_lm

    model = tiny_causal_lm("llama")
    compiled = torch.compile(model, backend="neuron", dynamic=True)
    vocab = model.config.vocab_size
    with torch.no_grad():
        for length in (37, 50):
            ids = torch.randint(0, vocab, (2, length))
            with counters.collect_reports() as reports:
                got = compiled(input_ids=ids).logits
            torch.testing.assert_close(got, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    stats = neuron_dynamo.stats()
    assert stats["bucketing.real_elements"] == 2 * 37 + 2 * 50
    assert stats["bucketing.padded_elements"] == 2 * 37 + 2 * 128  # exact at 37, then bucket 128; batch stays 2
    symbols = _symbol_stats(reports)
    assert symbols[0].values == {2} and symbols[0].padding_elements == 0
    assert symbols[1].values == {37, 50} and symbols[1].padding_elements == 2 * (128 - 50)
