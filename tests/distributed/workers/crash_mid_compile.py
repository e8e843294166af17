"""A job that crashes mid-compile: rank 1 kills itself (SIGKILL) while it holds the compile lock of a program; rank 0
waits at a barrier until torchrun tears the job down. The lock file stays on disk; its flock dies with the rank."""

import os
import signal

import torch
import torch.distributed as dist

import neuron_dynamo.compiler


def main() -> None:
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        dist.barrier()
        return
    neuron_dynamo.compiler._build_static = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
    torch.compile(torch.sin, backend="neuron")(torch.randn(4))


if __name__ == "__main__":
    main()
