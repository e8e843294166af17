"""Arguments outside a kernel's layout contract fail up front with a KernelContractError that names the fix."""

import re

import pytest
import torch
from neuron_dynamo.kernels.activations import gated_activation_kernel
from neuron_dynamo.kernels.attention import attention_kernel
from neuron_dynamo.kernels.contract import KernelContractError
from neuron_dynamo.kernels.cross_entropy import cross_entropy_kernel
from neuron_dynamo.kernels.embedding import embedding_kernel
from neuron_dynamo.kernels.matmul import matmul_kernel
from neuron_dynamo.kernels.norms import rmsnorm_kernel
from neuron_dynamo.kernels.softmax import softmax_kernel

from neuron_dynamo.errors import NeuronDynamoError

x = torch.randn(4, 8)
CASES = [
    (lambda: matmul_kernel(x, torch.randn(9, 3)), "contraction sizes differ"),
    (lambda: matmul_kernel(x, torch.randn(8, 3).bfloat16()), "cast both to one dtype"),
    (lambda: matmul_kernel(x, torch.randn(8, 3), None, "swish"), "is not one of"),
    (lambda: matmul_kernel(x, torch.randn(8, 3), torch.randn(4)), "bias must have shape (3,)"),
    (lambda: softmax_kernel(x, torch.zeros(1, 8)), "expand it first"),
    (lambda: rmsnorm_kernel(x, torch.ones(7)), "weight must have shape (8,)"),
    (lambda: gated_activation_kernel(x, torch.randn(4, 9)), "must match in shape and dtype"),
    (lambda: embedding_kernel(torch.zeros(3, dtype=torch.int32), torch.zeros(5)), "table must be [V, D]"),
    (lambda: cross_entropy_kernel(x, torch.zeros(3, dtype=torch.int32)), "labels must have shape (4,)"),
    (lambda: attention_kernel(*[torch.randn(1, 1, 100, 64)] * 3), "pad to a multiple of 128"),
    (lambda: attention_kernel(*[torch.randn(1, 1, 128, 192)] * 3), "head_dim 192 > 128"),
    (lambda: attention_kernel(torch.randn(1, 3, 128, 64), *[torch.randn(1, 2, 128, 64)] * 2), "must divide"),
    (lambda: attention_kernel(torch.randn(1, 1, 256, 64), *[torch.randn(1, 1, 128, 64)] * 2, None, True),
     "at least as many keys as queries"),
]


@pytest.mark.parametrize(("call", "fix"), CASES)
def test_contract_violations_are_named(call, fix):
    with pytest.raises(KernelContractError, match=re.escape(fix)) as info:
        call()
    assert isinstance(info.value, NeuronDynamoError)


def test_int64_indices_are_refused_with_the_cast_to_make():
    """NKI has no int64: the interpreter refuses the argument before the kernel runs (a NeuronDynamoError)."""
    with pytest.raises(NeuronDynamoError, match="int32"):
        embedding_kernel(torch.zeros(3, dtype=torch.int64), x)
