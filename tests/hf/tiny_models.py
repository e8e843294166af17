"""Tiny Hugging Face models built from configs: random weights, nothing downloaded, fast on the interpreter."""

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
