"""A square pair map under bucketing: `[n * n, c]` (RFD4 Proteina's pair representation, flattened) padded as `[n, n]`.

Dynamo records the map's length as `n**2` once it is viewed as `[n, n, c]`, and the view's second size as
`(n**2) // n`. The proof writes a floor division that divides exactly as its quotient (`n`), and reads `n**2` as the
merge of the factors `n, n`: the input is padded factor by factor, as any merged `[2, n]` input is, and viewed back
without refusing. Regrouped in pairs of entries it is refused: a pair could join a row's last real entry and its
padding.
"""

from __future__ import annotations

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv

from neuron_dynamo.bucket_dispatch import BucketedGraph
from neuron_dynamo.passes.bucketing import BucketConfig
from neuron_dynamo.passes.padding import prove_padding
from neuron_dynamo.passes.padding.analysis import merged_factors
from neuron_dynamo.passes.padding.state import exact_quotients

from .symbolic import dynamo_graph, symbolic_graph


def triangle_update(tokens, pairs):
    """Tokens `[1, n, c]` and their pair map `[n * n, c]`: the outgoing triangle product, plus the tokens' outer
    sum."""
    n = tokens.shape[1]
    grid = pairs.view(1, n, n, pairs.shape[-1])
    product = torch.einsum("bikc,bjkc->bijc", grid, grid) + tokens[:, :, None] + tokens[:, None]
    return product.reshape(n * n, -1).softmax(0)


def _inputs(n: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(n)
    return [torch.randn(1, n, 4, generator=generator), torch.randn(n * n, 4, generator=generator)]


def test_exact_quotients():
    n, m = sympy.symbols("n m", integer=True, positive=True)
    assert exact_quotients(FloorDiv(FloorDiv(n**2, n) ** 2, FloorDiv(n**2, n))) == n
    assert exact_quotients(FloorDiv(6 * n * m, 3 * m)) == 2 * n
    assert isinstance(exact_quotients(FloorDiv(n**2, 2)), FloorDiv)  # not exact for odd n
    assert isinstance(exact_quotients(FloorDiv(n, m)), FloorDiv)
    assert merged_factors(n**2, [n]) == (n, n) and merged_factors(2 * n**2, [n]) == (2, n, n)


def test_a_square_pair_map_is_padded_as_its_rows_and_columns():
    bucketed = BucketedGraph(dynamo_graph(triangle_update, _inputs(6), {0: [1], 1: [0]}),
                             BucketConfig.from_options(multiple=8))
    assert bucketed.proof.safe, bucketed.proof.reason
    for length in (3, 11, 14, 5):
        torch.testing.assert_close(bucketed.run(*_inputs(length))[0], triangle_update(*_inputs(length)),
                                   atol=1e-5, rtol=1e-5)
    assert len(bucketed.stats.programs) == 2  # n = 3, 5 in the bucket of 8; 11, 14 in the bucket of 16


def _flattened(group: int):
    def regroup(tokens, pairs):
        grid = pairs.view(1, tokens.shape[1], tokens.shape[1], 4)
        return grid.reshape(-1, group, 4).sum(1) * 2

    return regroup


def test_a_pair_map_cut_across_its_rows_is_refused():
    """Flattened back entry by entry (groups of 1) it is proven; in pairs of entries, a pair could join a row's
    last real entry and its padding."""
    proofs = []
    for group in (1, 2):
        graph = symbolic_graph(_flattened(group), _inputs(6), {0: [1], 1: [0]})
        symbols = {size.node.expr for node in graph.graph.nodes if node.op == "placeholder"
                   for size in node.meta["val"].shape if isinstance(size, torch.SymInt)}
        proofs.append(prove_padding(graph, sorted(set().union(*(s.free_symbols for s in symbols)), key=str)))
    assert proofs[0].safe, proofs[0].reason
    assert not proofs[1].safe
