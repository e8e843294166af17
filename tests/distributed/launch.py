"""Launch a worker script under `torchrun` on CPU and collect what each rank reports.

Each test starts its own job: `--standalone` (a free rendezvous port, so parallel jobs never collide), gloo,
one thread per rank, a timeout that kills the whole job. A worker reports by calling `report(...)`, which writes
one JSON file per rank into the directory the launcher passes in `DIST_TEST_OUT`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"


class TorchrunFailed(AssertionError):
    """A torchrun job exited non-zero or timed out; the message carries its output."""


def torchrun(worker: str, out_dir: Path, *args: str, nproc: int = 2, timeout: float = 120,
             env: dict[str, str] | None = None) -> list[dict]:
    """Run `workers/<worker>` on `nproc` ranks and return each rank's report, ordered by rank."""
    _job(worker, [str(WORKERS / worker), *args], out_dir, nproc, timeout, env)
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(nproc)]


def torchrun_module(module: str, out_dir: Path, *args: str, nproc: int = 2, timeout: float = 120,
                    env: dict[str, str] | None = None) -> str:
    """Run `torchrun -m <module> args` on `nproc` ranks (a tool, as its user starts it); returns the job's output."""
    return _job(module, ["-m", module, *args], out_dir, nproc, timeout, env)


def _job(name: str, target: list[str], out_dir: Path, nproc: int, timeout: float, env: dict[str, str] | None) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "--max-restarts=0", "--monitor-interval=0.2", *target]
    job_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "DIST_TEST_OUT": str(out_dir), **(env or {})}
    process = subprocess.Popen(command, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the job's own process group: torchrun and its ranks
        output, _ = process.communicate()
        raise TorchrunFailed(f"torchrun {name} timed out after {timeout} s:\n{output[-6000:]}") from None
    (out_dir / "torchrun.log").write_text(output)
    if process.returncode != 0:
        errors = "\n".join(line for line in output.splitlines() if "Error" in line)[-4000:]
        raise TorchrunFailed(f"torchrun {name} exited {process.returncode} (full output: {out_dir / 'torchrun.log'})"
                             f":\n{errors}\n...\n{output[-3000:]}")
    return output


def report(**values) -> None:
    """Called by a worker: this rank's results, as JSON."""
    out = Path(os.environ["DIST_TEST_OUT"])
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(values))
