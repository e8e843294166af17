"""Bucket policy: which static size serves a dynamic dimension.

Trainium compiles static shapes only and every new shape costs a compiler run, so each symbolic dimension of a
graph (a sympy symbol such as `s0`) is rounded up to a *bucket*; the graph is compiled once per bucket and inputs are
padded to it (`passes/padding.py` proves the padding harmless). This module only decides sizes; it knows nothing of
padding or compilation.

Policies (per dimension, chosen by `BucketConfig`):

| policy            | bucket of size n                                  | e.g. n = 300              |
|-------------------|---------------------------------------------------|---------------------------|
| `multiple` (128)  | the smallest multiple of `bucket_multiple` >= n   | 384                       |
| `pow2`            | the smallest power of two >= n                    | 512                       |
| explicit list     | the smallest listed bucket >= n                   | 512 for `[256, 512, 1024]`|
| `exact`           | n itself (no padding, one program per size)       | 300                       |

A size equal to a bucket maps to that bucket (first fit is `>=`, not NxDI's strict `<`, which wastes a bucket).
`max_bucket` caps every policy: a bucket above it is clamped to it, a size above it is an error naming the fix, or
runs at its exact size when `beyond_max_bucket="exact"`. Size 0 maps to 0 (an empty dimension has nothing to pad).

Per-dimension overrides are keyed by the tensor dimension index where a symbol first appears among the graph inputs
(dim 0 is the batch of most models, dim 1 the sequence), e.g. `{0: "pow2"}` buckets batch sizes as powers of two
while sequence lengths keep the default multiple of 128.

**Only what varies is padded.** Under `torch.compile(..., dynamic=True)` every input dim is symbolic, whether it
varies or not (a batch of 2, a head dim of 8): bucketing those from the first call pads a batch of 2 to 128. So a
plan built with `adaptive=True` marks the symbols governed by the *default* policy as adaptive: `choose()` gives
such a symbol its exact value until the caller (`bucket_dispatch.BucketedGraph`, which remembers the values each
symbol took) reports it `varying`, i.e. after it took a second distinct value; from then on it gets its policy. A
symbol whose policy the user chose (a `bucket_dims` override of its dim, or an explicit `buckets` list) is never
adaptive: it is bucketed from the first call. `max_bucket` applies to adaptive symbols too (a size above it raises,
or runs exact with `beyond_max_bucket="exact"`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping, Sequence

import sympy
import torch

from neuron_dynamo.errors import NeuronDynamoError

POLICIES = ("multiple", "pow2", "exact")
BEYOND_MAX = ("error", "exact")


class BucketingError(NeuronDynamoError, ValueError):
    """A bucket policy that cannot be applied, or a size beyond the largest allowed bucket."""


@dataclasses.dataclass(frozen=True)
class DimPolicy:
    """How one symbolic dimension is bucketed."""

    policy: str = "multiple"
    multiple: int = 128
    buckets: tuple[int, ...] = ()
    max_bucket: int | None = None
    beyond_max: str = "error"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES and not self.buckets:
            raise BucketingError(f"bucket policy {self.policy!r} is unknown; use one of {', '.join(POLICIES)}")
        if self.multiple < 1:
            raise BucketingError(f"bucket_multiple must be a positive integer, got {self.multiple}")
        if any(b < 1 for b in self.buckets) or list(self.buckets) != sorted(set(self.buckets)):
            raise BucketingError(f"buckets must be distinct positive integers, got {list(self.buckets)}")
        if self.max_bucket is not None and self.max_bucket < 1:
            raise BucketingError(f"max_bucket must be a positive integer, got {self.max_bucket}")
        if self.beyond_max not in BEYOND_MAX:
            raise BucketingError(f"beyond_max_bucket must be one of {', '.join(BEYOND_MAX)}, got {self.beyond_max!r}")

    @property
    def limit(self) -> int | None:
        """The largest size this policy serves from a bucket (None: unbounded)."""
        if self.buckets:
            return min(self.buckets[-1], self.max_bucket) if self.max_bucket is not None else self.buckets[-1]
        return self.max_bucket

    def bucket(self, size: int) -> int:
        """The static size that serves `size` (`size` itself when it runs exactly)."""
        if size < 0:
            raise BucketingError(f"a dimension size cannot be negative, got {size}")
        if size == 0 or self.policy == "exact" and not self.buckets:
            return size
        limit = self.limit
        if limit is not None and size > limit:
            if self.beyond_max == "exact":
                return size
            raise BucketingError(
                f"size {size} is larger than the largest bucket ({limit}); raise max_bucket / add a larger bucket, "
                f"or pass beyond_max_bucket='exact' to compile such sizes exactly"
            )
        if self.buckets:
            candidate = next(b for b in self.buckets if b >= size)
        elif self.policy == "pow2":
            candidate = 1 << (size - 1).bit_length()
        else:
            candidate = math.ceil(size / self.multiple) * self.multiple
        return min(candidate, self.max_bucket) if self.max_bucket is not None else candidate

    def describe(self) -> str:
        """The policy in a few words, for reports: `multiple of 128`, `pow2`, `exact`, `buckets [256, 512]`."""
        if self.buckets:
            text = f"buckets {list(self.buckets)}"
        elif self.policy == "multiple":
            text = f"multiple of {self.multiple}"
        else:
            text = self.policy
        return f"{text}, max {self.max_bucket}" if self.max_bucket is not None else text

    def enumerate(self, up_to: int) -> list[int]:
        """Every bucket serving sizes 1..up_to (for warm-up and reports)."""
        return sorted({self.bucket(n) for n in range(1, up_to + 1) if self.limit is None or n <= self.limit})


@dataclasses.dataclass(frozen=True)
class BucketConfig:
    """The user's bucketing choices: a default `DimPolicy` and overrides keyed by tensor dimension index."""

    default: DimPolicy = DimPolicy()
    per_dim: Mapping[int, DimPolicy] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_options(
        cls,
        policy: str = "multiple",
        multiple: int = 128,
        buckets: Sequence[int] = (),
        max_bucket: int | None = None,
        beyond_max: str = "error",
        per_dim: Mapping[int, str | int | Sequence[int]] | None = None,
    ) -> BucketConfig:
        """Build from option values. A per-dim override is a policy name, a multiple (int) or a list of buckets."""
        base = dict(multiple=multiple, max_bucket=max_bucket, beyond_max=beyond_max)
        default = DimPolicy(policy=policy, buckets=_as_buckets(buckets), **base)
        overrides = {}
        for dim, spec in (per_dim or {}).items():
            if isinstance(spec, str):
                overrides[int(dim)] = DimPolicy(policy=spec, **base)
            elif isinstance(spec, int) and not isinstance(spec, bool):
                overrides[int(dim)] = DimPolicy(policy="multiple", **{**base, "multiple": spec})
            elif isinstance(spec, Iterable):
                overrides[int(dim)] = DimPolicy(policy="multiple", buckets=_as_buckets(spec), **base)
            else:
                raise BucketingError(
                    f"bucket override for dim {dim} must be a policy name ({', '.join(POLICIES)}), a multiple (int) "
                    f"or a list of bucket sizes; got {spec!r}"
                )
        return cls(default=default, per_dim=overrides)

    def for_dim(self, dim: int | None) -> DimPolicy:
        return self.per_dim.get(dim, self.default) if dim is not None else self.default

    def user_chosen(self, dim: int | None) -> bool:
        """Whether the user chose the buckets of this dim (a `bucket_dims` override, or an explicit `buckets` list):
        such a dim is bucketed from its first call, even where only sizes that vary are padded."""
        return (dim is not None and dim in self.per_dim) or bool(self.for_dim(dim).buckets)


def _as_buckets(buckets: Iterable[int]) -> tuple[int, ...]:
    values = tuple(buckets)
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in values):
        raise BucketingError(f"buckets must be a list of integers, got {list(values)!r}")
    return tuple(sorted(values))


@dataclasses.dataclass(frozen=True)
class SymbolSite:
    """Where a symbol can be read at call time: the value of input `index`, or its size along `dim`."""

    index: int
    dim: int | None  # None: the input is itself the SymInt


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    """The symbolic dims of one graph, where to read each at call time, and the policy bucketing it."""

    symbols: tuple[sympy.Symbol, ...]
    sites: Mapping[sympy.Symbol, SymbolSite]
    policies: Mapping[sympy.Symbol, DimPolicy]
    # Symbols that run at their exact value until they vary (see "Only what varies is padded" above).
    adaptive: frozenset[sympy.Symbol] = frozenset()

    def bind(self, args: Sequence) -> dict[sympy.Symbol, int]:
        """The real value of every symbol, read from the call's arguments."""
        values = {}
        for symbol in self.symbols:
            site = self.sites[symbol]
            arg = args[site.index]
            values[symbol] = int(arg) if site.dim is None else int(arg.shape[site.dim])
        return values

    def choose(
        self, real: Mapping[sympy.Symbol, int], varying: Collection[sympy.Symbol] = ()
    ) -> dict[sympy.Symbol, int]:
        """The bucket value of every symbol (raises `BucketingError` beyond `max_bucket` unless exact is allowed).

        An adaptive symbol not in `varying` (it has had one value so far) keeps its real value, unless that value
        is beyond `max_bucket`, where its policy decides (error, or exact).
        """
        return {symbol: real[symbol] if self.settled(symbol, real[symbol], varying)
                else self.policies[symbol].bucket(real[symbol]) for symbol in self.symbols}

    def settled(self, symbol: sympy.Symbol, size: int, varying: Collection[sympy.Symbol] = ()) -> bool:
        """Whether `symbol` runs at its exact `size`: adaptive, not (yet) varying, and within `max_bucket`."""
        limit = self.policies[symbol].limit
        return symbol in self.adaptive and symbol not in varying and (limit is None or size <= limit)


def input_exprs(value) -> list[sympy.Expr] | sympy.Expr | None:
    """The sympy size expressions of a placeholder's example value (a tensor's shape, or a SymInt's expr)."""
    if isinstance(value, torch.SymInt):
        return value.node.expr
    if isinstance(value, torch.Tensor):
        return [sympy.sympify(s.node.expr if isinstance(s, torch.SymInt) else int(s)) for s in value.shape]
    return None


def plan_buckets(example_values: Sequence, config: BucketConfig, adaptive: bool = False) -> BucketPlan | None:
    """A `BucketPlan` for a graph whose inputs have these example values (fake tensors / SymInts from the graph's
    placeholder metadata); None when no input size is symbolic. With `adaptive`, the symbols under the default
    policy (not chosen by the user, `BucketConfig.user_chosen`) run exact until they vary.

    Raises `BucketingError` when a symbol appears only inside compound sizes (e.g. only as `2*s0`), because the call
    could not read its value back.
    """
    sites: dict[sympy.Symbol, SymbolSite] = {}
    dims: dict[sympy.Symbol, int | None] = {}
    seen: set[sympy.Symbol] = set()
    for index, value in enumerate(example_values):
        exprs = input_exprs(value)
        if exprs is None:
            continue
        if isinstance(exprs, sympy.Expr):
            seen |= exprs.free_symbols
            if isinstance(exprs, sympy.Symbol) and exprs not in sites:
                sites[exprs] = SymbolSite(index, None)
            continue
        for dim, expr in enumerate(exprs):
            seen |= expr.free_symbols
            if isinstance(expr, sympy.Symbol):
                sites.setdefault(expr, SymbolSite(index, dim))
                dims.setdefault(expr, dim)
    if not seen:
        return None
    unbound = seen - set(sites)
    if unbound:
        raise BucketingError(
            f"symbol(s) {', '.join(sorted(map(str, unbound)))} appear only inside compound input sizes, so their "
            f"value cannot be read at call time; mark the underlying dimension dynamic instead"
        )
    symbols = tuple(sorted(sites, key=str))
    return BucketPlan(
        symbols=symbols,
        sites={s: sites[s] for s in symbols},
        policies={s: config.for_dim(dims.get(s)) for s in symbols},
        adaptive=frozenset(s for s in symbols if adaptive and not config.user_chosen(dims.get(s))),
    )
