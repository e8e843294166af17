"""The tiny Diffusers cases at other resolutions: per class, its forward's inputs as a function of a size.

A size is in the class's own latent units, (height, width) or (frames, height, width) (a sequence length for the
audio models, a grid side where a helper takes one). Each class has three sizes: A, whose image tokens fill more than
one bucket of 128, then B and C, two shapes within one bucket (B is the case's own resolution in
`tiny_diffusers.py` / `test_diffusers_classes.py`). The configs are the cases'; only the inputs change here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from test_diffusers_classes import ALL_CASES, flux2_ids, flux_ids, repeated_block_classes
from tiny_diffusers import (
    anyflow_far_inputs,
    cosmos3_inputs,
    ideogram4_inputs,
    krea2_inputs,
    minimax_h3_inputs,
    positions,
    qwen_image21_inputs,
    randn,
    rfd4_autoencoder_inputs,
    rfd4_inputs,
    sana_wm_inputs,
    sana_wm_refiner_inputs,
)


@dataclasses.dataclass(frozen=True)
class Resolutions:
    """A class's inputs at a size, and its sizes A, B, C."""

    inputs: Callable[..., dict]
    sizes: tuple[tuple[int, ...], ...]


def tiny_model(name: str) -> torch.nn.Module:
    """The case's model as test_diffusers_classes.py builds it: seed 0, eval mode, the case's `prepare`."""
    case = ALL_CASES[name]
    torch.manual_seed(0)
    model = repeated_block_classes()[name](**case.config).eval()
    if case.prepare:
        case.prepare(model)
    return model


def flux_like(height: int, width: int, guidance: bool = False, pooled: int = 0) -> dict:
    inputs = dict(hidden_states=randn(1, height * width, 4), encoder_hidden_states=randn(1, 8, 32, seed=1),
                  timestep=torch.tensor([1.0]), **flux_ids(height, width, 8))
    if guidance:
        inputs["guidance"] = torch.tensor([3.5])
    if pooled:
        inputs["pooled_projections"] = randn(1, pooled, seed=2)
    return inputs


def flux2(height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, height * width, 4), encoder_hidden_states=randn(1, 8, 32, seed=1),
                timestep=torch.tensor([1.0]), guidance=torch.tensor([1.0]), **flux2_ids(height, width, 8))


def video(frames: int, height: int, width: int, channels: int = 4, text_dim: int = 16, **extra) -> dict:
    return dict(hidden_states=randn(1, channels, frames, height, width),
                encoder_hidden_states=randn(1, 12, text_dim, seed=1), timestep=torch.tensor([500]), **extra)


def wan_vace(frames: int, height: int, width: int) -> dict:
    return video(frames, height, width, channels=16, text_dim=32,
                 control_hidden_states=randn(1, 48, frames, height, width, seed=3))


def ltx_video(frames: int, height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, frames * height * width, 4), encoder_hidden_states=randn(1, 16, 16, seed=1),
                timestep=torch.tensor([500]), encoder_attention_mask=torch.ones(1, 16, dtype=torch.bool),
                num_frames=frames, height=height, width=width)


def qwen_image(height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, height * width, 16), encoder_hidden_states=randn(1, 8, 16, seed=1),
                encoder_hidden_states_mask=torch.ones(1, 8, dtype=torch.long), timestep=torch.tensor([1.0]),
                img_shapes=[(1, height, width)])


def hunyuan_video(frames: int, height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, 4, frames, height, width), timestep=torch.tensor([500.0]),
                encoder_hidden_states=randn(1, 12, 16, seed=1), pooled_projections=randn(1, 8, seed=2),
                encoder_attention_mask=torch.ones(1, 12), guidance=torch.tensor([500.0]))


def unet(height: int, width: int) -> dict:
    return dict(sample=randn(1, 4, height, width), timestep=torch.tensor([10]), encoder_hidden_states=randn(1, 5, 16))


def anyflow(frames: int, height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, frames, 4, height, width), timestep=torch.full((1, frames), 500.0),
                r_timestep=torch.full((1, frames), 250.0), encoder_hidden_states=randn(1, 12, 16, seed=1))


def ernie_image(height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, 16, height, width), timestep=torch.tensor([1.0]),
                text_bth=randn(1, 8, 16, seed=1), text_lens=torch.tensor([8]))


def glm_image(height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, 4, height, width), encoder_hidden_states=randn(1, 12, 32, seed=1),
                prior_token_id=torch.tensor([3]), prior_token_drop=torch.zeros(1, dtype=torch.bool),
                timestep=torch.tensor([500]), target_size=torch.tensor([[float(height), float(width)]]),
                crop_coords=torch.tensor([[0.0, 0.0]]))


def helios(frames: int, height: int, width: int) -> dict:
    """The history latents share the frame's height and width (multiples of 8: the long history is patched 8x8)."""
    return dict(hidden_states=randn(1, 4, frames, height, width), timestep=torch.tensor([500]),
                encoder_hidden_states=randn(1, 12, 16, seed=1), indices_hidden_states=torch.ones(1, frames),
                indices_latents_history_short=torch.ones(1, 1), indices_latents_history_mid=torch.ones(1, 1),
                indices_latents_history_long=torch.ones(1, 4),
                latents_history_short=randn(1, 4, 1, height, width, seed=2),
                latents_history_mid=randn(1, 4, 1, height, width, seed=3),
                latents_history_long=randn(1, 4, 4, height, width, seed=4))


def joy_image_edit(frames: int, height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, 16, frames, height, width), encoder_hidden_states=randn(1, 12, 16, seed=1),
                timestep=torch.tensor([1.0]))


def joy_image_edit_plus(height: int, width: int) -> dict:
    """A target and one reference image of `height x width` patches each."""
    return dict(hidden_states=randn(1, 2 * height * width, 16, 1, 2, 2), encoder_hidden_states=randn(1, 12, 16, seed=1),
                timestep=torch.tensor([1.0]), shape_list=[[(1, height, width), (1, height, width)]])


def longcat_audio(length: int) -> dict:
    return dict(hidden_states=randn(1, length, 8), encoder_hidden_states=randn(1, 10, 16, seed=1),
                encoder_attention_mask=torch.ones(1, 10, dtype=torch.bool),
                attention_mask=torch.ones(1, length, dtype=torch.bool), timestep=torch.ones(1))


def ltx2_video(frames: int, height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, frames * height * width, 4), audio_hidden_states=randn(1, 9, 4, seed=1),
                encoder_hidden_states=randn(1, 16, 16, seed=2), audio_encoder_hidden_states=randn(1, 16, 16, seed=3),
                timestep=torch.tensor([500.0]), encoder_attention_mask=torch.ones(1, 16, dtype=torch.bool),
                num_frames=frames, height=height, width=width, audio_num_frames=9, fps=25.0)


def minimax_music(length: int) -> dict:
    """The condition is per frame: as long as the latent."""
    return dict(hidden_states=randn(1, 8, length), encoder_hidden_states=randn(1, length, 16, seed=1),
                timestep=torch.tensor([0.5]))


def motif_video(frames: int, height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, 33, frames, height, width), encoder_hidden_states=randn(1, 12, 32, seed=1),
                timestep=torch.tensor([500]))


def stable_audio(length: int) -> dict:
    return dict(hidden_states=randn(1, 8, length), timestep=torch.tensor([0.5]),
                encoder_hidden_states=randn(1, 4, 16, seed=1), global_hidden_states=randn(1, 12, seed=2))


def z_image(height: int, width: int) -> dict:
    return dict(x=[randn(16, 1, height, width)], cap_feats=[randn(16, 16, seed=1)], t=torch.tensor([0.0]))


def bria_fibo(height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, height * width, 16), encoder_hidden_states=randn(1, 8, 32, seed=1),
                text_encoder_layers=[randn(1, 8, 16, seed=2), randn(1, 8, 16, seed=3)],
                img_ids=flux_ids(height, width, 8)["img_ids"], txt_ids=torch.zeros(8, 3), timestep=torch.tensor([1.0]))


def hunyuan_video15(frames: int, height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, 4, frames, height, width), timestep=torch.tensor([1.0]),
                encoder_hidden_states=randn(1, 6, 16, seed=1), encoder_hidden_states_2=randn(1, 4, 8, seed=2),
                encoder_attention_mask=torch.ones(1, 6), encoder_attention_mask_2=torch.ones(1, 4),
                image_embeds=torch.zeros(1, 3, 12))


def flux3(height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, height * width, 4), encoder_hidden_states=randn(1, 8, 16, seed=1),
                timestep=torch.tensor([0.5]), img_ids=positions(1, height, width, 1), txt_ids=positions(1, 1, 1, 8))


def kandinsky5(frames: int, height: int, width: int) -> dict:
    """Latents (batch, frames, height, width, channels), patched 2x2: rope positions of the token grid."""
    return dict(hidden_states=randn(1, frames, height, width, 4), encoder_hidden_states=randn(1, 6, 16, seed=1),
                timestep=torch.tensor([500.0]), pooled_projections=randn(1, 8, seed=2),
                visual_rope_pos=[torch.arange(frames), torch.arange(height // 2), torch.arange(width // 2)],
                text_rope_pos=torch.arange(6))


def kandinsky6(frames: int, height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, frames, height, width, 4), encoder_hidden_states=randn(1, 6, 16, seed=1),
                pooled_projections=randn(1, 8, seed=2), timestep=torch.tensor([500.0]))


def kandinsky6_sr(frames: int, height: int, width: int) -> dict:
    """Token grids of multiples of 8 (its NABLA attention groups 8x8 neighbourhoods)."""
    return dict(hidden_states=randn(1, frames, height, width, 9), timestep=torch.tensor([500.0]))


def hunyuan_image(height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, 4, height, width), timestep=torch.tensor([500.0]),
                encoder_hidden_states=randn(1, 6, 16, seed=1), encoder_attention_mask=torch.ones(1, 6))


def bria_fibo2(height: int, width: int) -> dict:
    return dict(hidden_states=randn(1, 4, height, width), timestep=torch.tensor([0.5]),
                encoder_hidden_states=randn(1, 2, 6, 16, seed=1))


def minimax_h3_vae(frames: int, height: int, width: int) -> dict:
    return dict(sample=randn(1, 3, frames, height, width))


def wan_animate(height: int, width: int) -> dict:
    """21 latent frames (the face video's 77 frames, the released segment length), the pose at the same size."""
    return dict(hidden_states=randn(1, 12, 21, height, width), timestep=torch.tensor([500]),
                encoder_hidden_states=randn(1, 12, 16, seed=1), encoder_hidden_states_image=randn(1, 12, 16, seed=2),
                pose_hidden_states=randn(1, 4, 20, height, width, seed=3),
                face_pixel_values=randn(1, 3, 77, 16, 16, seed=4))


def _flux_sizes(build: Callable[..., dict]) -> Resolutions:
    return Resolutions(build, ((12, 12), (4, 4), (4, 6)))  # image tokens 144 (bucket 256), 16, 24 (bucket 128)


WAN_SIZES = ((2, 16, 24), (2, 16, 16), (1, 16, 16))  # patch 1x2x2: 192, 128, 64 tokens

RESOLUTIONS: dict[str, Resolutions] = {
    "FluxTransformer2DModel": _flux_sizes(lambda h, w: flux_like(h, w, pooled=32)),
    "Flux2Transformer2DModel": _flux_sizes(flux2),
    "ChromaTransformer2DModel": _flux_sizes(flux_like),
    "OvisImageTransformer2DModel": _flux_sizes(flux_like),
    "LongCatImageTransformer2DModel": _flux_sizes(lambda h, w: flux_like(h, w, guidance=True)),
    "WanTransformer3DModel": Resolutions(video, WAN_SIZES),
    "SkyReelsV2Transformer3DModel": Resolutions(video, WAN_SIZES),
    "ChronoEditTransformer3DModel": Resolutions(
        lambda f, h, w: video(f, h, w, channels=16, text_dim=32, encoder_hidden_states_image=None), WAN_SIZES),
    "WanVACETransformer3DModel": Resolutions(wan_vace, WAN_SIZES),
    "LTXVideoTransformer3DModel": Resolutions(ltx_video, ((2, 8, 12), (2, 8, 8), (1, 8, 8))),
    "QwenImageTransformer2DModel": _flux_sizes(qwen_image),
    "HunyuanVideoTransformer3DModel": Resolutions(hunyuan_video, ((1, 12, 12), (1, 8, 8), (1, 8, 12))),
    "UNet2DConditionModel": Resolutions(unet, ((12, 12), (8, 8), (8, 12))),
    "AnyFlowTransformer3DModel": Resolutions(anyflow, ((2, 16, 24), (2, 8, 8), (2, 8, 12))),
    "ErnieImageTransformer2DModel": _flux_sizes(ernie_image),
    "GlmImageTransformer2DModel": Resolutions(glm_image, ((24, 24), (8, 8), (8, 12))),
    "HeliosTransformer3DModel": Resolutions(helios, ((2, 16, 24), (2, 8, 8), (2, 8, 16))),
    "Ideogram4Transformer2DModel": Resolutions(lambda side: ideogram4_inputs(image=side), ((12,), (2,), (4,))),
    "JoyImageEditTransformer3DModel": Resolutions(joy_image_edit, ((1, 24, 24), (1, 4, 4), (1, 4, 8))),
    "JoyImageEditPlusTransformer3DModel": Resolutions(joy_image_edit_plus, ((8, 10), (1, 1), (2, 3))),
    "Krea2Transformer2DModel": Resolutions(lambda side: krea2_inputs(grid=side), ((12,), (2,), (3,))),
    "LongCatAudioDiTTransformer": Resolutions(longcat_audio, ((160,), (16,), (24,))),
    "LTX2VideoTransformer3DModel": Resolutions(ltx2_video, ((2, 8, 10), (2, 4, 4), (2, 4, 6))),
    "MiniMaxH3Transformer3DModel": Resolutions(lambda length: minimax_h3_inputs(video=length), ((144,), (8,), (12,))),
    "MiniMaxMusic3Transformer1DModel": Resolutions(minimax_music, ((160,), (24,), (40,))),
    "MotifVideoTransformer3DModel": Resolutions(motif_video, ((2, 8, 10), (2, 4, 4), (2, 4, 6))),
    "NucleusMoEImageTransformer2DModel": _flux_sizes(qwen_image),
    "StableAudio3DiTModel": Resolutions(stable_audio, ((160,), (16,), (24,))),
    "ZImageTransformer2DModel": Resolutions(z_image, ((24, 24), (8, 8), (8, 12))),
    "BriaFiboTransformer2DModel": _flux_sizes(bria_fibo),
    "Cosmos3OmniTransformer": Resolutions(cosmos3_inputs, ((12, 12), (2, 2), (2, 3))),
    "HunyuanVideo15Transformer3DModel": Resolutions(hunyuan_video15, ((1, 12, 12), (1, 8, 8), (1, 8, 12))),
    "Flux3Transformer2DModel": _flux_sizes(flux3),
    "Kandinsky5Transformer3DModel": Resolutions(kandinsky5, ((1, 24, 24), (1, 8, 8), (1, 8, 12))),
    "HunyuanImageTransformer2DModel": _flux_sizes(hunyuan_image),
    "DreamLiteUNetModel": Resolutions(unet, ((12, 12), (8, 8), (8, 12))),
    "Kandinsky6SRTransformer3DModel": Resolutions(kandinsky6_sr, ((1, 8, 24), (1, 8, 8), (1, 8, 16))),
    "QwenImage21Transformer2DModel": Resolutions(lambda h, w: qwen_image21_inputs(height=h, width=w),
                                                 ((12, 12), (4, 4), (4, 6))),
    "BriaFibo2Transformer2DModel": Resolutions(bria_fibo2, ((24, 24), (8, 8), (8, 12))),
    "AutoencoderKLMiniMaxH3": Resolutions(minimax_h3_vae, ((22, 24, 24), (22, 8, 8), (22, 8, 12))),
    "WanAnimateTransformer3DModel": Resolutions(wan_animate, ((6, 6), (4, 4), (4, 6))),
    "Kandinsky6Transformer3DModel": Resolutions(kandinsky6, ((1, 24, 24), (1, 8, 8), (1, 8, 12))),
    "AnyFlowFARTransformer3DModel": Resolutions(lambda side: anyflow_far_inputs(size=side), ((16,), (8,), (12,))),
    "SanaWMTransformer3DModel": Resolutions(sana_wm_inputs, ((2, 8, 10), (2, 4, 4), (2, 4, 6))),
    "SanaWMLTX2RefinerTransformer3DModel": Resolutions(sana_wm_refiner_inputs, ((2, 8, 10), (2, 2, 2), (2, 2, 4))),
    "RFD4ProteinaTransformer": Resolutions(rfd4_inputs, ((130,), (6,), (10,))),
    "RFD4ProteinaAutoencoder": Resolutions(rfd4_autoencoder_inputs, ((130,), (6,), (10,))),
}
