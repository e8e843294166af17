"""Sorting and order statistics on the NKI targets: sort, topk, median, kthvalue, searchsorted, isin.

A sort is a bitonic network over each row (padded to a power of two): log²(n)/2 compare-exchange stages, each a
flip of the row's halves (an indirect-DMA gather) and a fused element-wise select. Every element carries its
position, and the network orders by (class, key, position), so the result is the *stable* order torch defines:
NaN as the largest value (ascending: last; descending: first), -0.0 equal to 0.0, equal keys in input order. The
values are then gathered from the input by those positions (exact in every dtype). Keys compare in fp32: exact for
floats and for integers below 2**24 (`int_ranges.magnitude`).

Where torch's CPU kernels order ties by their own algorithm rather than by position, the positions are exact only
where that algorithm is stable too, and the other calls are refused when they read the positions:
- `sort(stable=False)` is libstdc++'s introsort, an insertion sort (stable) up to 16 elements;
- `topk` is `nth_element` + `sort`, stable up to 3 elements; with `sorted=False` the values' order is its own;
- `kthvalue` is a quickselect without position tie-break, stable up to 2 elements;
- `median`/`nanmedian` along a dim break ties by position (so they are exact), except a nanmedian of a row of NaN
  only, whose index is where `nth_element` leaves it with every comparison false: a function of n, `_all_nan_index`.

searchsorted/bucketize replay torch's binary search step by step (a gather of the middle element per step), so
even an unsorted sequence gives torch's answer; isin compares every pair, as torch's small-test-set path does.
"""

from __future__ import annotations

import functools
import operator

import torch
import torch.fx as fx

from neuron_dynamo.lowering import codegen, int_ranges
from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten

SORT_LIMIT = 2**14  # longest sorted dim: 105 network stages
UNSTABLE_EXACT = 16  # torch's unstable CPU sort is an insertion sort (stable) up to this many elements
TOPK_EXACT = 3  # nth_element is an insertion sort (stable) up to this many elements
KTHVALUE_EXACT = 2  # torch's quickselect keeps equal elements in place up to this many
PAIRS_LIMIT = 2**24  # elements of the all-pairs comparison of isin
SORT_OPS = (aten.sort.default, aten.sort.stable, aten.topk.default, aten.median.default, aten.median.dim,
            aten.nanmedian.default, aten.nanmedian.dim, aten.kthvalue.default)
SEARCH_OPS = (aten.searchsorted.Tensor, aten.searchsorted.Scalar, aten.bucketize.Tensor, aten.bucketize.Scalar)
ISIN_OPS = (aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)


@lowers(*SORT_OPS, *SEARCH_OPS, *ISIN_OPS, family="sorting")
def reference(op, *args, **kwargs):
    """Reference kernel: torch sorts."""
    return op(*args, **kwargs)


# ------------------------------------------------------------------------------------------------ the network
def _key_rows(rows: torch.Tensor, descending: bool, padded: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(key, code) rows [R, padded] whose order by (class, key, position) is torch's stable order: code is
    class · padded + position, the class ranking NaN and the padding apart from the numbers (which alone keep
    their key: the others' is 0)."""
    key = rows.to(torch.float32)
    nan = key != key
    number = torch.where(nan, 0.0, -key if descending else key)
    ranked_apart = nan.logical_not() if descending else nan  # class 1: after NaN (descending) or numbers
    width = padded - rows.shape[1]
    cls = torch.nn.functional.pad(ranked_apart.to(torch.float32), (0, width), value=2.0)
    code = cls * padded + torch.arange(padded, dtype=torch.float32)
    return torch.nn.functional.pad(number, (0, width)), code


def _precedes(key_a, code_a, key_b, code_b, padded: int) -> torch.Tensor:
    """a before b in the (class, key, position) order."""
    same_class = torch.floor(code_a * (1.0 / padded)) == torch.floor(code_b * (1.0 / padded))
    by_key = (key_a < key_b) | ((key_a == key_b) & (code_a < code_b))
    return torch.where(same_class, by_key, code_a < code_b)


def _partner(rows: torch.Tensor, distance: int) -> torch.Tensor:
    """Each element's partner at `distance` (position XOR distance): the halves of each block swapped."""
    count, width = rows.shape
    return rows.reshape(count, width // (2 * distance), 2, distance).flip(2).reshape(count, width)


def _bitonic(key: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """The codes of [R, N] rows (N a power of two) in ascending (class, key, position) order."""
    padded = key.shape[1]
    position = torch.arange(padded, dtype=torch.float32)
    size = 2
    while size <= padded:
        ascending = position - torch.floor(position * (0.5 / size)) * (2 * size) < size if size < padded else None
        distance = size // 2
        while distance >= 1:
            lower = position - torch.floor(position * (1.0 / (2 * distance))) * (2 * distance) < distance
            keeps_min = lower if ascending is None else lower == ascending
            other_key, other_code = _partner(key, distance), _partner(code, distance)
            take = torch.where(keeps_min, _precedes(other_key, other_code, key, code, padded),
                               _precedes(key, code, other_key, other_code, padded))
            key, code = torch.where(take, other_key, key), torch.where(take, other_code, code)
            distance //= 2
        size *= 2
    return code - torch.floor(code * (1.0 / padded)) * padded


def _sorted_positions(rows: torch.Tensor, descending: bool) -> torch.Tensor:
    """The input positions of [R, n] rows in torch's stable sort order, as int64 (plain torch code)."""
    if rows.shape[1] == 1:
        return torch.zeros(rows.shape, dtype=torch.int64)
    padded = 1 << max(rows.shape[1] - 1, 0).bit_length()
    key, code = _key_rows(rows, descending, padded)
    return _bitonic(key, code)[:, :rows.shape[1]].to(torch.int64)


def _as_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.reshape(1, 1) if x.dim() == 0 else x.movedim(dim, -1).reshape(-1, x.shape[dim])


def _from_rows(rows: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """[R, m] rows back in x's layout, with m along `dim`."""
    if x.dim() == 0:
        return rows.reshape(())
    moved = list(x.movedim(dim, -1).shape)
    return rows.reshape(moved[:-1] + [rows.shape[1]]).movedim(-1, dim)


# ------------------------------------------------------------------------------------------------ refusals
def _arg(node: fx.Node, index: int, name: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _reads_output(node: fx.Node, index: int) -> bool:
    """Whether anything reads output `index` of a multi-output node (a user other than getitem reads them all)."""
    return any(user.target is not operator.getitem or user.args[1] == index for user in node.users)


def _key_refusal(value: torch.Tensor, node: fx.Node) -> str | None:
    """Keys compare in fp32: floats exactly, integers below 2**24."""
    if value.dtype not in codegen.NKI_DTYPES:
        return f"a sort of {value.dtype}"
    if not value.dtype.is_floating_point and int_ranges.magnitude(node) > int_ranges.FP32_EXACT:
        return f"a sort of {str(value.dtype).removeprefix('torch.')}: keys compare in fp32, which rounds above 2**24"
    return None


def _length(node: fx.Node, dim) -> int | None:
    source = node.args[0].meta["val"]
    try:
        return 1 if source.dim() == 0 else int(source.shape[dim if dim is not None else 0])
    except (TypeError, ValueError, RuntimeError):  # a symbolic size
        return None


def _sort_refusal(node: fx.Node) -> str | None:
    source = node.args[0].meta["val"]
    packet, name = node.target.overloadpacket, node.target._overloadname
    whole = packet in (aten.median, aten.nanmedian) and name == "default"
    try:
        length = int(source.numel()) if whole else _length(node, _dim_of(node))
    except (TypeError, ValueError, RuntimeError):
        length = None
    if length is None:
        return "a sort along a symbolic size"
    if source.numel() >= int_ranges.FP32_EXACT:
        return "a sort of 2**24 elements or more (the gather of the values addresses them in fp32)"
    if length > SORT_LIMIT:
        return f"a sort of {length} elements (more than {SORT_LIMIT}: the bitonic network would be too long)"
    return _key_refusal(source, node.args[0]) or _tie_refusal(node, length)


def _dim_of(node: fx.Node) -> int:
    packet = node.target.overloadpacket
    if packet is aten.sort:
        dim = node.kwargs.get("dim", -1) if node.target._overloadname == "stable" else _arg(node, 1, "dim", -1)
    elif packet in (aten.topk, aten.kthvalue):
        dim = _arg(node, 2, "dim", -1)
    else:
        dim = _arg(node, 1, "dim", 0)
    rank = node.args[0].meta["val"].dim()
    return dim % rank if rank else 0


def _tie_refusal(node: fx.Node, length: int) -> str | None:
    """Positions of equal keys: refused where torch's CPU kernel orders them by an unstable algorithm."""
    packet, indices_read = node.target.overloadpacket, _reads_output(node, 1)
    if packet is aten.sort and not _stable(node) and indices_read and length > UNSTABLE_EXACT:
        return (f"an unstable sort of {length} elements whose indices are read: torch's CPU introsort orders equal "
                f"keys its own way beyond {UNSTABLE_EXACT} elements (stable=True is lowered)")
    if packet is aten.topk and length > TOPK_EXACT:
        if not _arg(node, 4, "sorted", True):
            return f"an unsorted topk of {length} elements: torch returns nth_element's order"
        if indices_read:
            return (f"a topk of {length} elements whose indices are read: torch's nth_element orders equal values "
                    "its own way")
    if packet is aten.kthvalue and indices_read and length > KTHVALUE_EXACT:
        return (f"a kthvalue of {length} elements whose index is read: torch's quickselect picks among equal values "
                "its own way")
    return None


def _stable(node: fx.Node) -> bool:
    return node.target._overloadname == "stable" and bool(node.kwargs.get("stable"))


# ------------------------------------------------------------------------------------------------ sort, topk
@lowers(aten.sort.default, aten.sort.stable, family="sorting", target="simulator", accepts=_sort_refusal,
        handles_empty=True)
def sort(op, x, *args, **kwargs):
    """Values and positions in torch's stable order (equal to its unstable one where `_sort_refusal` lets it)."""
    if op._overloadname == "stable":  # sort.stable(x, *, stable, dim=-1, descending=False)
        dim, descending = kwargs.get("dim", -1), kwargs.get("descending", False)
    else:
        dim, descending = (list(args) + [-1, False][len(args):])[:2]
    dim = dim % max(x.dim(), 1)
    if x.numel() == 0:
        return op(x, *args, **kwargs)
    return _sorted(x, dim, bool(descending), x.shape[dim] if x.dim() else 1)


def _sorted(x: torch.Tensor, dim: int, descending: bool, count: int):
    """The first `count` of x's values and positions along `dim` in torch's stable order."""
    from neuron_dynamo.lowering.generated import run_traced

    def first_sorted(x):
        rows = _as_rows(x, dim)
        positions = _sorted_positions(rows, descending)[:, :count]
        return _from_rows(rows.gather(1, positions), x, dim), _from_rows(positions, x, dim)

    return run_traced(f"sort:{dim}:{descending}:{count}", first_sorted, [x])


@lowers(aten.topk.default, family="sorting", target="simulator", accepts=_sort_refusal, handles_empty=True)
def topk(op, x, k, dim=-1, largest=True, sorted=True):
    """The first k of a stable sort, descending for the largest (NaN first, as torch ranks it the largest)."""
    dim = dim % max(x.dim(), 1)
    if x.numel() == 0 or k == 0:
        return op(x, k, dim, largest, sorted)
    return _sorted(x, dim, largest, k)


# ------------------------------------------------------------------------------------------------ order statistics
@functools.cache
def _all_nan_index(n: int) -> int:
    """Where libstdc++'s `nth_element(first, first, last)` leaves position 0 when every comparison is false (a
    nanmedian of NaNs only): its introselect moves the median of three to the front and swaps the ends of the rest
    inward until the range is 3 long (the insertion sort then moves nothing)."""
    order, first, last = list(range(n)), 0, n
    while last - first > 3:
        middle = first + (last - first) // 2
        order[first], order[middle] = order[middle], order[first]
        low, high = first + 1, last
        while True:
            high -= 1
            if low >= high:
                break
            order[low], order[high] = order[high], order[low]
            low += 1
        first, last = (low, last) if low <= first else (first, low)
    return order[first]


def _median_rank(rows: torch.Tensor, ignore_nan: bool) -> torch.Tensor:
    """[R, 1] rank of the median in the stable ascending order: the lower median, or the first NaN for median
    (torch returns it), or the lower median of the numbers for nanmedian (rank 0 when there are none)."""
    n = rows.shape[1]
    nans = (rows != rows).to(torch.float32).sum(1, keepdim=True)
    if ignore_nan:
        return torch.floor(torch.clamp(n - nans - 1, min=0) * 0.5).to(torch.int64)
    return torch.where(nans > 0, n - nans, float((n - 1) // 2)).to(torch.int64)


@lowers(aten.median.default, aten.median.dim, aten.nanmedian.default, aten.nanmedian.dim, family="sorting",
        target="simulator", accepts=_sort_refusal)
def median(op, x, dim=None, keepdim=False):
    """The element at the median's rank of a stable sort (torch breaks ties by position, so the index is exact)."""
    from neuron_dynamo.lowering.generated import run_traced

    ignore_nan = op.overloadpacket is aten.nanmedian
    whole = op._overloadname == "default"
    dim = 0 if whole else dim % max(x.dim(), 1)
    n = x.numel() if whole else (x.shape[dim] if x.dim() else 1)

    def pick(x):
        rows = x.reshape(1, -1) if whole else _as_rows(x, dim)
        positions = _sorted_positions(rows, descending=False).gather(1, _median_rank(rows, ignore_nan))
        if ignore_nan:
            none = (rows == rows).to(torch.float32).sum(1, keepdim=True) == 0
            positions = torch.where(none, _all_nan_index(n), positions)
        values = rows.gather(1, positions)
        if whole:
            return values.reshape(())
        return _reduced(values, x, dim, keepdim), _reduced(positions, x, dim, keepdim)

    return run_traced(f"{op}:{dim}:{keepdim}", pick, [x])


def _reduced(column: torch.Tensor, x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    """An [R, 1] per-row result in the shape of a reduction of x over `dim`."""
    out = _from_rows(column, x, dim)
    return out if keepdim or x.dim() == 0 else out.squeeze(dim)


@lowers(aten.kthvalue.default, family="sorting", target="simulator", accepts=_sort_refusal)
def kthvalue(op, x, k, dim=-1, keepdim=False):
    """The k-th of a stable ascending sort (NaN the largest, as torch's quickselect ranks it)."""
    from neuron_dynamo.lowering.generated import run_traced

    dim = dim % max(x.dim(), 1)
    count = x.shape[dim] if x.dim() else 1
    if not 1 <= k <= count:
        return op(x, k, dim, keepdim)  # torch raises: the error is the result

    def pick(x):
        rows = _as_rows(x, dim)
        positions = _sorted_positions(rows, descending=False)[:, k - 1:k]
        return _reduced(rows.gather(1, positions), x, dim, keepdim), _reduced(positions, x, dim, keepdim)

    return run_traced(f"kthvalue:{k}:{dim}:{keepdim}", pick, [x])


# ------------------------------------------------------------------------------------------------ searchsorted
def _search_refusal(node: fx.Node) -> str | None:
    bucketize = node.target.overloadpacket is aten.bucketize
    sequence, values = (node.args[1], node.args[0]) if bucketize else (node.args[0], node.args[1])
    if not isinstance(values, fx.Node):
        return "a search for a number (a Python scalar)"
    if node.kwargs.get("side") == "left" and node.kwargs.get("right"):
        return "side='left' with right=True: torch raises"
    seq, val = sequence.meta["val"], values.meta["val"]
    if seq.dtype != val.dtype:
        return f"a search of {val.dtype} values in a {seq.dtype} sequence"
    if seq.shape[-1] >= int_ranges.FP32_EXACT:
        return "a search in a sequence of 2**24 elements or more (positions would not be exact in fp32)"
    return _key_refusal(seq, sequence) or _key_refusal(val, values)


def _binary_search(sequence: torch.Tensor, values: torch.Tensor, sorter: torch.Tensor | None, right: bool):
    """torch's `cus_lower_bound`/`cus_upper_bound` on [R, n] sequences and [R, m] values, one step at a time:
    every value's range halves until it is empty, after at most bit_length(n) steps (plain torch code)."""
    n = sequence.shape[1]
    start = torch.zeros(values.shape, dtype=torch.float32)
    end = torch.full(values.shape, float(n))
    wide = values.to(torch.float32)
    for _ in range(n.bit_length()):
        searching = start < end
        middle = torch.floor((start + end) * 0.5)
        probe = torch.clamp(middle, max=n - 1).to(torch.int64)
        if sorter is not None:
            probe = sorter.gather(1, probe)
        found = sequence.gather(1, probe).to(torch.float32)
        beyond = (found > wide) if right else (found >= wide)
        start = torch.where(searching & beyond.logical_not(), middle + 1, start)
        end = torch.where(searching & beyond, middle, end)
    return start


@lowers(*SEARCH_OPS[:2], family="sorting", target="simulator", accepts=_search_refusal, handles_empty=True)
def searchsorted(op, sequence, values, *, out_int32=False, right=False, side=None, sorter=None):
    right = right or side == "right"
    return _search(sequence, values, sorter, right, torch.int32 if out_int32 else torch.int64,
                   lambda: op(sequence, values, out_int32=out_int32, right=right, side=side, sorter=sorter))


@lowers(*SEARCH_OPS[2:], family="sorting", target="simulator", accepts=_search_refusal, handles_empty=True)
def bucketize(op, values, boundaries, *, out_int32=False, right=False):
    return _search(boundaries, values, None, right, torch.int32 if out_int32 else torch.int64,
                   lambda: op(values, boundaries, out_int32=out_int32, right=right))


def _search(sequence, values, sorter, right: bool, out_dtype: torch.dtype, eager):
    """Positions of `values` in `sequence` (1-D: shared by every value; else row by row along the last dim)."""
    from neuron_dynamo.lowering.generated import run_traced

    if values.numel() == 0:
        return eager()  # nothing to search
    if sequence.shape[-1] == 0 or (sequence.dim() > 1 and sequence.numel() == 0):
        if sequence.dim() > 1 and sequence.shape[:-1] != values.shape[:-1]:
            return eager()  # torch raises on the mismatched shapes
        return run_traced(f"search_none:{out_dtype}", lambda v: torch.zeros(v.shape, dtype=out_dtype), [values])
    shape = values.shape
    tensors = [sequence, values] + ([sorter] if sorter is not None else [])

    def search(sequence, values, *sorter):
        count = sequence.shape[-1]
        rows = sequence.reshape(-1, count)
        wanted = values.reshape(rows.shape[0], -1)
        order = sorter[0].reshape(-1, count) if sorter else None
        return _binary_search(rows, wanted, order, right).reshape(shape).to(out_dtype)

    return run_traced(f"searchsorted:{right}:{out_dtype}", search, tensors)


# ------------------------------------------------------------------------------------------------ isin
def _brute_force(elements: int, tests: int) -> bool:
    """torch's choice (numpy's heuristic): compare every pair when the test set is small, else sort both."""
    return tests < int(10.0 * float(elements) ** 0.145)


def _isin_refusal(node: fx.Node) -> str | None:
    elements, tests = node.args[0], node.args[1]
    if not isinstance(elements, fx.Node):
        return "an isin of a Python number"
    common = torch.result_type(elements.meta["val"], tests.meta["val"] if isinstance(tests, fx.Node) else tests)
    if common not in codegen.NKI_DTYPES:
        return f"an isin in {common}"
    if not common.is_floating_point and any(int_ranges.magnitude(a) > int_ranges.FP32_EXACT for a in (elements,
                                                                                                       tests)):
        return f"an isin in {common}: values compare in fp32, which rounds above 2**24"
    if isinstance(tests, fx.Node):
        count, tested = int(elements.meta["val"].numel()), int(tests.meta["val"].numel())
        if count * tested > PAIRS_LIMIT:
            return "an isin whose all-pairs comparison would exceed 2**24 elements"
        if _arg(node, 2, "assume_unique", False) and not _brute_force(count, tested):
            return ("an isin with assume_unique=True over a large test set: torch's sorting path is undefined for "
                    "repeated elements")
    return None


@lowers(*ISIN_OPS, family="sorting", target="simulator", accepts=_isin_refusal, handles_empty=True)
def isin(op, elements, tests, *, assume_unique=False, invert=False):
    """Whether each element equals some test element (in their common dtype, compared in fp32: NaN never does,
    -0.0 equals 0.0): a count of equal pairs."""
    from neuron_dynamo.lowering.generated import run_traced

    common = torch.result_type(elements, tests)
    if elements.numel() == 0 or (isinstance(tests, torch.Tensor) and tests.numel() == 0):
        return op(elements, tests, assume_unique=assume_unique, invert=invert)  # nothing to compare
    if not isinstance(tests, torch.Tensor):  # isin.Tensor_Scalar: one test element
        tests = torch.tensor(tests, dtype=common)

    def contained(elements, tests):
        wide = elements.to(common).to(torch.float32).reshape(-1, 1)
        hits = (wide == tests.to(common).to(torch.float32).reshape(1, -1)).to(torch.float32).sum(1)
        found = (hits == 0) if invert else (hits > 0)
        return found.reshape(elements.shape)

    return run_traced(f"isin:{common}:{invert}", contained, [elements, tests])




# ------------------------------------------------------------------------------------------------ nonzero_static
NONZERO_LIMIT = 4096  # positions numbered by one cumsum (the scan kernel's longest row)


@lowers(aten.nonzero_static.default, family="sorting")
def nonzero_static_reference(op, *args, **kwargs):
    """Reference kernel: torch lists the non-zero positions."""
    return op(*args, **kwargs)


def _nonzero_static_refusal(node: fx.Node) -> str | None:
    x = node.args[0].meta["val"]
    size = node.args[1] if len(node.args) > 1 else node.kwargs["size"]
    fill = node.args[2] if len(node.args) > 2 else node.kwargs.get("fill_value", -1)
    if x.dtype not in codegen.NKI_DTYPES:
        return f"nonzero_static of {x.dtype}"
    if x.numel() > NONZERO_LIMIT:
        return f"nonzero_static over more than {NONZERO_LIMIT} positions (they are numbered by one cumsum)"
    if size * x.numel() > PAIRS_LIMIT:
        return "nonzero_static whose one-hot of slots and positions would exceed 2**24 elements"
    if not codegen.INT32_RANGE[0] <= fill <= codegen.INT32_RANGE[1]:
        return f"a fill value beyond int32 ({fill}): the device keeps integers in 32 bits"
    return None


@lowers(aten.nonzero_static.default, family="sorting", target="simulator", accepts=_nonzero_static_refusal,
        handles_empty=True)
def nonzero_static(op, x, *, size, fill_value=-1):
    """Slot k takes the position whose count of non-zeros before it (a cumsum) is k: a one-hot of slots against
    positions, whose product with the positions' coordinates (a host table) picks them exactly (one term each);
    slots beyond the count take `fill_value`."""
    from neuron_dynamo.lowering.generated import run_traced

    if size == 0 or x.dim() == 0 or x.numel() == 0:
        return torch.full((size, x.dim()), fill_value, dtype=torch.int64)  # nothing to find: all fill (or no dims)
    coordinates = torch.stack(torch.unravel_index(torch.arange(x.numel()), x.shape), -1).to(torch.float32)

    def listed(x: torch.Tensor, coordinates: torch.Tensor) -> torch.Tensor:
        found = (x.reshape(-1) != 0).to(torch.float32)
        order = torch.where(found > 0, found.cumsum(0) - 1, -1.0)
        one_hot = (order.reshape(1, -1) == torch.arange(size, dtype=torch.float32).reshape(-1, 1)).to(torch.float32)
        picked = torch.matmul(one_hot, coordinates)
        return torch.where(one_hot.amax(1, keepdim=True) > 0, picked, float(fill_value)).to(torch.int64)

    return run_traced(f"nonzero_static:{size}:{fill_value}", listed, [x, coordinates])
