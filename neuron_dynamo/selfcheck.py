"""`neuron-precompile selfcheck`: what the first user with a Trainium host runs, and attaches to a bug report.

Nothing of the `neuron` target has run on Trainium before that user. The self-check runs the kernel library (small
shapes, fp32 and bf16) and two tiny Transformers models on the device through TorchNeuron *and* on the simulator,
and reports, per kernel and model: whether the values agree within a tolerance fit for the dtype, the largest
difference, the measured device wall time of a warm call (after `torch.neuron.synchronize()`, so it includes the
launch) and the cost model's estimate for the same call. On a machine without TorchNeuron and a Neuron device it
says so and exits 2 before doing anything.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

# Tolerances for a kernel on the device against the same kernel on the interpreter: both round to the storage dtype
# but may sum in another order, and TensorE may multiply fp32 in fewer passes than NumPy.
TOLERANCE = {torch.float32: (2e-3, 2e-3), torch.bfloat16: (3e-2, 3e-2), torch.float16: (5e-3, 5e-3)}
TIMED_CALLS = 5


@dataclasses.dataclass
class Row:
    """One kernel or model, run on both."""

    name: str
    kind: str  # "kernel" or "model"
    dtype: str
    ok: bool = False
    max_abs_diff: float | None = None
    device_us: float | None = None  # measured: median wall time of a warm call on the device
    estimated_us: float | None = None  # the cost model's estimate of the same call (kernels only)
    error: str = ""


def _rand(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def kernel_cases(dtype: torch.dtype) -> list[tuple[str, Any, Callable[[], tuple]]]:
    """(name, kernel, make_args) for the kernel library at small shapes in `dtype`."""
    from neuron_dynamo.kernels.activations import activation_kernel, gated_activation_kernel
    from neuron_dynamo.kernels.attention import attention_kernel
    from neuron_dynamo.kernels.cross_entropy import cross_entropy_loss_kernel
    from neuron_dynamo.kernels.embedding import embedding_kernel
    from neuron_dynamo.kernels.matmul import matmul_kernel
    from neuron_dynamo.kernels.norms import layernorm_kernel, rmsnorm_kernel
    from neuron_dynamo.kernels.rope import rope_kernel
    from neuron_dynamo.kernels.softmax import log_softmax_kernel, softmax_kernel
    from neuron_dynamo.kernels.transpose import transpose_kernel

    n, d, s, vocab = 256, 64, 256, 512
    r = lambda *shape: _rand(*shape, dtype=dtype)  # noqa: E731
    ids = lambda count, high: torch.randint(0, high, (count,), dtype=torch.int32)  # noqa: E731
    return [
        ("matmul", matmul_kernel, lambda: (r(n, n), r(n, n))),
        ("matmul_linear_bias_gelu", matmul_kernel, lambda: (r(n, n), r(n // 2, n), r(n // 2), "gelu_tanh", False,
                                                            True)),
        ("attention_causal", attention_kernel, lambda: (r(1, 2, s, d), r(1, 2, s, d), r(1, 2, s, d), None, True,
                                                        d ** -0.5)),
        ("softmax", softmax_kernel, lambda: (r(n, n),)),
        ("log_softmax", log_softmax_kernel, lambda: (r(n, n),)),
        ("rmsnorm", rmsnorm_kernel, lambda: (r(n, n), r(n), 1e-6)),
        ("layernorm", layernorm_kernel, lambda: (r(n, n), r(n), r(n))),
        ("silu", activation_kernel, lambda: (r(n, n), "silu")),
        ("silu_mul", gated_activation_kernel, lambda: (r(n, n), r(n, n), "silu")),
        ("transpose", transpose_kernel, lambda: (r(n, n),)),
        ("rope", rope_kernel, lambda: (r(1, 2, s, d), r(1, s, d), r(1, s, d))),
        ("embedding", embedding_kernel, lambda: (ids(n, vocab), r(vocab, d))),
        ("cross_entropy_loss", cross_entropy_loss_kernel, lambda: (r(n, vocab), ids(n, vocab), -100, True)),
    ]


def _leaves(value: Any) -> list[torch.Tensor]:
    values = value if isinstance(value, (tuple, list)) else [value]
    return [v for v in values if isinstance(v, torch.Tensor)]


def compare(device_out: Any, host_out: Any, dtype: torch.dtype) -> tuple[bool, float]:
    """Whether every result agrees within the dtype's tolerance, and the largest absolute difference."""
    rtol, atol = TOLERANCE.get(dtype, (0.0, 0.0))
    ok, worst = True, 0.0
    for got, want in zip(_leaves(device_out), _leaves(host_out), strict=True):
        got = got.detach().to("cpu")
        if got.shape != want.shape or got.dtype != want.dtype:
            return False, float("inf")
        if want.numel():
            diff = (got.double() - want.double()).abs().nan_to_num(nan=float("inf"), posinf=0.0)
            worst = max(worst, float(diff.max()))
            ok = ok and torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol, equal_nan=True)
    return ok, worst


def _timed(run: Callable[[], Any]) -> tuple[Any, float]:
    """The result of a warm call, and the median wall time in µs of `TIMED_CALLS` calls (device synchronised)."""
    result = run()
    torch.neuron.synchronize()
    times = []
    for _ in range(TIMED_CALLS):
        start = time.perf_counter()
        result = run()
        torch.neuron.synchronize()
        times.append((time.perf_counter() - start) * 1e6)
    return result, statistics.median(times)


def check_kernel(name: str, kernel: Any, make: Callable[[], tuple], dtype: torch.dtype) -> Row:
    from neuron_dynamo.toolchain import simulator, torchneuron

    row = Row(name, "kernel", str(dtype).removeprefix("torch."))
    try:
        torch.manual_seed(0)
        args = make()
        with simulator.device_time() as spent:
            host = simulator.simulate(kernel, *args)
        row.estimated_us = round(spent.ns / 1e3, 2)
        device_args = tuple(a.to(torchneuron.DEVICE_TYPE) if isinstance(a, torch.Tensor) else a for a in args)
        torchneuron.record_call(kernel, args, {}, host)  # the op, registered as a region's plan would
        device, row.device_us = _timed(lambda: torchneuron.device_launch(kernel, device_args, {}))
        row.ok, row.max_abs_diff = compare(device, host, dtype)
    except Exception as exc:  # one kernel failing is a finding, not the end of the check
        row.error = f"{type(exc).__name__}: {str(exc)[:300]}"
    return row


def tiny_models() -> dict[str, Callable[[], torch.nn.Module]]:
    import transformers

    def llama() -> torch.nn.Module:
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256))

    def gpt2() -> torch.nn.Module:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0))
        model.loss_type = "ForCausalLM"
        return model

    return {"tiny_llama": llama, "tiny_gpt2": gpt2}


def check_model(name: str, build: Callable[[], torch.nn.Module]) -> Row:
    import torch._dynamo

    row = Row(name, "model", "float32")
    try:
        torch.manual_seed(0)
        model = build().eval()
        ids = torch.randint(0, 128, (2, 37))
        torch._dynamo.reset()
        with torch.no_grad():
            host = torch.compile(model, backend="neuron_dynamo")(ids).logits
            model = model.to("neuron")
            torch._dynamo.reset()
            compiled = torch.compile(model, backend="neuron_dynamo")
            device_ids = ids.to("neuron")
            device, row.device_us = _timed(lambda: compiled(device_ids).logits)
        row.ok, row.max_abs_diff = compare(device, host, torch.float32)
    except Exception as exc:
        row.error = f"{type(exc).__name__}: {str(exc)[:300]}"
    return row


def run(progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Every check; the report as a dict (host facts, one row per kernel and dtype and per model, a summary)."""
    from neuron_dynamo import counters
    from neuron_dynamo.toolchain import torchneuron

    rows: list[Row] = []
    for dtype in (torch.float32, torch.bfloat16):
        for name, kernel, make in kernel_cases(dtype):
            rows.append(check_kernel(name, kernel, make, dtype))
            progress(_line(rows[-1]))
    for name, build in tiny_models().items():
        rows.append(check_model(name, build))
        progress(_line(rows[-1]))
    failed = [row.name + "/" + row.dtype for row in rows if not row.ok]
    return {
        "host": {**torchneuron.versions(), "platform": torchneuron.platform(),
                 "lnc": torchneuron.logical_nc_config(0), "neuron_cc_flags": torchneuron.compiler_flags(),
                 "torch": torch.__version__, "device_count": torch.neuron.device_count()},
        "device_us": "measured wall time of a warm call, median of 5, device synchronised (includes the launch)",
        "estimated_us": "the cost model's estimated trn device time of the kernel alone (an estimate)",
        "rows": [dataclasses.asdict(row) for row in rows],
        "counters": {k: v for k, v in counters.stats().items() if k.startswith("neuron.")},
        "summary": {"checks": len(rows), "passed": len(rows) - len(failed), "failed": failed},
    }


def _line(row: Row) -> str:
    status = "ok  " if row.ok else "FAIL"
    figures = (f"max|diff| {row.max_abs_diff:.3g}  device {row.device_us:.1f} us"
               if row.max_abs_diff is not None and row.device_us is not None else row.error)
    estimate = f"  estimated {row.estimated_us:.1f} us" if row.estimated_us is not None else ""
    return f"{status} {row.kind:6} {row.name:26} {row.dtype:9} {figures}{estimate}"
