"""Diffusers the way its docs use it: `compile_repeated_blocks(backend="neuron")`, whole-model `torch.compile`, and
full tiny pipelines, each equal to eager (tiny random-weight models built from configs, nothing downloaded)."""

import pytest
import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    StableDiffusionPipeline,
    UNet2DConditionModel,
)

import neuron_dynamo

REFERENCE = {"target": "reference"}
TEXT_LEN = 8


def tiny_flux(layers: int = 2, single_layers: int = 2, in_channels: int = 4) -> FluxTransformer2DModel:
    torch.manual_seed(0)
    return FluxTransformer2DModel(
        patch_size=1, in_channels=in_channels, num_layers=layers, num_single_layers=single_layers,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8]).eval()


def flux_inputs(height: int, width: int) -> dict:
    """The transformer's inputs for a latent of height x width patches (ids as FluxPipeline builds them)."""
    generator = torch.Generator().manual_seed(100 * height + width)
    img_ids = torch.zeros(height * width, 3)
    img_ids[:, 1] = torch.arange(height).repeat_interleave(width)
    img_ids[:, 2] = torch.arange(width).repeat(height)
    return dict(
        hidden_states=torch.randn(1, height * width, 4, generator=generator),
        encoder_hidden_states=torch.randn(1, TEXT_LEN, 32, generator=generator),
        pooled_projections=torch.randn(1, 32, generator=generator), timestep=torch.tensor([1.0]),
        img_ids=img_ids, txt_ids=torch.zeros(TEXT_LEN, 3), return_dict=False)


def tiny_unet() -> UNet2DConditionModel:
    torch.manual_seed(0)
    return UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=4, norm_num_groups=4).eval()


def tiny_vae() -> AutoencoderKL:
    torch.manual_seed(0)
    return AutoencoderKL(
        block_out_channels=(8,), in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",), latent_channels=4, norm_num_groups=4, sample_size=16,
        shift_factor=0.0, scaling_factor=1.0).eval()


def programs_compiled() -> int:
    return neuron_dynamo.stats().get("programs_compiled", 0)


# --- regional compilation, the documented way ------------------------------------------------------------------------
def _documented_way(options: dict | None) -> None:
    """Diffusers' own contract (its `test_torch_compile_repeated_blocks`): recompile_limit=1 and fullgraph=True, so
    every block of a class must run from one Dynamo graph, and a second call compiles nothing."""
    model = tiny_flux()
    inputs = flux_inputs(4, 4)
    with torch.no_grad():
        expected = model(**inputs)[0]
    neuron_dynamo.reset_stats()
    model.compile_repeated_blocks(backend="neuron", fullgraph=True, **({"options": options} if options else {}))
    with torch._dynamo.config.patch(recompile_limit=1), torch.no_grad():
        first = model(**inputs)[0]
        compiled = programs_compiled()
        second = model(**inputs)[0]
    stats = neuron_dynamo.stats()
    torch.testing.assert_close(first, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(second, expected, rtol=1e-4, atol=1e-4)
    assert stats["dynamo_graphs"] == len(model._repeated_blocks)  # one graph per block class, 4 blocks
    assert stats["calls"] == 2 * 4  # every block of both calls ran the compiled graph of its class
    assert stats["programs_compiled"] == compiled  # the second call compiled nothing


# Flux's single block returns two disjoint slices of one tensor. Laid out as views of one buffer (eager's layout),
# they would give the next block inputs with stride (24*32, 32, 1) where the first got contiguous ones: Dynamo's
# stride guard fails and a second graph is compiled. Outputs that share no element are plain tensors
# (`output_layout.EagerLayout`), so all blocks of a class share one graph.
@pytest.mark.parametrize("options", [None, REFERENCE], ids=["default-target", "reference"])
def test_flux_regional_documented_way(options):
    _documented_way(options)


def test_flux_regional_resolutions_share_buckets():
    """Several resolutions: Dynamo makes the blocks' graphs dynamic after the first change of size (its recompile
    limit must allow that: static, dynamic, and dynamic again for the first block, whose inputs are views), the
    backend serves them from buckets, and returning to a resolution compiles nothing."""
    model = tiny_flux()
    resolutions = [(4, 4), (4, 6), (6, 6)]
    with torch.no_grad():
        expected = {size: model(**flux_inputs(*size))[0] for size in resolutions}
    neuron_dynamo.reset_stats()
    model.compile_repeated_blocks(backend="neuron", fullgraph=True, options=REFERENCE)
    with torch.no_grad():
        for size in resolutions + resolutions[:1]:
            torch.testing.assert_close(model(**flux_inputs(*size))[0], expected[size], rtol=1e-4, atol=1e-4)
        before = programs_compiled()
        for size in resolutions:
            torch.testing.assert_close(model(**flux_inputs(*size))[0], expected[size], rtol=1e-4, atol=1e-4)
    stats = neuron_dynamo.stats()
    assert programs_compiled() == before, "returning to a resolution compiled a program"
    assert not [key for key in stats if key.startswith("bucketing.refusals.")]
    assert stats["bucketing.graphs"] >= 2 and not stats.get("bucketing.graphs_refused")


def test_flux_returning_to_a_resolution_compiles_nothing():
    """Sizes A, B (another bucket), then A: Dynamo's dynamic graph has replaced the static graph that served A, and
    the program that graph stored in the compile cache serves A again, exactly (`cache_key.semantic_graph` makes the
    two graphs one key). No program is built on the return."""
    model = tiny_flux()
    small, large = (4, 4), (12, 12)  # 24 and 152 tokens: buckets 128 and 256
    with torch.no_grad():
        expected = model(**flux_inputs(*small))[0]
    model.compile_repeated_blocks(backend="neuron", fullgraph=True, options=REFERENCE)
    with torch.no_grad():
        model(**flux_inputs(*small))
        model(**flux_inputs(*large))
        built = neuron_dynamo.stats().get("cache.misses", 0)
        torch.testing.assert_close(model(**flux_inputs(*small))[0], expected, rtol=1e-4, atol=1e-4)
    stats = neuron_dynamo.stats()
    assert stats.get("cache.misses", 0) == built, "returning to a resolution built a program"
    assert stats.get("cache.hits", 0) >= 2  # the double and the single block's programs of A


# --- whole-model compile ---------------------------------------------------------------------------------------------
def test_unet_whole_model_compile():
    unet = tiny_unet()
    compiled = torch.compile(unet, backend="neuron")
    sample, timestep, context = torch.randn(1, 4, 8, 8), torch.tensor([10]), torch.randn(1, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(sample, timestep, context).sample, unet(sample, timestep, context).sample,
                                   rtol=1e-4, atol=1e-4)


# --- full tiny pipelines ---------------------------------------------------------------------------------------------
def test_stable_diffusion_pipeline_regional():
    """UNet2DConditionModel's repeated blocks (Diffusers allows it recompile_limit=2: its blocks differ)."""
    pipe = StableDiffusionPipeline(
        vae=tiny_vae(), text_encoder=None, tokenizer=None, unet=tiny_unet(), scheduler=DDIMScheduler(),
        safety_checker=None, feature_extractor=None, image_encoder=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    embeds = torch.randn(1, 5, 16, generator=torch.Generator().manual_seed(0))

    def run(size: int) -> torch.Tensor:
        return pipe(prompt_embeds=embeds, negative_prompt_embeds=torch.zeros_like(embeds), height=size, width=size,
                    num_inference_steps=2, output_type="pt", generator=torch.Generator().manual_seed(0)).images

    expected = run(16)
    pipe.unet.compile_repeated_blocks(backend="neuron", fullgraph=True, options=REFERENCE)
    with torch._dynamo.config.patch(recompile_limit=2):
        torch.testing.assert_close(run(16), expected, rtol=1e-4, atol=1e-4)


def test_flux_pipeline_regional_resolutions():
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=tiny_vae(), text_encoder=None, tokenizer=None,
        text_encoder_2=None, tokenizer_2=None, transformer=tiny_flux(layers=1, single_layers=1, in_channels=16))
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(0)
    embeds, pooled = torch.randn(1, TEXT_LEN, 32, generator=generator), torch.randn(1, 32, generator=generator)

    def run(size: int) -> torch.Tensor:
        return pipe(prompt_embeds=embeds, pooled_prompt_embeds=pooled, height=size, width=size, num_inference_steps=2,
                    output_type="pt", generator=torch.Generator().manual_seed(0)).images

    expected = {size: run(size) for size in (16, 24)}
    pipe.transformer.compile_repeated_blocks(backend="neuron", fullgraph=True, options=REFERENCE)
    for size in (16, 24):
        torch.testing.assert_close(run(size), expected[size], rtol=1e-4, atol=1e-4)
