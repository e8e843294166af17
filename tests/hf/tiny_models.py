"""Tiny Hugging Face models built from configs: random weights, nothing downloaded, fast on the interpreter."""

import copy

import torch
import transformers

VOCAB = 128


def tiny_llama():
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attention_dropout=0.0)
    return transformers.LlamaForCausalLM(config)


def tiny_qwen3():
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, attention_dropout=0.0)
    return transformers.Qwen3ForCausalLM(config)


def tiny_mistral():
    config = transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, sliding_window=None, attention_dropout=0.0)
    return transformers.MistralForCausalLM(config)


def tiny_gpt2():
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # its class name maps to no loss type: the warning would break the graph
    return model


def tiny_bert():
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertModel(config)


def encoder_loss(model, ids):
    return model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.square().mean()


# --- Any causal-LM architecture --------------------------------------------------------------------------------------
# `tiny_causal_lm(model_type)` builds every key of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES from its DEFAULT config, shrunk by
# attribute name rather than by a hand-written config per model: a new architecture usually works with no edit here.
# Only sizes shrink; the default semantics stay (sliding windows, caches, MoE routing, layer patterns), because the
# point is to test what users run. Sliding/chunked windows shrink with everything else, to below the test lengths, so
# that they take effect.

VOCAB_LM = 256
LM_LAYERS = 2
_WIDTH = 64
_FFN = 128
_HEADS = 4
_HEAD_DIM = 16
_POSITIONS = 256
_WINDOW = 32


def _names(*names: str, value: int) -> dict[str, int]:
    return dict.fromkeys(names, value)


# attribute -> value, whatever the default. Every width becomes the same, so widths that must agree (a projector's
# input and the tower's output, a hidden size and its embedding size) still agree.
_SET: dict[str, int] = {
    **_names("hidden_size", "d_model", "n_embd", "embedding_size", "embedding_dim", "emb_dim", "word_embed_proj_dim",
             "attention_hidden_size", "lru_width", "hidden_size_global", "projector_input_dim", "projector_output_dim",
             "out_hidden_size", "vision_output_dim", "backbone_hidden_size", "adapter_in_dim", "adapter_out_dim",
             "input_embedding_size", "output_embedding_size", "ple_embed_dim", value=_WIDTH),
    **_names("intermediate_size", "ffn_dim", "d_ff", "dff", "d_inner", "dim_ff", "decoder_ffn_dim", "encoder_ffn_dim",
             "moe_intermediate_size", "shared_expert_intermediate_size", "shared_experts_intermediate_size",
             "moe_shared_expert_intermediate_size", "ffn_hidden_size", "dense_intermediate_size",
             "expert_ffn_hidden_size", "intermediate_size_mlp", "shared_intermediate_size", "feed_forward_size",
             "mlp_dim", "mamba_d_ssm", value=_FFN),
    **_names("num_attention_heads", "n_head", "n_heads", "num_heads", "attention_heads", "decoder_attention_heads",
             "encoder_attention_heads", "num_decoder_attention_heads", "num_encoder_attention_heads",
             "swa_num_attention_heads", "conf_num_attention_heads", "num_attention_heads_per_layer",
             "mamba_n_heads", "mamba_num_heads", "n_mamba_heads", "linear_num_value_heads", "linear_num_heads",
             value=_HEADS),
    **_names("head_dim", "d_head", "dim_head", "d_kv", "attention_head_dim", "attention_head_size", "kv_channels",
             "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_head_dim", "swa_head_dim",
             "linear_key_head_dim", "linear_value_head_dim", "linear_head_dim", "mamba_d_head", "mamba_head_dim",
             "mamba_headdim", value=_HEAD_DIM),
    "qk_head_dim": 2 * _HEAD_DIM,  # qk_nope_head_dim + qk_rope_head_dim
    **_names("vocab_size", "vocab_size_per_layer_input", "unpadded_vocab_size", "decoder_vocab_size", value=VOCAB_LM),
}

# attribute -> cap: min(default, cap), so that a smaller default survives (top-1 routing, no shared expert, a
# model without MLA's query compression, a 1-layer sub-module).
_AT_MOST: dict[str, int] = {
    **_names("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers",
             "num_decoder_layers", "num_encoder_layers", "conf_num_hidden_layers", "num_global_layers",
             value=LM_LAYERS),
    **_names("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "context_length",
             "max_target_positions", "max_source_positions", "model_max_length", value=_POSITIONS),
    **_names("sliding_window", "sliding_window_size", "attention_window_size", "window_size", "local_attention",
             "local_attention_window_len", "attention_chunk_size", "keep_window_size", value=_WINDOW),
    **_names("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", value=4),
    **_names("num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk", "moe_top_k", "n_group",
             "num_expert_group", "n_groups", "mamba_n_groups", "mamba_ngroups", "zero_expert_num", value=2),
    **_names("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "topk_group",
             "first_k_dense_replace", "moe_layer_start_index", "moe_layer_end_index", "attn_layer_offset",
             "num_kv_shared_layers", value=1),
    **_names("attn_layer_period", "expert_layer_period", value=2),
    **_names("kv_lora_rank", "q_lora_rank", "o_lora_rank", "hc_lowrank", "adapter_rank", "laurel_rank",
             "gated_norm_rank", "loop_gate_rank", value=32),
    **_names("state_size", "ssm_state_size", "mamba_d_state", "d_state", "hidden_size_per_layer_input", value=16),
    **_names("time_step_rank", "mamba_dt_rank", "rotary_dim", value=8),
    "image_size": 64,
}

_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "kv_n_heads", "num_query_groups", "swa_num_key_value_heads",
             "linear_num_key_heads")
_HEAD_COUNTS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "swa_num_attention_heads",
                "linear_num_value_heads")
_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")
# Lists of layer indices (rather than one entry per layer): remapped onto the layers kept.
_LAYER_INDEX_LISTS = ("global_attn_indexes", "cross_attention_layers", "hybrid_layer_ids", "full_attn_idxs",
                      "moe_layers", "ple_layer_ids", "mlp_only_layers")

# The few architectures the generic shrink cannot build, each with why. Applied both to the default config (which
# must build) and over the shrunk one; nested dicts update sub-configs.
_OVERRIDES: dict[str, dict] = {}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kv_heads(default: int, heads: int | None) -> int:
    """Keep the attention kind: multi-query stays 1 head, multi-head stays as many as the query heads, GQA gets 2."""
    if default == 1:
        return 1
    if heads is not None and default >= heads:
        return _HEADS
    return 2


def _shrunk_value(key: str, value, heads: int | None):
    """The tiny value of one attribute (a number, or a list of per-layer numbers), or `value` when no rule applies."""
    if isinstance(value, (list, tuple)) and value and all(_is_int(v) for v in value):
        if key in _SET or key in _AT_MOST:  # a per-layer list of sizes, e.g. one intermediate_size per layer
            return [_shrunk_value(key, v, heads) for v in value]
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if "dropout" in key or "pdrop" in key or key.endswith("layerdrop") or key.endswith("jitter_noise"):
        return 0.0
    if not isinstance(value, int):
        return value
    if key in _SET:
        return _SET[key]
    if key in _AT_MOST:
        return min(value, _AT_MOST[key])
    if key in _KV_HEADS:
        return _kv_heads(value, heads)
    return value


def _kept_layers(values: dict, count: int) -> list[int]:
    """Which of the default's layers to keep: the first, and the first of another kind (sliding/full attention,
    linear attention/attention, dense/MoE...) when the per-layer lists have one, so both kinds stay covered."""
    per_layer = [v for k, v in values.items() if isinstance(v, (list, tuple)) and len(v) == count and "token" not in k]
    per_layer.sort(key=lambda v: values.get("layer_types") is not v)  # layer_types first
    for kinds in per_layer:
        other = next((i for i, kind in enumerate(kinds) if kind != kinds[0]), None)
        if other is not None:
            return [0, other][:LM_LAYERS]
    return list(range(min(count, LM_LAYERS)))


def _is_config(value) -> bool:
    return isinstance(value, dict) and "model_type" in value


def _fit_token_ids(values: dict) -> None:
    """Special token ids beyond the tiny vocabulary move to its top, each to its own id."""
    free = iter(range(VOCAB_LM - 1, VOCAB_LM // 2, -1))
    for key, value in values.items():
        if not (key.endswith("token_id") or key.endswith("token_index") or key.endswith("token_ids")):
            continue
        if _is_int(value) and value >= VOCAB_LM:
            values[key] = next(free)
        elif isinstance(value, (list, tuple)):
            values[key] = [next(free) if _is_int(v) and v >= VOCAB_LM else v for v in value]


def _shrink(values: dict) -> dict:
    """A tiny copy of a config's `to_dict()`: sizes by attribute name, per-layer lists cut to the layers kept,
    sub-configs (text_config, vision_config...) likewise."""
    values = {k: _shrink(v) if _is_config(v) else v for k, v in values.items()}
    count = next((values[k] for k in _LAYER_COUNTS if isinstance(values.get(k), int)), None)
    if count is not None and count > LM_LAYERS:
        kept = _kept_layers(values, count)
        for key, value in values.items():
            if isinstance(value, (list, tuple)) and len(value) == count and "token" not in key:
                values[key] = [value[i] for i in kept]
            elif key in _LAYER_INDEX_LISTS and isinstance(value, (list, tuple)):
                values[key] = [kept.index(i) for i in value if i in kept]
    heads = next((values[k] for k in _HEAD_COUNTS if isinstance(values.get(k), int)), None)
    values = {k: _shrunk_value(k, v, heads) for k, v in values.items()}
    _fit_token_ids(values)
    return values


def _merge(values: dict, override: dict) -> dict:
    """`values` updated by `override`, recursively for sub-config dicts."""
    merged = dict(values)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def tiny_causal_lm_config(model_type: str) -> transformers.PretrainedConfig:
    """The default config of `model_type` (a key of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), shrunk to a tiny model."""
    config_class = transformers.CONFIG_MAPPING[model_type]
    override = _OVERRIDES.get(model_type, {})
    values = _shrink(config_class(**copy.deepcopy(override)).to_dict())
    if "is_decoder" in values:  # encoder families (BERT...) run as decoders in their causal-LM class
        values["is_decoder"] = True
    return config_class.from_dict(_merge(values, override))


def tiny_causal_lm(model_type: str, *, seed: int = 0) -> torch.nn.Module:
    """A tiny random-weight causal LM of `model_type`, in eval mode, float32. Downloads nothing."""
    config = tiny_causal_lm_config(model_type)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()
