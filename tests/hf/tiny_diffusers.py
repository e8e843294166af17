"""Tiny configs of Diffusers model classes with `_repeated_blocks`, after Diffusers' own model tests.

Each case is the class's init arguments (1–2 blocks, hidden size ≤ 32, random weights) and a builder of its forward's
keyword arguments at one small resolution; nothing is downloaded. `DEFAULT_TARGET_CASES` are the classes that
tests/hf/test_diffusers_classes.py runs on the default target only.
"""

import dataclasses
from collections.abc import Callable

import torch


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + sum(shape)))


@dataclasses.dataclass(frozen=True)
class Case:
    """A tiny instance of one class: its init arguments and a builder of its forward's keyword arguments."""

    config: dict
    inputs: Callable[[], dict]
    recompile_limit: int = 1  # more only where Dynamo's own eager backend needs more (Diffusers' tests say so too)
    prepare: Callable[[torch.nn.Module], None] | None = None  # weights a fresh model leaves at zero, given values


ANYFLOW = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
               text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, rope_max_seq_len=32)


def anyflow_inputs() -> dict:
    return dict(hidden_states=randn(1, 2, 4, 8, 8), timestep=torch.full((1, 2), 500.0),
                r_timestep=torch.full((1, 2), 250.0), encoder_hidden_states=randn(1, 12, 16, seed=1))


def anyflow_far_inputs(chunk_partition: tuple[int, ...] = (1, 1, 2), size: int = 8) -> dict:
    """Four frames in three chunks, the first compressed (`full_chunk_limit=2`), and the causal BlockMask built outside
    the compiled blocks, as Diffusers' compile test does: built inside, `create_block_mask` would break the graph."""
    from diffusers.models.transformers.transformer_anyflow_far import _build_anyflow_far_causal_block_mask

    frames = sum(chunk_partition)
    mask = _build_anyflow_far_causal_block_mask(list(chunk_partition), size, size, ANYFLOW["patch_size"], (1, 4, 4),
                                                full_chunk_limit=2)
    return dict(hidden_states=randn(1, frames, 4, size, size), timestep=torch.full((1, frames), 500.0),
                r_timestep=torch.full((1, frames), 250.0), encoder_hidden_states=randn(1, 12, 16, seed=1),
                chunk_partition=list(chunk_partition), attention_mask=mask)


def helios_inputs() -> dict:
    return dict(hidden_states=randn(1, 4, 2, 8, 8), timestep=torch.tensor([500]),
                encoder_hidden_states=randn(1, 12, 16, seed=1), indices_hidden_states=torch.ones(1, 2),
                indices_latents_history_short=torch.ones(1, 1), indices_latents_history_mid=torch.ones(1, 1),
                indices_latents_history_long=torch.ones(1, 4), latents_history_short=randn(1, 4, 1, 8, 8, seed=2),
                latents_history_mid=randn(1, 4, 1, 8, 8, seed=3), latents_history_long=randn(1, 4, 4, 8, 8, seed=4))


def ideogram4_inputs(text: int = 4, image: int = 2) -> dict:
    from diffusers.models.transformers import transformer_ideogram4 as ideogram4

    tokens = text + image * image
    hidden_states = torch.zeros(1, tokens, 16)
    hidden_states[:, text:] = randn(1, image * image, 16)
    words = torch.zeros(1, tokens, 24)
    words[:, :text] = randn(1, text, 24, seed=1)
    position_ids = torch.zeros(1, tokens, 3, dtype=torch.long)
    position_ids[:, :text] = torch.arange(text)[:, None]
    offset = ideogram4.IMAGE_POSITION_OFFSET
    position_ids[:, text:, 0] = offset
    position_ids[:, text:, 1] = torch.arange(image).repeat_interleave(image) + offset
    position_ids[:, text:, 2] = torch.arange(image).repeat(image) + offset
    indicator = torch.full((1, tokens), ideogram4.OUTPUT_IMAGE_INDICATOR)
    indicator[:, :text] = ideogram4.LLM_TOKEN_INDICATOR
    return dict(hidden_states=hidden_states, encoder_hidden_states=words, timestep=torch.tensor([0.5]),
                position_ids=position_ids, segment_ids=torch.ones(1, tokens, dtype=torch.long), indicator=indicator)


def krea2_inputs(text: int = 4, grid: int = 2) -> dict:
    position_ids = torch.zeros(text + grid * grid, 3)
    position_ids[text:, 1] = torch.arange(grid).repeat_interleave(grid)
    position_ids[text:, 2] = torch.arange(grid).repeat(grid)
    mask = torch.ones(1, text, dtype=torch.bool)
    mask[:, -1] = False
    return dict(hidden_states=randn(1, grid * grid, 16), encoder_hidden_states=randn(1, text, 3, 16, seed=1),
                timestep=torch.tensor([0.5]), position_ids=position_ids, encoder_attention_mask=mask)


def minimax_h3_inputs(text: int = 4, audio: int = 6, video: int = 8) -> dict:
    tokens = text + audio + video
    text_indices, audio_indices = torch.arange(text), torch.arange(text, text + audio)
    video_indices = torch.arange(text + audio, tokens)
    token_tags = torch.zeros(tokens, dtype=torch.long)
    token_tags[text_indices], token_tags[audio_indices] = 1, 2
    timestep_indices = torch.zeros(tokens, dtype=torch.long)
    timestep_indices[audio_indices] = 1
    position_ids = torch.zeros(tokens, 3)
    position_ids[:, 0] = torch.arange(tokens, dtype=torch.float32)
    position_ids[video_indices, 1] = torch.arange(video, dtype=torch.float32) % 4
    position_ids[video_indices, 2] = torch.arange(video, dtype=torch.float32) % 2
    return dict(hidden_states=randn(1, video, 16), audio_hidden_states=randn(1, audio, 6, seed=1),
                encoder_hidden_states=randn(1, text, 8, seed=2), timestep=torch.tensor([0.7, 0.3]),
                timestep_indices=timestep_indices, token_tags=token_tags, position_ids=position_ids,
                video_indices=video_indices, audio_indices=audio_indices, text_indices=text_indices)


def cosmos3_inputs(height: int = 2, width: int = 2) -> dict:
    vision = height * width
    indexes = torch.arange(2, 2 + vision)
    return dict(input_ids=torch.tensor([1, 2]), text_indexes=torch.tensor([0, 1]),
                position_ids=torch.zeros(3, 2 + vision, dtype=torch.long), und_len=2, sequence_length=2 + vision,
                vision_tokens=[randn(1, 2, 1, height, width)], vision_token_shapes=[(1, height, width)],
                vision_sequence_indexes=indexes, vision_mse_loss_indexes=indexes, vision_timesteps=torch.ones(vision),
                vision_noisy_frame_indexes=[torch.tensor([0])])


def positions(*sizes: int) -> torch.Tensor:
    """Integer coordinates of a grid, one row per token: Flux-style position ids."""
    return torch.cartesian_prod(*(torch.arange(size) for size in sizes)).reshape(-1, len(sizes))


def qwen_image21_inputs(text: int = 6, height: int = 4, width: int = 4) -> dict:
    slots = height * width // 4
    img_mask = torch.cat([torch.zeros(text, dtype=torch.bool), torch.ones(slots, dtype=torch.bool)])[None]
    return dict(hidden_states=randn(1, height * width, 16), encoder_hidden_states=randn(1, text, 16, seed=1),
                timestep=torch.tensor([0.5]), img_shapes=[[(1, height, width)]], img_mask=img_mask)


def sana_wm_inputs(frames: int = 2, height: int = 4, width: int = 4) -> dict:
    """Latents, per-frame timesteps, and a camera moving forward (flat 4x4 camera-to-world, then fx, fy, cx, cy)."""
    camera_to_world = torch.eye(4).repeat(1, frames, 1, 1)
    camera_to_world[..., 2, 3] = torch.arange(frames) * 0.1
    intrinsics = torch.tensor([float(width), float(height), width / 2, height / 2]).expand(1, frames, 4)
    return dict(hidden_states=randn(1, 4, frames, height, width), timestep=torch.full((1, 1, frames), 500.0),
                encoder_hidden_states=randn(1, 1, 6, 8, seed=1), encoder_attention_mask=torch.ones(1, 6),
                camera_conditions=torch.cat([camera_to_world.flatten(-2), intrinsics], dim=-1),
                chunk_plucker=randn(1, 8, frames, height, width, seed=2))


def live_short_convolutions(model: torch.nn.Module) -> None:
    """SANA-WM's temporal short convolutions start at zero (a checkpoint fills them): its GDN branch would be dead."""
    from diffusers.models.transformers.transformer_sana_wm import SanaWMTemporalShortConvolution

    for index, module in enumerate(m for m in model.modules() if isinstance(m, SanaWMTemporalShortConvolution)):
        module.weight.data = randn(*module.weight.shape, seed=index) * 0.5


def sana_wm_refiner_inputs(frames: int = 2, height: int = 2, width: int = 2) -> dict:
    """Video tokens and the caller-supplied RoPE of frames `[0, frames)`, built as the refiner's own RoPE builds it."""
    from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMLTX2AudioVideoRotaryPosEmbed

    rope = SanaWMLTX2AudioVideoRotaryPosEmbed(dim=16, double_precision=False, num_attention_heads=2)
    coords = rope.prepare_video_coords(1, frames, height, width, device=torch.device("cpu"), fps=24.0)
    tokens = frames * height * width
    return dict(hidden_states=randn(1, tokens, 4), encoder_hidden_states=randn(1, 8, 16, seed=1),
                timestep=torch.linspace(100.0, 900.0, tokens)[None], video_rotary_emb=rope(coords),
                encoder_attention_mask=torch.ones(1, 8))


RFD4_TRUNK = dict(nlayers=2, token_dim=16, nheads=2, dim_cond=16, pair_repr_dim=8, latent_dim=4, token_type_emb_dim=4)


def rfd4_masks(tokens: int) -> dict:
    """A molecule of `tokens` positions, the last one padding, and the two masks both RFD4 models need; nothing else."""
    padding_mask = torch.ones(1, tokens, dtype=torch.bool)
    padding_mask[:, -1] = False
    return dict(padding_mask=padding_mask, conditioning={"is_in_context_conditioning": torch.zeros(1, tokens),
                                                         "supports_local_latent": torch.ones(1, tokens)})


def rfd4_inputs(tokens: int = 6) -> dict:
    return dict(bb_ca=randn(1, tokens, 3), local_latents=randn(1, tokens, 4, seed=1), bb_ca_time=torch.tensor([0.3]),
                local_latents_time=torch.tensor([0.6]), token_type=torch.zeros(1, tokens, dtype=torch.long),
                **rfd4_masks(tokens))


def rfd4_autoencoder_inputs(tokens: int = 6) -> dict:
    """The decoder's inputs: the autoencoder's forward is `decode`."""
    return dict(z_latent=randn(1, tokens, 4), ca_coors_nm=randn(1, tokens, 3, seed=1),
                token_type=torch.tensor([[0, 1] * (tokens // 2)]), **rfd4_masks(tokens))


DEFAULT_TARGET_CASES: dict[str, Case] = {
    "AnyFlowTransformer3DModel": Case(ANYFLOW, anyflow_inputs),
    "AnyFlowFARTransformer3DModel": Case({**ANYFLOW, "compressed_patch_size": (1, 4, 4), "full_chunk_limit": 2},
                                         anyflow_far_inputs),
    "ErnieImageTransformer2DModel": Case(
        dict(hidden_size=16, num_attention_heads=1, num_layers=2, ffn_hidden_size=16, in_channels=16, out_channels=16,
             text_in_dim=16, rope_axes_dim=(8, 4, 4)),
        lambda: dict(hidden_states=randn(1, 16, 4, 4), timestep=torch.tensor([1.0]), text_bth=randn(1, 8, 16, seed=1),
                     text_lens=torch.tensor([8]))),
    "GlmImageTransformer2DModel": Case(
        dict(patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
             text_embed_dim=32, time_embed_dim=16, condition_dim=8, prior_vq_quantizer_codebook_size=64),
        lambda: dict(hidden_states=randn(1, 4, 8, 8), encoder_hidden_states=randn(1, 12, 32, seed=1),
                     prior_token_id=torch.tensor([3]), prior_token_drop=torch.zeros(1, dtype=torch.bool),
                     timestep=torch.tensor([500]), target_size=torch.tensor([[8.0, 8.0]]),
                     crop_coords=torch.tensor([[0.0, 0.0]]))),
    "HeliosTransformer3DModel": Case(
        dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
             text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, rope_dim=(4, 4, 4)),
        helios_inputs),
    "Ideogram4Transformer2DModel": Case(
        dict(in_channels=16, num_layers=2, attention_head_dim=8, num_attention_heads=4, intermediate_size=32,
             adaln_dim=16, llm_features_dim=24, rope_theta=10_000, mrope_section=(2, 1, 1)),
        ideogram4_inputs),
    "JoyImageEditTransformer3DModel": Case(
        dict(patch_size=[1, 2, 2], in_channels=16, hidden_size=32, num_attention_heads=2, text_dim=16, num_layers=2,
             rope_dim_list=[4, 6, 6]),
        lambda: dict(hidden_states=randn(1, 16, 1, 4, 4), encoder_hidden_states=randn(1, 12, 16, seed=1),
                     timestep=torch.tensor([1.0]))),
    "JoyImageEditPlusTransformer3DModel": Case(
        dict(patch_size=[1, 2, 2], in_channels=16, hidden_size=32, num_attention_heads=2, text_dim=16, num_layers=2,
             rope_dim_list=[4, 6, 6]),
        lambda: dict(hidden_states=randn(1, 2, 16, 1, 2, 2), encoder_hidden_states=randn(1, 12, 16, seed=1),
                     timestep=torch.tensor([1.0]), shape_list=[[(1, 1, 1), (1, 1, 1)]])),
    "Krea2Transformer2DModel": Case(
        dict(in_channels=16, num_layers=2, attention_head_dim=8, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=32, timestep_embed_dim=8, text_hidden_dim=16, num_text_layers=3,
             text_num_attention_heads=2, text_num_key_value_heads=1, text_intermediate_size=16,
             num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 2, 2)),
        krea2_inputs),
    "LongCatAudioDiTTransformer": Case(
        dict(dit_dim=32, dit_depth=2, dit_heads=2, dit_text_dim=16, latent_dim=8, text_conv=False),
        lambda: dict(hidden_states=randn(1, 16, 8), encoder_hidden_states=randn(1, 10, 16, seed=1),
                     encoder_attention_mask=torch.ones(1, 10, dtype=torch.bool),
                     attention_mask=torch.ones(1, 16, dtype=torch.bool), timestep=torch.ones(1))),
    "LTX2VideoTransformer3DModel": Case(
        dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
             audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
             audio_cross_attention_dim=8, num_layers=2, caption_channels=16, rope_double_precision=False),
        lambda: dict(hidden_states=randn(1, 2 * 4 * 4, 4), audio_hidden_states=randn(1, 9, 4, seed=1),
                     encoder_hidden_states=randn(1, 16, 16, seed=2),
                     audio_encoder_hidden_states=randn(1, 16, 16, seed=3),
                     timestep=torch.tensor([500.0]), encoder_attention_mask=torch.ones(1, 16, dtype=torch.bool),
                     num_frames=2, height=4, width=4, audio_num_frames=9, fps=25.0)),
    "MiniMaxH3Transformer3DModel": Case(
        dict(num_attention_heads=2, attention_head_dim=16, hidden_size=24, num_layers=2, num_refiner_layers=2,
             ffn_dim=32, in_channels=4, audio_in_channels=6, text_dim=8, freq_dim=8, time_embed_hidden_dim=24,
             time_embed_dim=16, rope_freq_dim=2),
        minimax_h3_inputs),
    "MiniMaxMusic3Transformer1DModel": Case(
        dict(in_channels=8, condition_dim=16, num_layers=2, num_attention_heads=2, attention_head_dim=8,
             ff_inner_dim=32, rotary_dim=4, fourier_embedding_dim=8),
        lambda: dict(hidden_states=randn(1, 8, 24), encoder_hidden_states=randn(1, 24, 16, seed=1),
                     timestep=torch.tensor([0.5]))),
    "MotifVideoTransformer3DModel": Case(
        dict(in_channels=33, out_channels=16, num_attention_heads=2, attention_head_dim=12, num_layers=1,
             num_single_layers=1, patch_size=1, text_embed_dim=32, image_embed_dim=4, rope_axes_dim=(4, 4, 4)),
        lambda: dict(hidden_states=randn(1, 33, 2, 4, 4), encoder_hidden_states=randn(1, 12, 32, seed=1),
                     timestep=torch.tensor([500]))),
    "NucleusMoEImageTransformer2DModel": Case(
        dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
             joint_attention_dim=16, axes_dims_rope=(8, 4, 4), moe_enabled=False, capacity_factors=[8.0, 8.0]),
        lambda: dict(hidden_states=randn(1, 16, 16), encoder_hidden_states=randn(1, 8, 16, seed=1),
                     encoder_hidden_states_mask=torch.ones(1, 8, dtype=torch.long), timestep=torch.tensor([1.0]),
                     img_shapes=[(1, 4, 4)])),
    "StableAudio3DiTModel": Case(
        dict(io_channels=8, embed_dim=32, depth=2, num_heads=4, cond_token_dim=16, global_cond_dim=12,
             local_add_cond_dim=5, timestep_features_dim=16, ff_mult=2, num_memory_tokens=3,
             use_differential_attention=False),
        lambda: dict(hidden_states=randn(1, 8, 16), timestep=torch.tensor([0.5]),
                     encoder_hidden_states=randn(1, 4, 16, seed=1), global_hidden_states=randn(1, 12, seed=2))),
    "ZImageTransformer2DModel": Case(
        dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=16, n_layers=1, n_refiner_layers=1,
             n_heads=1, n_kv_heads=2, cap_feat_dim=16, axes_dims=[8, 4, 4], axes_lens=[256, 32, 32]),
        lambda: dict(x=[randn(16, 1, 8, 8)], cap_feats=[randn(16, 16, seed=1)], t=torch.tensor([0.0])),
        recompile_limit=3),  # one block class serves the noise refiner, the context refiner and the layers
    "BriaFiboTransformer2DModel": Case(
        dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
             num_attention_heads=2, joint_attention_dim=32, text_encoder_dim=16, axes_dims_rope=[0, 4, 4]),
        lambda: dict(hidden_states=randn(1, 16, 16), encoder_hidden_states=randn(1, 8, 32, seed=1),
                     text_encoder_layers=[randn(1, 8, 16, seed=2), randn(1, 8, 16, seed=3)],
                     img_ids=randn(16, 3, seed=4), txt_ids=randn(8, 3, seed=5), timestep=torch.tensor([1.0]))),
    "Cosmos3OmniTransformer": Case(
        dict(head_dim=6, hidden_act="relu2", hidden_size=12, intermediate_size=24, latent_channel=2,
             latent_patch_size=1, num_attention_heads=2, num_hidden_layers=2, num_key_value_heads=1,
             patch_latent_dim=2, qk_norm_for_text=False, rope_axes_dim=[1, 1, 1], rope_theta=1e8, vocab_size=32),
        cosmos3_inputs),
    "HunyuanVideo15Transformer3DModel": Case(
        dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
             num_refiner_layers=1, mlp_ratio=2.0, text_embed_dim=16, text_embed_2_dim=8, image_embed_dim=12,
             rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v"),
        lambda: dict(hidden_states=randn(1, 4, 1, 8, 8), timestep=torch.tensor([1.0]),
                     encoder_hidden_states=randn(1, 6, 16, seed=1), encoder_hidden_states_2=randn(1, 4, 8, seed=2),
                     encoder_attention_mask=torch.ones(1, 6), encoder_attention_mask_2=torch.ones(1, 4),
                     image_embeds=torch.zeros(1, 3, 12))),
    "Flux3Transformer2DModel": Case(
        dict(in_channels=4, cond_in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
             num_attention_heads=2, joint_attention_dim=16, timestep_channels=16, axes_dims_rope=(2, 2, 2, 2)),
        lambda: dict(hidden_states=randn(1, 16, 4), encoder_hidden_states=randn(1, 8, 16, seed=1),
                     timestep=torch.tensor([0.5]), img_ids=positions(1, 4, 4, 1), txt_ids=positions(1, 1, 1, 8)),
        recompile_limit=2),  # Flux3ModeTransformerBlock runs the text tokens, then the image tokens (another length)
    "Kandinsky5Transformer3DModel": Case(
        dict(in_visual_dim=4, in_text_dim=16, in_text_dim2=8, time_dim=16, out_visual_dim=4, model_dim=16, ff_dim=32,
             num_text_blocks=1, num_visual_blocks=2, axes_dims=(2, 2, 4)),
        lambda: dict(hidden_states=randn(1, 1, 8, 8, 4), encoder_hidden_states=randn(1, 6, 16, seed=1),
                     timestep=torch.tensor([500.0]), pooled_projections=randn(1, 8, seed=2),
                     visual_rope_pos=[torch.arange(1), torch.arange(4), torch.arange(4)],
                     text_rope_pos=torch.arange(6))),
    "HunyuanImageTransformer2DModel": Case(
        dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
             num_single_layers=1, num_refiner_layers=1, text_embed_dim=16, rope_axes_dim=(4, 4)),
        lambda: dict(hidden_states=randn(1, 4, 4, 4), timestep=torch.tensor([500.0]),
                     encoder_hidden_states=randn(1, 6, 16, seed=1), encoder_attention_mask=torch.ones(1, 6))),
    "DreamLiteUNetModel": Case(
        dict(sample_size=8,
             down_block_types=("DreamLiteCrossAttnNoSelfAttnDownBlock2D", "DreamLiteCrossAttnDownBlock2D"),
             up_block_types=("DreamLiteCrossAttnUpBlock2D", "DreamLiteUpBlock2D"), block_out_channels=(16, 32),
             cross_attention_dim=16, attention_head_dim=8, layers_per_block=1, norm_num_groups=8),
        lambda: dict(sample=randn(1, 4, 8, 8), timestep=torch.tensor([10]), encoder_hidden_states=randn(1, 5, 16)),
        recompile_limit=2),  # its BasicTransformerBlockDreamLites differ in width between resolutions
    "Kandinsky6SRTransformer3DModel": Case(
        dict(in_visual_dim=4, out_visual_dim=4, time_dim=16, model_dim=32, ff_dim=32, num_visual_blocks=2,
             axes_dims=(4, 6, 6)),
        lambda: dict(hidden_states=randn(1, 1, 8, 8, 9), timestep=torch.tensor([500.0]))),
    "QwenImage21Transformer2DModel": Case(
        dict(in_channels=16, out_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=2,
             context_in_dim=16, axes_dims_rope=(8, 4, 4)),
        qwen_image21_inputs),
    "BriaFibo2Transformer2DModel": Case(
        dict(in_channels=4, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2, cap_feat_dim=16,
             injection_layer_ids=(0,), perceiver_num_layers=1, min_num_gist_tokens=4, max_num_gist_tokens=8,
             gist_step=4, gist_min_text_len=4, gist_max_text_len=16, axes_dims=(4, 6, 6), axes_lens=(64, 16, 16)),
        lambda: dict(hidden_states=randn(1, 4, 8, 8), timestep=torch.tensor([0.5]),
                     encoder_hidden_states=randn(1, 2, 6, 16, seed=1)),
        recompile_limit=3),  # one block class serves the noise refiner, the context refiner and the layers
    "AutoencoderKLMiniMaxH3": Case(
        dict(latent_channels=4, block_out_channels=(8, 16), layers_per_block=1, spatial_downsample_factors=(2, 2),
             temporal_downsample_factors=(2, 2), norm_num_groups=8, decoder_num_layers=2, decoder_num_attention_heads=2,
             decoder_attention_head_dim=8, decoder_num_register_tokens=2, decoder_ffn_mult=2,
             latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4),
        lambda: dict(sample=randn(1, 3, 22, 8, 8))),
    "WanAnimateTransformer3DModel": Case(
        dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=12, latent_channels=4,
             out_channels=4, text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, image_dim=16, rope_max_seq_len=32,
             motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16}, motion_encoder_size=16, motion_style_dim=8,
             motion_dim=4, motion_encoder_dim=16, face_encoder_hidden_dim=16, face_encoder_num_heads=2,
             inject_face_latents_blocks=2),
        lambda: dict(hidden_states=randn(1, 12, 21, 4, 4), timestep=torch.tensor([500]),
                     encoder_hidden_states=randn(1, 12, 16, seed=1),
                     encoder_hidden_states_image=randn(1, 12, 16, seed=2),
                     pose_hidden_states=randn(1, 4, 20, 4, 4, seed=3),
                     face_pixel_values=randn(1, 3, 77, 16, 16, seed=4))),  # 77 frames: the released segment length
    "Kandinsky6Transformer3DModel": Case(
        dict(in_visual_dim=4, out_visual_dim=4, in_text_dim=16, in_text_dim2=8, time_dim=16, model_dim=16, ff_dim=32,
             num_text_blocks=1, num_visual_blocks=2, axes_dims=(2, 2, 4), visual_cond=False),
        lambda: dict(hidden_states=randn(1, 1, 8, 8, 4), encoder_hidden_states=randn(1, 6, 16, seed=1),
                     pooled_projections=randn(1, 8, seed=2), timestep=torch.tensor([500.0]))),
    "SanaWMTransformer3DModel": Case(
        dict(in_channels=4, num_layers=2, hidden_size=32, num_attention_heads=2, softmax_every_n=2, linear_head_dim=16,
             caption_channels=8, mlp_ratio=2.0, chunk_plucker_channels=8, chunk_plucker_post_attn_blocks=2),
        sana_wm_inputs, recompile_limit=2,  # block 0 runs the GDN attention, block 1 the softmax one: two graphs
        prepare=live_short_convolutions),  # its softmax attention casts to bf16: ~4e-5 of bf16 rounding at the output
    "SanaWMLTX2RefinerTransformer3DModel": Case(
        dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
             audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
             audio_cross_attention_dim=8, num_layers=2, caption_channels=16, rope_double_precision=False),
        sana_wm_refiner_inputs),
    "RFD4ProteinaTransformer": Case(
        dict(**RFD4_TRUNK, cath_emb_dim=4, t_emb_dim=8, seq_sep_dim=4, xt_pair_dist_dim=4, tri_mult_c=8,
             feats_seq=("xt_bb_ca", "xt_local_latents", "token_type"),
             feats_cond_seq=("time_emb_bb_ca", "time_emb_local_latents"), feats_pair_repr=("xt_bb_ca_pair_dists",),
             feats_pair_cond=("time_emb_bb_ca",), num_sequence_classes=8, num_token_types=2),
        rfd4_inputs),
    "RFD4ProteinaAutoencoder": Case(
        dict(**RFD4_TRUNK, n_residue_types=4, num_token_types=2,
             atom37_mask=[[slot < 4 + kind for slot in range(37)] for kind in range(4)],
             allowed_residue_types=[[True, True, False, False], [False, True, True, True]]),
        rfd4_autoencoder_inputs),
}
