"""Pattern matching: decomposed RMSNorm, SwiGLU and rotary-embedding chains become one library-kernel call each."""


import torch
import transformers
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_dynamo.lowering import lower_region
from neuron_dynamo.lowering.artifact import dump_region, load_region
from neuron_dynamo.lowering.patterns import PatternKernel


def rms_norm(x, weight):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + 1e-6))


def swiglu(a, b):
    return torch.nn.functional.silu(a) * b


def rope(q, cos, sin):
    return transformers.models.llama.modeling_llama.apply_rotary_pos_emb(q, q, cos, sin)[0]


def lowered_calls(fn, *args):
    lowered = lower_region(make_fx(fn)(*args), "simulator")
    names = [n.target.__name__ for n in lowered.graph.nodes if isinstance(n.target, PatternKernel)]
    return lowered, names


def test_chains_become_library_kernels_and_match_eager():
    cases = [
        (rms_norm, (torch.randn(3, 130, 32), torch.randn(32)), "rmsnorm_kernel"),
        (swiglu, (torch.randn(5, 48), torch.randn(5, 48)), "silu_mul_kernel"),
        (rope, (torch.randn(2, 4, 12, 16), torch.randn(1, 12, 16), torch.randn(1, 12, 16)), "rope_kernel"),
        (rope, (torch.randn(2, 4, 12, 16), torch.randn(2, 12, 16), torch.randn(2, 12, 16)), "rope_kernel"),
    ]
    for fn, args, kernel in cases:
        lowered, names = lowered_calls(fn, *args)
        assert names == [kernel]
        torch.testing.assert_close(lowered(*args), fn(*args), atol=1e-5, rtol=1e-5)


def test_a_training_forward_norm_is_one_kernel_that_also_returns_what_the_backward_saves():
    def norm_and_saved(x, weight):  # Hugging Face's RMSNorm as AOTAutograd's forward graph saves it
        inverse = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        normed = x * inverse
        return weight * normed, normed, inverse.detach()

    for args in ((torch.randn(4, 32), torch.randn(32)), (torch.randn(2, 130, 24), torch.randn(24))):
        lowered, names = lowered_calls(norm_and_saved, *args)
        assert names == ["rmsnorm_saved_kernel"]
        for ours, theirs in zip(lowered(*args), norm_and_saved(*args), strict=True):
            assert ours.shape == theirs.shape
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(load_region(dump_region(lowered))(*args)[0], norm_and_saved(*args)[0])


def test_an_unweighted_norm_whose_statistic_is_needed_elsewhere_stays_fused_code():
    def norm_and_stat(x):
        inverse = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * inverse, inverse

    args = (torch.randn(4, 32),)
    lowered, names = lowered_calls(norm_and_stat, *args)
    assert names == []
    for ours, theirs in zip(lowered(*args), norm_and_stat(*args), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_lowered_region_round_trips_through_its_artifact():
    def fn(x, w, b):
        return swiglu(x @ w, b).softmax(-1).sum(0) * 3

    args = torch.randn(8, 16), torch.randn(16, 24), torch.randn(8, 24)
    lowered = lower_region(make_fx(fn)(*args), "simulator")
    loaded = load_region(dump_region(lowered))
    assert loaded.code == lowered.code
    torch.testing.assert_close(loaded(*args), fn(*args), atol=1e-5, rtol=1e-5)


def test_explicit_attention_chain_becomes_the_flash_kernel():
    def eager_attention(q, k, v, mask):
        scores = torch.bmm(q, k.transpose(1, 2)) * 0.25 + mask
        return torch.bmm(torch.softmax(scores, dim=-1), v)

    args = torch.randn(6, 12, 16), torch.randn(6, 20, 16), torch.randn(6, 20, 16), torch.randn(1, 12, 20)
    lowered, names = lowered_calls(eager_attention, *args)
    assert names == ["attention_kernel"]
    torch.testing.assert_close(lowered(*args), eager_attention(*args), atol=1e-5, rtol=1e-5)
