"""The padding proof: may a graph run on inputs padded to a bucket and give the same real outputs?

Bucketing (`passes/bucketing.py`) serves a dynamic dimension from a static program compiled for a larger *bucket*
size: inputs are padded at the end of each dynamic dim, the program runs, outputs are sliced back. That is only
correct when no padded element can reach a real output. This pass proves it, or inserts the masks that make it true,
or refuses (the graph then runs at its exact shapes, and the reason is logged and counted).

It is a forward dataflow analysis over the aten graph *with symbolic sizes* (AOTAutograd's graph, before it is
specialised to a bucket). A tensor dim is *padded* when its size expression contains a bucketed symbol; its real
region is `[0, e(real))`, its pad region `[e(real), e(bucket))` ("right padding"). For each padded dim the analysis
tracks what the pad region holds:

    ZERO     exactly 0 (or False)                    NEG_INF  exactly -inf
    FINITE   finite values, arbitrary                 UNKNOWN  anything, inf and NaN included

and, for integer tensors, an index *bound* (values at real positions index only the real region of a dim: `arange`).
Graph inputs are padded with 0, so every padded input dim starts as ZERO (ids, attention masks and labels included:
an attention mask padded with 0 masks the padded keys). Values of unpadded tensors (weights, real data) broadcast
into a pad region are never assumed finite: they may be inf (an additive -inf mask is real data).

Rules, over a padded dim (`mask` = the analysis inserts `masked_fill(pad region, value)`; `refuse` = exact shapes):

| op family | rule |
|---|---|
| graph inputs | padded with 0 at the tail of each dynamic dim; when that is refused, a dim sized `c·s` (a flattened |
|   | `[c, s]`: a saved activation in a backward graph) or `s**2` (a flattened square pair map) is padded as |
|   | `[c, s]` or `[s, s]` (merged), and the proof runs again |
| element-wise (`Tag.pointwise`), casts | safe. Pad kind computed exactly when every padded operand holds a constant |
|   | (0, -inf); else int/bool results FINITE, 0 * finite = 0, bounded ops (tanh, relu) keep FINITE, others UNKNOWN; |
|   | an integer `//`, `%`, fmod, div(rounding_mode) masks the divisor's pad to 1 (eager raises on 0) |
| view, reshape, (un)squeeze | safe while the padded dim stays a dim; a merge with other dims is followed as a |
|   | *merged* dim (padding interleaved), which only element-wise ops, matmul, reductions, softmax, norms |
|   | and scatters may consume; a split must cut at factor boundaries (a tail-padded product `2*s`, the merge |
|   | of `[s, 2]` with `s` outermost, splits back as `[s, 2]` only). Sizes are read with exact floor divisions |
|   | written as quotients (`(s**2) // s` is `s`) |
| view_as_complex, view_as_real | safe: the dims keep their padding (the size-2 real/imaginary pair dim is static, |
|   | never padded; a padded dim split into pairs is refused by the view rule). A complex pad kind is `kind + 0j`; |
|   | each part of a -inf pad: UNKNOWN. _conj, resolve_conj, resolve_neg, real, imag, complex, polar: element-wise; |
|   | on complex numbers only neg, conj and the parts are bounded (tanh has poles there, sin and cos grow like sinh) |
| permute, transpose, expand, repeat | dims follow; a broadcast (or tiling) to a padded size fills the pad with |
|   | real data (UNKNOWN); a padded dim tiled more than once: refuse |
| slice, narrow, select | constant start >= 0: safe. A tail slice `x[:, -k:]` (the last position's logits): read |
|   | at the real end (a gather). Other starts counted from the end (`x[:, -1]`): refuse. A slice to the end of |
|   | a dim from a start computed from a dynamic size (`x[:, n:]`, `x[:, -n:]`): `x[-n:]` of `n + c` elements |
|   | starts at c; others are read where they begin at the real sizes (a gather, clamped). Any other start, |
|   | index or (unpadded) end computed from a dynamic size (`table[x.shape[1] - 1]`), of any tensor: refuse |
| cat / split, unbind | along unpadded dims safe; along a padded dim the last operand may be padded; one padded |
|   | operand followed by unpadded ones (a KV cache and the new keys): those are moved up to its real end (gather); |
|   | `split_with_sizes` of a tail-padded dim whose pieces but the last are unpadded: safe; other splits refuse |
| stack | safe: the new dim is unpadded, the others keep the operands' pads (mixed kinds: UNKNOWN) |
| constant_pad_nd | right padding of a padded dim: the fill is moved to the real end (mask); a crop at the start |
|   | (negative left pad: a causal conv's backward) keeps the tail; a crop at the end: refuse. A left pad as |
|   | wide as a dynamic size on an unpadded dim (`F.pad(mask, (n, 0))`): a cat of the fill and the data, the data |
|   | moved up to the fill's real end (gather); on a padded dim: refuse |
| mm, bmm, addmm, baddbmm, mv, dot | contraction safe when one operand's pad is ZERO and the other's ZERO or FINITE; |
|   | else mask operands to 0 |
| sum, any / amax, max, argmax, logsumexp | need the neutral pad 0 / -inf, else mask to it (+inf: min, 1: prod) |
| mean | mask to 0, then sum / real element count |
| var, std | refuse |
| softmax, log_softmax | mask the input to -inf (pad of the result: 0 / -inf); backward: mask operands to 0 |
| attention (SDPA fwd/bwd) | causal self-attention, both lengths padded by one symbol: safe for real queries. |
|   | Else mask the padded keys with -inf (causal over different length symbols: the top-left causal mask made |
|   | explicit first). Padded keys/values zeroed; backward zeroes padded queries' grad/out/lse. A padded head dim: |
|   | refuse (the default scale). Only the symbols that vary are proven over (bucket_dispatch.py) |
| cumsum, cumprod, cummax | safe (right padding: a real position sees only earlier real positions); merged dim: refuse |
| sort, argsort, topk, median, mode | refuse (padding would move into real positions) |
| unique, nonzero, masked_select | refuse (the output size would count padding) |
| layer norm, batch norm (eval) | safe when the normalised dims are unpadded; LN backward masks to 0 |
| convolution (+ backward) | stride 1, not transposed: any kernel, conv padding and dilation over a padded spatial dim |
|   | (input pad set to 0); backward zeroes grad_out's and the input's pad; padded channels or batch (bwd): refuse |
| embedding (+ backward) | padded indices are valid rows (pad 0); backward masks padded gradient rows to 0 |
| index, index_select, gather | along a padded dim only with an index bounded by that dim (derived from `arange`) |
|   | indices into an unpadded dim (embedding too) whose pad is not 0 (`arange(s)` position ids): pad set to 0 |
| nll_loss (fwd/bwd) | padded targets are set to `ignore_index` |
| scatter, index_add, slice_scatter | along unpadded dims safe; slice_scatter along a padded dim restores the |
|   | destination behind the real end; other writes along a padded dim (a KV cache) refuse |
| index_put | accumulate: mask padded values to 0, when the values are padded like the indices (not broadcast, |
|   | not merged differently: else refuse), padded indices set in range; overwrite of unpadded values at unpadded |
|   | indices into a padded buffer (a static KV cache): negative indices counted from the real end; else refuse |
| mutations (copy_, add_, ...) | refuse when padding is involved (the caller would never see the padded copy) |
| random (dropout, rand, bernoulli) | refuse on padded shapes (the random stream would differ) |
| creation (full, zeros, arange) | pad kind from the fill value; `arange` start must not depend on a bucketed size |
| a size used as data (`x / s0`) | a pointwise op gets the real size (int or float expression: `1 / s0`, `s0 ** 0.5`) |
|   | as a 0-d tensor; `full`/`scalar_tensor`/`fill` fill 0 and add the real size; anywhere else: refuse |
| c10d_functional | collectives, over sizes of one symbol only (every rank pads alike; `collective_rules.py`): |
|   | `all_reduce`, `broadcast`, `wait_tensor` element-wise across ranks; `all_gather_into_tensor` along a |
|   | padded dim 0 gives a merged `[ranks, s]`, which only `reduce_scatter_tensor` may cut (in rank chunks) |
| anything else touching padding | refuse, naming the op |

Masks compare `arange(bucket size)` against the real size, which the transformed graph receives as extra 0-d int64
inputs (one per bucketed symbol, appended after the original inputs) so that one static program serves every real
length of its bucket.
"""

from neuron_dynamo.passes.padding import (  # noqa: F401 - register the rules
    collective_rules,
    complex_rules,
    compute_rules,
    indexing_rules,
    shape_rules,
)
from neuron_dynamo.passes.padding.analysis import Analysis, merged_factors, prove_padding
from neuron_dynamo.passes.padding.state import DimPad, Pad, PaddingProof, PaddingRefused, TensorPad, graph_outputs

__all__ = ["Analysis", "DimPad", "Pad", "PaddingProof", "PaddingRefused", "TensorPad", "graph_outputs",
           "merged_factors", "prove_padding"]
