"""The cache key of one static program: every fact that changes the compiled artifact, and nothing else.

DESIGN §4 and reference/peers.md §9.2 list what goes in. A missing fact serves a wrong kernel; an extra fact only
costs a recompile, so when in doubt a fact goes in:

* the canonical graph text (constant arguments included, placeholder names normalised) of the *post-bucketing*,
  static graph, and the shapes, strides and dtypes of its inputs. Two nodes that change no result are left out of
  the text (`semantic_graph`): unused `getitem`s of multi-output ops and slices that take a whole dim. Dynamo's
  dynamic graph specialised at a size has them where its static graph at that size does not, and the two must
  share one program (sizes A, B, then A again compile nothing);
* every option, except the few that provably do not change the artifact (`KEY_EXEMPT_OPTIONS`: where the cache
  lives, and the bucketing policy, whose effect is already in the static graph and its input shapes). An option
  added later enters the key by default;
* the target and its toolchain (`target.cache_facts()` when the target provides it: toolchain name, version and
  flags, generation, LNC, kernel source hashes), and `NEURON_CC_FLAGS`;
* a hash of the package's own sources (lowering, kernels, interpreter, partitioner...), like Inductor's
  `torch_key()`: an edited lowering must never be served from an entry compiled before the edit, and the package
  version alone does not change in a development checkout;
* the package, torch and Python versions, the payload format version, and the user's `cache_tag`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import operator
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from neuron_dynamo.cache import make_key
from neuron_dynamo.options import Options
from neuron_dynamo.passes.canonical import canonical_graph_text, input_signature

# Bumped whenever the stored program format (program_cache.py) changes meaning.
PROGRAM_FORMAT = 2

KEY_EXEMPT_OPTIONS = frozenset({
    # where and how the cache itself works
    "cache", "cache_dir", "cache_tag", "cache_max_mb", "cache_failure_ttl", "retry_failed", "cache_lock_timeout",
    "cache_trusted_keys",  # who may have signed an entry: a writer and its readers must compute the same keys
    # bucketing chooses the static graph and shapes, which are in the key themselves
    "bucketing", "bucket_policy", "bucket_multiple", "buckets", "bucket_dims", "max_bucket", "beyond_max_bucket",
})

# Environment variables that change what the toolchain produces (reference/peers.md §6.3: debug flags change NEFFs).
KEY_ENVIRONMENT = ("NEURON_CC_FLAGS",)

# The packages whose sources decide what an artifact contains.
_SOURCE_PACKAGES = ("neuron_dynamo", "neuron_dynamo.kernels")


def codegen_options(options: Options) -> dict[str, Any]:
    """The options that enter the key: all of them but `KEY_EXEMPT_OPTIONS`, by name."""
    return {
        field.name: getattr(options, field.name)
        for field in dataclasses.fields(options)
        if field.name not in KEY_EXEMPT_OPTIONS
    }


def target_facts(target: Any) -> dict[str, Any]:
    """The target's name and, when it provides `cache_facts()`, its toolchain facts."""
    facts = {"name": target.name}
    provider = getattr(target, "cache_facts", None)
    if provider is not None:
        facts.update(provider())
    return facts


@functools.cache
def source_hash() -> str:
    """sha256 over the package's .py sources (path and content), computed once per process."""
    digest = hashlib.sha256()
    for package in _SOURCE_PACKAGES:
        spec = importlib.util.find_spec(package)
        for location in spec.submodule_search_locations or ():
            root = Path(location)
            for path in sorted(root.rglob("*.py")):
                digest.update(f"{package}/{path.relative_to(root).as_posix()}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def versions() -> dict[str, str]:
    try:
        package = importlib.metadata.version("neuron-dynamo")
    except importlib.metadata.PackageNotFoundError:
        package = "unknown"
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return {"neuron_dynamo": package, "torch": torch.__version__, "python": python}


def semantic_graph(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of `gm` without unused `getitem`s and whole-dim slices (`x[:, 0:]`): nodes no result depends on.

    A slice that the graph returns stays (it decides whether an output is a view). Node order, `get_attr` nodes and
    every other node are untouched, so a stored program still binds its constants by position.
    """
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, val_map={}))
    for node in list(graph.nodes):
        if _whole_dim_slice(node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and node.target is operator.getitem and not node.users:
            graph.erase_node(node)
    return fx.GraphModule(gm, graph)


def _whole_dim_slice(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target is not torch.ops.aten.slice.Tensor:
        return False
    if any(user.op == "output" for user in node.users) or not isinstance(node.args[0], fx.Node):
        return False
    source, result = node.args[0].meta.get("val"), node.meta.get("val")
    start = node.args[2] if len(node.args) > 2 else node.kwargs.get("start")
    step = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
    return (isinstance(source, torch.Tensor) and isinstance(result, torch.Tensor) and start in (None, 0)
            and step == 1 and source.shape == result.shape and source.stride() == result.stride())


def structure_parts(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> dict[str, Any]:
    """What is compiled, without how: the graph (`semantic_graph`) and its input layout."""
    graph_text = canonical_graph_text(semantic_graph(gm))
    return {"graph": hashlib.sha256(graph_text.encode()).hexdigest(), "inputs": input_signature(list(example_inputs))}


def key_parts(gm: fx.GraphModule, example_inputs: Sequence[Any], options: Options, target: Any,
              structure: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything that changes the artifact of compiling `gm` at the shapes of `example_inputs` (`structure`: its
    `structure_parts`, when the caller has them already)."""
    return {
        "format": PROGRAM_FORMAT,
        **(structure or structure_parts(gm, example_inputs)),
        "options": codegen_options(options),
        "target": target_facts(target),
        "environment": {name: os.environ.get(name, "") for name in KEY_ENVIRONMENT},
        "sources": source_hash(),
        "versions": versions(),
        "tag": options.cache_tag,
    }


def program_key(gm: fx.GraphModule, example_inputs: Sequence[Any], options: Options, target: Any) -> str:
    """The hex key of one static program (see `key_parts`)."""
    return make_key(key_parts(gm, example_inputs, options, target))
