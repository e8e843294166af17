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
# `tiny_causal_lm(model_type)` builds any key of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES from its DEFAULT config, shrunk by
# attribute name rather than by a hand-written config per model, so that a new architecture usually needs no edit here.
# Only sizes shrink; the default semantics stay (sliding windows, caches, MoE routing, layer patterns), because the
# point is to test what users run. Windows (sliding, chunked) shrink with everything else, below the test lengths, so
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


# attribute -> value, whatever the default (None included: "derive it", which some models then fail to do). Every
# width becomes the same, so widths that must agree (a projector's input and a tower's output) still agree.
_SET: dict[str, int] = {
    **_names("hidden_size", "d_model", "n_embd", "embedding_size", "embedding_dim", "emb_dim", "word_embed_proj_dim",
             "lru_width", "hidden_size_global", "projector_input_dim", "projector_output_dim",
             "out_hidden_size", "vision_output_dim", "backbone_hidden_size", "adapter_in_dim", "adapter_out_dim",
             "input_embedding_size", "output_embedding_size", "ple_embed_dim", "adapter_input_size", "shape_embed_dim",
             "pronunciation_embed_dim", value=_WIDTH),
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
             "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_head_dim", "linear_key_head_dim",
             "linear_value_head_dim", "linear_head_dim", value=_HEAD_DIM),
    **_names("qk_head_dim", "swa_head_dim", value=2 * _HEAD_DIM),  # qk_nope_head_dim + qk_rope_head_dim
    # Mamba heads span the expanded width: heads * head_dim = expand (2) * hidden_size
    **_names("mamba_d_head", "mamba_head_dim", "mamba_headdim", value=2 * _WIDTH // _HEADS),
    **_names("vocab_size", "vocab_size_per_layer_input", "unpadded_vocab_size", "decoder_vocab_size",
             "encoder_hash_byte_group_vocab", "shape_vocab_size", "pronunciation_vocab_size", value=VOCAB_LM),
}

# attribute -> cap: min(default, cap), so that a smaller default survives (top-1 routing, a single shared expert,
# multi-query attention).
_AT_MOST: dict[str, int] = {
    **_names("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers",
             "num_decoder_layers", "num_encoder_layers", "conf_num_hidden_layers", "num_global_layers", "num_blocks",
             value=LM_LAYERS),
    **_names("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "context_length",
             "max_target_positions", "max_source_positions", "model_max_length", value=_POSITIONS),
    **_names("sliding_window", "sliding_window_size", "attention_window_size", "window_size", "local_attention",
             "local_attention_window_len", "attention_chunk_size", "keep_window_size", "index_topk", value=_WINDOW),
    **_names("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", value=4),
    **_names("num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk", "moe_top_k", "n_group",
             "num_expert_group", "n_groups", "mamba_n_groups", "mamba_ngroups", "zero_expert_num", value=2),
    # one shared expert; one dense layer before the MoE ones, so that the second layer is MoE
    **_names("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "topk_group",
             "first_k_dense_replace", "num_dense_layers", "moe_layer_start_index", "moe_layer_end_index",
             "attn_layer_offset", value=1),
    **_names("attn_layer_period", "expert_layer_period", value=2),
    **_names("kv_lora_rank", "q_lora_rank", "o_lora_rank", "hc_lowrank", "adapter_rank", "laurel_rank",
             "gated_norm_rank", "loop_gate_rank", value=32),
    **_names("state_size", "ssm_state_size", "mamba_d_state", "d_state", "hidden_size_per_layer_input", value=16),
    **_names("time_step_rank", "mamba_dt_rank", "rotary_dim", value=8),
    "image_size": 64,
}

# Widths that are a multiple of the hidden size (zamba's attention takes twice as wide an input): keep the multiple.
_HIDDEN_MULTIPLES = ("attention_hidden_size",)
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "kv_n_heads", "num_query_groups", "swa_num_key_value_heads",
             "linear_num_key_heads")
_HEAD_COUNTS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "swa_num_attention_heads",
                "linear_num_value_heads")
_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_blocks", "decoder_layers")
_NO_NOISE = ("dropout", "pdrop", "layerdrop", "jitter_noise")  # float attributes set to 0 (eval runs no dropout)
# Lists of layer indices (rather than one entry per layer): remapped onto the layers kept.
_LAYER_INDEX_LISTS = ("global_attn_indexes", "cross_attention_layers", "hybrid_layer_ids", "full_attn_idxs",
                      "moe_layers", "ple_layer_ids", "mlp_only_layers")
# Counts of layers at the end of the stack (KV-sharing layers reuse an earlier layer's cache): recounted over the kept.
_TRAILING_LAYER_COUNTS = ("num_kv_shared_layers",)

# The few architectures the generic shrink cannot build, each with why. Each dict updates the shrunk config values
# (nested dicts update sub-configs); it also builds the default config when that does not build as it is.
_OVERRIDES: dict[str, dict] = {
    "cohere_compass_text": {  # its default rope_parameters has no entry per layer type, which the model looks up
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "bamba": {"attn_layer_indices": [1]},  # the default has no attention layer: its cache then has no length
    # the model reads attn_config.rope_theta, the default has none; and it clamps q/k/v by clip_qkv, unset by default
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    "deepseek_v2": {"num_experts_per_tok": 2},  # unset by default: routing would take top-None
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},  # unset by default
    "dory": {  # stored as (attention, mlp) pairs, halved when built; input + recurrent + output = the layer count
        "layer_types": ["sliding_attention", "mlp", "full_attention", "mlp", "sliding_attention", "mlp"],
        "n_input_layers": 2, "n_recurrent_layers": 2, "n_output_layers": 2},
    # the sliding-window layers' head_dim must be qk_nope_head_dim + qk_rope_head_dim (layer 1 is one of them)
    "dots3_note_text": {"per_layer_config": {1: {"head_dim": 2 * _HEAD_DIM}}},
    # its default fails its own validation
    "gemma4_assistant": {"text_config": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0}},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},  # as bamba
    "hrm_text": {"num_layers_per_stack": None},  # let the config derive it again from the (tiny) layer count
    # lfm2's default has no short-convolution layer, unlike every checkpoint; lfm2_moe's has no layer_types at all
    "lfm2": {"layer_types": ["conv", "full_attention"], "full_attn_idxs": [1]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "mamba2": {"head_dim": 2 * _WIDTH // _HEADS},  # heads * head_dim must equal expand (2) * hidden_size
    # input ids are (batch * codebooks, length): batch 1 needs 1 codebook; generate starts from decoder_start_token_id
    # (the checkpoints' pad id), which only the checkpoints' generation config sets
    "musicgen": {"decoder": {"num_codebooks": 1, "decoder_start_token_id": VOCAB_LM - 1}},
    "musicgen_melody": {"decoder": {"num_codebooks": 1, "decoder_start_token_id": VOCAB_LM - 1}},
    "qwen4_exp_text": {  # its indexed-attention layers need the indexer sizes, which default to unset
        "indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": _HEAD_DIM, "indexer_budget": 16,
        "indexer_compress_ratio": 4},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},  # its 3-block cycle has no attention in 2 layers
    "reformer": {"axial_pos_embds_dim": [16, 48]},  # must add up to hidden_size
    # its cache rounds the q/k width (hidden_size * qk_dim_factor) up to a multiple of 64, the model does not
    "xlstm": {"hidden_size": 2 * _WIDTH, "embedding_dim": 2 * _WIDTH},
    "xmod": {"default_language": "en_XX"},  # the model refuses to run without a language adapter chosen
    "zamba": {"layers_block_type": ["hybrid", "hybrid"]},  # the shared transformer must be tied to a second user
}
_OVERRIDES["qwen4_exp"] = {"text_config": _OVERRIDES["qwen4_exp_text"]}
_OVERRIDES["dots3_note"] = {"text_config": _OVERRIDES["dots3_note_text"]}
# Architectures that need more than LM_LAYERS layers.
_LAYERS_KEPT = {
    "dory": 6,  # an input, a recurrent and an output layer, each an (attention, mlp) pair
    "gemma3n_text": 4,  # KV sharing: the last 2 layers reuse the cache of a sliding and of a full attention layer
}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kv_heads(default: int | None, heads: int | None) -> int:
    """Keep the attention kind: multi-query stays 1 head, multi-head (or unset) as many as the query heads, GQA 2."""
    if default == 1:
        return 1
    if default is None or (heads is not None and default >= heads):
        return _HEADS
    return 2


def _shrunk_value(key: str, value, heads: int | None):
    """The tiny value of one attribute (a number, or a list of per-layer numbers), or `value` when no rule applies."""
    if isinstance(value, (list, tuple)) and value and all(_is_int(v) for v in value):
        if key in _SET or key in _AT_MOST:  # a per-layer list of sizes, e.g. one intermediate_size per layer
            return [_shrunk_value(key, v, heads) for v in value]
        return value
    if key in _SET and (value is None or _is_int(value)):
        return _SET[key]
    if key in _KV_HEADS and (value is None or _is_int(value)):
        return _kv_heads(value, heads)
    if isinstance(value, float) and value and any(word in key for word in _NO_NOISE):
        return 0.0
    if key in _AT_MOST and _is_int(value):
        return min(value, _AT_MOST[key])
    return value


def _kept_layers(values: dict, count: int, keep: int) -> list[int]:
    """Which `keep` of the default's `count` layers to keep: the first layer of each kind (sliding/full attention,
    linear attention/attention, dense/MoE...) so that every kind stays covered, then the last layers (KV sharing and
    the like happen at the end of the stack)."""
    per_layer = [v for k, v in values.items() if isinstance(v, (list, tuple)) and len(v) == count and "token" not in k]
    per_layer.sort(key=lambda v: values.get("layer_types") is not v)  # layer_types first
    firsts = [0]
    for kinds in per_layer:
        firsts = sorted({kinds.index(kind) for kind in kinds})
        if len(firsts) > 1:
            break
    special = sorted(int(i) for i in values.get("per_layer_config") or {})  # layers that differ from the rest
    firsts = sorted({*firsts, *special[:1]})[:keep]
    rest = [i for i in reversed(range(count)) if i not in firsts]
    return sorted(firsts + rest[:keep - len(firsts)])


def _keep_layers(values: dict, count: int, kept: list[int]) -> None:
    """Cut everything that is per layer (lists, index lists, per-layer configs, trailing counts) to the kept layers."""
    for key, value in values.items():
        if isinstance(value, (list, tuple)) and len(value) == count and "token" not in key:
            values[key] = [value[i] for i in kept]
        elif key in _LAYER_INDEX_LISTS and isinstance(value, (list, tuple)):
            values[key] = [kept.index(i) for i in value if i in kept]
        elif key in _TRAILING_LAYER_COUNTS and _is_int(value):
            values[key] = sum(i >= count - value for i in kept)
    if isinstance(values.get("per_layer_config"), dict):  # {layer index: the attributes that differ there}
        heads = next((values[k] for k in _HEAD_COUNTS if _is_int(values.get(k))), None)
        values["per_layer_config"] = {
            kept.index(int(i)): {k: _shrunk_value(k, v, layer.get("num_attention_heads", heads))
                                 for k, v in layer.items()}
            for i, layer in values["per_layer_config"].items() if int(i) in kept}


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


def _shrink(values: dict, override: dict, keep: int) -> dict:
    """A tiny copy of a config's `to_dict()`: sizes by attribute name, per-layer lists cut to the `keep` layers kept,
    sub-configs (text_config, vision_config...) likewise; then `override` on top."""
    values = {k: _shrink(v, override.get(k) or {}, keep) if _is_config(v) else v for k, v in values.items()}
    count_key = next((k for k in _LAYER_COUNTS if _is_int(values.get(k))), None)
    if count_key is not None and values[count_key] > keep:
        _keep_layers(values, values[count_key], _kept_layers(values, values[count_key], keep))
    heads = next((values[k] for k in _HEAD_COUNTS if _is_int(values.get(k))), None)
    hidden = values.get("hidden_size")
    values = {k: v if k == count_key else _shrunk_value(k, v, heads) for k, v in values.items()}
    for key in _HIDDEN_MULTIPLES:
        if _is_int(values.get(key)) and _is_int(hidden) and values[key] % hidden == 0:
            values[key] = values[key] // hidden * _WIDTH
    if count_key is not None:
        values[count_key] = min(values[count_key], keep)
    _fit_token_ids(values)
    for key, value in override.items():
        if not (isinstance(value, dict) and _is_config(values.get(key))):  # sub-configs took theirs above
            values[key] = _merged(values.get(key), value)
    return values


def _merged(value, override):
    """`override`, or for dicts (rope parameters, per-layer configs) `value` updated by it, recursively."""
    if not (isinstance(value, dict) and isinstance(override, dict)):
        return override
    return {**value, **{k: _merged(value.get(k), v) for k, v in override.items()}}


def tiny_causal_lm_config(model_type: str) -> transformers.PretrainedConfig:
    """The default config of `model_type` (a key of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), shrunk to a tiny model."""
    config_class = transformers.CONFIG_MAPPING[model_type]
    override = _OVERRIDES.get(model_type, {})
    try:
        default = config_class()
    except Exception:  # a default config that fails its own validation
        default = config_class(**copy.deepcopy(override))
    values = _shrink(default.to_dict(), override, _LAYERS_KEPT.get(model_type, LM_LAYERS))
    if "is_decoder" in values:  # encoder families (BERT...) run as decoders in their causal-LM class
        values["is_decoder"] = True
    return config_class.from_dict(values)


def tiny_causal_lm(model_type: str, *, seed: int = 0) -> torch.nn.Module:
    """A tiny random-weight causal LM of `model_type`, in eval mode, float32. Downloads nothing."""
    config = tiny_causal_lm_config(model_type)
    torch.manual_seed(seed)
    model_class = transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    part = _part_taken(config, model_class)
    if part is None:
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        model = model_class._from_config(part, dtype=torch.float32)
    return model.eval()


def _part_taken(config: transformers.PretrainedConfig, model_class: type) -> transformers.PretrainedConfig | None:
    """For a composite config whose causal-LM class takes one part only (MusicGen: text encoder, audio encoder and
    decoder; the class takes the decoder's): that part."""
    if isinstance(config, model_class.config_class):
        return None
    return next((value for value in vars(config).values() if isinstance(value, model_class.config_class)), None)
