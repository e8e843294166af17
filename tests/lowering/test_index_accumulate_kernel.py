"""Accumulating index writes compiled with backend="neuron" run as one launch of a library kernel and give eager's
results: the embedding backward (`embedding_backward_kernel`), index_put with accumulate, index_add and put
(`scatter_add_kernel`)."""

import pytest
import torch
import torch.nn.functional as F
from compiled import check_compiled

import neuron_dynamo.lowering.indexing as indexing
from neuron_dynamo import counters


@pytest.fixture
def launched(monkeypatch):
    """The names of the kernels the index lowerings launch during the test."""
    names = []
    launch = indexing.launch

    def record(kernel, *args, **kwargs):
        names.append(getattr(kernel, "__name__", str(kernel)))
        return launch(kernel, *args, **kwargs)

    monkeypatch.setattr(indexing, "launch", record)
    return names


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_compiled_embedding_backward_equals_eager(dtype, padding_idx, launched):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (2, 64), generator=gen)
    ids[0, :5] = 3  # a repeated id, and the padding row when there is one
    grad = torch.randn(2, 64, 64, generator=gen).to(dtype)

    def grad_of(fn):
        weight = torch.randn(128, 64, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_()
        fn(ids, weight, padding_idx=padding_idx).backward(grad)
        return weight.grad

    torch._dynamo.reset()
    expected = grad_of(F.embedding)
    before = counters.stats().get("kernels_launched", 0)
    compiled = grad_of(torch.compile(F.embedding, backend="neuron"))
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(compiled, expected, **tolerance)
    assert launched == ["embedding_kernel", "embedding_backward_kernel"], launched  # forward, backward
    assert counters.stats()["kernels_launched"] - before == 2


def test_negative_and_repeated_indices_accumulate_in_one_launch(launched):
    x, source = torch.randn(6, 5), torch.randn(4, 5)
    index = torch.tensor([-1, 0, -1, 2])
    check_compiled(lambda x, i, s: x.index_put((i,), s, accumulate=True), x, index, source, rtol=1e-6, atol=1e-6)
    check_compiled(lambda x, i, s: x.index_add(0, i, s, alpha=2.0), x, index.abs(), source, rtol=1e-6, atol=1e-6)
    check_compiled(lambda x, i, s: x.put(i, s[0], accumulate=True), x, torch.tensor([-30, 29, -1, 0, 0]), source,
                   rtol=1e-6, atol=1e-6)
    assert launched == ["scatter_add_kernel"] * 3, launched


def test_scale_grad_by_freq_divides_by_the_counts_of_ids():
    ids = torch.tensor([[1, 4, 4, 0], [4, 2, 1, 7]])
    grad = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(2))

    def grad_of(fn):
        weight = torch.randn(9, 6, generator=torch.Generator().manual_seed(3)).requires_grad_()
        fn(ids, weight, scale_grad_by_freq=True).backward(grad)
        return weight.grad

    torch._dynamo.reset()
    with counters.collect_reports() as reports:
        compiled = grad_of(torch.compile(F.embedding, backend="neuron"))
    torch.testing.assert_close(compiled, grad_of(F.embedding), rtol=1e-6, atol=1e-6)
    assert not [entry for report in reports for entry in report.fallback_ops]
