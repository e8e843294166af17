"""A program's cache key and the choice of program depend on the sizes a call has, not on the sizes the graph was
traced at nor on what an earlier run left in the process: so a warm-up finds the keys a fresh process needs."""

import torch
import torch._dynamo

import neuron_dynamo
from neuron_dynamo.bucket_dispatch import forget_generalized_graphs
from neuron_dynamo.cache import CompileCache
from neuron_dynamo.precompile import Loaded, Task, plan, run_plan

OPTIONS = {"target": "reference"}


class Heads(torch.nn.Module):
    """Float inputs only (its static graphs keep exact shapes) and views that read the length."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        batch, length, _ = x.shape
        heads = self.proj(x).view(batch, length, 2, 4).transpose(1, 2)
        return torch.nn.functional.silu(heads).transpose(1, 2).reshape(batch, length, 8)


def make_inputs(batch, length):
    return (torch.randn(batch, length, 8),)


def fresh_run(model, lengths):
    """The cache counters of calling `lengths` in order as a fresh process would (nothing compiled in memory)."""
    torch._dynamo.reset()
    forget_generalized_graphs()
    before = neuron_dynamo.stats()
    compiled = torch.compile(model, backend="neuron_dynamo", options=OPTIONS)
    with torch.no_grad():
        for length in lengths:
            (x,) = make_inputs(1, length)
            torch.testing.assert_close(compiled(x), model(x))
    after = neuron_dynamo.stats()
    return {name: after.get(name, 0) - before.get(name, 0) for name in ("cache.hits", "cache.misses")}


def bucket_entries(cache_dir):
    """Key of each stored program whose input is at the bucket size 128, by its input shapes."""
    return {str(entry.meta["input_shapes"]): entry.key for entry in CompileCache(root=cache_dir).entries()
            if [1, 128, 8] in entry.meta["input_shapes"]}


def test_a_bucket_program_has_one_key_whatever_size_the_graph_was_traced_at(tmp_path, monkeypatch):
    """Lengths 8 then 100 trace the dynamic graph at 100, 100 then 8 at 8: one program for their bucket of 128."""
    model = Heads().eval()
    keys = []
    for lengths in ([8, 100], [100, 8]):
        cache_dir = tmp_path / "-".join(map(str, lengths))
        monkeypatch.setenv("NEURON_DYNAMO_CACHE_DIR", str(cache_dir))
        assert fresh_run(model, lengths)["cache.misses"] >= 2
        keys.append(bucket_entries(cache_dir))
    assert len(keys[0]) == 1 and keys[0] == keys[1], keys


def test_the_runs_of_a_warm_up_do_not_share_programs_in_memory(cache_dir):
    """The auto plan for lengths 8 and 200 (buckets 128 and 256): its run starting at 200 stores the static program
    of 200; the run starting at 8 must still compile the bucket of 256 when it calls 200, since a fresh process
    calling 8 then 200 has no static program of 200 and takes that bucket."""
    model = Heads().eval()
    tasks = [Task(1, (8,)), Task(1, (200,))]
    runs = plan(tasks, "auto", train=False)
    settings = {"dtype": "float32", "dynamic": "auto", "options": OPTIONS}
    run_plan(Loaded(model, make_inputs, "heads", "seq"), tasks, runs, settings, report=lambda event: None)
    assert fresh_run(model, [8, 200]) == {"cache.hits": 2, "cache.misses": 0}


def test_returning_to_a_size_finds_the_program_of_a_strided_input(tmp_path, monkeypatch):
    """An input that is a view (a transposed feature map, as Diffusers' UNet and Wan-like blocks get): after sizes A
    and B, the dynamic graph at A again runs the program that A's static graph stored, traced with the view's
    strides (a contiguous retrace was another key: a miss)."""
    monkeypatch.setenv("NEURON_DYNAMO_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    forget_generalized_graphs()
    model = Heads().eval()
    compiled = torch.compile(model, backend="neuron_dynamo", options=OPTIONS)

    def call(length):
        x = torch.randn(1, 8, length).transpose(1, 2)  # [1, length, 8], strides (8 * length, 1, length)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))

    call(200)
    call(8)
    before = neuron_dynamo.stats()
    call(200)
    after = neuron_dynamo.stats()
    assert after.get("cache.misses", 0) == before.get("cache.misses", 0)
    assert after.get("cache.hits", 0) > before.get("cache.hits", 0)
