"""Diffusers regional compilation at several resolutions, on the default target: a few classes that differ.

`compile_repeated_blocks(backend="neuron", fullgraph=True)` with Dynamo's default recompile limit, at the case's own
resolution B, another resolution C in the same bucket of 128 image tokens, and B again (sizes from
`tiny_diffusers_resolutions.py`). After C, Dynamo has made the block graphs dynamic: where the padding proof accepts
them, C and the return to B run from one bucket program per block graph, and the return compiles nothing. A class
whose blocks the proof refuses runs exact shapes, reports the reason, and still matches eager.
benchmarks/diffusers_resolutions.py runs every class, with a size in a second bucket too.
"""

import pytest
import torch
from test_diffusers_classes import _tensors
from tiny_diffusers_resolutions import RESOLUTIONS, tiny_model

import neuron_dynamo

BUCKETED = [
    "WanTransformer3DModel",  # video: 3D patches, frames change between B and C
    "QwenImageTransformer2DModel",  # RoPE through complex numbers, joint attention over text and image
    "HunyuanVideo15Transformer3DModel",  # the text mask padded in front by the image length, then split apart
    "StableAudio3DiTModel",  # audio: memory tokens in front, the RoPE table's last n rows
    "NucleusMoEImageTransformer2DModel",  # image queries over image + text keys, a bool mask; its MLP is 0 wide
]
EXACT = {"HeliosTransformer3DModel": "bucketing.refusals.aten.split_with_sizes"}  # history and frame in one sequence


def _run(name: str) -> tuple[dict, dict]:
    """Eager, then compiled at B, C and B again: every output against eager; the stats after C and at the end."""
    resolutions = RESOLUTIONS[name]
    sizes = [resolutions.sizes[1], resolutions.sizes[2], resolutions.sizes[1]]
    model = tiny_model(name)
    with torch.no_grad():
        expected = [_tensors(model(**resolutions.inputs(*size))) for size in sizes[:2]]
    neuron_dynamo.reset_stats()
    model.compile_repeated_blocks(backend="neuron", fullgraph=True)
    with torch.no_grad():
        for size, want in zip(sizes, [*expected, expected[0]], strict=True):
            torch.testing.assert_close(_tensors(model(**resolutions.inputs(*size))), want, rtol=1e-4, atol=1e-4)
            if size == sizes[1]:
                after_c = dict(neuron_dynamo.stats())
    return after_c, neuron_dynamo.stats()


@pytest.mark.parametrize("name", BUCKETED)
def test_resolutions_share_a_bucket_program_and_the_return_compiles_nothing(name):
    after_c, stats = _run(name)
    assert not [key for key in stats if key.startswith("bucketing.refusals")], stats
    assert stats.get("dynamo_graphs_eager", 0) == 0
    assert stats["programs_compiled"] == after_c["programs_compiled"], "the return to B compiled a program"
    assert stats.get("cache.misses", 0) == after_c.get("cache.misses", 0)
    exact = lambda counts: {key: value for key, value in counts.items() if ".calls.exact[" in key}  # noqa: E731
    assert exact(stats) == exact(after_c), "a dynamic graph ran exact shapes on the return"
    assert stats["bucketing.calls"] > after_c["bucketing.calls"]  # the return ran C's bucket programs
    assert stats.get("bucketing.programs", 0) == after_c.get("bucketing.programs", 0) > 0


@pytest.mark.parametrize("name", sorted(EXACT))
def test_refused_blocks_run_exact_shapes_and_say_why(name):
    _, stats = _run(name)
    assert stats.get(EXACT[name], 0) >= 1, {key: value for key, value in stats.items() if "refusals" in key}
    assert stats.get("dynamo_graphs_eager", 0) == 0
