"""How fast the CPU NKI interpreter runs real NKI 0.6 kernels, and what the cost model estimates for them.

Two kernels, written here in NKI 0.6 exactly as they would be for a Trainium:

* ``matmul``: C = A @ B, 1024 × 1024 × 1024 bf16 (A given K-major as ``a_t = A.T``, the layout TensorE wants).
  B stays resident in SBUF; A^T streams in 512-column strips, the next strip loaded before the current one is
  multiplied (double buffering); each 128 × 512 output tile accumulates over K in one PSUM bank (fp32), goes to
  SBUF through ``tensor_copy`` (cast to bf16) and leaves with one DMA per 128-row strip.
* ``softmax``: row softmax of a 4096 × 4096 fp32 matrix, 128 rows at a time: ``tensor_reduce`` max (negated),
  ``activation`` exp with that bias and an add-reduction of the row sums, ``reciprocal``, ``tensor_scalar``.

For each kernel it prints the interpreter's wall time, torch eager's wall time on the same math (best of
``--repeat`` runs after a warm-up), their ratio, the largest deviation from eager, and the cost model's
**estimated** device time (perfect-overlap lower bound and serial upper bound), TensorE utilisation and fraction
of the HBM roofline. The issue's goal for the matmul is an interpreter wall time ≤ 10× eager: a figure, not a test.
``--json`` prints one JSON document instead of the table; ``--cprofile`` adds the interpreter's hottest functions.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch

from neuron_dynamo import nki

nki.make_importable()

import nki.isa as nisa  # noqa: E402  (the interpreter registers `nki` in make_importable)
import nki.language as nl  # noqa: E402

PMAX = 128  # partitions
FMAX = 512  # fp32 columns of one PSUM bank
A_STRIP = 512  # columns of A^T per streamed strip


@nki.jit
def matmul_kernel(a_t, b):
    """C[M, N] = a_t.T @ b for a_t [K, M], b [K, N]; K and M multiples of 128, N a multiple of 512."""
    k_size, m_size = a_t.shape
    n_size = b.shape[1]
    c = nl.ndarray((m_size, n_size), dtype=b.dtype, buffer=nl.shared_hbm)
    k_tiles = k_size // PMAX

    b_tiles = []  # resident: K-major [128, N] tiles
    for k in range(k_tiles):
        tile = nl.ndarray((PMAX, n_size), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=b[k * PMAX : (k + 1) * PMAX, 0:n_size])
        b_tiles.append(tile)

    def load_strip(m0):
        strip = []
        for k in range(k_tiles):
            tile = nl.ndarray((PMAX, A_STRIP), dtype=a_t.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile, src=a_t[k * PMAX : (k + 1) * PMAX, m0 : m0 + A_STRIP])
            strip.append(tile)
        return strip

    next_strip = load_strip(0)
    for m_strip in range(0, m_size, A_STRIP):
        strip = next_strip
        if m_strip + A_STRIP < m_size:  # prefetch: DMA of the next strip overlaps this strip's matmuls
            next_strip = load_strip(m_strip + A_STRIP)
        for mi in range(A_STRIP // PMAX):
            out = nl.ndarray((PMAX, n_size), dtype=c.dtype, buffer=nl.sbuf)
            for n0 in range(0, n_size, FMAX):
                acc = nl.ndarray((PMAX, FMAX), dtype=nl.float32, buffer=nl.psum)
                for k in range(k_tiles):
                    nisa.nc_matmul(
                        dst=acc,
                        stationary=strip[k][0:PMAX, mi * PMAX : (mi + 1) * PMAX],
                        moving=b_tiles[k][0:PMAX, n0 : n0 + FMAX],
                        accumulate=k > 0,
                    )
                nisa.tensor_copy(dst=out[0:PMAX, n0 : n0 + FMAX], src=acc)
            m0 = m_strip + mi * PMAX
            nisa.dma_copy(dst=c[m0 : m0 + PMAX, 0:n_size], src=out)
    return c


@nki.jit
def softmax_kernel(x):
    """Row softmax of x [R, C] (R a multiple of 128), fp32 math."""
    rows, cols = x.shape
    y = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, rows, PMAX):
        tile = nl.ndarray((PMAX, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x[r0 : r0 + PMAX, 0:cols])
        neg_max = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=tile, axis=1, negate=True, keepdims=True)
        exp = nl.ndarray((PMAX, cols), dtype=nl.float32, buffer=nl.sbuf)
        row_sum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(
            dst=exp,
            op=nl.exp,
            data=tile,
            bias=neg_max,
            reduce_op=nl.add,
            reduce_res=row_sum,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )
        inv_sum = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv_sum, data=row_sum)
        out = nl.ndarray((PMAX, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=out, data=exp, op0=nl.multiply, operand0=inv_sum)
        nisa.dma_copy(dst=y[r0 : r0 + PMAX, 0:cols], src=out)
    return y


def _matmul_case(size: int):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(torch.bfloat16)
    b = torch.randn(size, size, generator=gen).to(torch.bfloat16)
    a_t = a.T.contiguous()
    return matmul_kernel, (a_t, b), lambda a_t, b: a_t.T @ b


def _softmax_case(size: int):
    x = torch.randn(size, size, generator=torch.Generator().manual_seed(0))
    return softmax_kernel, (x,), lambda x: torch.softmax(x, dim=-1)


CASES = {
    "matmul": (_matmul_case, 1024, "tiled matmul {n}x{n}x{n} bf16"),
    "softmax": (_softmax_case, 4096, "softmax {n}x{n} fp32"),
}


def _best_of(fn, repeat: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _hot_functions(fn, top: int) -> list[dict]:
    """The interpreter's `top` functions by cumulative time, for finding where its wall time goes."""
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = []
    for (path, line, name), (_, calls, own, cumulative, _) in stats.stats.items():
        rows.append(
            {
                "function": f"{os.path.basename(path)}:{line}({name})",
                "calls": calls,
                "own_s": own,
                "cumulative_s": cumulative,
            }
        )
    return sorted(rows, key=lambda r: r["own_s"], reverse=True)[:top]


def run_case(name: str, size: int, repeat: int, cprofile_top: int):
    """(the JSON row of one kernel, its estimated `Profile`)."""
    make, _, label = CASES[name]
    kernel, args, eager = make(size)
    expected = eager(*args)
    result, profile = nki.simulate(kernel, profile=True)(*args)
    max_abs_err = (result.float() - expected.float()).abs().max().item()
    interp_s = _best_of(lambda: kernel(*args), repeat)
    eager_s = _best_of(lambda: eager(*args), repeat)
    # The interpreter must accumulate in fp32 as PSUM does, while eager bf16 may use the CPU's bf16 matrix units
    # (AMX): eager on fp32 copies of the operands is the same arithmetic, so it is timed too.
    args_f32 = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    eager_f32_s = _best_of(lambda: eager(*args_f32), repeat)
    row = {
        "kernel": name,
        "label": label.format(n=size),
        "interpreter_s": interp_s,
        "eager_s": eager_s,
        "slowdown_vs_eager": interp_s / eager_s,
        "eager_fp32_s": eager_f32_s,
        "slowdown_vs_eager_fp32": interp_s / eager_f32_s,
        "max_abs_err_vs_eager": max_abs_err,
        "instructions": sum(profile.instructions.values()),
        "estimated_device_us": profile.estimated_ns / 1e3,
        "estimated_serial_us": profile.serial_ns / 1e3,
        "estimated_tensor_utilisation": profile.tensor_utilisation,
        "estimated_hbm_roofline_fraction": profile.hbm_roofline_fraction,
        "estimated_bottleneck": profile.bottleneck,
        "profile": profile.to_dict(),
    }
    if cprofile_top:
        row["interpreter_hot_functions"] = _hot_functions(lambda: kernel(*args), cprofile_top)
    return row, profile


def _table(rows: list[dict], target: str, torch_threads: int) -> str:
    lines = [
        f"NKI interpreter vs torch eager (CPU, {torch_threads} torch threads); estimated device time on {target}",
        f"{'kernel':<30} {'interp ms':>10} {'eager ms':>9} {'ratio':>7} {'eager fp32 ms':>14} {'ratio':>7} "
        f"{'max err':>9} {'instrs':>7} "
        f"{'est. us':>9} {'serial us':>10} {'TensorE':>8} {'HBM':>6} {'bound':>7}",
    ]
    for r in rows:
        lines.append(
            f"{r['label']:<30} {r['interpreter_s'] * 1e3:>10.1f} {r['eager_s'] * 1e3:>9.1f} "
            f"{r['slowdown_vs_eager']:>6.1f}x {r['eager_fp32_s'] * 1e3:>14.1f} {r['slowdown_vs_eager_fp32']:>6.1f}x "
            f"{r['max_abs_err_vs_eager']:>9.2e} {r['instructions']:>7} "
            f"{r['estimated_device_us']:>9.1f} {r['estimated_serial_us']:>10.1f} "
            f"{r['estimated_tensor_utilisation']:>8.1%} {r['estimated_hbm_roofline_fraction']:>6.1%} "
            f"{r['estimated_bottleneck']:>7}"
        )
    for r in rows:
        for hot in r.get("interpreter_hot_functions", []):
            lines.append(
                f"  {r['kernel']}: {hot['function']:<60} calls {hot['calls']:>7} own {hot['own_s']:.3f} s "
                f"cumulative {hot['cumulative_s']:.3f} s"
            )
    lines.append(
        "'est.'/'serial' are the cost model's estimated device time (perfect overlap / no overlap); "
        "TensorE and HBM are estimated fractions of peak."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument("--kernels", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per measurement (best is kept)")
    parser.add_argument(
        "--target",
        choices=["trn1", "trn2", "trn3"],
        default=None,
        help="target of the estimates (sets NEURON_PLATFORM_TARGET_OVERRIDE; default: that variable, else trn2)",
    )
    parser.add_argument(
        "--size",
        type=int,
        default=None,
        help="override the problem size (matmul: multiple of 512, softmax: multiple of 128)",
    )
    parser.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="TOP",
        help="also list the interpreter's TOP hottest functions (cProfile, by own time)",
    )
    args = parser.parse_args(argv)

    if args.target:
        os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = args.target
    results = [run_case(name, args.size or CASES[name][1], args.repeat, args.cprofile) for name in args.kernels]
    rows = [row for row, _ in results]
    target = rows[0]["profile"]["target"] if rows else ""
    if args.json:
        doc = {
            "benchmark": "nki_interpreter",
            "target": target,
            "torch_threads": torch.get_num_threads(),
            "results": rows,
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print(_table(rows, target, torch.get_num_threads()))
        for row, profile in results:
            print(f"\n{row['label']}:\n{profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
