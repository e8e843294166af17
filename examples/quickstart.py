"""Quickstart: a tiny Llama (random weights, built from a config, offline) compiled with backend="neuron".

Generates a few tokens greedily with the compiled model, checks them against eager PyTorch, and prints the
explain report: which ops ran in regions on the target, which ran eagerly and why, and the FLOPs involved.
"""

import torch
import transformers

import neuron_dynamo


def tiny_llama() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config).eval()


@torch.no_grad()
def generate(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding over the whole sequence each step: every step is one more token, i.e. one more shape."""
    ids = prompt
    for _ in range(new_tokens):
        logits = model(input_ids=ids).logits
        ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=-1)
    return ids[:, prompt.shape[1]:]


def main() -> None:
    torch.manual_seed(0)
    model = tiny_llama()
    prompt = torch.randint(0, 128, (1, 6))

    compiled = torch.compile(model, backend="neuron")
    tokens = generate(compiled, prompt, new_tokens=6)
    expected = generate(model, prompt, new_tokens=6)
    print("prompt:          ", prompt.tolist()[0])
    print("generated tokens:", tokens.tolist()[0])
    print("same as eager:   ", torch.equal(tokens, expected))
    print("counters:        ", neuron_dynamo.stats())
    print()
    with torch.no_grad():
        print(neuron_dynamo.explain(model, input_ids=prompt))
    print()
    print("backend:", neuron_dynamo.backend_info())
    if not torch.equal(tokens, expected):
        raise SystemExit("the compiled model generated different tokens than eager PyTorch")


if __name__ == "__main__":
    main()
