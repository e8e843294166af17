"""Every Diffusers model class with `_repeated_blocks`, compiled the documented way.

Diffusers' recipe is `model.compile_repeated_blocks(fullgraph=True)` under `torch._dynamo.config.recompile_limit = 1`:
all blocks of a class must run from one Dynamo graph. The class list comes from the installed diffusers at run time;
each class needs a tiny config (random weights, nothing downloaded), or an entry in NOT_COVERED with the reason.
The first classes' sweep (CASES) runs on the `reference` target and a handful of them on the default target; the
classes of `tiny_diffusers.py` run on the default target only, at one resolution. A class the backend fails on is in
KNOWN_FAILURES with its exact error, run as a strict xfail: it fails the suite once it passes.
"""

import inspect

import diffusers
import pytest
import torch
from tiny_diffusers import DEFAULT_TARGET_CASES, Case, randn

import neuron_dynamo

REFERENCE = {"target": "reference"}


def flux_ids(height: int, width: int, text: int) -> dict:
    image = torch.zeros(height * width, 3)
    image[:, 1] = torch.arange(height).repeat_interleave(width)
    image[:, 2] = torch.arange(width).repeat(height)
    return {"img_ids": image, "txt_ids": torch.zeros(text, 3)}


def flux2_ids(height: int, width: int, text: int) -> dict:
    image = torch.cartesian_prod(torch.arange(1), torch.arange(height), torch.arange(width), torch.arange(1))
    words = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(text))
    return {"img_ids": image.unsqueeze(0), "txt_ids": words.unsqueeze(0)}


def flux_like_inputs(guidance: bool = False, pooled: int = 0) -> dict:
    inputs = dict(hidden_states=randn(1, 16, 4), encoder_hidden_states=randn(1, 8, 32, seed=1),
                  timestep=torch.tensor([1.0]), **flux_ids(4, 4, 8))
    if guidance:
        inputs["guidance"] = torch.tensor([3.5])
    if pooled:
        inputs["pooled_projections"] = randn(1, pooled, seed=2)
    return inputs


def video_inputs(channels: int = 4, text_dim: int = 16, **extra) -> dict:
    return dict(hidden_states=randn(1, channels, 2, 16, 16), encoder_hidden_states=randn(1, 12, text_dim, seed=1),
                timestep=torch.tensor([500]), **extra)


WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
           text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
           rope_max_seq_len=32)
FLUX_LIKE = dict(patch_size=1, in_channels=4, num_layers=2, num_single_layers=2, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=[4, 4, 8])

CASES: dict[str, Case] = {
    "FluxTransformer2DModel": Case({**FLUX_LIKE, "pooled_projection_dim": 32},
                                   lambda: flux_like_inputs(pooled=32)),
    "Flux2Transformer2DModel": Case(
        {**FLUX_LIKE, "timestep_guidance_channels": 256, "axes_dims_rope": [4, 4, 4, 4]},
        lambda: dict(hidden_states=randn(1, 16, 4), encoder_hidden_states=randn(1, 8, 32, seed=1),
                     timestep=torch.tensor([1.0]), guidance=torch.tensor([1.0]), **flux2_ids(4, 4, 8))),
    "ChromaTransformer2DModel": Case(
        {**FLUX_LIKE, "approximator_num_channels": 8, "approximator_hidden_dim": 16, "approximator_layers": 1},
        flux_like_inputs),
    "OvisImageTransformer2DModel": Case({**FLUX_LIKE, "out_channels": 4, "axes_dims_rope": (4, 4, 8)},
                                        flux_like_inputs),
    "LongCatImageTransformer2DModel": Case({**FLUX_LIKE, "pooled_projection_dim": 32},
                                           lambda: flux_like_inputs(guidance=True)),
    "WanTransformer3DModel": Case(WAN, video_inputs),
    "SkyReelsV2Transformer3DModel": Case(WAN, video_inputs),
    "ChronoEditTransformer3DModel": Case(
        {**WAN, "attention_head_dim": 8, "in_channels": 16, "out_channels": 16, "text_dim": 32, "freq_dim": 16,
         "rope_max_seq_len": 64, "rope_temporal_skip_len": 8},
        lambda: video_inputs(channels=16, text_dim=32, encoder_hidden_states_image=None)),
    "WanVACETransformer3DModel": Case(
        {**WAN, "in_channels": 16, "out_channels": 16, "text_dim": 32, "num_layers": 4, "vace_layers": [0, 2],
         "vace_in_channels": 48},
        lambda: video_inputs(channels=16, text_dim=32, control_hidden_states=randn(1, 48, 2, 16, 16, seed=3)),
        recompile_limit=2),  # WanVACETransformerBlock runs WanTransformerBlock's forward: one code object, two graphs
    "LTXVideoTransformer3DModel": Case(
        dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
             num_layers=2, qk_norm="rms_norm_across_heads", caption_channels=16),
        lambda: dict(hidden_states=randn(1, 2 * 8 * 8, 4), encoder_hidden_states=randn(1, 16, 16, seed=1),
                     timestep=torch.tensor([500]), encoder_attention_mask=torch.ones(1, 16, dtype=torch.bool),
                     num_frames=2, height=8, width=8)),
    "QwenImageTransformer2DModel": Case(
        dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=4,
             joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4)),
        lambda: dict(hidden_states=randn(1, 16, 16), encoder_hidden_states=randn(1, 8, 16, seed=1),
                     encoder_hidden_states_mask=torch.ones(1, 8, dtype=torch.long), timestep=torch.tensor([1.0]),
                     img_shapes=[(1, 4, 4)])),
    "HunyuanVideoTransformer3DModel": Case(
        dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=2,
             num_single_layers=2, num_refiner_layers=2, patch_size=1, patch_size_t=1, guidance_embeds=True,
             text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4), image_condition_type=None),
        lambda: dict(hidden_states=randn(1, 4, 1, 8, 8), timestep=torch.tensor([500.0]),
                     encoder_hidden_states=randn(1, 12, 16, seed=1), pooled_projections=randn(1, 8, seed=2),
                     encoder_attention_mask=torch.ones(1, 12), guidance=torch.tensor([500.0]))),
    "UNet2DConditionModel": Case(
        dict(block_out_channels=(8, 16), layers_per_block=2, sample_size=8, in_channels=4, out_channels=4,
             down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
             up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
             cross_attention_dim=16, attention_head_dim=4, norm_num_groups=4),
        lambda: dict(sample=randn(1, 4, 8, 8), timestep=torch.tensor([10]), encoder_hidden_states=randn(1, 5, 16)),
        recompile_limit=2),  # its BasicTransformerBlocks differ in width between resolutions
}

# Classes without a case, each with the reason: a fact about the class, or that no case is written yet.
NOT_COVERED: dict[str, str] = {
    "WanAnimate2Transformer3DModel": "Dynamo itself cannot trace its block with fullgraph=True (the eager backend "
                                     "raises too): data-dependent guard `4*u4 < 2` in rope_apply's "
                                     "`freqs[0][: f * time_stride : time_stride]`",
}

# Classes the backend fails on, with the exact error; each runs as a strict xfail, so a fix shows up as a failure here.
KNOWN_FAILURES: dict[str, str] = {}
ALL_CASES: dict[str, Case] = {**CASES, **DEFAULT_TARGET_CASES}


def repeated_block_classes() -> dict[str, type]:
    """The installed diffusers' model classes that name their repeated blocks."""
    classes = {}
    for name in dir(diffusers):
        value = getattr(diffusers, name, None)
        if inspect.isclass(value) and issubclass(value, diffusers.ModelMixin) and getattr(value, "_repeated_blocks",
                                                                                       None):
            classes[name] = value
    return classes


def test_every_class_with_repeated_blocks_has_a_case():
    classes = repeated_block_classes()
    missing = sorted(set(classes) - set(ALL_CASES) - set(NOT_COVERED))
    assert not missing, (f"diffusers classes with _repeated_blocks and no tiny config: {missing}; add a tiny config "
                         "to tests/hf/tiny_diffusers.py, or list the class in NOT_COVERED with why")
    stale = sorted((set(ALL_CASES) | set(NOT_COVERED)) - set(classes))
    assert set(KNOWN_FAILURES) <= set(ALL_CASES), "a known failure needs its tiny config"
    assert not set(ALL_CASES) & set(NOT_COVERED), "a class with a tiny config is covered: drop it from NOT_COVERED"
    assert not stale, f"classes no longer in diffusers or without _repeated_blocks: {stale}"


def block_classes(model: torch.nn.Module) -> set[str]:
    return {type(m).__name__ for m in model.modules() if type(m).__name__ in model._repeated_blocks}


def documented_way(name: str, options: dict | None) -> dict:
    """Eager, then `compile_repeated_blocks(backend="neuron", fullgraph=True)` under recompile_limit=1, twice: equal
    outputs, one Dynamo graph per block class, every block call served by it, and nothing compiled by the second."""
    case = ALL_CASES[name]
    torch.manual_seed(0)
    model = repeated_block_classes()[name](**case.config).eval()
    if case.prepare:
        case.prepare(model)
    with torch.no_grad():
        expected = model(**case.inputs())
    neuron_dynamo.reset_stats()
    model.compile_repeated_blocks(backend="neuron", fullgraph=True, **({"options": options} if options else {}))
    with torch._dynamo.config.patch(recompile_limit=case.recompile_limit), torch.no_grad():
        first = model(**case.inputs())
        compiled = neuron_dynamo.stats().get("programs_compiled", 0)
        second = model(**case.inputs())
    stats = neuron_dynamo.stats()
    for got in (first, second):
        torch.testing.assert_close(_tensors(got), _tensors(expected), rtol=1e-4, atol=1e-4)
    assert stats["dynamo_graphs"] <= case.recompile_limit * len(block_classes(model)), "blocks do not share graphs"
    assert stats.get("dynamo_graphs_eager", 0) == 0, "a block graph ran eagerly: the backend failed"
    assert stats.get("graphs_failed", 0) == 0, "a compiled block graph failed at run time and ran eagerly"
    assert stats["programs_compiled"] == compiled, "the second call compiled a program"
    return stats


def _tensors(output) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    return [t for item in output for t in _tensors(item)] if isinstance(output, (tuple, list)) else []


DEFAULT_TARGET_SAMPLE = ["WanTransformer3DModel", "QwenImageTransformer2DModel", "ChromaTransformer2DModel"]


@pytest.mark.slow  # about 10 s per class on a shared machine
@pytest.mark.parametrize("name", sorted(set(CASES) - set(DEFAULT_TARGET_SAMPLE)))  # run on the default target below
def test_regional_documented_way(name):
    documented_way(name, REFERENCE)


@pytest.mark.parametrize("name", DEFAULT_TARGET_SAMPLE)
def test_regional_documented_way_default_target(name):
    documented_way(name, None)


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(
    strict=True, raises=AssertionError, reason=KNOWN_FAILURES[name])) if name in KNOWN_FAILURES else name
    for name in sorted(DEFAULT_TARGET_CASES)])
def test_regional_documented_way_more_classes(name):
    documented_way(name, None)
