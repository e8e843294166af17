"""Every OpInfo op, fp32 forward, on the default target (simulator):
equal to eager, or run eagerly with a reason; never an error."""

import pytest
import torch
from opinfo_cases import check, op_params


@pytest.mark.parametrize("op", op_params(torch.float32, backward=False))
def test_op(op, record_property):
    check(op, torch.float32, record_property, backward=False, target=None)
