"""Estimated trn2 performance of the NKI kernel library (neuron_dynamo.kernels), from the CPU interpreter.

Each kernel runs once in the interpreter on realistic shapes; the cost model (neuron_dynamo/nki/costmodel.py)
estimates its device time on one trn2 NeuronCore: the calibrated estimate (a dependency-aware schedule, see the
cost model's docstring) between the perfect-overlap and serial bounds. Printed per kernel: the estimated time,
the figure that matters for it (TensorE utilisation for matmul-bound kernels — for causal
attention counted on the causal FLOPs only, i.e. the useful half of the score matrix — or the fraction of the
HBM roofline for memory-bound ones), the engine that bounds it, and the interpreter's wall time.
All device figures are ESTIMATES, not measurements.

    python benchmarks/kernel_library.py            # table
    python benchmarks/kernel_library.py --json     # one JSON document
    python benchmarks/kernel_library.py --only attention_causal --only matmul
    python benchmarks/kernel_library.py --quick    # small shapes (a smoke run of every kernel, seconds)
"""

import argparse
import json
import time

import torch
from neuron_dynamo.kernels.activations import activation_kernel, gated_activation_kernel
from neuron_dynamo.kernels.attention import attention_kernel
from neuron_dynamo.kernels.attention_bwd import attention_backward_kernel
from neuron_dynamo.kernels.cross_entropy import (
    cross_entropy_backward_kernel,
    cross_entropy_kernel,
    cross_entropy_loss_kernel,
)
from neuron_dynamo.kernels.embedding import embedding_kernel
from neuron_dynamo.kernels.matmul import matmul_kernel
from neuron_dynamo.kernels.norms import layernorm_kernel, rmsnorm_kernel
from neuron_dynamo.kernels.rope import rope_kernel
from neuron_dynamo.kernels.scatter import embedding_backward_kernel
from neuron_dynamo.kernels.softmax import log_softmax_kernel, softmax_kernel
from neuron_dynamo.kernels.transpose import transpose_kernel

BF16 = torch.bfloat16
PEAK_BF16_FLOPS_PER_NS = 128 * 128 * 2 * 2.4  # trn2 TensorE, bf16 (nki.md §2.2–2.3)


def rand(*shape, dtype=BF16):
    return torch.randn(*shape).to(dtype)


def cases(quick):
    """(name, kernel, make, shape label, metric) per benchmark; make() -> (args, useful FLOPs or None)."""
    n = 512 if quick else 4096  # the square size of the headline shapes
    s = 512 if quick else 4096  # attention sequence length
    vocab = 4096 if quick else 32000
    d = 128

    def attention_causal():
        q, k, v = rand(1, 1, s, d), rand(1, 1, s, d), rand(1, 1, s, d)
        return (q, k, v, None, True, d**-0.5), 2 * 2 * s * s * d / 2  # QKᵀ and PV over the causal half

    def attention_backward():
        sb = s
        q, k, v, dout = rand(1, 1, sb, d), rand(1, 1, sb, d), rand(1, 1, sb, d), rand(1, 1, sb, d)
        out, lse = attention_kernel(q, k, v, None, True, d**-0.5)
        return (q, k, v, out, dout, lse, None, True, d**-0.5), 5 * 2 * sb * sb * d / 2  # five products per block

    def attention_decode():
        q, k, v = rand(1, 32, 1, d), rand(1, 8, s, d), rand(1, 8, s, d)
        return (q, k, v, None, False, d**-0.5, torch.tensor([s - 100], dtype=torch.int32)), None

    def cross_entropy_bwd():
        logits, labels = rand(n, vocab), torch.randint(0, vocab, (n,), dtype=torch.int32)
        _, lse = cross_entropy_kernel(logits, labels)
        return (logits, labels, lse, torch.full((n,), 1.0 / n)), None

    rows = min(vocab, 2**24 // n)  # the lowering's one-hot limit: rows x ids <= 2**24

    def embedding_backward():
        return (rand(n, n // 4), torch.randint(0, rows, (n,), dtype=torch.int32), rows), None

    x = lambda: rand(n, n)  # noqa: E731
    return [
        ("matmul", matmul_kernel, lambda: ((rand(n, n), rand(n, n)), 2 * n**3), f"{n}x{n}x{n} bf16", "tensor"),
        ("matmul_linear_bias_gelu", matmul_kernel,
         lambda: ((rand(n, n), rand(n // 2, n), rand(n // 2), "gelu_tanh", False, True), 2 * n * n * n // 2),
         f"{n}x{n} @ ({n // 2}x{n})ᵀ + b, gelu_tanh bf16", "tensor"),
        ("matmul_decode_linear", matmul_kernel,
         lambda: ((rand(16, n), rand(n, n), None, "none", False, True), None), f"16x{n} @ ({n}x{n})ᵀ bf16", "hbm"),
        ("attention_causal", attention_kernel, attention_causal, f"1x1x{s}x{d} causal bf16", "causal"),
        ("attention_decode_gqa", attention_kernel, attention_decode, f"q 1x32x1x{d}, kv 1x8x{s}x{d} bf16", "hbm"),
        ("attention_backward_causal", attention_backward_kernel, attention_backward, f"1x1x{s}x{d} causal bf16",
         "causal"),
        ("softmax", softmax_kernel, lambda: ((x(),), None), f"{n}x{n} bf16", "hbm"),
        ("log_softmax", log_softmax_kernel, lambda: ((x(),), None), f"{n}x{n} bf16", "hbm"),
        ("rmsnorm", rmsnorm_kernel, lambda: ((x(), rand(n)), None), f"{n}x{n} bf16", "hbm"),
        ("layernorm", layernorm_kernel, lambda: ((x(), rand(n), rand(n)), None), f"{n}x{n} bf16", "hbm"),
        ("silu", activation_kernel, lambda: ((x(), "silu"), None), f"{n}x{n} bf16", "hbm"),
        ("silu_mul", gated_activation_kernel, lambda: ((x(), x(), "silu"), None), f"{n}x{n} bf16", "hbm"),
        ("transpose", transpose_kernel, lambda: ((x(),), None), f"{n}x{n} bf16", "hbm"),
        ("rope", rope_kernel, lambda: ((rand(1, 32, n, d), rand(1, n, d), rand(1, n, d)), None),
         f"1x32x{n}x{d} bf16", "hbm"),
        ("embedding", embedding_kernel,
         lambda: ((torch.randint(0, vocab, (n,), dtype=torch.int32), rand(vocab, n)), None),
         f"{n} ids, table {vocab}x{n} bf16", "hbm"),
        ("embedding_backward", embedding_backward_kernel, embedding_backward,
         f"{n} ids x {n // 4} bf16 into {rows} rows", "tensor"),
        ("cross_entropy", cross_entropy_kernel,
         lambda: ((rand(n, vocab), torch.randint(0, vocab, (n,), dtype=torch.int32)), None),
         f"{n}x{vocab} bf16", "hbm"),
        ("cross_entropy_loss", cross_entropy_loss_kernel,
         lambda: ((rand(n, vocab), torch.randint(0, vocab, (n,), dtype=torch.int32), -100, True), None),
         f"{n}x{vocab} bf16, mean", "hbm"),
        ("cross_entropy_backward", cross_entropy_backward_kernel, cross_entropy_bwd, f"{n}x{vocab} bf16", "hbm"),
    ]


def run(name, kernel, make, shape, metric):
    args, flops = make()
    start = time.perf_counter()
    _, profile = kernel.profile(*args)
    wall = time.perf_counter() - start
    if metric == "tensor":
        figure = profile.tensor_utilisation
    elif metric == "causal":
        figure = flops / (PEAK_BF16_FLOPS_PER_NS * profile.estimated_ns)
    else:
        figure = profile.hbm_roofline_fraction
    return {
        "kernel": name,
        "shape": shape,
        "estimated_us": round(profile.estimated_ns / 1e3, 2),
        "perfect_overlap_us": round(profile.perfect_overlap_ns / 1e3, 2),
        "serial_us": round(profile.serial_ns / 1e3, 2),
        "metric": {"tensor": "TensorE utilisation", "causal": "TensorE util. (causal FLOPs)",
                   "hbm": "HBM roofline"}[metric],
        "value": round(figure, 4),
        "bottleneck": profile.bottleneck,
        "engine_busy_us": {e: round(t / 1e3, 2) for e, t in profile.engine_busy_ns.items()},
        "interpreter_wall_s": round(wall, 2),
        "target": profile.target,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--only", action="append", default=[], help="run only these kernels (repeatable)")
    parser.add_argument("--quick", action="store_true", help="small shapes: a smoke run of every kernel")
    opts = parser.parse_args()
    rows = [run(*case) for case in cases(opts.quick) if not opts.only or case[0] in opts.only]
    if opts.json:
        print(json.dumps({"estimated": True, "target": "trn2", "results": rows}, indent=2))
        return
    print("NKI kernel library on trn2 — ESTIMATED by the calibrated cost model, 1 NeuronCore")
    print(f"{'kernel':<27} {'shape':<44} {'est. us':>9}  {'figure':<34} {'bound by':<8} {'wall s':>7}")
    for r in rows:
        figure = f"{r['value']:.1%} {r['metric']}"
        print(f"{r['kernel']:<27} {r['shape']:<44} {r['estimated_us']:>9.1f}  {figure:<34} {r['bottleneck']:<8} "
              f"{r['interpreter_wall_s']:>7.1f}")


if __name__ == "__main__":
    main()
