"""The bucket policy: which static size serves each dynamic size."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_dynamo.passes.bucketing import BucketConfig, BucketingError, DimPolicy, SymbolSite, plan_buckets

from .symbolic import symbolic_graph


def test_default_rounds_up_to_a_multiple_of_128_and_a_bucket_maps_to_itself():
    policy = DimPolicy()
    assert [policy.bucket(n) for n in (1, 127, 128, 129, 256, 600)] == [128, 128, 128, 256, 256, 640]


def test_pow2_and_explicit_buckets_and_exact():
    assert [DimPolicy(policy="pow2").bucket(n) for n in (1, 3, 4, 5, 300)] == [1, 4, 4, 8, 512]
    explicit = DimPolicy(buckets=(256, 512, 1024))
    assert [explicit.bucket(n) for n in (1, 256, 257, 1024)] == [256, 256, 512, 1024]
    assert DimPolicy(policy="exact").bucket(77) == 77
    assert DimPolicy(multiple=64).bucket(65) == 128


def test_max_bucket_clamps_then_errors_or_runs_exact():
    capped = DimPolicy(max_bucket=600)
    assert capped.bucket(590) == 600  # 640 would exceed the cap: the cap itself is the bucket
    assert capped.bucket(600) == 600
    with pytest.raises(BucketingError, match="larger than the largest bucket .600.*beyond_max_bucket='exact'"):
        capped.bucket(601)
    assert DimPolicy(max_bucket=600, beyond_max="exact").bucket(700) == 700
    with pytest.raises(BucketingError, match="largest bucket .1024"):
        DimPolicy(buckets=(256, 1024)).bucket(2000)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"policy": "linear"}, "unknown"),
        ({"multiple": 0}, "positive"),
        ({"buckets": (256, 128)}, "distinct"),
        ({"max_bucket": 0}, "positive"),
        ({"beyond_max": "truncate"}, "beyond_max_bucket"),
    ],
)
def test_bad_policies_name_the_problem(kwargs, fragment):
    with pytest.raises(BucketingError, match=fragment):
        DimPolicy(**kwargs)


def test_per_dim_overrides_from_options():
    config = BucketConfig.from_options(per_dim={0: "pow2", 2: 64, 3: [8, 16]}, max_bucket=4096)
    assert config.for_dim(0).bucket(3) == 4
    assert config.for_dim(1).bucket(3) == 128
    assert config.for_dim(2).bucket(65) == 128
    assert config.for_dim(3).bucket(9) == 16
    with pytest.raises(BucketingError, match="policy name"):
        BucketConfig.from_options(per_dim={0: 1.5})


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 5000),
    policy=st.sampled_from(["multiple", "pow2"]),
    multiple=st.integers(1, 300),
)
def test_bucket_is_the_smallest_allowed_size_that_fits(size, policy, multiple):
    dim = DimPolicy(policy=policy, multiple=multiple)
    bucket = dim.bucket(size)
    assert bucket >= size
    allowed = set(dim.enumerate(bucket))
    assert bucket in allowed and not any(size <= b < bucket for b in allowed)


def test_plan_reads_each_symbol_from_the_inputs_and_uses_the_dim_override():
    inputs = [torch.randn(2, 7, 4), torch.ones(2, 7)]
    gm = symbolic_graph(lambda x, m: x * m.unsqueeze(-1), inputs, {0: [0, 1], 1: [0, 1]})
    values = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    plan = plan_buckets(values, BucketConfig.from_options(per_dim={0: "pow2"}))
    batch, length = (values[0].shape[0].node.expr, values[0].shape[1].node.expr)
    assert plan.sites[batch] == SymbolSite(0, 0) and plan.sites[length] == SymbolSite(0, 1)
    real = plan.bind([torch.zeros(3, 100, 4), torch.zeros(3, 100)])
    assert real == {batch: 3, length: 100}
    assert plan.choose(real) == {batch: 4, length: 128}


def test_plan_of_a_static_graph_is_none_and_compound_only_symbols_are_an_error():
    static = symbolic_graph(lambda x: x + 1, [torch.randn(3)], {})
    assert plan_buckets([n.meta["val"] for n in static.graph.nodes if n.op == "placeholder"], BucketConfig()) is None
    doubled = symbolic_graph(lambda x: torch.cat([x, x]), [torch.randn(5)], {0: [0]})
    cat = next(n for n in doubled.graph.nodes if n.op == "call_function" and "cat" in str(n.target))
    assert str(cat.meta["val"].shape[0]) == "2*s0" or "2*" in str(cat.meta["val"].shape[0])
    with pytest.raises(BucketingError, match="compound"):
        plan_buckets([cat.meta["val"]], BucketConfig())  # an input whose only size is 2*s0


def test_adaptive_plan_runs_default_policy_symbols_exact_until_they_vary():
    """dynamic=True: a default-policy size keeps its value until it varies; a `bucket_dims` dim is bucketed at once."""
    inputs = [torch.randn(2, 7, 4), torch.ones(2, 7)]
    gm = symbolic_graph(lambda x, m: x * m.unsqueeze(-1), inputs, {0: [0, 1], 1: [0, 1]})
    values = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    batch, length = (values[0].shape[0].node.expr, values[0].shape[1].node.expr)
    plain = plan_buckets(values, BucketConfig(), adaptive=True)
    assert plain.adaptive == {batch, length}
    real = {batch: 3, length: 100}
    assert plain.choose(real) == real
    assert plain.choose(real, varying={length}) == {batch: 3, length: 128}
    chosen = plan_buckets(values, BucketConfig.from_options(per_dim={0: "pow2"}), adaptive=True)
    assert chosen.adaptive == {length} and chosen.choose(real) == {batch: 4, length: 100}
    assert plan_buckets(values, BucketConfig.from_options(buckets=[64, 256]), adaptive=True).adaptive == frozenset()
    assert plan_buckets(values, BucketConfig()).adaptive == frozenset()  # not adaptive: bucketed from the first call
    capped = plan_buckets(values, BucketConfig.from_options(max_bucket=64), adaptive=True)
    with pytest.raises(BucketingError, match="largest bucket"):
        capped.choose(real)  # max_bucket bounds an exact size too
    assert DimPolicy(multiple=64, max_bucket=512).describe() == "multiple of 64, max 512"
    assert DimPolicy(buckets=(8, 16)).describe() == "buckets [8, 16]"
