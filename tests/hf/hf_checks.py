"""What the architecture tests share: inputs as users build them, and the comparison with eager."""

import torch
import transformers
from tiny_models import VOCAB_LM, tiny_causal_lm_config

import neuron_dynamo

LENGTHS = (37, 50)


def token_ids(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB_LM, (batch, length), generator=torch.Generator().manual_seed(seed))


def left_padded_mask(batch: int, length: int) -> torch.Tensor:
    """Row b has b * 3 padding tokens on the left (row 0 none), as a tokenizer with padding_side="left" gives."""
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        mask[row, : row * 3] = 0
    return mask


def assert_logits_match(model, compiled, calls, atol, rtol):
    with torch.no_grad():
        for kwargs in calls:
            want = model(**kwargs).logits
            got = compiled(**kwargs).logits
            torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)
    # The backend may run some graphs eagerly, but never because it broke: that would hide a bug from this test.
    assert neuron_dynamo.stats().get("graphs_failed", 0) == 0
    assert neuron_dynamo.stats().get("dynamo_graphs_eager", 0) == 0


def training_model(model_type: str, positions: int, seed: int) -> torch.nn.Module:
    """The tiny causal LM of `model_type` in training mode, its position table grown to `positions` (tiny configs
    hold fewer than a long training length needs)."""
    config = tiny_causal_lm_config(model_type)
    for name in ("n_positions", "max_position_embeddings"):
        if getattr(config, name, None) is not None:
            setattr(config, name, max(getattr(config, name), positions))
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()


def training_gradients(model, compiled, ids: torch.Tensor):
    """One training step (`labels=ids`) eager, then compiled: (parameter name, compiled grad, eager grad)."""
    model.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    compiled(input_ids=ids, labels=ids).loss.backward()
    return [(name, p.grad, expected[name]) for name, p in model.named_parameters() if name in expected]
