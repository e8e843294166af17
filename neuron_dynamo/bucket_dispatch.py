"""One graph with symbolic sizes served by a few static programs: pick bucket, pad, run, slice.

`BucketedGraph` wraps an aten graph with symbolic dims (from `dynamic=True`, automatic dynamic or `mark_dynamic`).
At each call it reads the real sizes from the arguments, rounds them up to buckets (`passes/bucketing.py`), pads the
inputs with zeros, runs the static program compiled (once, lazily) for that bucket from the graph the padding proof
transformed (`passes/padding.py`), and slices the outputs back using their sympy size expressions evaluated at the
real sizes. Dispatch happens here, inside the backend, so Dynamo sees one graph and never recompiles for a length.

When the proof refuses, the graph runs at each call's exact sizes (one program per distinct shape) and the reason is
logged and counted.

Only sizes that vary are padded. Under `torch.compile(..., dynamic=True)` Dynamo makes every dim symbolic, the
batch of 2 and the head dim of 8 included, so such a graph is bucketed *adaptively*: a symbol under the default
policy runs at its exact value while it has had one value (a graph whose every symbol is in that state runs the
traced graph itself, `exact[...]`); from its second distinct value on it gets its policy. A symbol whose policy
the user chose (`bucket_dims`, explicit `buckets`) is bucketed from the first call. Graphs made symbolic by Dynamo
because a size changed (automatic dynamic), by `mark_dynamic`, or by the static-graph generalisation below (which
makes only the length dims symbolic) hold only sizes known to vary: they are bucketed from the first call.

Per symbol, `BucketStats.symbols` and the counters `bucketing.<graph>.padding_elements.<symbol>` record the input
elements that lie in the padded region of that symbol's dims (an element padded along two symbols counts for each).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import sympy
import torch
import torch.fx as fx

from neuron_dynamo import counters
from neuron_dynamo.passes.bucketing import BucketConfig, BucketingError, BucketPlan, plan_buckets
from neuron_dynamo.passes.canonical import canonical_graph_text
from neuron_dynamo.passes.padding import PaddingProof, graph_outputs, prove_padding
from neuron_dynamo.passes.specialize import SpecializationError, StaticGraph, evaluate, generalize, specialize
from neuron_dynamo.program_cache import forget_stored_programs, has_stored_program, may_have_stored_program

log = logging.getLogger("neuron_dynamo.bucket_dispatch")

# Compiles one static specialisation into a callable taking its tensor inputs (the backend's compile step).
CompileStatic = Callable[[fx.GraphModule, list], Callable]


def compile_reference(gm: fx.GraphModule, example_inputs: list) -> Callable:
    """Run a static graph with torch itself (the `reference` path, and the default for tests of this module)."""
    return gm


@dataclasses.dataclass
class SymbolStats:
    """One symbolic size of a bucketed graph: where it is read, its policy, the values it took, its padding."""

    site: str  # e.g. "input 3 [s0, s1], dim 0"
    policy: str  # e.g. "multiple of 128"
    adaptive: bool  # exact until it varies (dynamic=True and the default policy)
    values: set[int] = dataclasses.field(default_factory=set)
    varied_at_call: int | None = None  # the call (1-based) that brought its second distinct value
    padding_elements: int = 0  # input elements in the padded region of this symbol's dims

    @property
    def mode(self) -> str:
        """How the symbol runs now, in words."""
        if not self.adaptive:
            return f"{self.policy} (from the first call)"
        if self.varied_at_call is None:
            return f"exact while it has one value (then {self.policy})"
        return f"{self.policy} (since call {self.varied_at_call})"

    def to_dict(self) -> dict:
        return {"site": self.site, "policy": self.policy, "mode": self.mode, "distinct_values": len(self.values),
                "min": min(self.values, default=None), "max": max(self.values, default=None),
                "padding_elements": self.padding_elements}


@dataclasses.dataclass
class BucketStats:
    """What one bucketed graph did: programs built, calls per bucket, padding waste and refusals."""

    programs: dict[str, int] = dataclasses.field(default_factory=dict)  # program key -> compile count
    calls: dict[str, int] = dataclasses.field(default_factory=dict)  # program key -> calls
    padded_elements: int = 0
    real_elements: int = 0
    refusals: list[str] = dataclasses.field(default_factory=list)
    masks: list[str] = dataclasses.field(default_factory=list)
    symbols: dict[str, SymbolStats] = dataclasses.field(default_factory=dict)  # symbol name -> its stats

    @property
    def padding_ratio(self) -> float:
        """Input elements the programs processed per real input element (1.0: no padding)."""
        return self.padded_elements / self.real_elements if self.real_elements else 1.0

    @property
    def padding_waste(self) -> float:
        """The share of processed input elements that were padding."""
        return 1.0 - self.real_elements / self.padded_elements if self.padded_elements else 0.0

    def to_dict(self) -> dict:
        return {
            "programs_compiled": len(self.programs),
            "programs": sorted(self.programs),
            "calls_per_program": dict(self.calls),
            "padded_elements": self.padded_elements,
            "real_elements": self.real_elements,
            "padding_ratio": round(self.padding_ratio, 4),
            "padding_waste": round(self.padding_waste, 4),
            "refusals": list(self.refusals),
            "masks_inserted": len(self.masks),
            "symbols": {name: symbol.to_dict() for name, symbol in self.symbols.items()},
        }


@dataclasses.dataclass
class _Program:
    static: StaticGraph
    run: Callable


def bucket_config(options) -> BucketConfig:
    """The `BucketConfig` described by the backend options (`bucket_policy`, `buckets`, `bucket_dims`, ...)."""
    per_dim = {}
    for entry in options.bucket_dims:
        dim, sep, spec = entry.partition("=")
        if not sep or not dim.strip().lstrip("-").isdigit():
            raise BucketingError(f"bucket_dims entry {entry!r} must look like DIM=POLICY, e.g. '0=pow2' or '1=64'")
        spec = spec.strip()
        per_dim[int(dim)] = int(spec) if spec.isdigit() else spec
    return BucketConfig.from_options(
        policy=options.bucket_policy,
        multiple=options.bucket_multiple,
        buckets=options.buckets,
        max_bucket=options.max_bucket or None,
        beyond_max=options.beyond_max_bucket,
        per_dim=per_dim,
    )


def bucketed_graph(gm: fx.GraphModule, config: BucketConfig, compile_static: CompileStatic, name: str,
                   adaptive: bool | None = None):
    """A `BucketedGraph` for `gm`, or None when its symbolic sizes cannot be bucketed (logged and counted).

    `adaptive`: pad a default-policy symbol only once it varies; None decides from how Dynamo made the graph
    symbolic (`every_dim_symbolic`).
    """
    if adaptive is None:
        adaptive = every_dim_symbolic()
    placeholders = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    try:
        if plan_buckets(placeholders, config) is None:
            return None
    except BucketingError as error:
        log.info("%s: not bucketed, running at exact shapes: %s", name, error)
        counters.bump("bucketing.graphs_refused")
        counters.bump("bucketing.refusals.unbound_symbol")
        return None
    return BucketedGraph(gm, config, compile_static, name, adaptive=adaptive)


def every_dim_symbolic() -> bool:
    """Whether Dynamo is compiling with every dim symbolic (`torch.compile(..., dynamic=True)`), whether it varies
    or not; otherwise (automatic dynamic after a size changed, `mark_dynamic`) only the dims known to vary are.

    `dynamic=True` is Dynamo's `assume_static_by_default=False`, patched in while it compiles the frame, which is
    when the backend builds its graphs (AOTAutograd's backward included; a backward AOTAutograd could only compile
    later, at its first run, would be bucketed from its first call).
    """
    return not torch._dynamo.config.assume_static_by_default


# Bucketed graphs generalised from static graphs, by structure: a recompile for a new length finds its programs here.
_GENERALIZED: dict[str, BucketedGraph | None] = {}


def forget_generalized_graphs() -> None:
    """Drop the bucketed graphs shared by static graphs (their programs go with them), and the record of programs
    static graphs stored for their dynamic successors; for tests and long runs."""
    _GENERALIZED.clear()
    forget_stored_programs()


def generalized_bucketed_graph(gm: fx.GraphModule, config: BucketConfig, compile_static: CompileStatic, name: str,
                               key: str) -> BucketedGraph | None:
    """Serve a static graph (`dynamic=False`) from the bucket programs of its generalisation, or None.

    The static graph is retraced with its length dims symbolic (`passes/specialize.generalize`); when the padding
    proof accepts that graph, every static graph of the same structure (Dynamo recompiles one per new length)
    shares one `BucketedGraph`, hence one program per bucket. `key` identifies the compile settings.
    """
    symbolic = generalize(gm)
    if symbolic is None:
        counters.bump("bucketing.static_graphs_exact")
        log.info("%s: static graph keeps its exact shapes (no length dim, or the graph fixes its sizes)", name)
        return None
    shapes = [str(n.meta["val"].shape) for n in symbolic.graph.nodes if n.op == "placeholder"]
    structure = hashlib.sha256("\n".join([key, *shapes, canonical_graph_text(symbolic)]).encode()).hexdigest()
    if structure in _GENERALIZED:
        counters.bump("bucketing.static_graphs_reused")
    else:
        # Only the length dims were made symbolic, because lengths vary: bucketed from the first call.
        bucketed = bucketed_graph(symbolic, config, compile_static, name, adaptive=False)
        _GENERALIZED[structure] = bucketed if bucketed is not None and bucketed.proof.safe else None
    shared = _GENERALIZED[structure]
    counters.bump("bucketing.static_graphs_bucketed" if shared is not None else "bucketing.static_graphs_exact")
    return shared


class BucketedGraph:
    """A callable serving every size of a symbolic aten graph from per-bucket static programs.

    Called like the backend's `CompiledGraph`: with ONE list of arguments (AOTAutograd's boxed convention);
    `run(*args)` is the unboxed form.
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        config: BucketConfig | None = None,
        compile_static: CompileStatic = compile_reference,
        name: str = "graph",
        adaptive: bool = False,
    ) -> None:
        self.gm = gm
        self.name = name
        self.compile_static = compile_static
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._values = [n.meta.get("val") for n in placeholders]
        self.plan: BucketPlan | None = plan_buckets(self._values, config or BucketConfig(), adaptive=adaptive)
        if self.plan is None:
            raise ValueError(f"{name} has no symbolic input size; compile it as a static graph")
        self.stats = BucketStats()
        for symbol in self.plan.symbols:
            self.stats.symbols[str(symbol)] = SymbolStats(
                _site(symbol, self.plan.sites[symbol], self._values), self.plan.policies[symbol].describe(),
                symbol in self.plan.adaptive)
        self._first: dict[sympy.Symbol, int] = {}  # adaptive symbols: the value of the first call
        self._varying: set[sympy.Symbol] = set()  # adaptive symbols that took a second value: bucketed from now on
        self._calls = 0
        self._input_symbols = [frozenset().union(*(s.node.expr.free_symbols for s in value.shape
                                                   if isinstance(s, torch.SymInt)))
                               if isinstance(value, torch.Tensor) else frozenset() for value in self._values]
        self._proofs: dict[tuple[sympy.Symbol, ...], PaddingProof] = {}
        self.proof: PaddingProof = self._proof_for(self._padded_symbols())
        output = next(n for n in gm.graph.nodes if n.op == "output")
        self._outputs = [leaf.meta.get("val") if isinstance(leaf, fx.Node) else leaf for leaf in graph_outputs(output)]
        self._programs: dict[tuple, _Program] = {}
        self._failed: set[tuple] = set()
        self._boxed_call = True
        counters.bump("bucketing.graphs")

    @property
    def programs(self) -> dict[tuple, _Program]:
        return self._programs

    def _padded_symbols(self) -> tuple[sympy.Symbol, ...]:
        """The symbols padded now: all but the adaptive ones that have not varied yet (those run at their value)."""
        return tuple(s for s in self.plan.symbols if s not in self.plan.adaptive or s in self._varying)

    def _proof_for(self, symbols: tuple[sympy.Symbol, ...]) -> PaddingProof:
        """The padding proof over `symbols` (the others are specialised to their exact values), made once per set:
        a head dim that never varies must not make the proof refuse padding the length. A proof over more symbols
        serves too (a symbol at its exact size pads nothing), so when the set alone is refused, all of them are
        tried."""
        if symbols not in self._proofs:
            proof = prove_padding(self.gm, symbols)
            if not proof.safe and symbols != self.plan.symbols:
                everything = self._proofs.get(self.plan.symbols) or prove_padding(self.gm, self.plan.symbols)
                proof = everything if everything.safe else proof
            self._proofs[symbols] = proof
            if proof.safe:
                self.stats.masks = list(proof.masks)
            else:
                self._refuse(proof.reason)
        return self._proofs[symbols]

    def _refuse(self, reason: str) -> None:
        log.info("%s: padding refused, running at exact shapes: %s", self.name, reason)
        counters.bump("bucketing.graphs_refused")
        counters.bump(f"bucketing.refusals.{reason.split(' ', 1)[0]}")
        if reason not in self.stats.refusals:
            self.stats.refusals.append(reason)

    # ---- the call ------------------------------------------------------------------------------------------------

    def __call__(self, args: list):
        inputs = list(args)
        args.clear()
        return self.run(*inputs)

    def run(self, *args):
        real = self.plan.bind(args)
        self._observe(real)
        self.proof = self._proof_for(self._padded_symbols())
        # raises beyond max_bucket (unless exact)
        bucket = self.plan.choose(real, self._varying) if self.proof.safe else real
        for symbol, limit in self.proof.limits.items():  # never beyond what the graph can slice: clamped
            if real[symbol] <= limit < bucket[symbol]:
                bucket[symbol] = limit
        beyond = any(p.limit is not None and real[s] > p.limit for s, p in self.plan.policies.items())
        settled = all(self.plan.settled(s, real[s], self._varying) for s in self.plan.symbols)  # nothing to pad
        padded = self.proof.safe and not beyond and not settled and tuple(bucket.items()) not in self._failed
        if padded and self._exact_at_hand(real, bucket):
            padded = False
        if padded:
            try:
                program, key = self._program(bucket, padded=True)
            except BucketingError:
                raise
            except Exception as error:  # the graph's own guards exclude this bucket size, or its compile failed
                self._failed.add(tuple(bucket.items()))
                kind = "not traceable" if isinstance(error, SpecializationError) else "failed to compile"
                self._refuse(f"bucket {_show(bucket)} {kind}, running exact: {type(error).__name__}: {error}")
                padded = False
        if padded:
            try:
                results = program.run(*self._inputs(args, real, bucket, padded=True))
            except BucketingError:
                raise
            except Exception as error:  # e.g. a size the static graph baked in: the bucket cannot serve this graph
                self._failed.add(tuple(bucket.items()))
                self._refuse(f"bucket {_show(bucket)} failed to run, running exact: {type(error).__name__}: {error}")
                padded = False
            else:
                self._count_call(key)
                return self._outputs_at(results, real, bucket)
        program, key = self._program(real, padded=False)
        self._count_call(key)
        return self._outputs_at(program.run(*self._inputs(args, real, real, padded=False)), real, real)

    def _observe(self, real: Mapping[sympy.Symbol, int]) -> None:
        """Record each symbol's value; an adaptive symbol's second distinct value makes it bucketed from now on."""
        self._calls += 1
        for symbol in self.plan.symbols:
            stats = self.stats.symbols[str(symbol)]
            stats.values.add(real[symbol])
            if symbol not in self.plan.adaptive or symbol in self._varying:
                continue
            first = self._first.setdefault(symbol, real[symbol])
            if real[symbol] != first:
                self._varying.add(symbol)
                stats.varied_at_call = self._calls
                counters.bump("bucketing.sizes_varied")
                log.info("%s: %s varies (%d, then %d): %s from now on", self.name, symbol, first, real[symbol],
                         stats.policy)

    def _exact_at_hand(self, real: Mapping[sympy.Symbol, int], bucket: Mapping[sympy.Symbol, int]) -> bool:
        """Whether these exact sizes have a program already, where the bucket has none yet: this graph's own, or the
        one a static graph stored in the compile cache (Dynamo replaces the static graph of sizes A by a dynamic
        one when B comes; at A again, that program serves without compiling the bucket's)."""
        if self._key(bucket, padded=True) in self._programs:
            return False
        if self._key(real, padded=False) in self._programs:
            return True
        if not may_have_stored_program(self._layout_at(real)):  # most calls: no need to specialise the graph
            return False
        try:
            static = specialize(self.gm, real, strided=True)
        except SpecializationError:
            return False
        return has_stored_program(static.gm, static.example_inputs)

    def _layout_at(self, sizes: Mapping[sympy.Symbol, int]) -> tuple:
        """The `input_layout` of the graph specialised at `sizes` (`specialize` makes its inputs this way)."""
        return tuple(((), torch.int64) if value is None else (_shape_at(value, sizes), value.dtype)
                     for value in self._values if value is None or isinstance(value, torch.Tensor))

    def _key(self, sizes: Mapping[sympy.Symbol, int], padded: bool) -> tuple:
        return ("bucket" if padded else "exact", *(sizes[s] for s in self.plan.symbols),
                *(("padding", *_names(self.proof.symbols)) if padded else ()))

    def _count_call(self, key: str) -> None:
        self.stats.calls[key] = self.stats.calls.get(key, 0) + 1
        counters.bump("calls")
        counters.bump("bucketing.calls")
        counters.bump(f"bucketing.{self.name}.calls.{key}")

    def _program(self, sizes: Mapping[sympy.Symbol, int], padded: bool) -> tuple[_Program, str]:
        key = self._key(sizes, padded)
        shown = f"{key[0]}[{_show(sizes)}]"
        if key not in self._programs:
            start = time.perf_counter()
            graph = self.proof.graph if padded else self.gm
            static = specialize(graph, sizes, strided=not padded)
            run = self.compile_static(static.gm, static.example_inputs)
            counters.bump("bucketing.compile_seconds", time.perf_counter() - start)
            report = getattr(run, "report", None)
            if report is not None and hasattr(report, "bucket"):
                report.bucket = shown
                report.bucket_stats = self.stats
            self._programs[key] = _Program(static, run)
            self.stats.programs[shown] = self.stats.programs.get(shown, 0) + 1
            counters.bump("bucketing.programs")
            counters.bump(f"bucketing.{self.name}.programs")
            log.debug("%s: compiled %s", self.name, shown)
        return self._programs[key], shown

    def _inputs(self, args: Sequence, real: Mapping, sizes: Mapping, padded: bool) -> list:
        program_inputs = []
        layouts = self.proof.input_factors if padded else []
        for position, (arg, value) in enumerate(zip(args, self._values, strict=False)):
            if not isinstance(value, torch.Tensor):
                continue
            target = [evaluate(s.node.expr, sizes) if isinstance(s, torch.SymInt) else int(s) for s in value.shape]
            if any(isinstance(s, torch.SymInt) for s in value.shape):
                self._count_elements(_numel(target), arg.numel())
                self._count_symbol_padding(value, target, real, sizes, self._input_symbols[position])
            layout = layouts[position] if position < len(layouts) else None
            if layout and any(layout):
                arg = _pad_merged(arg, layout, real, sizes)
            if list(arg.shape) != target:
                arg = _pad_to(arg, target)
            program_inputs.append(arg)
        if padded:
            program_inputs.extend(torch.tensor(real[s], dtype=torch.int64) for s in self.proof.symbols)
        return program_inputs

    def _count_elements(self, padded: int, real: int) -> None:
        self.stats.padded_elements += padded
        self.stats.real_elements += real
        for prefix in ("bucketing", f"bucketing.{self.name}"):
            counters.bump(f"{prefix}.padded_elements", padded)
            counters.bump(f"{prefix}.real_elements", real)

    def _count_symbol_padding(self, value: torch.Tensor, target: Sequence[int], real: Mapping, sizes: Mapping,
                              symbols: frozenset) -> None:
        """Per symbol of this input: the elements in the padded region of its dims (numel at the program's sizes
        minus numel with that one symbol at its real value)."""
        total = _numel(target)
        for symbol in symbols:
            added = 0
            if sizes[symbol] != real[symbol]:
                at_real = {**sizes, symbol: real[symbol]}
                added = total - _numel([
                    evaluate(s.node.expr, at_real) if isinstance(s, torch.SymInt) and symbol in s.node.expr.free_symbols
                    else size for s, size in zip(value.shape, target, strict=True)])
            self.stats.symbols[str(symbol)].padding_elements += added
            counters.bump(f"bucketing.{self.name}.padding_elements.{symbol}", added)

    def _outputs_at(self, results, real: Mapping, sizes: Mapping) -> list:
        flat = list(results) if isinstance(results, (tuple, list)) else [results]
        factors = self.proof.output_factors if self.proof.safe else []
        outputs = []
        for position, (result, value) in enumerate(zip(flat, self._outputs, strict=True)):
            if isinstance(value, (torch.SymInt, torch.SymFloat)):
                outputs.append(evaluate(value.node.expr, real))
            elif isinstance(value, torch.Tensor) and isinstance(result, torch.Tensor):
                layout = factors[position] if position < len(factors) and factors[position] else None
                sliced = _slice_to(result, value, real, sizes, layout)
                # a tensor of its own, not a view into the bucket-sized buffer (in-place ops on outputs, contiguity)
                outputs.append(sliced if sliced is result else sliced.clone(memory_format=torch.contiguous_format))
            else:
                outputs.append(result)
        return outputs


def _site(symbol: sympy.Symbol, site, values: Sequence) -> str:
    """Where a symbol is, for reports: the first tensor input dim that is exactly it, `input 3 [s0, s1], dim 0`
    (Dynamo also passes sizes as SymInt inputs; `input 0 (a size)` when only such an input holds it)."""
    for index, value in enumerate(values):
        if not isinstance(value, torch.Tensor):
            continue
        for dim, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and size.node.expr == symbol:
                return f"input {index} [{', '.join(str(s) for s in value.shape)}], dim {dim}"
    return f"input {site.index}" + (" (a size)" if site.dim is None else f", dim {site.dim}")


def _show(sizes: Mapping[sympy.Symbol, int]) -> str:
    return _shown(tuple(sizes.items()))


@functools.lru_cache(maxsize=4096)
def _shown(sizes: tuple[tuple[sympy.Symbol, int], ...]) -> str:
    """Memoised: every call names its program, and printing sympy symbols is slow."""
    return ", ".join(f"{symbol}={value}" for symbol, value in sorted(sizes, key=lambda kv: str(kv[0])))


@functools.cache
def _names(symbols: tuple[sympy.Symbol, ...]) -> tuple[str, ...]:
    return tuple(map(str, symbols))


def _shape_at(value: torch.Tensor, sizes: Mapping[sympy.Symbol, int]) -> tuple[int, ...]:
    return tuple(evaluate(s.node.expr, sizes) if isinstance(s, torch.SymInt) else int(s) for s in value.shape)


def _numel(shape: Sequence[int]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def _pad_to(tensor: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """`tensor` padded with zeros at the end of each dim up to `shape`."""
    widths = []
    for have, want in zip(reversed(tensor.shape), reversed(shape), strict=True):
        widths += [0, want - have]
    return torch.nn.functional.pad(tensor, widths)


def _pad_merged(tensor: torch.Tensor, layout: Sequence, real: Mapping, sizes: Mapping) -> torch.Tensor:
    """`tensor` with each merged dim padded factor by factor (the inverse of `_slice_to`'s cut): `[2·L]` as `[2, L]`
    padded to `[2, bucket]`, flattened back."""
    for dim, parts in enumerate(layout):
        if parts is None:
            continue
        shape = list(tensor.shape)
        split = tensor.reshape(shape[:dim] + [evaluate(p, real) for p in parts] + shape[dim + 1:])
        split = _pad_to(split, shape[:dim] + [evaluate(p, sizes) for p in parts] + shape[dim + 1:])
        tensor = split.reshape(shape[:dim] + [-1] + shape[dim + 1:])
    return tensor


def _slice_to(result: torch.Tensor, value: torch.Tensor, real: Mapping, sizes: Mapping, layout) -> torch.Tensor:
    """The real region of a bucket-sized output: each padded dim cut to its size expression at the real values (a
    merged dim is cut factor by factor)."""
    for dim, size in enumerate(value.shape):
        if not isinstance(size, torch.SymInt):
            continue
        parts = layout[dim] if layout else None
        if parts is None:
            want = evaluate(size.node.expr, real)
            if result.shape[dim] != want:
                result = result.narrow(dim, 0, want)
            continue
        shape = list(result.shape)
        unmerged = result.reshape(shape[:dim] + [evaluate(p, sizes) for p in parts] + shape[dim + 1:])
        for k, part in enumerate(parts):
            unmerged = unmerged.narrow(dim + k, 0, evaluate(part, real))
        result = unmerged.reshape(shape[:dim] + [evaluate(size.node.expr, real)] + shape[dim + 1:])
    return result
