"""A planted cache entry cannot run code: entries are decoded as data (lowering/artifact.py).

The attacker of these tests can write the cache (as if the directory checks had been bypassed) and recomputes the
header's checksum, so every planted entry is checksum-valid. Each must be refused on load, quarantined and
recompiled, with the model's answer still eager's and the planted code never run.
"""

import base64
import hashlib
import json

import pytest
import torch

import neuron_dynamo.cache as cache_module
from neuron_dynamo import counters
from neuron_dynamo.lowering.artifact import ArtifactError, decode_graph, load_region, resolve_op
from neuron_dynamo.lowering.codegen import CodegenError, _literal


def model(x, y):
    return torch.relu(x @ y) * 2 + 1


def run_compiled(x, y):
    torch._dynamo.reset()
    return torch.compile(model, backend="neuron")(x, y)


def read_entry(path):
    """(header, program document) of an entry file."""
    raw = path.read_bytes()
    if hasattr(cache_module, "encode_entry"):  # entries signed with the user's key (cache_auth.py)
        from neuron_dynamo.cache_auth import load_keyring

        header, payload = cache_module._split(cache_module._unseal(raw, load_keyring()))
        return header, json.loads(payload)
    size = int.from_bytes(raw[8:16], "big")
    return json.loads(raw[16:16 + size]), json.loads(raw[16 + size:])


def write_entry(path, header, document):
    """What an attacker with write access (and, for signed entries, the key) does: a new payload and a recomputed,
    valid header and tag. Only the decoder stands between such an entry and the reader."""
    payload = json.dumps(document).encode()
    header = {**header, "sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload)}
    if hasattr(cache_module, "encode_entry"):
        from neuron_dynamo.cache_auth import load_keyring

        path.write_bytes(cache_module.encode_entry(header, payload, load_keyring()))
        return
    header_bytes = json.dumps(header).encode()
    path.write_bytes(b"NDCACHE1" + len(header_bytes).to_bytes(8, "big") + header_bytes + payload)


def region_rows(document):
    (name, region), = document["regions"].items()
    return name, json.loads(base64.b64decode(region["artifact"])[1:])


def set_region_rows(document, name, rows):
    document["regions"][name]["artifact"] = base64.b64encode(bytes([2]) + json.dumps(rows).encode()).decode()


def call_rows(rows):
    return [row for row in rows if row[0] == "call_function"]


MARKER = "/tmp/neuron_dynamo_planted_marker"
PAYLOAD = f"__import__('os').system('touch {MARKER}')"


def _exec_target(doc):
    name, rows = region_rows(doc)
    call_rows(rows)[-1][2] = {"function": "builtins:exec"}
    call_rows(rows)[-1][3] = {"tuple": [PAYLOAD]}
    set_region_rows(doc, name, rows)


def _module_path_target(doc):
    name, rows = region_rows(doc)
    call_rows(rows)[-1][2] = {"function": "os.system"}
    set_region_rows(doc, name, rows)


def _dunder_op(doc):
    name, rows = region_rows(doc)
    call_rows(rows)[0][2] = {"op": "aten.__class__.__init__"}
    set_region_rows(doc, name, rows)


def _fused_string_constant(doc):
    name, rows = region_rows(doc)
    fused = next(row for row in call_rows(rows) if "fused" in row[2])
    fused[2]["fused"]["steps"][1]["args"]["tuple"][1] = PAYLOAD  # pasted into NKI source before the fix
    set_region_rows(doc, name, rows)


def _fused_keyword_name(doc):
    name, rows = region_rows(doc)
    fused = next(row for row in call_rows(rows) if "fused" in row[2])
    fused[2]["fused"]["steps"][0]["kwargs"] = [[f"x=({PAYLOAD})", 1]]
    set_region_rows(doc, name, rows)


def _fused_operand_out_of_range(doc):
    name, rows = region_rows(doc)
    fused = next(row for row in call_rows(rows) if "fused" in row[2])
    fused[2]["fused"]["steps"][0]["args"]["tuple"][0] = {"ref": ["step", 5]}
    set_region_rows(doc, name, rows)


def _placeholder_target(doc):
    doc["graph"][0][2] = f"x=({PAYLOAD})"  # torch.fx pastes placeholder targets into the forward() signature


def _keyword_of_a_node(doc):
    name, rows = region_rows(doc)
    call_rows(rows)[0][4] = {"dict": [[f"x=({PAYLOAD}) or y", 1]]}
    set_region_rows(doc, name, rows)


def _private_method(doc):
    doc["graph"][2][0] = "call_method"
    doc["graph"][2][2] = "__reduce_ex__"


def _region_named_like_code(doc):
    doc["regions"] = {f"r; {PAYLOAD}": doc["regions"]["region_0"]}


PLANTS = [_exec_target, _module_path_target, _dunder_op, _fused_string_constant, _fused_keyword_name,
          _fused_operand_out_of_range, _placeholder_target, _keyword_of_a_node, _private_method,
          _region_named_like_code]


@pytest.mark.parametrize("plant", PLANTS, ids=[p.__name__.strip("_") for p in PLANTS])
def test_a_planted_entry_is_refused_quarantined_and_recompiled(cache_dir, plant, tmp_path):
    import os

    if os.path.exists(MARKER):
        os.unlink(MARKER)
    x, y = torch.randn(4, 8), torch.randn(8, 4)
    run_compiled(x, y)
    (entry,) = cache_dir.glob("v1/entries/*/*.entry")
    header, document = read_entry(entry)
    plant(document)
    write_entry(entry, header, document)
    counters.reset_stats()
    out = run_compiled(x, y)
    torch.testing.assert_close(out, model(x, y))
    stats = counters.stats()
    assert stats.get("cache.hits", 0) == 0 and stats.get("cache.corrupt") == 1, stats
    assert not os.path.exists(MARKER), "planted code ran"
    assert len(list(cache_dir.glob("v1/quarantine/*"))) == 1
    counters.reset_stats()
    run_compiled(x, y)  # the recompiled entry replaced the planted one
    assert counters.stats().get("cache.hits") == 1


def test_the_codec_resolves_only_registered_ops():
    assert resolve_op("aten.mm.default") is torch.ops.aten.mm.default
    for name in ("aten.mm", "aten.__class__.__init__", "os.system.x", "aten.not_an_op.default", 3):
        with pytest.raises(ArtifactError):
            resolve_op(name)


@pytest.mark.parametrize("column, value", [(2, "x=1"), (2, "x) or (y"), (1, "a.b"), (1, "x-y")])
def test_decode_refuses_names_that_are_not_identifiers(column, value):
    placeholder = ["placeholder", "x", "x", {"tuple": []}, {"dict": []}]
    output = ["output", "output", "output", {"tuple": [{"node": 0}]}, {"dict": []}]
    decode_graph([placeholder, output])
    placeholder[column] = value
    with pytest.raises(ArtifactError, match="identifier"):
        decode_graph([placeholder, output])


def test_an_old_pickle_artifact_is_refused():
    import os
    import pickle

    with pytest.raises(ArtifactError):
        load_region(bytes([1]) + pickle.dumps(("placeholder", "x", os.system, ("true",), {})))


def test_generated_source_never_embeds_a_string():
    with pytest.raises(CodegenError):
        _literal("__import__('os')")
