"""Backend options: one frozen dataclass, validated once, before anything is compiled.

Options reach the backend as `torch.compile(model, backend="neuron", options={...})`. Each field carries its own
help text and (where it applies) its allowed values in the field metadata, so validation, environment overrides and
the README's options table all come from this one definition. Later issues add a field here and nothing else.

Precedence: field default < environment variable `NEURON_DYNAMO_<NAME>` < `options={...}`. The environment sets the
defaults of a whole run (CI, a shell), the code states what a particular call needs.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import typing
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from neuron_dynamo.errors import NeuronDynamoError

ENV_PREFIX = "NEURON_DYNAMO_"

# Modes torch.compile may forward to a backend. They tune Inductor/CUDA graphs; here they are accepted and ignored
# (Transformers' CompileConfig sends "reduce-overhead" by default).
TORCH_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class OptionError(NeuronDynamoError, ValueError):
    """An option name or value the backend does not accept."""


def _option(default: Any, help: str, choices: tuple | None = None, minimum: int | None = None) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum})


@dataclasses.dataclass(frozen=True)
class Options:
    target: str = _option(
        "auto",
        "Where lowered regions run. `reference`: the region's aten graph executed by torch (a debugging aid); "
        "`simulator`: NKI kernels on the CPU interpreter; `neuron`: TorchNeuron on `neuron`-device tensors; "
        "`auto`: `neuron` for inputs on the `neuron` device, else `simulator`.",
        choices=("auto", "neuron", "simulator", "reference"),
    )
    fallback: str = _option(
        "eager",
        "What to do with an op the target cannot run: `eager` runs it with PyTorch and reports it; `error` raises, "
        "naming the op and the reason (a strict mode for CI).",
        choices=("eager", "error"),
    )
    min_region_size: int = _option(
        1, "Regions with fewer compute ops than this run eagerly (each region costs a kernel launch).", minimum=1
    )
    eager_ops: tuple[str, ...] = _option(
        (),
        "Op names forced to run eagerly, e.g. `aten.mm` (every overload) or `aten.mm.default` (one overload). "
        "From the environment: a comma-separated list.",
    )
    bucketing: bool = _option(
        True,
        "Serve dynamic sizes from a few static programs: inputs are padded up to a bucket and outputs sliced back, "
        "where the padding proof (passes/padding.py) shows no real output can change; elsewhere the graph runs at "
        "exact shapes and the reason is counted.",
    )
    bucket_policy: str = _option(
        "multiple",
        "How a dynamic size is rounded up: `multiple` (of `bucket_multiple`), `pow2` (next power of two) or `exact` "
        "(no padding, one program per size).",
        choices=("multiple", "pow2", "exact"),
    )
    bucket_multiple: int = _option(128, "The step of the `multiple` bucket policy.", minimum=1)
    buckets: tuple[int, ...] = _option(
        (), "Explicit bucket sizes (replace bucket_policy): a size runs in the smallest bucket >= it."
    )
    bucket_dims: tuple[str, ...] = _option(
        (),
        "Per-dimension overrides `DIM=POLICY`, DIM being the input tensor dim where a dynamic size first appears "
        "(0: batch, 1: sequence for most models), POLICY `multiple`, `pow2`, `exact` or a multiple, e.g. `0=pow2`.",
    )
    max_bucket: int = _option(
        0, "The largest bucket (0: unbounded); a larger size raises, unless beyond_max_bucket='exact'.", minimum=0
    )
    beyond_max_bucket: str = _option(
        "error", "Sizes above max_bucket: `error` raises naming the fix, `exact` compiles them at their exact size.",
        choices=("error", "exact"),
    )
    cache: str = _option(
        "on",
        "The persistent compile cache: `on` reads and writes, `readonly` only reads (a shared cache), `off` "
        "compiles everything and touches no disk.",
        choices=("on", "off", "readonly"),
    )
    cache_dir: str = _option(
        "",
        "The compile cache directory (empty: `~/.cache/neuron_dynamo`). Created 0700. It must belong to you and be "
        "writable by no one else (see the threat model under Compile cache); otherwise programs run uncached and a "
        "warning names the fix.",
    )
    cache_tag: str = _option("", "A salt mixed into every cache key, to keep separate entries for the same graphs.")
    cache_max_mb: int = _option(
        0, "Size cap of the compile cache in MiB (0: unbounded); least recently used entries go first.", minimum=0
    )
    cache_failure_ttl: int = _option(
        3600, "Seconds a failed compile stays cached, so other processes do not retry it at once (0: never).",
        minimum=0,
    )
    retry_failed: bool = _option(False, "Compile again a program whose failure is still cached.")
    cache_lock_timeout: int = _option(
        30,
        "Seconds to wait for another process compiling the same program before compiling it too (a holder that "
        "died is detected at once; compiling twice is slower, never wrong).",
        minimum=0,
    )
    cache_trusted_keys: tuple[str, ...] = _option(
        (),
        "Key files of other users whose cache entries you trust, e.g. the CI account's for a shared read-only cache "
        "(your own key is always trusted). Each must be a file of yours, mode 0600. From the environment: a "
        "comma-separated list. See the threat model under Compile cache.",
    )
    device_mode: str = _option(
        "eager",
        "How target `neuron` runs a region on TorchNeuron: `eager` calls each NKI kernel as its TorchNeuron op (a NEFF "
        "per kernel signature, glue in TorchNeuron's eager mode); `graph` hands each region and bucket to "
        "TorchNeuron's compiler (one NEFF per region), falling back to `eager` if it refuses.",
        choices=("eager", "graph"),
    )
    lnc: int = _option(
        0, "Logical NeuronCore degree for target `neuron`, a cache-key fact (1 or 2; 0: NEURON_LOGICAL_NC_CONFIG, "
        "else 1, nki's default).", minimum=0,
    )

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            _check_field(field, getattr(self, field.name))

    @classmethod
    def names(cls) -> list[str]:
        return [field.name for field in dataclasses.fields(cls)]


@functools.cache
def _type_hints() -> dict[str, Any]:
    return typing.get_type_hints(Options)  # resolved once: the annotations are strings (postponed evaluation)


def _field_type(field: dataclasses.Field) -> Any:
    return _type_hints()[field.name]


def _check_field(field: dataclasses.Field, value: Any) -> None:
    expected = _field_type(field)
    if typing.get_origin(expected) is tuple:
        item_type = typing.get_args(expected)[0]
        if not isinstance(value, tuple) or not all(
            isinstance(item, item_type) and not isinstance(item, bool) for item in value
        ):
            items = "strings" if item_type is str else "integers"
            raise OptionError(f"option {field.name!r} must be a list of {items}, got {value!r}")
    elif expected is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise OptionError(f"option {field.name!r} must be an integer, got {value!r}")
    elif not isinstance(value, expected):
        raise OptionError(f"option {field.name!r} must be of type {expected.__name__}, got {value!r}")
    choices = field.metadata["choices"]
    if choices is not None and value not in choices:
        raise OptionError(f"option {field.name!r} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    minimum = field.metadata["minimum"]
    if minimum is not None and value < minimum:
        raise OptionError(f"option {field.name!r} must be at least {minimum}, got {value!r}")
    check = _VALUE_CHECKS.get(field.name)
    if check is not None:
        check(value)


def _check_lnc(value: int) -> None:
    # Not `choices=`: those would also change the options table (the help text already says "1 or 2; 0: ...").
    if value not in (0, 1, 2):
        raise OptionError(
            f"option 'lnc' must be 0, 1 or 2 (the logical NeuronCore degree; 0: NEURON_LOGICAL_NC_CONFIG, else 1), "
            f"got {value!r}"
        )


def _check_eager_ops(names: tuple[str, ...]) -> None:
    for name in names:
        if name in _KNOWN_OPS:
            continue
        problem = _op_name_problem(name)
        if problem is None:
            _KNOWN_OPS.add(name)  # only successes are remembered: a library imported later registers its ops then
        else:
            raise OptionError(
                f"eager_ops entry {name!r} {problem}; write an op as `namespace.op` (every overload, e.g. "
                "'aten.mm') or `namespace.op.overload` (one overload, e.g. 'aten.mm.default')"
            )


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KNOWN_OPS: set[str] = set()


def _op_name_problem(name: str) -> str | None:
    """None if `name` names a registered op (`ns.op` or `ns.op.overload`), else what is wrong with it.

    Only attribute look-ups on `torch.ops` (what Dynamo's graphs hold): nothing is imported.
    """
    parts = name.split(".")
    if len(parts) not in (2, 3) or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        if len(parts) == 1 and _IDENTIFIER.fullmatch(name):
            return "has no namespace" + (f" (did you mean 'aten.{name}'?)" if _lookup("aten", name) else "")
        return "is not an op name"
    if parts[0].startswith("__"):  # (ops may: aten.__and__)
        return "is not an op name"
    packet = _lookup(parts[0], parts[1])
    if packet is None:
        return (f"is not a registered op (no op {parts[1]!r} in torch.ops.{parts[0]}; an op of another library "
                "is known once that library is imported)")
    if len(parts) == 3 and parts[2] not in packet.overloads():
        overloads = ", ".join(repr(f"{parts[0]}.{parts[1]}.{overload}") for overload in packet.overloads())
        return f"names no overload of {parts[0]}.{parts[1]} (its overloads: {overloads})"
    return None


def _lookup(namespace: str, op: str) -> Any:
    """The `torch.ops.<namespace>.<op>` overload packet, or None."""
    import torch

    try:
        packet = getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return None
    return packet if isinstance(packet, torch._ops.OpOverloadPacket) else None


def _check_cache_dir(value: str) -> None:
    if "\0" in value:  # the OS would refuse it at the first use, after the graph was traced: refuse it now
        raise OptionError(f"option 'cache_dir' contains a NUL byte ({value!r}); give a directory path without one")


_VALUE_CHECKS: dict[str, Callable[[Any], None]] = {
    "lnc": _check_lnc, "eager_ops": _check_eager_ops, "cache_dir": _check_cache_dir}

# NEURON_DYNAMO_* variables that are not options but are read elsewhere (logging, the interpreter's replay switch)
OTHER_VARIABLES = frozenset({"NEURON_DYNAMO_LOG", "NEURON_DYNAMO_NKI_REPLAY"})
_warned_variables: set[str] = set()


def _warn_unknown_variables(environ: Mapping[str, str]) -> None:
    """A misspelt NEURON_DYNAMO_* variable would be ignored without a word: say so once, naming the closest."""
    known = {ENV_PREFIX + name.upper() for name in Options.names()} | OTHER_VARIABLES
    for name in environ:
        if name.startswith(ENV_PREFIX) and name not in known and name not in _warned_variables:
            _warned_variables.add(name)
            closest = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {closest[0]}?" if closest else f"; known ones: {', '.join(sorted(known))}"
            warnings.warn(f"the environment variable {name} is not a neuron-dynamo setting and is ignored{hint}",
                          UserWarning, stacklevel=3)


def _coerce(field: dataclasses.Field, value: Any, source: str) -> Any:
    """Turn a user value (or an environment string) into the field's type; the type check comes later."""
    expected = _field_type(field)
    if typing.get_origin(expected) is tuple:
        if isinstance(value, str):
            items = tuple(item.strip() for item in value.split(",") if item.strip())
            if typing.get_args(expected)[0] is int:
                try:
                    return tuple(int(item) for item in items)
                except ValueError:
                    raise OptionError(f"{source} must be a comma-separated list of integers, got {value!r}") from None
            return items
        if isinstance(value, (list, tuple, set, frozenset)):
            return tuple(os.fspath(item) if isinstance(item, os.PathLike) else item for item in value)
        return value
    if expected is str and isinstance(value, os.PathLike):  # cache_dir=Path(...)
        return os.fspath(value)
    if isinstance(value, str) and expected is int:
        try:
            return int(value)
        except ValueError:
            raise OptionError(f"{source} must be an integer, got {value!r}") from None
    if isinstance(value, str) and expected is bool:
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise OptionError(f"{source} must be a boolean (1/0, true/false), got {value!r}")
    return value


def resolve_options(
    options: Mapping[str, Any] | None = None, mode: str | None = None, environ: Mapping[str, str] | None = None
) -> Options:
    """Validate `options` (and `mode`) into an `Options`, applying `NEURON_DYNAMO_<NAME>` environment overrides."""
    if mode is not None and mode not in TORCH_COMPILE_MODES:
        raise OptionError(f"mode={mode!r} is not a torch.compile mode; use one of {', '.join(TORCH_COMPILE_MODES)}")
    if options is not None and not isinstance(options, Mapping):
        raise OptionError(_not_a_mapping(options))
    options = dict(options or {})
    valid = Options.names()
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise OptionError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for backend 'neuron'; valid options: {', '.join(valid)}"
        )
    environ = os.environ if environ is None else environ
    _warn_unknown_variables(environ)
    values = {}
    for field in dataclasses.fields(Options):
        env_name = ENV_PREFIX + field.name.upper()
        if field.name in options:
            values[field.name] = _coerce(field, options[field.name], f"option {field.name!r}")
        elif env_name in environ:  # surrounding whitespace is a shell accident, never part of a value
            values[field.name] = _coerce(field, environ[env_name].strip(), f"environment variable {env_name}")
            try:
                _check_field(field, values[field.name])
            except OptionError as exc:
                raise OptionError(f"{exc} (from the environment variable {env_name}: correct or unset it)") from None
    return Options(**values)


def _not_a_mapping(options: Any) -> str:
    example = "{'target': 'reference'}"
    if isinstance(options, str) and "=" in options:  # options="target=reference, fallback=error"
        pairs = [part.partition("=") for part in re.split(r"[,\s]+", options.strip()) if part]
        if all(sep and name for name, sep, _ in pairs):
            example = "{" + ", ".join(f"{name.strip()!r}: {value.strip()!r}" for name, _, value in pairs) + "}"
    return (
        f"options must be a dict like {example}, got {type(options).__name__} {options!r}: write "
        f"torch.compile(model, backend='neuron', options={example})"
    )


def options_table() -> str:
    """The options as a Markdown table (for the README and `--help` texts)."""
    rows = ["| option | default | values | environment | meaning |", "|---|---|---|---|---|"]
    for field in dataclasses.fields(Options):
        choices = field.metadata["choices"]
        values = " \\| ".join(f"`{choice}`" for choice in choices) if choices else _field_type(field).__name__
        if typing.get_origin(_field_type(field)) is tuple:
            values = f"list of {typing.get_args(_field_type(field))[0].__name__}"
        rows.append(
            f"| `{field.name}` | `{field.default!r}` | {values} | `{ENV_PREFIX}{field.name.upper()}` "
            f"| {field.metadata['help']} |"
        )
    return "\n".join(rows)
