"""Layout-contract checks: a kernel called outside its documented contract fails before it runs any
instruction, with a message that names the problem and the fix (instead of a wrong answer or an obscure
hardware-rule error deep inside the tiling)."""

from neuron_dynamo.errors import NeuronDynamoError

FLOAT_DTYPES = ("float32", "bfloat16", "float16")


class KernelContractError(NeuronDynamoError):
    """A library kernel was called with arguments outside its documented layout contract."""


def require(condition, kernel, message):
    """Raise KernelContractError('<kernel>: <message>') unless `condition` holds."""
    if not condition:
        raise KernelContractError(f"{kernel}: {message}")


def require_float(kernel, name, t):
    require(str(t.dtype) in FLOAT_DTYPES, kernel,
            f"{name} has dtype {t.dtype}; the kernel takes {', '.join(FLOAT_DTYPES)} (cast it first)")


def require_vector(kernel, name, t, size):
    require(tuple(t.shape) == (size,), kernel, f"{name} must have shape ({size},), got {tuple(t.shape)}")
