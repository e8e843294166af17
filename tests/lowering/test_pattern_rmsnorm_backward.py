"""The backward of an RMSNorm, as AOTAutograd hands it to the backend, becomes one rmsnorm_backward_kernel."""

import copy

import pytest
import torch
import transformers
from functorch.compile import aot_function, make_boxed_func
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from neuron_dynamo.lowering import lower_region
from neuron_dynamo.lowering.artifact import dump_region, load_region
from neuron_dynamo.lowering.patterns import PATTERN_KERNELS, PatternKernel
from neuron_dynamo.passes.decompositions import decomposition_table

aten = torch.ops.aten


class Block(torch.nn.Module):
    """Two norms and a residual connection: the first norm's x gradient joins the residual stream's."""

    def __init__(self, d):
        super().__init__()
        self.first, self.second = LlamaRMSNorm(d), LlamaRMSNorm(d)

    def forward(self, x):
        return self.second(self.first(x) + x)


def backward_graph(module, x):
    """AOTAutograd's backward graph of module(x) (with the backend's decompositions) and the inputs of one run."""
    params = dict(module.named_parameters())
    seen = {}

    def backward_compiler(graph, _):
        seen["graph"] = graph

        def run(*args):
            seen["args"] = args
            return graph(*args)

        return make_boxed_func(run)

    forward = aot_function(lambda x, *p: torch.func.functional_call(module, dict(zip(params, p, strict=True)), (x,)),
                           lambda graph, _: make_boxed_func(graph), backward_compiler,
                           decompositions=decomposition_table())
    forward(x.requires_grad_(), *params.values()).backward(torch.randn(x.shape, generator=torch.Generator()
                                                                       .manual_seed(1)).to(x.dtype))
    return seen["graph"], seen["args"]


def lowered_calls(graph):
    lowered = lower_region(copy.deepcopy(graph), "simulator")
    return lowered, [n.target.__name__ for n in lowered.graph.nodes if isinstance(n.target, PatternKernel)]


def llama_norm(d=64, dtype=torch.float32, frozen=False):
    torch.manual_seed(0)
    norm = LlamaRMSNorm(d).to(dtype)
    with torch.no_grad():
        norm.weight.normal_()
    return norm.requires_grad_(not frozen)


def assert_same(ours, theirs, dtype):
    """Equal up to rounding in another order (half precision: eager rounds each of grad_w's products to it, the
    kernel sums them exactly in fp32), relative to the output's magnitude."""
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for a, b in zip(ours, theirs, strict=True):
        if b is None:  # no gradient for a frozen weight
            assert a is None
            continue
        scale = max(1.0, b.abs().max().item()) if b.numel() else 1.0
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance * scale)


@pytest.mark.parametrize("case, module, dtype, kernels", [
    ("llama", llama_norm(), torch.float32, 1),
    ("frozen weight", llama_norm(frozen=True), torch.float32, 1),
    ("half precision", llama_norm(dtype=torch.bfloat16), torch.bfloat16, 1),
    ("gemma (1 + weight)", GemmaRMSNorm(64), torch.float32, 1),
    ("residual", Block(64), torch.float32, 2),
])
def test_a_norm_backward_is_one_kernel_and_matches_eager(case, module, dtype, kernels):
    graph, args = backward_graph(module, torch.randn(2, 100, 64).to(dtype) * 3)
    lowered, names = lowered_calls(graph)
    assert names == ["rmsnorm_backward_kernel"] * kernels
    assert_same(lowered(*args), graph(*args), dtype)
    if case == "llama":
        assert_same(load_region(dump_region(lowered))(*args), lowered(*args), dtype)


def with_output(graph, pick):
    """The graph with the first node `pick` accepts returned too (so that it has another reader)."""
    graph = copy.deepcopy(graph)
    node = next(n for n in graph.graph.nodes if pick(n))
    output = next(n for n in graph.graph.nodes if n.op == "output")
    output.args = ((*output.args[0], node),)
    graph.recompile()
    return graph


@pytest.mark.parametrize("pick", [
    lambda n: n.target == aten.sum.dim_IntList and list(n.args[1]) == [2],  # Σ a·x
    lambda n: n.target == aten.mul.Tensor and any(a.meta["val"].dim() == 1 for a in n.args),  # a = g · weight
    lambda n: n.target == aten.div.Scalar,  # the correction's coefficient
], ids=["row sum", "grad times weight", "coefficient"])
def test_no_rewrite_when_an_intermediate_has_another_reader(pick):
    graph, args = backward_graph(llama_norm(), torch.randn(2, 5, 64))
    graph = with_output(graph, pick)
    lowered, names = lowered_calls(graph)
    assert names == []
    assert_same(lowered(*args), graph(*args), torch.float32)


def test_a_weight_gradient_needed_elsewhere_stays_fused_code_and_the_kernel_gives_grad_x_alone():
    graph, args = backward_graph(llama_norm(), torch.randn(2, 5, 64))
    graph = with_output(graph, lambda n: n.target == aten.sum.dim_IntList and list(n.args[1]) == [0, 1])
    lowered, names = lowered_calls(graph)
    assert names == ["rmsnorm_backward_kernel"]
    assert_same(lowered(*args), graph(*args), torch.float32)


def test_the_detached_copy_of_rstd_is_an_operand_of_its_own():
    """The graph cubes a separate input (a detached copy of rstd): given another value there, the kernel follows."""
    graph, args = backward_graph(llama_norm(), torch.randn(2, 5, 64))
    places = [n for n in graph.graph.nodes if n.op == "placeholder"]
    cubed = next(i for i, n in enumerate(places) if any(u.target == aten.detach.default for u in n.users))
    args = (*args[:cubed], args[cubed] * 1.5, *args[cubed + 1:])
    lowered, names = lowered_calls(graph)
    assert names == ["rmsnorm_backward_kernel"]
    assert_same(lowered(*args), graph(*args), torch.float32)


def test_no_tokens_stay_as_they_are():
    graph, args = backward_graph(llama_norm(), torch.randn(2, 0, 64))
    lowered, names = lowered_calls(graph)
    assert names == []
    assert_same(lowered(*args), graph(*args), torch.float32)


def test_a_compiled_llama_training_step_runs_the_kernel_and_gives_eager_gradients(monkeypatch):
    kernel = PATTERN_KERNELS["rmsnorm_backward_kernel"]
    calls = []
    monkeypatch.setattr(kernel, "implementation", lambda *a, run=kernel.implementation: calls.append(1) or run(*a))
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)

    def gradients(run):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config)
        run(model, ids).backward()
        return {name: p.grad for name, p in model.named_parameters()}

    def loss(model, ids):
        return model(input_ids=ids, labels=ids).loss

    ours, theirs = gradients(torch.compile(loss, backend="neuron")), gradients(loss)
    assert len(calls) == 3  # two norms in the layer, the final norm
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
