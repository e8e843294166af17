"""Running a compiled graph: pick (or lazily build) the static program for the call's shapes and run it.

Trainium runs static shapes only, so one AOTAutograd graph, possibly symbolic, owns a dict of static programs keyed
by the concrete shapes (and integer inputs) of the call. Each program is the partitioned graph: its regions call
the compiled kernels, the fallback ops run with PyTorch, all in graph order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
import torch.fx as fx

from neuron_dynamo import counters

log = logging.getLogger("neuron_dynamo.runtime")


class StaticProgram:
    """One static specialisation of a graph: the partitioned module with compiled regions, and its report."""

    def __init__(self, module: fx.GraphModule, report: Any,
                 recover: Callable[[str], StaticProgram] | None = None) -> None:
        self.module = module
        self.report = report
        self.recover = recover  # a program loaded from the cache: how to build it afresh if its first run fails

    def __call__(self, *args: Any) -> Any:
        if counters.reporting():  # an explain() is listening: tell it this program ran
            counters.publish_report(self.report)
        if self.recover is None:
            return self.module(*args)
        recover, self.recover = self.recover, None
        try:
            return self.module(*args)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            log.warning("%s: a program loaded from the compile cache failed (%s); its entry is quarantined and the "
                        "program compiled again", self.report.name, reason)
            rebuilt = recover(reason)
            self.module, self.report = rebuilt.module, rebuilt.report
            return self.module(*args)


def specialization_key(args: Sequence[Any]) -> Hashable:
    """What tells two calls' static programs apart: every tensor's shape and every integer input."""
    return tuple(tuple(arg.shape) if isinstance(arg, torch.Tensor) else arg for arg in args)


class CompiledGraph:
    """What AOTAutograd calls in place of one forward, backward or inference graph.

    `compile_program(args)` builds the static program for the shapes of `args`; it runs at most once per key.
    A graph without symbolic dims has a single key, so its one program is found without computing the key.
    It takes its inputs as one list (AOTAutograd's boxed calling convention) and lets go of them once the
    program holds them, so activations can be freed as early as the graph allows. (`_boxed_call` is set per
    instance: AOTAutograd wraps backward compilers in `functools.wraps`, which copies instance attributes only.)
    """

    def __init__(self, name: str, compile_program: Callable[[Sequence[Any]], StaticProgram], *, static: bool) -> None:
        self.name = name
        self.compile_program = compile_program
        self.static = static
        self.programs: dict[Hashable, StaticProgram] = {}
        self._boxed_call = True

    def program_for(self, args: Sequence[Any]) -> StaticProgram:
        key = () if self.static else specialization_key(args)
        program = self.programs.get(key)
        if program is None:
            log.debug("%s: compiling a static program for %s", self.name, key)
            program = self.programs[key] = self.compile_program(args)
        return program

    def __call__(self, args: list[Any]) -> Any:
        program = self.program_for(args)
        counters.bump("calls")
        inputs = list(args)
        args.clear()
        return program(*inputs)


class EagerFallback:
    """Runs a compiled graph, and the graph itself with PyTorch once the backend fails on it (compile or run).

    Nothing the backend raises may reach a user where eager would have run: a failure in any stage (specialisation,
    the padding proof, cache keys, lowering, a kernel at run time) is logged once, counted, reported through
    `on_failure(reason, inputs)`, and from then on that graph runs eagerly. `passthrough` errors are the ones the
    user asked for (bad options, sizes beyond max_bucket, fallback="error"), and with `strict` every error is raised.
    An error that the eager graph raises as well (an integer division by zero in the inputs) is the inputs' fault,
    not the backend's: it reaches the user as eager's error, and the compiled graph stays in use.
    `compiled` hands its outputs back as tensors of their own (`output_layout.EagerLayout`), as the graph does.
    """

    def __init__(
        self, compiled: Callable[[list[Any]], Any], graph: fx.GraphModule, name: str, *, strict: bool,
        passthrough: tuple[type[BaseException], ...], on_failure: Callable[[str, Sequence[Any]], None],
    ) -> None:
        self.compiled = compiled
        self.graph = graph
        self.name = name
        self.strict = strict
        self.passthrough = passthrough
        self.on_failure = on_failure
        self.failure: str | None = None
        self._boxed_call = True

    def __call__(self, args: list[Any]) -> Any:
        inputs = list(args)
        args.clear()
        if self.failure is None:
            try:
                return self.compiled(list(inputs))
            except self.passthrough:
                raise
            except Exception as exc:
                if self.strict:
                    raise
                result = self.graph(*inputs)  # eager raising too: the inputs' error (x // 0), not the backend's
                self.failure = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                log.warning("%s: the backend failed, running this graph eagerly from now on: %s", self.name,
                            self.failure, exc_info=log.isEnabledFor(logging.DEBUG))
                counters.bump("graphs_failed")
                self.on_failure(self.failure, inputs)
                counters.bump("calls_eager")
                return result
        counters.bump("calls_eager")
        return self.graph(*inputs)
