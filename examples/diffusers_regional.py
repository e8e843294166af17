"""Regional compilation of a Diffusers pipeline: only the repeated transformer blocks go through the backend.

A tiny Flux pipeline with random weights (nothing downloaded; the prompt embeddings are given, so no text encoder
is needed) generates two images, the second at another resolution, with its transformer blocks compiled by
`compile_repeated_blocks(backend="neuron")`; the images are compared with eager and the report of what ran where
is printed; a mismatch with eager exits non-zero. Run: `python examples/diffusers_regional.py`.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel  # noqa: E402

import neuron_dynamo  # noqa: E402


def tiny_flux_pipeline() -> FluxPipeline:
    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
    vae = AutoencoderKL(
        block_out_channels=(8,), in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",), latent_channels=4, norm_num_groups=4, sample_size=16,
        shift_factor=0.0, scaling_factor=1.0)
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae.eval(), transformer=transformer.eval(),
                        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def main() -> None:
    pipe = tiny_flux_pipeline()
    generator = torch.Generator().manual_seed(0)
    embeds, pooled = torch.randn(1, 8, 32, generator=generator), torch.randn(1, 32, generator=generator)

    def generate(size: int) -> torch.Tensor:
        return pipe(prompt_embeds=embeds, pooled_prompt_embeds=pooled, height=size, width=size,
                    num_inference_steps=2, output_type="pt", generator=torch.Generator().manual_seed(0)).images

    sizes = (16, 24)
    eager = {size: generate(size) for size in sizes}
    pipe.transformer.compile_repeated_blocks(backend="neuron")
    with neuron_dynamo.explaining() as report:  # every static program that ran during the calls
        for size in sizes:
            image = generate(size)
            print(f"{size}x{size}: max |compiled - eager| = {(image - eager[size]).abs().max().item():.2e}")
            torch.testing.assert_close(image, eager[size], rtol=1e-4, atol=1e-4)
    print(report)
    stats = neuron_dynamo.stats()
    print(f"\n{stats['dynamo_graphs']} Dynamo graph(s) served {stats['calls']} block calls "
          f"({len(pipe.transformer.transformer_blocks) + len(pipe.transformer.single_transformer_blocks)} blocks, "
          f"{2 * len(sizes)} denoising steps); {stats['programs_compiled']} static program(s) compiled")


if __name__ == "__main__":
    main()
