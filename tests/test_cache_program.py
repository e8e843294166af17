"""The compile cache in the compile path: keys, hits across processes, recovery, modes, stats and the report."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_dynamo
from neuron_dynamo import counters
from neuron_dynamo.cache_key import KEY_EXEMPT_OPTIONS, program_key
from neuron_dynamo.compiler import compile_static
from neuron_dynamo.options import resolve_options
from neuron_dynamo.toolchain import REFERENCE


def options(**overrides):
    return resolve_options({"target": "reference", **overrides}, environ={"NEURON_DYNAMO_CACHE_DIR": os.environ.get(
        "NEURON_DYNAMO_CACHE_DIR", "")})


def mlp(x, w1, w2):
    return torch.softmax(torch.nn.functional.gelu(x @ w1) @ w2 * 0.5, dim=-1)


def traced(fn=mlp, shapes=((3, 8), (8, 16), (16, 4)), dtype=torch.float32):
    inputs = [torch.randn(shape, dtype=dtype) for shape in shapes]
    return make_fx(fn)(*inputs), inputs


def cache_stats():
    return {name: value for name, value in counters.stats().items() if name.startswith("cache.")}


# ------------------------------------------------------------------------------------------------------ keys
def test_key_is_stable_across_hash_seeds(pinned_sources):
    code = textwrap.dedent("""
        import torch
        from torch.fx.experimental.proxy_tensor import make_fx
        from neuron_dynamo.cache_key import program_key
        from neuron_dynamo.options import resolve_options
        from neuron_dynamo.toolchain import REFERENCE
        def fn(x, w):
            return torch.softmax(x @ w * 0.5, dim=-1).sum(dim=(0,))
        inputs = [torch.zeros(3, 8), torch.zeros(8, 4)]
        print(program_key(make_fx(fn)(*inputs), inputs, resolve_options({"eager_ops": ["aten.sum"]}, environ={}),
                          REFERENCE))
    """)
    keys = {
        subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                       capture_output=True, text=True, check=True).stdout.strip()
        for seed in ("0", "1", "4242")
    }
    assert len(keys) == 1 and len(keys.pop()) == 64


def test_key_ignores_placeholder_names_and_metadata():
    gm, inputs = traced()
    renamed, _ = traced()
    for index, node in enumerate(renamed.graph.nodes):
        if node.op == "placeholder":
            node.name = node.target = f"user_arg_{index}"
        node.meta["stack_trace"] = "File model.py, line 12"
    renamed.recompile()
    assert program_key(gm, inputs, options(), REFERENCE) == program_key(renamed, inputs, options(), REFERENCE)


@dataclasses.dataclass(frozen=True)
class VersionedTarget:
    """The reference target, plus the toolchain facts a real toolchain reports."""

    version: str
    name: str = "reference"

    def cache_facts(self):
        return {"toolchain": "fake-neuronx-cc", "version": self.version, "flags": ["-O2"]}

    def supports(self, node):
        return REFERENCE.supports(node)

    def compile_region(self, lowered, example_inputs):
        return lowered


def test_key_changes_with_everything_that_changes_the_artifact():
    gm, inputs = traced()
    base = program_key(gm, inputs, options(), REFERENCE)

    def key_of(fn=mlp, shapes=((3, 8), (8, 16), (16, 4)), dtype=torch.float32, opts=None, target=REFERENCE):
        graph, args = traced(fn, shapes, dtype)
        return program_key(graph, args, opts or options(), target)

    changed = {
        "shape": key_of(shapes=((5, 8), (8, 16), (16, 4))),
        "dtype": key_of(dtype=torch.bfloat16),
        "constant": key_of(lambda x, w1, w2: torch.softmax(torch.nn.functional.gelu(x @ w1) @ w2 * 0.25, dim=-1)),
        "constant dim": key_of(lambda x, w1, w2: torch.softmax(torch.nn.functional.gelu(x @ w1) @ w2 * 0.5, dim=0)),
        "option": key_of(opts=options(eager_ops=("aten.gelu",))),
        "option fallback": key_of(opts=options(min_region_size=2)),
        "cache_tag": key_of(opts=options(cache_tag="experiment-2")),
        "toolchain 2.19": key_of(target=VersionedTarget("2.19")),
        "toolchain 2.20": key_of(target=VersionedTarget("2.20")),
    }
    assert base not in changed.values()
    assert len(set(changed.values())) == len(changed)
    strided = [inputs[0].t().contiguous().t(), *inputs[1:]]  # same shape, other strides
    assert program_key(gm, strided, options(), REFERENCE) != base


def test_key_ignores_where_the_cache_lives_and_the_bucket_policy(tmp_path):
    gm, inputs = traced()
    base = program_key(gm, inputs, options(), REFERENCE)
    same = options(cache_dir=str(tmp_path), cache="readonly", retry_failed=True, cache_max_mb=5, bucket_multiple=64)
    assert program_key(gm, inputs, same, REFERENCE) == base
    assert {"cache", "cache_dir", "cache_tag", "retry_failed"} <= KEY_EXEMPT_OPTIONS


def test_key_changes_with_the_package_sources(monkeypatch):
    import neuron_dynamo.cache_key as cache_key

    gm, inputs = traced()
    base = program_key(gm, inputs, options(), REFERENCE)
    assert len(cache_key.source_hash()) == 64
    monkeypatch.setattr(cache_key, "source_hash", lambda: "an edited lowering")
    assert program_key(gm, inputs, options(), REFERENCE) != base


# ------------------------------------------------------------------------------------------- hits and misses
def test_second_compile_is_a_hit_that_skips_partitioning(cache_dir, monkeypatch):
    gm, inputs = traced()
    counters.reset_stats()
    cold = compile_static(gm, inputs, options(), REFERENCE)
    assert cold.report.cache == "miss"
    import neuron_dynamo.compiler as compiler

    monkeypatch.setattr(compiler, "partition", lambda *a, **k: pytest.fail("a hit must not partition"))
    monkeypatch.setattr(compiler, "lower_region", lambda *a, **k: pytest.fail("a hit must not lower"))
    warm = compile_static(traced()[0], inputs, options(), REFERENCE)
    assert warm.report.cache == "hit"
    torch.testing.assert_close(warm(*inputs), mlp(*inputs))
    torch.testing.assert_close(warm(*inputs), cold(*inputs))
    for field in ("ops_total", "ops_lowered", "flops_total", "regions", "fallback_ops", "input_shapes"):
        assert getattr(warm.report, field) == getattr(cold.report, field)
    assert cache_stats()["cache.hits"] == 1 and cache_stats()["cache.misses"] == 1


def test_fresh_process_after_a_warm_run_has_no_miss(cache_dir, pinned_sources):
    script = textwrap.dedent("""
        import json, torch, neuron_dynamo
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 4),
                                    torch.nn.LayerNorm(4))
        x = torch.randn(2, 8, requires_grad=True)
        compiled = torch.compile(model, backend="neuron_dynamo", options={"target": "reference"})
        out = compiled(x)
        out.sum().backward()  # forward and backward graphs
        torch.testing.assert_close(out, model(x))
        print(json.dumps({k: v for k, v in neuron_dynamo.stats().items() if k.startswith("cache.")}))
    """)

    def run():
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.strip().splitlines()[-1])

    cold, warm = run(), run()
    assert cold.get("cache.misses", 0) == 2 and cold.get("cache.hits", 0) == 0  # forward + backward
    assert warm.get("cache.misses", 0) == 0 and warm.get("cache.hits", 0) == 2


def test_truncated_entry_is_a_counted_miss_and_is_recovered(cache_dir):
    gm, inputs = traced()
    compile_static(gm, inputs, options(), REFERENCE)
    (entry,) = cache_dir.glob("v1/entries/*/*.entry")
    entry.write_bytes(entry.read_bytes()[:-20])
    counters.reset_stats()
    program = compile_static(gm, inputs, options(), REFERENCE)
    assert program.report.cache == "miss"
    assert cache_stats()["cache.corrupt"] == 1
    torch.testing.assert_close(program(*inputs), mlp(*inputs))
    assert compile_static(gm, inputs, options(), REFERENCE).report.cache == "hit"


def test_unusable_entry_is_quarantined_and_compiled_again(cache_dir, monkeypatch):
    import neuron_dynamo.program_cache as program_cache

    gm, inputs = traced()
    compile_static(gm, inputs, options(), REFERENCE)
    monkeypatch.setattr(program_cache, "PROGRAM_FORMAT", 999)  # as if written by another format
    counters.reset_stats()
    program = compile_static(gm, inputs, options(), REFERENCE)
    assert program.report.cache == "miss" and cache_stats()["cache.corrupt"] == 1
    assert len(list(cache_dir.glob("v1/quarantine/*"))) == 1


def test_unusable_entry_in_a_readonly_cache_is_compiled_without_it(cache_dir, monkeypatch):
    import neuron_dynamo.program_cache as program_cache

    gm, inputs = traced()
    compile_static(gm, inputs, options(), REFERENCE)
    monkeypatch.setattr(program_cache, "PROGRAM_FORMAT", 999)
    program = compile_static(gm, inputs, options(cache="readonly"), REFERENCE)
    assert program.report.cache == "miss"
    torch.testing.assert_close(program(*inputs), mlp(*inputs))
    assert len(list(cache_dir.glob("v1/entries/*/*.entry"))) == 1  # a read-only cache is left as it is


def test_cache_options_reach_the_store(tmp_path):
    from neuron_dynamo.program_cache import cache_for

    store = cache_for(options(cache_dir=str(tmp_path / "elsewhere"), cache_max_mb=2, cache_failure_ttl=60))
    assert store.root == tmp_path / "elsewhere" and store.max_bytes == 2 * 2**20 and store.failure_ttl == 60


def test_graph_constants_are_matched_by_position_not_by_name(cache_dir):
    def build(first, second):
        graph = fx.Graph()
        x = graph.placeholder("x")
        a, b = graph.get_attr(first), graph.get_attr(second)
        scaled = graph.call_function(torch.ops.aten.mul.Tensor, (x, a))
        graph.output(graph.call_function(torch.ops.aten.sub.Tensor, (scaled, b)))
        return graph

    scale, shift = torch.tensor([2.0, 3.0]), torch.tensor([10.0, 20.0])
    one = fx.GraphModule({"c0": scale, "c1": shift}, build("c0", "c1"))
    other = fx.GraphModule({"c1": scale, "c0": shift}, build("c1", "c0"))  # same graph, attribute names swapped
    x = torch.ones(2)
    assert compile_static(one, [x], options(), REFERENCE).report.cache == "miss"
    loaded = compile_static(other, [x], options(), REFERENCE)
    assert loaded.report.cache == "hit"
    torch.testing.assert_close(loaded(x), x * scale - shift)


# ----------------------------------------------------------------------------------------------------- modes
def test_off_and_readonly_write_nothing(cache_dir):
    gm, inputs = traced()
    counters.reset_stats()
    assert compile_static(gm, inputs, options(cache="off"), REFERENCE).report.cache == "off"
    assert not cache_dir.exists()
    assert compile_static(gm, inputs, options(cache="readonly"), REFERENCE).report.cache == "miss"
    assert not list(cache_dir.glob("v1/entries/*/*"))
    assert cache_stats()["cache.bypasses"] == 1
    compile_static(gm, inputs, options(), REFERENCE)
    assert compile_static(gm, inputs, options(cache="readonly"), REFERENCE).report.cache == "hit"


@dataclasses.dataclass(frozen=True)
class OpaqueTarget:
    """A target whose compiled regions are plain callables it cannot serialize."""

    name: str = "reference"

    def supports(self, node):
        return None

    def compile_region(self, lowered, example_inputs):
        return lambda *args: lowered(*args)


@dataclasses.dataclass(frozen=True)
class RefusingTarget(OpaqueTarget):
    """A target whose serializer refuses some regions with its own error."""

    def serialize_region(self, compiled, lowered):
        raise RuntimeError("this region reads a graph constant: not stored")


@pytest.mark.parametrize("target", [OpaqueTarget(), RefusingTarget()], ids=["no serializer", "serializer refuses"])
def test_a_program_that_cannot_be_stored_is_a_bypass_and_still_runs(cache_dir, target):
    gm, inputs = traced()
    counters.reset_stats()
    program = compile_static(gm, inputs, options(), target)
    assert program.report.cache == "bypass"
    torch.testing.assert_close(program(*inputs), mlp(*inputs))
    assert cache_stats()["cache.bypasses"] == 1 and "cache.misses" not in cache_stats()
    assert not list(cache_dir.glob("v1/entries/*/*"))


@dataclasses.dataclass
class SlowFakeCompiler:
    """A fake toolchain: compiling a region takes `seconds` and yields bytes, which load without compiling."""

    seconds: float
    fail: bool = False
    compiles: int = 0
    name: str = "reference"

    def cache_facts(self):
        return {"toolchain": "slow-fake", "fail": self.fail}

    def supports(self, node):
        return None

    def compile_region(self, lowered, example_inputs):
        self.compiles += 1
        time.sleep(self.seconds)
        if self.fail:
            raise RuntimeError("fake compiler: internal error")
        return lowered

    def serialize_region(self, compiled, lowered):
        from neuron_dynamo.program_cache import encode_graph

        return json.dumps(encode_graph(compiled.graph, {})).encode()

    def load_region(self, data):
        from neuron_dynamo.program_cache import decode_graph

        return fx.GraphModule({}, decode_graph(json.loads(data), []))


def test_slow_fake_compiler_warm_run_saves_the_compile_time(cache_dir):
    gm, inputs = traced()
    compiler = SlowFakeCompiler(seconds=0.3)
    cold = compile_static(gm, inputs, options(), compiler)
    assert compiler.compiles == cold.report.regions == 1
    counters.reset_stats()
    warm = compile_static(gm, inputs, options(), compiler)
    assert compiler.compiles == 1  # the warm run did not compile
    assert warm.report.cache == "hit"
    torch.testing.assert_close(warm(*inputs), mlp(*inputs))
    (entry,) = neuron_dynamo.program_cache.cache_for(options()).entries()
    assert entry.meta["compile_seconds"] >= 0.3  # what the hit saved (the time it took to load is subtracted)
    assert cache_stats()["cache.seconds_saved"] == pytest.approx(warm.report.cache_seconds_saved)


def test_failed_regions_are_cached_for_the_ttl_then_retried(cache_dir):
    gm, inputs = traced()
    broken = SlowFakeCompiler(seconds=0.0, fail=True)
    first = compile_static(gm, inputs, options(), broken)
    assert first.report.regions == 0 and first.report.fallback_ops  # runs eagerly, with the reason
    torch.testing.assert_close(first(*inputs), mlp(*inputs))
    again = compile_static(gm, inputs, options(), broken)
    assert again.report.cache == "hit" and broken.compiles == 1  # the failure is cached...
    torch.testing.assert_close(again(*inputs), mlp(*inputs))
    retried = compile_static(gm, inputs, options(retry_failed=True), broken)
    assert retried.report.cache == "miss" and broken.compiles == 2  # ...until retry_failed
    expired = compile_static(gm, inputs, options(cache_failure_ttl=0), broken)
    assert expired.report.cache == "miss" and broken.compiles == 3  # ...or until its TTL is over


def test_stats_and_explain_report_the_cache(cache_dir):
    def fn(x):
        return torch.relu(x) * 2

    x = torch.randn(4)
    neuron_dynamo.reset_stats()
    first = neuron_dynamo.explain(fn, x, options={"target": "reference", "cache_tag": "explain-test"})
    assert [graph.cache for graph in first.graphs] == ["miss"]
    assert "compile cache" in str(first) and "miss" in str(first)
    assert first.to_dict()["totals"]["cache"]["misses"] == 1
    stats = neuron_dynamo.stats()
    assert stats["cache.misses"] == 1


CONCURRENT = textwrap.dedent("""
    import json, sys, time, torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from neuron_dynamo.compiler import compile_static
    from neuron_dynamo.options import resolve_options
    from neuron_dynamo.toolchain import REFERENCE

    class LoggedSlowTarget:
        name = "reference"
        def supports(self, node):
            return None
        def compile_region(self, lowered, example_inputs):
            with open(sys.argv[1], "a") as log:
                log.write("compiled\\n")
            time.sleep(1.0)  # long enough for every process to reach the key's lock
            return lowered

    def fn(x, w):
        return torch.tanh(x @ w) * 3.0
    inputs = [torch.ones(4, 8), torch.full((8, 2), 0.1)]
    program = compile_static(make_fx(fn)(*inputs), inputs, resolve_options({}), LoggedSlowTarget())
    torch.testing.assert_close(program(*inputs), fn(*inputs))
    print(program.report.cache)
""")


def test_concurrent_processes_compile_one_program_once(tmp_path, cache_dir, pinned_sources):
    log = tmp_path / "compiles.log"
    processes = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(log)], stdout=subprocess.PIPE, text=True,
                                  env=os.environ) for _ in range(4)]
    statuses = sorted(process.communicate(timeout=300)[0].strip().splitlines()[-1] for process in processes)
    assert [process.returncode for process in processes] == [0, 0, 0, 0]
    assert log.read_text().count("compiled") == 1
    assert statuses == ["hit", "hit", "hit", "miss"]


def test_every_entry_of_a_training_run_reads_back_in_a_fresh_process(cache_dir, pinned_sources):
    """Tiny BERT trained at two lengths on the default target: the second process hits every program (an entry
    that does not decode, e.g. a fused kernel holding a memory_format, would be quarantined and missed each time)."""
    script = textwrap.dedent("""
        import json, sys, torch, neuron_dynamo
        sys.path.insert(0, "tests/hf")
        from tiny_models import tiny_causal_lm
        torch.manual_seed(0)
        model = tiny_causal_lm("bert").train()
        compiled = torch.compile(model, backend="neuron")
        for length in (21, 37):
            ids = torch.randint(0, 200, (2, length))
            compiled(input_ids=ids, labels=ids).loss.backward()
        print(json.dumps({k: v for k, v in neuron_dynamo.stats().items() if k.startswith("cache.")}))
    """)

    def run():
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ,
                                cwd=os.path.dirname(os.path.dirname(__file__)))
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.strip().splitlines()[-1])

    cold, warm = run(), run()
    assert cold.get("cache.misses", 0) >= 4 and cold.get("cache.bypasses", 0) == 0
    assert warm.get("cache.hits") == cold["cache.misses"] and warm.get("cache.misses", 0) == 0
    assert "cache.corrupt" not in cold and "cache.corrupt" not in warm
