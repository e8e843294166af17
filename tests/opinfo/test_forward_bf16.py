"""Every OpInfo op, bf16 forward, on the default target (simulator):
equal to eager, or run eagerly with a reason; never an error."""

import pytest
import torch
from opinfo_cases import check, op_params


@pytest.mark.parametrize("op", op_params(torch.bfloat16, backward=False))
def test_op(op, record_property):
    check(op, torch.bfloat16, record_property, backward=False, target=None)
