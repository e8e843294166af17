"""Functional collectives in a graph, in one process (a gloo group of one rank): fast.

They run through torch.distributed with the reason "collective" (never "unsupported op"), everything around them is
lowered, and the padding proof treats them soundly. The two-rank runs are in test_torchrun.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import neuron_dynamo
from neuron_dynamo.passes.padding import Pad, prove_padding

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from symbolic import symbolic_graph  # noqa: E402

c10d = torch.ops._c10d_functional


@pytest.fixture
def world_of_one():
    """A single-rank gloo group: collectives run for real, with nothing to wait for (and the counters start at 0)."""
    neuron_dynamo.reset_stats()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _tensor_parallel_step(x, w_in, w_out):
    """A row-parallel MLP as tensor parallel writes it: partial sums all-reduced, then gathered and re-scattered."""
    group = dist.group.WORLD
    hidden = torch.relu(x @ w_in)
    out = funcol.all_reduce(hidden @ w_out, "sum", group)
    gathered = funcol.all_gather_single(out.sin(), 0, group)
    return funcol.reduce_scatter_single(gathered * 2, "sum", 0, group) + 1


def test_collectives_run_through_torch_distributed_and_the_rest_is_lowered(world_of_one):
    x, w_in, w_out = torch.randn(6, 16), torch.randn(16, 32), torch.randn(32, 16)
    report = neuron_dynamo.explain(_tensor_parallel_step, x, w_in, w_out)  # the default target
    torch.testing.assert_close(report.output, _tensor_parallel_step(x, w_in, w_out), atol=1e-4, rtol=1e-4)
    (graph,) = report.graphs
    reasons = {entry["op"]: entry["reason"] for entry in graph.fallback_ops}
    assert set(reasons) == {f"_c10d_functional.{op}.default" for op in
                            ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "wait_tensor")}
    assert set(reasons.values()) == {"collective (run by torch.distributed)"}
    assert graph.ops_lowered == graph.ops_total - sum(entry["count"] for entry in graph.fallback_ops)
    assert report.totals()["fallback_ops"] == 0 and report.totals()["collectives"] == 6
    text = str(report)
    assert "no fallback ops: every op but the collectives ran on the target" in text
    assert "collectives (run by torch.distributed between the regions):" in text
    assert "unsupported op" not in text
    assert neuron_dynamo.stats()["fallback_ops._c10d_functional.all_reduce.default (collective)"] == 1


def test_a_collective_is_no_failure_under_fallback_error(world_of_one):
    x, w_in, w_out = torch.randn(6, 16), torch.randn(16, 32), torch.randn(32, 16)
    compiled = torch.compile(_tensor_parallel_step, backend="neuron",
                             options={"fallback": "error", "target": "reference"})
    torch.testing.assert_close(compiled(x, w_in, w_out), _tensor_parallel_step(x, w_in, w_out))


def test_collectives_over_a_padded_length_serve_every_length_from_one_bucket(world_of_one):
    w_in, w_out = torch.randn(16, 32), torch.randn(32, 16)
    compiled = torch.compile(_tensor_parallel_step, backend="neuron", dynamic=True, options={"target": "reference"})
    for length in (5, 9, 12):
        x = torch.randn(length, 16)
        want = _tensor_parallel_step(x, w_in, w_out)
        torch.testing.assert_close(compiled(x, w_in, w_out), want, atol=1e-4, rtol=1e-4)  # padded: another sum order
    stats = neuron_dynamo.stats()
    assert stats.get("bucketing.graphs_refused", 0) == 0, stats
    # dynamic=True runs the first length exact (adaptive), then both later lengths from one padded program
    assert [count for key, count in stats.items() if ".calls.bucket[" in key] == [2], stats


# ---- the proof, for two ranks (traced with fake tensors: nothing is communicated) ------------------------------------


def _proof(fn, *shapes, dynamic=None):
    gm = symbolic_graph(fn, [torch.randn(*shape) for shape in shapes], dynamic or {0: [0]})
    symbols = {size.node.expr for node in gm.graph.nodes if node.op == "placeholder"
               for size in node.meta["val"].shape if isinstance(size, torch.SymInt)}
    return prove_padding(gm, sorted(symbols, key=str))


def test_all_reduce_keeps_a_zero_pad_and_a_sum_after_it_needs_no_mask():
    proof = _proof(lambda x: c10d.wait_tensor(c10d.all_reduce(x * 2, "sum", "0")).sum(0), (5, 4))
    assert proof.safe, proof.reason
    assert proof.masks == []  # 0 + 0 across ranks is 0: the sum over the padded dim reads only zeros there


def test_all_reduce_of_a_nonzero_pad_is_masked_before_a_sum():
    proof = _proof(lambda x: c10d.wait_tensor(c10d.all_reduce(x.exp(), "sum", "0")).sum(0), (5, 4))
    assert proof.safe and any("sum" in mask for mask in proof.masks), proof.masks


def test_all_gather_along_the_padded_dim_is_followed_as_rank_blocks():
    # [2·s] after the gather: each rank's block carries its own pad; a sum masks both blocks' pads
    proof = _proof(lambda x: c10d.wait_tensor(c10d.all_gather_into_tensor(x.exp(), 2, "0")).sum(0), (5, 4))
    assert proof.safe, proof.reason


def test_all_gather_along_the_padded_dim_then_chunked_is_refused():
    def gather_then_first_block(x):
        gathered = c10d.wait_tensor(c10d.all_gather_into_tensor(x, 2, "0"))
        return gathered[: x.shape[0]] * 2

    proof = _proof(gather_then_first_block, (5, 4))
    assert not proof.safe


def test_reduce_scatter_of_a_tail_padded_dim_is_refused():
    proof = _proof(lambda x: c10d.wait_tensor(c10d.reduce_scatter_tensor(x, "sum", 2, "0")) * 2, (6, 4))
    assert not proof.safe and "reduce_scatter cuts padded dim 0" in proof.reason, proof.reason


def test_reduce_scatter_of_gathered_rank_blocks_gives_each_rank_its_tail_padded_block():
    def gather_scatter(x):
        gathered = c10d.wait_tensor(c10d.all_gather_into_tensor(x, 2, "0"))
        return c10d.wait_tensor(c10d.reduce_scatter_tensor(gathered, "sum", 2, "0")).cumsum(0)

    proof = _proof(gather_scatter, (5, 4))  # cumsum refuses a merged dim: the scattered one is a tail again
    assert proof.safe, proof.reason


def test_a_collective_over_a_size_of_two_symbols_is_refused():
    def flattened(x):
        return c10d.wait_tensor(c10d.all_reduce(x.reshape(-1), "sum", "0")) * 2

    proof = _proof(flattened, (5, 3), dynamic={0: [0, 1]})
    assert not proof.safe and "ranks with equal real sizes could pad it differently" in proof.reason, proof.reason


def test_all_to_all_over_a_padded_dim_is_refused():
    proof = _proof(lambda x: c10d.wait_tensor(c10d.all_to_all_single(x, [3, 3], [3, 3], "0")) * 2, (6, 4))
    assert not proof.safe and "all_to_all_single" in proof.reason, proof.reason


def test_pad_kinds_after_a_reduction_across_ranks():
    from neuron_dynamo.passes.padding.collective_rules import _reduced_kind

    assert _reduced_kind(Pad.ZERO, "sum", torch.float32) is Pad.ZERO
    assert _reduced_kind(Pad.NEG_INF, "max", torch.float32) is Pad.NEG_INF
    assert _reduced_kind(Pad.NEG_INF, "product", torch.float32) is Pad.UNKNOWN
    assert _reduced_kind(Pad.FINITE, "sum", torch.float32) is Pad.UNKNOWN  # may overflow
    assert _reduced_kind(Pad.FINITE, "sum", torch.int64) is Pad.FINITE
