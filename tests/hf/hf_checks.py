"""What the architecture tests share: inputs as users build them, and the comparison with eager."""

import torch
from tiny_models import VOCAB_LM

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
