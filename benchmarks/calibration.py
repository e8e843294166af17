"""The cost model's calibrated estimate against every device time AWS has published for NKI, and the kernel
library's figures re-stated with it.

Published figures (each row cites its page):

* AWS NKI tutorial "Matrix multiplication", Neuron 2.23, Trn1, bf16 ``[4096, 8192] @ [8192, 8192]``: latency and
  HFU of the tiled, hoisted-load, free-dimension-blocked and fully optimised kernels (our own NKI 0.6 versions in
  `matmul_tutorial_kernels.py`). Full size takes a few minutes in the interpreter; ``--scale 2`` halves M, N, K
  (the published figures are then scaled by 1/8, an approximation the output says).
* ``nki_perf_guide.rst``: initiation interval of back-to-back dependent one-element ScalarE instructions, NC-v2.
* ``nki-dma-overview.rst``: one DMA engine's busy time for A[4, 4096] bf16 HBM -> SBUF on trn2.
* ``fused_mamba.rst``: measured latencies of the Mamba tutorial kernels (listed, not predicted: those kernels are
  not in this repository).

    python benchmarks/calibration.py [--json] [--scale 2] [--skip-library] [--quick-library]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import pathlib
import sys

import torch

from neuron_dynamo import nki

nki.make_importable()

import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

from neuron_dynamo.nki.costmodel import Instruction, Timeline, resolve_target  # noqa: E402

HERE = pathlib.Path(__file__).parent
SDK = "https://awsdocs-neuron.readthedocs-hosted.com/en"
MATMUL_PAGE = f"{SDK}/v2.23.0/general/nki/tutorials/matrix_multiplication.html"
PERF_GUIDE = f"{SDK}/latest/nki/deep-dives/nki_perf_guide.html"
DMA_OVERVIEW = f"{SDK}/latest/nki/get-started/about/nki-dma-overview.html"
MAMBA_PAGE = f"{SDK}/latest/nki/guides/tutorials/fused_mamba.html"

MATMUL_PUBLISHED = {  # kernel -> (latency ms, HFU), Trn1, table "Latency (ms) / HFU (%)"
    "tiled": (51.80, 0.1098),
    "hoisted": (42.96, 0.1324),
    "block_free": (22.07, 0.2651),
    "fully_optimized": (6.97, 0.8524),
}
MAMBA_PUBLISHED = [  # (what, ms), trn1 (the tutorial's profiles)
    ("mamba_v1 [1, 256, 512], state 16", 0.17293),
    ("mamba_v2 seq_len 512", 1.6), ("mamba_v2 seq_len 4096", 17.6),
    ("mamba_v3 seq_len 512", 1.6), ("mamba_v3 seq_len 4096", 13.3),
]


@contextlib.contextmanager
def _target(name):
    """Run kernels on `name` (the documented NEURON_PLATFORM_TARGET_OVERRIDE switch)."""
    old = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")
    os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = name
    try:
        yield
    finally:
        if old is None:
            del os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"]
        else:
            os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = old


def _load_module(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def matmul_rows(scale: int, target: str = "trn1") -> list[dict]:
    """The four tutorial kernels at [4096, 8192] @ [8192, 8192] / scale on `target`."""
    kernels = _load_module("matmul_tutorial_kernels")
    m, k, n = 4096 // scale, 8192 // scale, 8192 // scale
    lhs_t, rhs = torch.randn(k, m).to(torch.bfloat16), torch.randn(k, n).to(torch.bfloat16)
    rows = []
    for name, (ms, hfu) in MATMUL_PUBLISHED.items():
        with _target(target):
            _, prof = getattr(kernels, name).profile(lhs_t, rhs)
        published = ms / scale**3
        rows.append({
            "figure": f"matmul tutorial {name} latency, [{m}, {k}] @ [{k}, {n}] bf16",
            "target": target, "unit": "ms", "published": round(published, 4),
            "published_note": "" if scale == 1 else f"published full-size figure / {scale ** 3} (approximation)",
            "predicted": round(prof.estimated_ns / 1e6, 4),
            "perfect_overlap": round(prof.perfect_overlap_ns / 1e6, 4),
            "serial": round(prof.serial_ns / 1e6, 4),
            "error": round(prof.estimated_ns / 1e6 / published - 1, 4),
            "predicted_tensor_utilisation": round(prof.tensor_utilisation, 4), "published_hfu": hfu,
            "source": MATMUL_PAGE,
        })
    return rows


def _dependent_chain(x, n_instr):
    """n_instr one-element ScalarE activations, each reading the previous one's output."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    for _ in range(n_instr // 2):
        nisa.activation(dst=b, op=nl.copy, data=a)
        nisa.activation(dst=a, op=nl.copy, data=b)
    nisa.dma_copy(dst=out, src=a)
    return out


def dependent_ii_row(n_instr: int = 400) -> dict:
    """Initiation interval of a dependent chain: (chain - chain of 2) / (n_instr - 2)."""
    x = torch.randn(128, 1)
    with _target("trn1"):
        long = nki.jit(_dependent_chain).profile(x, n_instr)[1].schedule_ns
        short = nki.jit(_dependent_chain).profile(x, 2)[1].schedule_ns
    ii = (long - short) / (n_instr - 2)
    return {"figure": "II of back-to-back dependent one-element ScalarE instructions", "target": "trn1",
            "unit": "ns", "published": 189.0, "predicted": round(ii, 1), "error": round(ii / 189.0 - 1, 4),
            "source": PERF_GUIDE}


def dma_engine_row() -> dict:
    """One DMA engine's time for A[4, 4096] bf16 HBM -> SBUF (4 partitions: one engine), trn2."""
    instr = Instruction(op="dma_copy", engine="dma", partitions=4, free_elems=4096, in_dtypes=("bfloat16",),
                        out_dtype="bfloat16", in_buffers=("hbm",), out_buffer="sbuf", dma_bytes=4 * 4096 * 2)
    engines, ns = Timeline(resolve_target("trn2"))._dma_engine_time(instr)
    return {"figure": f"DMA engine busy time, A[4, 4096] bf16 HBM -> SBUF ({engines} engine)", "target": "trn2",
            "unit": "ns", "published": 1416.0, "predicted": round(ns, 1), "error": round(ns / 1416.0 - 1, 4),
            "source": DMA_OVERVIEW}


def mamba_rows() -> list[dict]:
    return [{"figure": f"fused Mamba tutorial {what}", "target": "trn1", "unit": "ms", "published": ms,
             "predicted": None, "error": None, "source": MAMBA_PAGE,
             "published_note": "not predicted: AWS's Mamba kernels are not in this repository"}
            for what, ms in MAMBA_PUBLISHED]


def library_rows(quick: bool) -> list[dict]:
    bench = _load_module("kernel_library")
    return [bench.run(*case) for case in bench.cases(quick)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    parser.add_argument("--scale", type=int, default=1, choices=(1, 2),
                        help="divide the matmul tutorial's M, N, K by this (2 at most: the optimised kernel's blocks)")
    parser.add_argument("--skip-library", action="store_true", help="do not re-state the kernel library")
    parser.add_argument("--quick-library", action="store_true", help="kernel library at small shapes")
    opts = parser.parse_args()
    published = [*matmul_rows(opts.scale), dependent_ii_row(), dma_engine_row(), *mamba_rows()]
    library = [] if opts.skip_library else library_rows(opts.quick_library)
    if opts.json:
        print(json.dumps({"estimated": True, "published": published, "library": library}, indent=2))
        return
    print("Calibrated cost model vs AWS's published measurements (predictions are ESTIMATES)")
    print(f"{'figure':<70} {'target':<6} {'published':>10} {'predicted':>10} {'error':>7}")
    for r in published:
        predicted = "-" if r["predicted"] is None else f"{r['predicted']:.4g}"
        error = "-" if r["error"] is None else f"{r['error']:+.0%}"
        print(f"{r['figure']:<70} {r['target']:<6} {r['published']:>8.4g}{r['unit']:>2} {predicted:>10} {error:>7}")
    for r in published:
        print(f"  {r['figure']}: {r['source']} {r.get('published_note', '')}")
    if library:
        print("\nKernel library on trn2, calibrated estimate (perfect-overlap and serial bounds in us)")
        for r in library:
            print(f"{r['kernel']:<27} {r['estimated_us']:>10.1f} us  [{r['perfect_overlap_us']:.1f}, "
                  f"{r['serial_us']:.1f}]  {r['value']:.1%} {r['metric']}")


if __name__ == "__main__":
    main()
