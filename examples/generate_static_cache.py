"""Greedy generation with a static KV cache, the decode step compiled by the backend: a tiny Llama (random weights,
built from its config, nothing downloaded).

`generate(..., cache_implementation="static", compile_config=CompileConfig(backend="neuron"))` is Transformers' own
way: it compiles the decode step; the prefill runs eagerly. On CPU tensors Transformers compiles only when
`_compile_all_devices` is set. The second prompt length makes Dynamo's decode graph dynamic in the cache length and
the backend compiles one program for its bucket of 128; from then on, prompts of any length up to the bucket compile
nothing: every decode step, at every position, runs that program. Each generation is checked against eager's
tokens (a mismatch exits non-zero), then the report of what ran where is printed.

    python examples/generate_static_cache.py
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import neuron_dynamo  # noqa: E402

PROMPT_LENGTHS = (5, 17, 40)  # the first two warm up (a static program, then the bucket's), the third reuses
NEW_TOKENS = 8


def tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config).eval()


def main() -> None:
    transformers.logging.set_verbosity_error()
    eager_model, model = tiny_llama(), tiny_llama()  # same weights; each keeps its own static cache
    config = transformers.CompileConfig(backend="neuron")
    config._compile_all_devices = True  # CPU tensors: Transformers auto-compiles only on allow-listed devices
    with neuron_dynamo.explaining() as report:
        for length in PROMPT_LENGTHS:
            prompt = torch.randint(1, 128, (1, length), generator=torch.Generator().manual_seed(length))
            before = neuron_dynamo.stats().get("programs_compiled", 0)
            tokens = model.generate(prompt, max_new_tokens=NEW_TOKENS, cache_implementation="static",
                                    compile_config=config)
            compiled = neuron_dynamo.stats().get("programs_compiled", 0) - before
            expected = eager_model.generate(prompt, max_new_tokens=NEW_TOKENS, cache_implementation="static")
            print(f"prompt of {length:2d} tokens: {tokens[0, length:].tolist()} "
                  f"(eager: {'same' if torch.equal(tokens, expected) else 'DIFFERENT'}), "
                  f"{compiled} program(s) compiled")
            if not torch.equal(tokens, expected):
                raise SystemExit(f"the compiled generation differs from eager at prompt length {length}")
    print()
    print(report)
    stats = neuron_dynamo.stats()
    print(f"\n{stats['calls']} decode steps ran through the backend; {stats['dynamo_graphs']} Dynamo graph(s), "
          f"{stats['programs_compiled']} static program(s) compiled in all")


if __name__ == "__main__":
    main()
