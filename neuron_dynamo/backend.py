"""The torch.compile backend: `torch.compile(model, backend="neuron")` (or "neuron_dynamo") lands here.

Registration is only through the `torch_dynamo_backends` entry points (pyproject.toml); importing this module
registers nothing and changes no Dynamo config. Each Dynamo graph goes through AOTAutograd, and its forward,
backward and inference graphs all go through `compile_graph`.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd

from neuron_dynamo import counters
from neuron_dynamo.bucket_dispatch import bucket_config
from neuron_dynamo.compiler import ASKED_FOR, compile_graph, next_graph_name
from neuron_dynamo.errors import NeuronDynamoError
from neuron_dynamo.options import OptionError, resolve_options
from neuron_dynamo.passes.decompositions import decomposition_table
from neuron_dynamo.toolchain import nki_toolchain_info, resolve_target

log = logging.getLogger("neuron_dynamo.backend")

# Raised while AOTAutograd traces a graph whose shapes depend on data (`narrow` with a tensor start calls .item()):
# Dynamo answers them with a graph break, as it does for its own backends; they are not the backend's failures.
DYNAMO_SIGNALS = (
    torch._dynamo.exc.TorchDynamoException,
    torch._subclasses.fake_tensor.DataDependentOutputException,
    torch._subclasses.fake_tensor.DynamicOutputShapeException,
)

BACKEND_NAMES = ("neuron", "neuron_dynamo")
OUR_ENTRY_POINT = "neuron_dynamo.backend:neuron_backend"
LOG_ENV = "NEURON_DYNAMO_LOG"
_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def neuron_backend(
    gm: fx.GraphModule, example_inputs: Sequence[Any], *, options: dict[str, Any] | None = None,
    mode: str | None = None, **unexpected: Any,
) -> Callable[..., Any]:
    """Compile one Dynamo graph. Options are validated, and the target resolved, before anything is traced."""
    if unexpected:
        raise OptionError(
            f"torch.compile passed {', '.join(sorted(unexpected))} to backend 'neuron'; "
            "only options={...} and mode= are accepted"
        )
    configure_logging()
    warn_if_name_shared()
    resolved = resolve_options(options, mode)
    resolve_target(resolved.target, resolved, example_inputs)
    bucket_config(resolved)  # a malformed bucket policy fails here, before anything is traced
    counters.bump("dynamo_graphs")
    name = next_graph_name()
    log.debug("%s: Dynamo graph with %d inputs, options %s", name, len(example_inputs), resolved)

    def compiler(kind: str) -> Callable[[fx.GraphModule, Sequence[Any]], Any]:
        return functools.partial(compile_graph, options=resolved, name=name, kind=kind)

    try:
        return aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
            decompositions=decomposition_table(),
        )(gm, example_inputs)
    except (*ASKED_FOR, *DYNAMO_SIGNALS):
        raise  # raised on purpose (bad options, a size beyond max_bucket, fallback="error"), or Dynamo's own signals
    except Exception as exc:  # AOTAutograd or our compile failed where eager runs: the graph runs eagerly
        if resolved.fallback == "error":
            raise
        log.warning("%s: compiling the Dynamo graph failed, running it eagerly: %s: %s", name, type(exc).__name__,
                    str(exc).splitlines()[0][:300] if str(exc) else "")
        counters.bump("dynamo_graphs_eager")
        return gm.forward


@functools.cache
def configure_logging() -> None:
    """Honour NEURON_DYNAMO_LOG=info|debug by giving the `neuron_dynamo` logger a handler and that level.

    Only on explicit request, and only our own logger: without the variable, the user's logging setup rules.
    """
    value = os.environ.get(LOG_ENV, "").strip().lower()
    if not value:
        return
    if value not in _LOG_LEVELS:
        raise OptionError(f"{LOG_ENV}={value!r} is not a log level; use one of {', '.join(_LOG_LEVELS)}")
    logger = logging.getLogger("neuron_dynamo")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(name)s] %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(_LOG_LEVELS[value])


def _provider(entry_point: metadata.EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    return f"{dist.name if dist else '?'}: {entry_point.value}"


def _neuron_claims() -> tuple[list[metadata.EntryPoint], str | None]:
    """The entry points claiming `backend="neuron"`, and the one torch uses (`entry_points(...)[name]`: the first
    found in path order, so the order of the installs decides)."""
    claims = [ep for ep in metadata.entry_points(group="torch_dynamo_backends") if ep.name == "neuron"]
    if not claims:
        return claims, None
    loaded = torch._dynamo.lookup_backend("neuron")  # torch's own choice (it loads the winner's module)
    return claims, f"{loaded.__module__}:{loaded.__qualname__}"


@functools.cache
def warn_if_name_shared() -> None:
    """Once per process: when another package (AWS's TorchNeuron) also claims `neuron`, say which one torch took."""
    claims, resolves_to = _neuron_claims()
    if len({ep.value for ep in claims}) < 2:
        return
    winner = next((_provider(ep) for ep in claims if ep.value == resolves_to), resolves_to)
    others = ", ".join(_provider(ep) for ep in claims if ep.value != resolves_to)
    warnings.warn(
        f"backend='neuron' is claimed by more than one package; torch resolved it to {winner} (also claimed by "
        f"{others}), a choice that follows install order. backend='neuron_dynamo' always means neuron-dynamo; "
        "neuron_dynamo.backend_info() shows the resolution.", UserWarning, stacklevel=2)


def backend_info() -> dict[str, Any]:
    """Which provider `backend="neuron"` resolves to, this package's version, the target and the NKI toolchain.

    AWS's TorchNeuron also registers the name `neuron`; when two packages claim it, torch takes the first entry
    point without a warning, so this says which one won (`neuron_dynamo` always names this package). It never raises
    over a bad `NEURON_DYNAMO_*` option: `options_error` says what is wrong (None when the options are valid).
    """
    claims, resolves_to = _neuron_claims()
    nki = nki_toolchain_info()
    try:
        version = metadata.version("neuron-dynamo")
    except metadata.PackageNotFoundError:
        version = "unknown"
    try:  # a diagnostic: a bad NEURON_DYNAMO_* variable is reported here, not raised
        options, options_error = resolve_options(), None
    except OptionError as exc:
        options_error = str(exc)
        try:  # the target alone may still be valid (the bad variable being another one)
            options = resolve_options(environ={k: v for k, v in os.environ.items() if k == "NEURON_DYNAMO_TARGET"})
        except OptionError:
            options = None
    if options is None:
        target = "unknown: the options are invalid (see options_error)"
    else:
        try:
            target = resolve_target(options.target).name
        except NeuronDynamoError as exc:
            target = f"unavailable: {exc}"
    return {
        "backend_names": list(BACKEND_NAMES),
        "neuron_resolves_to": resolves_to,
        "neuron_is_neuron_dynamo": resolves_to == OUR_ENTRY_POINT,
        "neuron_providers": [_provider(ep) for ep in claims],
        "torchneuron": _torchneuron_facts(),
        "version": version,
        "target": target,
        "target_option": options.target if options is not None else None,
        "options_error": options_error,
        "nki_provider": nki.get("provider"),
        "nki_version": nki.get("version"),
        "nki_target": nki.get("target"),
        "genuine_nki": bool(nki.get("genuine")),
    }


def _torchneuron_facts() -> dict[str, Any]:
    """Whether TorchNeuron can run regions here (the `neuron` target), its version facts, or why not."""
    from neuron_dynamo.toolchain import torchneuron

    return {"available": torchneuron.runtime_available(), "why_not": torchneuron.unavailable_reason() or None,
            **torchneuron.versions()}
