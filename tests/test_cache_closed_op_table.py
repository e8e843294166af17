"""A stored graph calls only what the closed op table lists (lowering/op_table.py), at bounded sizes.

The attacker writes graphs in the public format of the cache (encode_graph's JSON rows) naming ops and methods that
are registered and public but reach outside the tensors: mapping and saving files, printing, methods of a
non-tensor object, sizes that would exhaust memory. Each is refused when it is decoded (an `ArtifactError`, which
the cache quarantines: tests/test_cache_entries_are_data.py), and the tests check for the effects themselves: no
file appears, nothing is printed, no module is imported, no planted method runs. Real models' entries still read
back: every op the lowering stores is in the table.
"""

import base64
import hashlib
import json
import sys

import pytest
import torch

import neuron_dynamo.cache as cache_module
from neuron_dynamo import counters
from neuron_dynamo.lowering import registered_op_keys
from neuron_dynamo.lowering.artifact import ArtifactError, decode_graph, encode_graph, load_region
from neuron_dynamo.lowering.op_table import MAX_ELEMENTS, pure_ops, refusal


def placeholder(name):
    return ["placeholder", name, name, {"tuple": []}, {"dict": []}]


def call(name, target, *args, op="call_function", **kwargs):
    return [op, name, target, {"tuple": list(args)}, {"dict": [[k, v] for k, v in kwargs.items()]}]


def output(*positions):
    return ["output", "output", "output", {"tuple": [{"tuple": [{"node": p} for p in positions]}]}, {"dict": []}]


def ints(*values):
    return {"list": list(values)}


def region_bytes(rows):
    return bytes([2]) + json.dumps(rows).encode()


@pytest.fixture
def no_effects(tmp_path, capfd):
    """Asserts, after the test, that nothing was printed, no module imported and no file created in tmp_path."""
    modules, files = set(sys.modules), set(tmp_path.iterdir())
    yield tmp_path
    assert set(tmp_path.iterdir()) == files, "a planted op created a file"
    assert set(sys.modules) == modules, f"a planted op imported {sorted(set(sys.modules) - modules)}"
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)


def refused(rows):
    """The stored graph is refused by the graph decoder and, as a region artifact, by the region loader."""
    with pytest.raises(ArtifactError):
        decode_graph(rows)
    with pytest.raises(ArtifactError):
        load_region(region_bytes(rows))


# ------------------------------------------------------------------------------------- ops outside the table
def test_an_op_that_maps_a_file_is_refused(no_effects):
    path = str(no_effects / "mapped.bin")
    for shared in (True, False):
        refused([call("f", {"op": "aten.from_file.default"}, path, shared, 1 << 20), output(0)])
    refused([placeholder("x"), call("s", {"op": "aten.save.default"}, {"node": 0}, path), output(0)])


def test_ops_that_print_or_warn_are_refused(no_effects):
    refused([placeholder("x"), call("p", {"op": "aten._print.default"}, "planted output"), output(0)])
    refused([placeholder("x"), call("w", {"op": "aten.warn.default"}, "planted warning", 2), output(0)])
    refused([placeholder("x"), call("p", {"hop": "print"}, "planted {}", {"node": 0}), output(0)])


@pytest.mark.parametrize("op", ["aten.manual_seed.default", "aten.set_grad_enabled.default", "aten.set_.source_Tensor",
                                "aten.format.default", "aten.mul.left_t", "aten.join.default",
                                "neuron_tests.eager_only.default", "_c10d_functional.isend.default"])
def test_registered_ops_outside_the_table_are_refused(op, no_effects):
    refused([placeholder("x"), call("c", {"op": op}, {"node": 0}, 1), output(1)])


@pytest.mark.parametrize("hop", ["print", "call_torchbind", "inline_asm_elementwise", "run_const_graph",
                                 "executorch_call_delegate", "with_effects"])
def test_higher_order_ops_outside_the_table_are_refused(hop, no_effects):
    with pytest.raises(ArtifactError, match="higher-order"):
        decode_graph([placeholder("x"), call("h", {"hop": hop}, {"node": 0}), output(1)])


# ------------------------------------------------------------------------------------------- call_method
@pytest.mark.parametrize("method", ["_new_shared_filename", "__reduce_ex__", "tolist", "type", "untyped_storage",
                                    "share_memory_", "apply_", "register_hook", "numpy", "from_file", "pin_memory"])
def test_a_method_not_on_the_list_is_refused(method, no_effects):
    refused([placeholder("x"), call("m", method, {"node": 0}, op="call_method"), output(1)])


def test_a_listed_method_runs_only_on_a_tensor(no_effects):
    """`.view` is on the list; called on a storage or any other object (a placeholder can be handed anything) the
    decoded graph raises before the object's method runs."""
    called = []

    class Spy:
        def view(self, *args):
            called.append(args)
            return self

    rows = [placeholder("x"), call("v", "view", {"node": 0}, -1, op="call_method"), output(1)]
    gm = torch.fx.GraphModule(torch.nn.Module(), decode_graph(rows))
    torch.testing.assert_close(gm(torch.arange(6).reshape(2, 3))[0], torch.arange(6))  # a tensor: as before
    for receiver in (Spy(), torch.arange(4).untyped_storage(), [1, 2]):
        with pytest.raises(ArtifactError, match="not a tensor"):
            gm(receiver)
    assert called == []
    assert encode_graph(gm.graph) == rows  # read back, it is stored as the same call_method row


def test_a_method_on_a_constant_is_refused(no_effects):
    with pytest.raises(ArtifactError, match="receiver"):
        decode_graph([placeholder("x"), call("v", "view", "__import__('os')", -1, op="call_method"), output(1)])


# ------------------------------------------------------------------------------------------------- sizes
HUGE = [2**20, 2**20, 2**10]  # 2**50 elements


@pytest.mark.parametrize("target, args", [
    ({"op": "aten.empty.memory_format"}, [ints(*HUGE)]),
    ({"op": "aten.full.default"}, [ints(*HUGE), 0]),
    ({"op": "aten.zeros.default"}, [ints(2**35)]),
    ({"op": "aten.new_empty.default"}, [{"node": 0}, ints(*HUGE)]),
    ({"op": "aten.expand.default"}, [{"node": 0}, ints(*HUGE)]),
    ({"op": "aten.repeat.default"}, [{"node": 0}, ints(2**18, 2**18)]),
    ({"op": "aten.constant_pad_nd.default"}, [{"node": 0}, ints(0, 2**36)]),
    ({"op": "aten.empty_strided.default"}, [ints(4, 4), ints(2**40, 1)]),
    ({"op": "aten.arange.start_step"}, [0, {"float": "1e15"}, 1]),
    ({"op": "aten.randperm.default"}, [2**36]),
    ({"kernel": "aten.expand.default", "target": "reference"}, [{"node": 0}, ints(*HUGE)]),
    ({"function": "neuron_dynamo.match_strides"}, [{"node": 0}, {"tuple": [2**40, 1]}]),
])
def test_a_huge_constant_size_is_refused(target, args, no_effects):
    refused([placeholder("x"), call("c", target, *args), output(1)])


def test_a_huge_method_size_or_fused_shape_is_refused(no_effects):
    with pytest.raises(ArtifactError, match="memory"):
        decode_graph([placeholder("x"), call("v", "new_zeros", {"node": 0}, *HUGE, op="call_method"), output(1)])
    fused = {"fused": {"inputs": [], "steps": [], "outputs": []}, "shape": HUGE}
    refused([placeholder("x"), call("f", fused), output(1)])


def test_sizes_up_to_the_bound_still_decode():
    """The bound refuses sizes, not ops: what real graphs ask for decodes (views with -1, slices to sys.maxsize)."""
    rows = [placeholder("x"), call("e", {"op": "aten.expand.default"}, {"node": 0}, ints(4, 1024, 1024)),
            call("s", {"op": "aten.slice.Tensor"}, {"node": 1}, 0, 0, 2**63 - 1),
            call("v", {"op": "aten.view.default"}, {"node": 2}, ints(-1, 1024)),
            call("z", {"op": "aten.zeros.default"}, ints(MAX_ELEMENTS)), output(3)]
    decode_graph(rows)


def test_size_arithmetic_stays_within_int64_and_never_repeats_a_sequence():
    """`operator.mul` is in the table for SymInt arithmetic; decoded, it takes numbers only and keeps within int64,
    so neither `[...] * n` nor a chain of squarings can grow memory."""
    rows = [placeholder("x"), call("a", {"function": "operator.mul"}, {"node": 0}, {"node": 0})]
    for i in range(1, 8):
        rows.append(call(f"m{i}", {"function": "operator.mul"}, {"node": i}, {"node": i}))
    rows.append(output(8))
    gm = torch.fx.GraphModule(torch.nn.Module(), decode_graph(rows))
    assert gm(1)[0] == 1
    with pytest.raises(ArtifactError, match="int64"):
        gm(3)  # 3 ** 256
    with pytest.raises(ArtifactError, match="numbers only"):
        gm([0])
    pow_rows = [placeholder("x"), call("p", {"function": "operator.pow"}, {"node": 0}, 10**6), output(1)]
    with pytest.raises(ArtifactError, match="power"):
        torch.fx.GraphModule(torch.nn.Module(), decode_graph(pow_rows))(7)
    assert encode_graph(gm.graph) == rows  # the bounded functions are stored under their own names


# ------------------------------------------------------------------------------------------------ the table
def test_the_table_is_built_by_rule_and_excludes_what_reaches_outside():
    table = pure_ops()
    assert 2000 < len(table) < 5000
    aten = torch.ops.aten
    for op in (aten.mm.default, aten.add.Tensor, aten.empty.memory_format, aten.gelu.default, aten.div.Tensor_mode,
               aten.scatter_reduce.two, aten.native_dropout.default, aten.copy_.default, aten._assert_scalar.default,
               aten.sym_size.int, torch.ops.prims.iota.default):
        assert op in table, op
    for op in (aten.from_file.default, aten.save.default, aten._print.default, aten.warn.default,
               aten.manual_seed.default, aten.set_.source_Storage, aten.record_stream.default, aten.format.default):
        assert op not in table and refusal(op), op
    assert refusal(torch.ops._c10d_functional.all_reduce.default) is None  # collectives of joined groups


def test_every_op_the_registry_lowers_is_in_the_table():
    """A region that fails to lower runs its aten graph eagerly, and that graph is stored as ops: each op the
    registry lowers must be callable from a stored graph. (A packet such as `aten.add` also holds TorchScript's
    overloads on lists, strings and dicts, `aten.add.t`: those take no tensor, reach no graph, and stay out.)"""
    missing = []
    for key in registered_op_keys():
        overloads = [key] if isinstance(key, torch._ops.OpOverload) else [
            getattr(key, name) for name in key.overloads()]
        for op in overloads:
            takes_tensors = any(str(argument.type) in ("Tensor", "Optional[Tensor]", "List[Tensor]")
                                for argument in op._schema.arguments)
            if takes_tensors and refusal(op) is not None:
                missing.append(f"{op}: {refusal(op)}")
    assert missing == []


# ------------------------------------------------------------------------------------ real models round-trip
def _entry_rows(document):
    """Every stored row of a program entry: the program graph, failed regions' graphs, region artifacts."""
    rows = list(document["graph"])
    for region in document["regions"].values():
        if "graph" in region:
            rows += region["graph"]
        else:
            data = base64.b64decode(region["artifact"])
            start = data.index(b"[")  # past the artifact's own header (a format byte, a device plan)
            rows += json.loads(data[start:])
    return rows


def _read_document(path):
    raw = path.read_bytes()
    if hasattr(cache_module, "encode_entry"):
        from neuron_dynamo.cache_auth import load_keyring

        return json.loads(cache_module._split(cache_module._unseal(raw, load_keyring()))[1])
    size = int.from_bytes(raw[8:16], "big")
    return json.loads(raw[16 + size:])


@pytest.mark.parametrize("eager_ops", [(), ("aten.mm", "aten.softmax", "aten.native_layer_norm", "aten.embedding")])
def test_real_models_read_back_from_the_cache(cache_dir, eager_ops):
    """Tiny Llama and GPT-2, forward and a training step, compiled twice: the second compile hits every program,
    none is quarantined, and the stored graphs did hold eager ops (with `eager_ops`: the fallbacks between
    regions, which a program graph may hold for any aten op)."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent / "hf"))
    from tiny_models import tiny_causal_lm

    def run():
        outs = []
        for name in ("llama", "gpt2"):
            torch._dynamo.reset()
            torch.manual_seed(0)
            model = tiny_causal_lm(name).train()
            compiled = torch.compile(model, backend="neuron_dynamo", options={"eager_ops": list(eager_ops)})
            ids = torch.randint(0, 200, (2, 13), generator=torch.Generator().manual_seed(1))
            loss = compiled(input_ids=ids, labels=ids).loss
            loss.backward()
            outs.append(loss.detach())
        return outs

    counters.reset_stats()
    cold = run()
    stats = counters.stats()
    assert stats.get("cache.misses", 0) >= 4 and stats.get("cache.bypasses", 0) == 0, stats
    counters.reset_stats()
    warm = run()
    stats = counters.stats()
    assert stats.get("cache.misses", 0) == 0 and stats.get("cache.hits", 0) >= 4, stats
    assert "cache.corrupt" not in stats and not list(cache_dir.glob("v1/quarantine/*"))
    torch.testing.assert_close(warm, cold)
    stored = [row for entry in cache_dir.glob("v1/entries/*/*.entry") for row in _entry_rows(_read_document(entry))]
    ops = {row[2]["op"] for row in stored if row[0] == "call_function" and "op" in row[2]}
    if eager_ops:
        assert {"aten.mm.default", "aten.embedding.default"} <= ops, ops
    assert all(refusal(eval("torch.ops." + name, {"torch": torch})) is None for name in ops)  # noqa: S307


def test_checksum_valid_planted_op_in_a_real_entry_is_quarantined(cache_dir, tmp_path):
    """End to end: a fallback op of a real entry replaced by `aten.from_file` is refused, quarantined, and the
    program compiled again, with no file mapped."""
    def model(x, y):
        return torch.softmax(x @ y, -1) + 1

    def run():
        torch._dynamo.reset()
        return torch.compile(model, backend="neuron_dynamo", options={"eager_ops": ["aten.mm"]})(x, y)

    x, y = torch.randn(4, 8), torch.randn(8, 4)
    run()
    (entry,) = cache_dir.glob("v1/entries/*/*.entry")
    raw = entry.read_bytes()
    document = _read_document(entry)
    mm = next(row for row in document["graph"] if row[0] == "call_function" and row[2].get("op") == "aten.mm.default")
    mm[2] = {"op": "aten.from_file.default"}
    planted = tmp_path / "planted.bin"
    mm[3] = {"tuple": [str(planted), True, 1 << 20]}
    payload = json.dumps(document).encode()
    if hasattr(cache_module, "encode_entry"):
        from neuron_dynamo.cache_auth import load_keyring

        header = cache_module._split(cache_module._unseal(raw, load_keyring()))[0]
        header.update(sha256=hashlib.sha256(payload).hexdigest(), size=len(payload))
        entry.write_bytes(cache_module.encode_entry(header, payload, load_keyring()))
    else:
        size = int.from_bytes(raw[8:16], "big")
        header = {**json.loads(raw[16:16 + size]), "sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload)}
        header_bytes = json.dumps(header).encode()
        entry.write_bytes(raw[:8] + len(header_bytes).to_bytes(8, "big") + header_bytes + payload)
    counters.reset_stats()
    torch.testing.assert_close(run(), model(x, y))
    stats = counters.stats()
    assert stats.get("cache.hits", 0) == 0 and stats.get("cache.corrupt") == 1, stats
    assert len(list(cache_dir.glob("v1/quarantine/*"))) == 1
    assert not planted.exists()


def test_a_program_with_collectives_reads_back(cache_dir):
    """torch.distributed's functional collectives (in a gloo group of one rank) are in the table: a tensor-parallel
    step stored with them between its regions hits on the second compile."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    def step(x, w):
        out = funcol.all_reduce(torch.relu(x @ w), "sum", dist.group.WORLD)
        return funcol.all_gather_single(out.sin(), 0, dist.group.WORLD) + 1

    def run():
        torch._dynamo.reset()
        return torch.compile(step, backend="neuron_dynamo")(x, w)

    x, w = torch.randn(6, 16), torch.randn(16, 8)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        counters.reset_stats()
        cold = run()
        assert counters.stats().get("cache.misses") == 1
        counters.reset_stats()
        torch.testing.assert_close(run(), cold)
        stats = counters.stats()
    finally:
        dist.destroy_process_group()
    assert stats.get("cache.hits") == 1 and "cache.corrupt" not in stats, stats
    (entry,) = cache_dir.glob("v1/entries/*/*.entry")
    ops = {row[2].get("op") for row in _read_document(entry)["graph"] if row[0] == "call_function"}
    assert "_c10d_functional.all_reduce.default" in ops, ops


def test_a_program_entry_may_ask_only_a_margin_over_its_live_graphs_largest_tensor(no_effects):
    """Decoding an entry for a graph of this process bounds its sizes by that graph, not by what the entry says."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuron_dynamo.lowering.op_table import element_limit
    from neuron_dynamo.program_cache import ELEMENT_MARGIN, element_bound

    live = make_fx(lambda x: (x @ x).relu(), tracing_mode="fake")(torch.randn(64, 64))
    bound = element_bound(live)
    assert bound == max(ELEMENT_MARGIN * 64 * 64, 2**20)
    asks = lambda n: [placeholder("x"), call("z", {"op": "aten.zeros.default"}, ints(n)), output(1)]  # noqa: E731
    with element_limit(bound):
        decode_graph(asks(bound))  # what the program may use decodes
        with pytest.raises(ArtifactError):
            decode_graph(asks(bound + 1))  # below the global ceiling, above what this program could need
    assert bound + 1 < MAX_ELEMENTS
