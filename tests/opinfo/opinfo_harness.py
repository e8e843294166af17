"""PyTorch's OpInfo database through the backend: one op's samples compiled, run and compared with eager.

The oracle is PyTorch's own: `op_db` says which ops exist, what inputs they take (`sample_inputs`) and which dtypes
and autograd they support; eager PyTorch gives the expected values. Each sample becomes a function whose tensors are
its inputs and whose other arguments are constants, compiled as a user would (`torch.compile(fn, backend="neuron",
dynamic=False)`). The outcome records whether the op ran lowered or fell back (with the backend's reasons), and
whether the backend failed inside (a region or a graph that errored and ran eagerly: counted, never silent).

Used by `tests/opinfo/` and by `benchmarks/opinfo_coverage.py` (which runs every sample; the tests run a few).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import Any

import torch
import torch._dynamo
import torch.utils._pytree as pytree

from neuron_dynamo import counters
from neuron_dynamo.bucket_dispatch import forget_generalized_graphs
from neuron_dynamo.passes.partition import COLLECTIVE, HOST_CHECK

INTERNAL_FAILURES = ("graphs_failed", "regions_failed", "dynamo_graphs_eager")
BY_DESIGN = (COLLECTIVE, HOST_CHECK)  # outside the target by design, not for lack of a kernel

# Ops whose eager result is itself undefined, so no compiled value can be compared with it: only shapes and dtypes
# are. Each entry says why.
UNDEFINED_VALUES = {
    "bernoulli": "random: draws from the generator",
    "cauchy": "random: draws from the generator",
    "empty": "uninitialised memory",
    "empty_like": "uninitialised memory",
    "empty_permuted": "uninitialised memory",
    "empty_strided": "uninitialised memory",
    "exponential": "random: draws from the generator",
    "geometric": "random: draws from the generator",
    "log_normal": "random: draws from the generator",
    "multinomial": "random: draws from the generator",
    "new_empty": "uninitialised memory",
    "new_empty_strided": "uninitialised memory",
    "nn.functional.alpha_dropout": "random: a dropout mask from the generator",
    "nn.functional.dropout": "random: a dropout mask from the generator",
    "nn.functional.dropout2d": "random: a dropout mask from the generator",
    "nn.functional.dropout3d": "random: a dropout mask from the generator",
    "nn.functional.feature_alpha_dropout": "random: a dropout mask from the generator",
    "nn.functional.fractional_max_pool2d": "random: pooling regions from the generator",
    "nn.functional.fractional_max_pool3d": "random: pooling regions from the generator",
    "nn.functional.rrelu": "random: slopes from the generator in training mode",
    "normal": "random: draws from the generator",
    "rand_like": "random: draws from the generator",
    "randint": "random: draws from the generator",
    "randint_like": "random: draws from the generator",
    "randn": "random: draws from the generator",
    "randn_like": "random: draws from the generator",
    "uniform": "random: draws from the generator",
    "torch.empty": "uninitialised memory",
}


@dataclasses.dataclass
class Outcome:
    """What happened to one op (all the samples tried) in one configuration."""

    op: str
    status: str = "lowered"  # lowered · fell back · no graph · mismatch · error · no samples
    samples: int = 0
    fallbacks: dict[str, str] = dataclasses.field(default_factory=dict)  # op name → reason
    internal_failures: int = 0
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def op_name(opinfo: Any) -> str:
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


def tolerances(dtype: torch.dtype) -> dict[str, float]:
    """assert_close tolerances: an NKI kernel may sum in another order and keeps fp32 intermediates where eager
    rounds each bf16/fp16 step, so the bounds are a few units of the dtype's precision, not PyTorch's defaults."""
    if dtype in (torch.bfloat16,):
        return {"rtol": 2e-2, "atol": 2e-2}
    if dtype in (torch.float16,):
        return {"rtol": 4e-3, "atol": 4e-3}
    return {"rtol": 1e-4, "atol": 1e-4}


def _as_inputs(sample: Any) -> tuple[list[Any], Any]:
    """The sample's leaves (tensors are the inputs, everything else constants) and how to rebuild the call."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    return leaves, spec


def _fresh(leaves: list[Any]) -> list[Any]:
    """Independent copies of the tensor leaves (an op may write into its inputs), with their requires_grad."""
    out = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            copy = leaf.detach().clone()
            copy.requires_grad_(leaf.requires_grad)
            out.append(copy)
        else:
            out.append(leaf)
    return out


def _function(opinfo: Any, leaves: list[Any], spec: Any):
    """`fn(*tensors)` calling the op with the sample's tensors as inputs and its other leaves baked in."""
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    constants = list(leaves)

    def fn(*tensors):
        values = list(constants)
        for slot, tensor in zip(slots, tensors, strict=True):
            values[slot] = tensor
        inp, args, kwargs = pytree.tree_unflatten(values, spec)
        return opinfo.op(inp, *args, **kwargs)

    return fn, slots


def _float_outputs(value: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor) and t.dtype.is_floating_point
            and t.requires_grad]


def _gradients(outputs: Any, inputs: list[torch.Tensor], seed: int) -> list[torch.Tensor | None]:
    """d(sum of outputs · fixed random cotangents)/d(inputs): the same cotangents for eager and compiled."""
    outs = _float_outputs(outputs)
    wanted = [t for t in inputs if t.requires_grad]
    if not outs or not wanted:
        return []
    generator = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(o.shape, generator=generator).to(o.dtype) for o in outs]
    return list(torch.autograd.grad(outs, wanted, cotangents, allow_unused=True))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _compare(actual: Any, expected: Any, dtype: torch.dtype, values: bool) -> None:
    if not values:  # undefined values: shapes and dtypes only
        actual_leaves, expected_leaves = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
        assert len(actual_leaves) == len(expected_leaves)
        for a, e in zip(actual_leaves, expected_leaves, strict=True):
            if isinstance(e, torch.Tensor):
                assert isinstance(a, torch.Tensor) and a.shape == e.shape and a.dtype == e.dtype, (a, e)
        return
    torch.testing.assert_close(actual, expected, equal_nan=True, **tolerances(dtype))


# The wider dtype a result may instead be checked against (`_upcast_reference`).
UPCAST = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64}


def _mismatch(actual, expected, actual_grads, expected_grads, dtype, values) -> str | None:
    """None when the outputs (and gradients) agree, else the assert_close report's key lines."""
    try:
        _compare(actual, expected, dtype, values)
        if actual_grads is not None or expected_grads is not None:
            _compare(actual_grads, expected_grads, dtype, values)
    except AssertionError as exc:
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        keep = [line for line in lines if line.startswith(("Mismatched", "Greatest"))] or lines[:1]
        return " ".join(keep)[:400]
    return None


def _upcast_reference(fn, slots, leaves, dtype, backward, seed):
    """Eager computed in a wider dtype (`UPCAST`: fp32 for bf16/fp16, fp64 for fp32) from the same inputs, rounded
    to `dtype` at the end (Inductor's `reference_in_float`; `torch._dynamo.utils.same` checks against fp64 too).
    A kernel that keeps fp32 intermediates is closer to this than to eager's per-step rounding, and cancellation
    (a·b − c·d, a layer norm over one element) can put the two further apart than any fixed tolerance."""
    wide = UPCAST[dtype]
    fresh = _fresh(leaves)
    inputs = []
    for i in slots:
        tensor = fresh[i]
        if tensor.dtype == dtype:
            tensor = tensor.detach().to(wide).requires_grad_(tensor.requires_grad)
        inputs.append(tensor)
    try:
        torch.manual_seed(seed)
        out = fn(*inputs)
        grads = _gradients(out, inputs, seed) if backward else None
    except Exception:
        return None
    down = lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == wide else t  # noqa: E731
    return pytree.tree_map(down, out), None if grads is None else pytree.tree_map(down, grads)


def samples_of(opinfo: Any, dtype: torch.dtype, requires_grad: bool, limit: int | None) -> list[Any]:
    torch.manual_seed(0)
    out = []
    for sample in opinfo.sample_inputs("cpu", dtype, requires_grad=requires_grad):
        out.append(sample)
        if limit is not None and len(out) >= limit:
            break
    return out


def run_op(opinfo: Any, dtype: torch.dtype = torch.float32, *, backward: bool = False, target: str | None = None,
           limit: int | None = 3) -> Outcome:
    """Compile and run up to `limit` samples of one OpInfo op; compare outputs (and input gradients) with eager."""
    outcome = Outcome(op_name(opinfo))
    options = {"target": target} if target else None
    values = opinfo.name not in UNDEFINED_VALUES
    lowered_any = fell_back = False
    for index, sample in enumerate(samples_of(opinfo, dtype, backward, limit)):
        leaves, spec = _as_inputs(sample)
        fn, slots = _function(opinfo, leaves, spec)
        eager_leaves = _fresh(leaves)
        try:
            torch.manual_seed(index)
            expected = fn(*[eager_leaves[i] for i in slots])
            expected_grads = _gradients(expected, [eager_leaves[i] for i in slots], index) if backward else None
        except Exception:  # eager refuses this sample (some OpInfo samples are for error checks): nothing to compare
            continue
        outcome.samples += 1
        torch._dynamo.reset()
        forget_generalized_graphs()
        compiled = torch.compile(fn, backend="neuron", dynamic=False, options=options)
        compiled_leaves = _fresh(leaves)
        before = counters.stats()
        try:
            with counters.collect_reports() as reports:
                torch.manual_seed(index)
                actual = compiled(*[compiled_leaves[i] for i in slots])
                actual_grads = _gradients(actual, [compiled_leaves[i] for i in slots], index) if backward else None
        except Exception as exc:
            outcome.status = "error"
            outcome.detail = f"sample {index}: {type(exc).__name__}: {_first_line(exc)}"
            return outcome
        after = counters.stats()
        outcome.internal_failures += sum(after.get(k, 0) - before.get(k, 0) for k in INTERNAL_FAILURES)
        if after.get("eager_recomputes", 0) > before.get("eager_recomputes", 0):  # a kernel handed its call to torch
            outcome.fallbacks.setdefault("(run time)", "recomputed by torch: LAPACK decides this sample by a flag "
                                                       "or by rounding (eager_recomputes)")
            fell_back = True
        for report in reports:
            for entry in report.fallback_ops:
                if entry["reason"].startswith(BY_DESIGN):
                    continue
                outcome.fallbacks.setdefault(entry["op"], entry["reason"])
                fell_back = True
            if report.ops_lowered:
                lowered_any = True
        mismatch = _mismatch(actual, expected, actual_grads, expected_grads, dtype, values)
        if mismatch and dtype in UPCAST:  # eager's own rounding may be what differs: compare with a wider computation
            upcast = _upcast_reference(fn, slots, leaves, dtype, backward, index)
            if upcast is not None and not _mismatch(actual, upcast[0], actual_grads, upcast[1], dtype, values):
                mismatch = None
        if mismatch:
            outcome.status = "mismatch"
            outcome.detail = f"sample {index}: {mismatch}"
            return outcome
    if outcome.samples == 0:
        outcome.status = "no samples"
    elif outcome.internal_failures:
        outcome.status = "error"
        outcome.detail = f"{outcome.internal_failures} backend failure(s) run eagerly ({', '.join(INTERNAL_FAILURES)})"
    elif fell_back:
        outcome.status = "fell back"
    elif not lowered_any:
        outcome.status = "no graph"
    return outcome


def fp32_ops() -> list[Any]:
    """The OpInfo ops that support fp32 on CPU (the issue's 677)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]


def ops_for(dtype: torch.dtype, backward: bool = False) -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    ops = [op for op in op_db if dtype in op.supported_dtypes("cpu")]
    if backward:
        ops = [op for op in ops if op.supports_autograd and dtype in op.supported_backward_dtypes("cpu")]
    return ops


def shard(items: Iterable[Any], index: int, count: int) -> list[Any]:
    return [item for i, item in enumerate(items) if i % count == index]


def sample_limit() -> int | None:
    """Samples per op: NEURON_OPINFO_SAMPLES (0 = all), else 1 in `make test`."""
    value = int(os.environ.get("NEURON_OPINFO_SAMPLES", "1"))
    return None if value <= 0 else value
