"""NkiTensor: a typed, strided view of one allocation in HBM, SBUF or PSUM.

Storage is a contiguous NumPy array of the dtype's storage type (bf16/fp8 through ml_dtypes); every NkiTensor is a
NumPy view of it, so indexing, `nl.ds`, `reshape`, `permute` and `broadcast` never copy, exactly like NKI views.
`.ap()` builds a raw access pattern over the base storage; with `vector_offset` it becomes an *indirect* tensor
(an index array into the storage) for DMA gathers/scatters.

SBUF/PSUM tensors keep the partition dimension first: views may not move it, an integer index on it keeps it with
size 1, and an integer index on a free dim drops that dim unless fewer than 2 dims would remain (NKI 0.6 rank
rules). Fresh allocations are filled with NaN (integers: 4), so reads of unwritten memory show up in results.

Capacity: each SBUF/PSUM allocation is live from the first to the last instruction that touches it (the liveness
an allocator would see; a Python-object-lifetime model would count a tile rebound in a loop twice). At the end of
a program instance the interpreter sweeps those intervals and rejects a kernel whose live SBUF bytes per partition
exceed the target's capacity, or whose live PSUM tensors need more than the 8 banks (every PSUM tensor occupies
whole 2 KiB banks, as the PSUM allocator places tensors on bank boundaries).
"""

from __future__ import annotations

import enum
import itertools
import math
import operator
import weakref

import numpy as np

from neuron_dynamo.nki import dtypes
from neuron_dynamo.nki.context import Allocation, active, current
from neuron_dynamo.nki.errors import NkiValidationError, kernel_site


class MemoryRegion(enum.Enum):
    """Where a tensor lives (`nl.sbuf`, `nl.psum`, `nl.private_hbm` = `nl.hbm`, `nl.shared_hbm`)."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"


ONCHIP = ("sbuf", "psum")
HBM = ("private_hbm", "shared_hbm")


def buffer_kind(buffer: str) -> str:
    """The cost model's coarse buffer name: sbuf | psum | hbm."""
    return "hbm" if buffer in HBM else buffer


class Storage:
    """One allocation. `use` is its liveness record (on-chip only); `acc_groups` the open PSUM accumulation groups.

    `f32_cache` keeps the fp32 upcast of low-precision views that were read: a bf16 weight tile feeding eight
    matmuls is converted once. Every write goes through `NkiTensor._write`, which drops the cache.
    """

    __slots__ = ("data", "buffer", "name", "site", "use", "written", "acc_groups", "f32_cache", "serial", "__weakref__")

    _serials = itertools.count()  # unique over the process: `id()` is reused once a storage is freed

    def __init__(self, data: np.ndarray, buffer: str, name: str, site, use: Allocation | None) -> None:
        self.serial = next(self._serials)  # the cost model's identity of this allocation
        self.data = data
        self.buffer = buffer
        self.name = name
        self.site = site
        self.use = use
        self.written = False
        self.acc_groups: dict | None = {} if buffer == "psum" else None  # view key -> byte extent
        self.f32_cache: dict | None = None  # fp32 copies of low-precision views, dropped on every write


def _int(value, what: str) -> int:
    """A compile-time integer (ints, NumPy integers and registers, which know their value in the interpreter)."""
    if isinstance(value, (bool, np.bool_)):
        raise NkiValidationError("compile-time-int", f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise NkiValidationError("compile-time-int", f"{what} must be an integer, got {value!r}") from None


class Lifetime:
    """Held by every view of one on-chip tile and by nothing else: when the last view goes, the kernel can no longer
    name the tile and its array may serve the launch's next allocation. (The storage itself outlives its views: the
    steps recorded for a replay keep it.)"""

    __slots__ = ("__weakref__",)


class NkiTensor:
    """A view of an NKI allocation. Attributes: shape, dtype, buffer, ndim, size, strides, offset, name."""

    __slots__ = ("_a", "_s", "_dt", "_idx", "_life")

    def __init__(self, array: np.ndarray | None, storage: Storage, dtype: str, idx=None,
                 life: Lifetime | None = None) -> None:
        self._a = array
        self._s = storage
        self._dt = dtype
        self._idx = idx  # indirect tensors: their `Indirect` addressing
        self._life = life  # on-chip tiles: shared by all views of the allocation (see `Lifetime`)

    # ---------------------------------------------------------------- attributes
    @property
    def shape(self) -> tuple[int, ...]:
        return self._a.shape if self._idx is None else self._idx.shape

    @property
    def dtype(self) -> str:
        return self._dt

    @property
    def buffer(self) -> MemoryRegion:
        return MemoryRegion(self._s.buffer)

    @property
    def name(self) -> str:
        return self._s.name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return dtypes.itemsize(self._dt)

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements."""
        self._direct("strides")
        item = self._a.itemsize
        return tuple(s // item for s in self._a.strides)

    @property
    def offset(self) -> int:
        """Element offset of this view from the start of its allocation."""
        self._direct("offset")
        return (self._a.__array_interface__["data"][0] - self._s.data.__array_interface__["data"][0]) // (
            self._a.itemsize
        )

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        kind = "indirect " if self._idx is not None else ""
        return f"NkiTensor({kind}shape={self.shape}, dtype={self._dt}, buffer={self._s.buffer}, name={self.name!r})"

    def __bool__(self) -> bool:
        raise NkiValidationError(
            "tensor-truth-value",
            "an NKI tensor has no compile-time truth value (its contents exist only on the device); "
            "branch on shapes or Python values, or use nl.where / nisa.affine_select",
        )

    def __iter__(self):
        raise NkiValidationError(
            "tensor-iteration", "NKI tensors are not iterable; loop over indices: for i in range(t.shape[0]): t[i]"
        )

    def __setitem__(self, key, value) -> None:
        raise NkiValidationError(
            "no-item-assignment",
            "NKI 0.6 tensors do not support item assignment; write through an instruction "
            "(nisa.tensor_copy / nisa.dma_copy / nl.store) with the indexed view as dst",
        )

    # ---------------------------------------------------------------- data access (interpreter internals)
    def _direct(self, what: str) -> None:
        if self._idx is not None:
            raise NkiValidationError(
                "indirect-view", f"{what} is not defined on an indirect (vector_offset) access pattern"
            )

    def _onchip(self) -> bool:
        return self._s.buffer in ONCHIP

    def _read(self) -> np.ndarray:
        _outside_step("reads tensor values into the kernel's Python")
        if self._idx is None:
            return self._a
        flat = self._s.data.reshape(-1)
        idx, oob = self._idx.resolve()
        return flat[idx] if oob is None else flat[np.where(oob, 0, idx)]

    def _write(self, values: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Store `values` (any shape with this view's element count) cast to this view's dtype.

        `mask` (same element count) limits the write to the selected elements (DMA skips out-of-bounds rows).
        """
        recording = _recording()
        if recording is not None:
            if recording.in_step:
                recording.fills.wrote(self, mask is None and self._idx is None)
            else:
                recording.refuse("it writes memory outside a recorded instruction")
        values = dtypes.to_dtype(values, self._dt)
        self._s.written = True
        self._s.f32_cache = None
        if self._idx is None:
            a = self._a
            if not a.flags.writeable:
                raise NkiValidationError(
                    "write-to-broadcast", "cannot write into a broadcast view (stride-0 dimension); write the full tile"
                )
            if mask is None:
                a[...] = values.reshape(a.shape)
            else:
                mask = mask.reshape(a.shape)
                a[mask] = values.reshape(a.shape)[mask]
            return
        flat = self._s.data.reshape(-1)
        idx, oob = self._idx.resolve()
        values = values.reshape(idx.shape)
        keep = None if mask is None else mask.reshape(idx.shape)
        if oob is not None:
            keep = ~oob if keep is None else keep & ~oob
        if keep is None:
            flat[idx] = values
        else:
            flat[idx[keep]] = values[keep]

    # ---------------------------------------------------------------- views
    def __getitem__(self, key) -> NkiTensor:
        self._direct("indexing")
        if not isinstance(key, tuple):
            key = (key,)
        shape = self._a.shape
        ndim = len(shape)
        n_ellipsis = sum(1 for k in key if k is Ellipsis)
        if n_ellipsis > 1:
            raise NkiValidationError("index", "an index may contain at most one Ellipsis (...)")
        if n_ellipsis:
            at = next(i for i, k in enumerate(key) if k is Ellipsis)
            fill = ndim - (len(key) - 1)
            key = key[:at] + (slice(None),) * fill + key[at + 1 :]
        if len(key) > ndim:
            raise NkiValidationError("index", f"too many indices ({len(key)}) for a {ndim}-D tensor of shape {shape}")
        norm: list = []
        int_dims: list[int] = []
        for dim, item in enumerate(key):
            size = shape[dim]
            if isinstance(item, slice):
                step = 1 if item.step is None else _int(item.step, "a slice step")
                if step <= 0:
                    raise NkiValidationError("index", f"slice step must be positive, got {step}")
                start = 0 if item.start is None else _int(item.start, "a slice start")
                stop = size if item.stop is None else _int(item.stop, "a slice stop")
                start = start + size if start < 0 else start
                stop = stop + size if stop < 0 else stop
                if not 0 <= start <= stop <= size:
                    raise NkiValidationError(
                        "index-out-of-bounds",
                        f"slice {item.start}:{item.stop} is out of bounds for dim {dim} of size {size} "
                        f"(tensor shape {shape}); clamp ragged tiles with min()",
                    )
                norm.append(slice(start, stop, step))
            elif isinstance(item, NkiTensor):
                raise NkiValidationError(
                    "index",
                    "tensors cannot index tensors; use .ap(pattern, vector_offset=indices) for gathers/scatters",
                )
            else:
                idx = _int(item, "an index")
                idx = idx + size if idx < 0 else idx
                if not 0 <= idx < size:
                    raise NkiValidationError(
                        "index-out-of-bounds", f"index {item} is out of bounds for dim {dim} of size {size}"
                    )
                norm.append(idx)
                int_dims.append(dim)
        if int_dims and self._onchip():
            if norm[0].__class__ is int:  # the partition dim is never dropped
                norm[0] = slice(norm[0], norm[0] + 1)
                int_dims.remove(0)
            kept = ndim - len(int_dims)
            if kept < 2 and int_dims:
                last = int_dims[-1]
                norm[last] = slice(norm[last], norm[last] + 1)
        return self._view(self._a[tuple(norm)])

    def _view(self, array: np.ndarray) -> NkiTensor:
        return NkiTensor(array, self._s, self._dt, life=self._life)

    def _check_dim(self, dim, allow_partition: bool = False) -> int:
        d = _int(dim, "a dimension")
        d = d + self.ndim if d < 0 else d
        if not 0 <= d < self.ndim:
            raise NkiValidationError("view", f"dimension {dim} is out of range for shape {self.shape}")
        if d == 0 and self._onchip() and not allow_partition:
            raise NkiValidationError("partition-dim", "views of SBUF/PSUM tensors may not move or change dim 0")
        return d

    def slice(self, dim, start, end, step=1) -> NkiTensor:
        d = self._check_dim(dim, allow_partition=True)
        key = [slice(None)] * self.ndim
        key[d] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim, index) -> NkiTensor:
        """`index` an int, or (dynamic select) a tensor holding the index, which the interpreter reads now."""
        d = self._check_dim(dim, allow_partition=True)
        if isinstance(index, NkiTensor):
            if d == 0 and self._onchip():
                raise NkiValidationError("partition-dim", "a dynamic select of an SBUF/PSUM tensor may not index dim 0")
            index = int(np.asarray(index._read()).reshape(-1)[0])
        key = [slice(None)] * self.ndim
        key[d] = index
        return self[tuple(key)]

    def vector_select(self, dim, vector_offset) -> NkiTensor:
        """Per-partition gather along dim 0 of an HBM tensor: row p of the result is row `vector_offset[p]`."""
        self._direct("vector_select")
        if _int(dim, "a dimension") != 0:
            raise NkiValidationError("vector-select", f"vector_select indexes dim 0 only, got dim {dim}")
        if self._onchip():
            raise NkiValidationError("vector-select", "vector_select is supported on HBM tensors only")
        if not isinstance(vector_offset, NkiTensor) or vector_offset.ndim != 2 or vector_offset.shape[1] != 1:
            raise NkiValidationError("vector-select", "vector_offset must be an SBUF tensor of shape (partitions, 1)")
        pattern = self.get_pattern()
        pattern[0][1] = vector_offset.shape[0]
        return self.ap(pattern, offset=self.offset, vector_offset=vector_offset, indirect_dim=0)

    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None) -> NkiTensor:
        """einops-style `('b', ('h', 'w')) -> ('b', 'w', 'h')`: split, reorder and merge dims as one view."""
        self._direct("rearrange")
        sizes = dict(fixed_sizes or {})
        if len(src_pattern) != self.ndim:
            raise NkiValidationError("rearrange", f"source pattern {src_pattern} has {len(src_pattern)} dims, the "
                                     f"tensor {self.shape}")
        names: list[str] = []
        for item, n in zip(src_pattern, self.shape, strict=True):
            group = (item,) if isinstance(item, str) else tuple(item)
            unknown = [g for g in group if g not in sizes]
            known = math.prod(sizes[g] for g in group if g in sizes)
            if len(unknown) > 1 or (not unknown and known != n) or n % known:
                raise NkiValidationError("rearrange", f"cannot split a dim of size {n} into {group} with sizes {sizes}"
                                         "; give all but one size in fixed_sizes")
            if unknown:
                sizes[unknown[0]] = n // known
            names.extend(group)
        dst_groups = [(item,) if isinstance(item, str) else tuple(item) for item in dst_pattern]
        order = [g for group in dst_groups for g in group]
        if sorted(order) != sorted(names):
            raise NkiValidationError("rearrange", f"patterns {src_pattern} -> {dst_pattern} must name the same dims")
        split = self.reshape(tuple(sizes[g] for g in names)) if len(names) != self.ndim else self
        moved = split.permute(tuple(names.index(g) for g in order))
        merged = tuple(math.prod(sizes[g] for g in group) for group in dst_groups)
        return moved.reshape(merged) if len(merged) != len(order) else moved

    def permute(self, dims) -> NkiTensor:
        self._direct("permute")
        dims = tuple(_int(d, "a dimension") for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise NkiValidationError("view", f"permute({dims}) is not a permutation of the {self.ndim} dims")
        if self._onchip() and dims[0] != 0:
            raise NkiValidationError(
                "partition-dim", "permute may not move the partition dim (dim 0) of an SBUF/PSUM tensor"
            )
        return self._view(self._a.transpose(dims))

    def broadcast(self, dim, size) -> NkiTensor:
        self._direct("broadcast")
        d = self._check_dim(dim)
        if self.shape[d] != 1:
            raise NkiValidationError("view", f"broadcast needs dim {d} of size 1, shape is {self.shape}")
        shape = list(self.shape)
        shape[d] = _int(size, "a broadcast size")
        return self._view(np.broadcast_to(self._a, tuple(shape)))

    def expand_dim(self, dim) -> NkiTensor:
        self._direct("expand_dim")
        d = _int(dim, "a dimension")
        d = d + self.ndim + 1 if d < 0 else d
        if d == 0 and self._onchip():
            raise NkiValidationError("partition-dim", "expand_dim(0) would move the partition dim of an SBUF tensor")
        return self._view(np.expand_dims(self._a, d))

    def squeeze_dim(self, dim) -> NkiTensor:
        d = self._check_dim(dim)
        if self.shape[d] != 1:
            raise NkiValidationError("view", f"squeeze_dim needs dim {d} of size 1, shape is {self.shape}")
        return self._view(np.squeeze(self._a, d))

    def reshape(self, shape) -> NkiTensor:
        self._direct("reshape")
        shape = tuple(_int(s, "a shape entry") for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        view = self._a.view()
        try:
            view.shape = shape
        except (AttributeError, ValueError) as exc:
            raise NkiValidationError(
                "reshape",
                f"cannot reshape a view of shape {self.shape} with strides {self.strides} to {shape} without a copy "
                f"({exc}); reshape the contiguous tensor, or copy first",
            ) from None
        if self._onchip() and view.shape[0] != self.shape[0]:
            raise NkiValidationError(
                "partition-dim", f"reshape of an SBUF/PSUM tensor must keep the partition dim {self.shape[0]}"
            )
        return self._view(view)

    def reshape_dim(self, dim, shape) -> NkiTensor:
        d = self._check_dim(dim, allow_partition=True)
        new = self.shape[:d] + tuple(shape) + self.shape[d + 1 :]
        return self.reshape(new)

    def flatten_dims(self, start, end) -> NkiTensor:
        s = self._check_dim(start, allow_partition=True)
        e = self._check_dim(end, allow_partition=True)
        new = self.shape[:s] + (math.prod(self.shape[s : e + 1]),) + self.shape[e + 1 :]
        return self.reshape(new)

    def view(self, dtype) -> NkiTensor:
        """Reinterpret the bits as another dtype; the last dim scales by the size ratio (fp32 (128, 64) -> uint8
        (128, 256)), so it must be contiguous and, for a larger dtype, divisible by the ratio."""
        self._direct("view")
        name = dtypes.dtype_name(dtype)
        a = self._a
        new_size = dtypes.itemsize(name)
        if new_size != self.itemsize:
            if a.shape[-1] > 1 and a.strides[-1] != a.itemsize:
                raise NkiValidationError("view", f"view({name}) changes the element size, so the last dim must be "
                                         f"contiguous; it has a stride of {a.strides[-1] // a.itemsize} elements")
            if (a.shape[-1] * self.itemsize) % new_size:
                raise NkiValidationError("view", f"view({name}): the last dim ({a.shape[-1]} x {self.itemsize} bytes) "
                                         f"is not a multiple of {new_size} bytes")
            if a.shape[-1] == 1:  # NumPy wants a unit stride on the axis it rescales
                a = np.lib.stride_tricks.as_strided(a, a.shape, a.strides[:-1] + (a.itemsize,))
        return NkiTensor(a.view(dtypes.STORAGE[name]), self._s, name, life=self._life)

    def is_contiguous(self) -> bool:
        return self._idx is None and self._a.flags.c_contiguous

    def is_indirect(self) -> bool:
        return self._idx is not None

    def get_pattern(self) -> list[list[int]]:
        return [[st, n] for st, n in zip(self.strides, self.shape, strict=True)]

    def ap(self, pattern, offset=0, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None) -> NkiTensor:
        """A raw access pattern `[[step, num], ...]` (outermost first) over the base allocation, ignoring this view.

        For SBUF/PSUM the first pair addresses partitions: its step must equal the allocation's free-element count.
        `scalar_offset` (an int or a 1-element tensor) and `vector_offset` (one index per element of dim
        `indirect_dim`) move dim `indirect_dim` dynamically, in units of that dim's step: the indirect DMA gather /
        scatter (e.g. embedding lookup) of NKI.
        """
        if dtype is not None and dtypes.dtype_name(dtype) != self._dt:
            raise NkiValidationError("ap", "ap(dtype=...) reinterpretation is not supported; use .view(dtype) first")
        pattern = [[_int(st, "an access-pattern step"), _int(n, "an access-pattern count")] for st, n in pattern]
        if not pattern:
            raise NkiValidationError("ap", "an access pattern needs at least one [step, num] pair")
        base = self._s.data
        offset = _int(offset, "an access-pattern offset")
        if self._onchip():
            row = math.prod(base.shape[1:])
            if pattern[0][0] != row:
                raise NkiValidationError(
                    "ap",
                    f"the first [step, num] of an SBUF/PSUM access pattern addresses partitions: step must be the "
                    f"allocation's free size {row}, got {pattern[0][0]}",
                )
        steps = [st for st, _ in pattern]
        counts = [n for _, n in pattern]
        if any(st < 0 for st in steps) or any(n <= 0 for n in counts):
            raise NkiValidationError("ap", f"access pattern {pattern} needs non-negative steps and positive counts")
        if scalar_offset is not None:
            value = scalar_offset
            if isinstance(value, NkiTensor):
                value = int(np.asarray(value._read()).reshape(-1)[0])
            offset += _int(value, "scalar_offset") * steps[indirect_dim]
        flat = base.reshape(-1)
        if vector_offset is None:
            last = offset + sum(st * (n - 1) for st, n in pattern)
            if offset < 0 or last >= flat.size:
                raise NkiValidationError(
                    "ap", f"access pattern {pattern} at offset {offset} reaches element {last} of an allocation of "
                    f"{flat.size} elements"
                )
            item = flat.itemsize
            view = np.lib.stride_tricks.as_strided(flat[offset:], tuple(counts), tuple(st * item for st in steps))
            if view.dtype != dtypes.STORAGE[self._dt]:
                view = view.view(dtypes.STORAGE[self._dt])
            return self._view(view)
        if not isinstance(vector_offset, NkiTensor):
            raise NkiValidationError("ap", "vector_offset must be an SBUF tensor of indices")
        d = _int(indirect_dim, "indirect_dim")
        if not 0 <= d < len(pattern):
            raise NkiValidationError("ap", f"indirect_dim {d} is outside the {len(pattern)}-D access pattern")
        vector_offset._direct("vector_offset")
        shape = vector_offset.shape
        available = math.prod(shape)
        if len(shape) == 2 and shape[1] > 1:  # a [128, N] index tile is read column-major, as far as needed
            available = min(available, counts[d])
        if available != counts[d]:
            raise NkiValidationError(
                "ap", f"vector_offset has {available} indices but access-pattern dim {d} has {counts[d]} elements"
            )
        return NkiTensor(None, self._s, self._dt, Indirect(pattern, offset, d, flat.size, vector_offset),
                         life=self._life)


class Indirect:
    """The addressing of an indirect access pattern: the element indices come from the index tile when the DMA
    runs (as on hardware), so a replayed DMA gathers with that call's indices. The part of every index that does
    not depend on the tile (the offset and the other dims' steps) is computed once, with its extremes."""

    __slots__ = ("pattern", "offset", "dim", "size", "offsets", "shape", "_static", "_low", "_high")

    def __init__(self, pattern, offset: int, dim: int, size: int, offsets: NkiTensor) -> None:
        self.pattern = pattern
        self.offset = offset
        self.dim = dim
        self.size = size  # elements of the whole allocation
        self.offsets = offsets  # the index tile
        self.shape = tuple(n for _, n in pattern)
        static = np.full([1 if k == dim else n for k, n in enumerate(self.shape)], offset, dtype=np.int64)
        for k, (st, n) in enumerate(pattern):
            if k != dim:
                static += (np.arange(n, dtype=np.int64) * st).reshape([n if j == k else 1 for j in range(len(pattern))])
        self._static, self._low, self._high = static, int(static.min()), int(static.max())

    def resolve(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(flat element indices, out-of-bounds mask or None) from the index tile's current values."""
        d, counts = self.dim, self.shape
        rows = np.asarray(self.offsets._a)
        if rows.ndim == 2 and rows.shape[1] > 1:  # a [128, N] index tile is read column-major: indices.T.flatten()
            rows = rows.T.reshape(-1)[: counts[d]]
        rows = rows.reshape(-1)
        rows = rows.astype(np.int64) if rows.dtype.kind in "iu" else np.rint(rows.astype(np.float64)).astype(np.int64)
        along = rows * self.pattern[d][0]
        shape = [1] * len(counts)
        shape[d] = counts[d]
        idx = self._static + along.reshape(shape)
        # a dynamic index out of range invalidates its whole row (the DMA skips whole descriptors)
        bad = (along + self._low < 0) | (along + self._high >= self.size)
        if not bad.any():
            return idx, None
        return idx, np.broadcast_to(bad.reshape(shape), counts)


def _outside_step(what: str) -> None:
    """A data access outside an instruction's recorded step makes the call being recorded unreplayable."""
    recording = _recording()
    if recording is not None and not recording.in_step:
        recording.refuse(f"it {what}")


def _recording():
    """The recording of the running kernel call, if it is being recorded."""
    ctx = active()
    return None if ctx is None else ctx.launch.recording


def _no_operator(name):
    def method(self, *args):
        raise NkiValidationError(
            "tensor-operator",
            f"NKI 0.6 tensors have no `{name}` operator (legacy tiles did); call the instruction instead, e.g. "
            "nl.add(a, b) / nisa.tensor_tensor(dst, a, b, op=nl.add), and nc_matmul(dst, ...) to accumulate in PSUM",
        )

    method.__name__ = name
    return method


for _name in ("__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__",
              "__imul__", "__truediv__", "__rtruediv__", "__itruediv__", "__matmul__", "__rmatmul__", "__neg__",
              "__pow__", "__lt__", "__le__", "__gt__", "__ge__"):
    setattr(NkiTensor, _name, _no_operator(_name))


def allocate(shape, dtype, buffer, name: str = "", fill=None, site=None) -> NkiTensor:
    """A fresh tensor in `buffer` (NaN-filled unless `fill` says otherwise), registered with the running kernel."""
    ctx = current()
    if isinstance(buffer, str):
        raise NkiValidationError(
            "buffer-object", f"buffer={buffer!r}: buffers are objects, not strings; use nl.{buffer} (e.g. nl.sbuf)"
        )
    if not isinstance(buffer, MemoryRegion):
        raise NkiValidationError(
            "buffer-object", f"buffer={buffer!r} is not an NKI buffer; use nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm"
        )
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(_int(s, "a shape entry") for s in shape)
    if not shape or any(s <= 0 for s in shape):
        raise NkiValidationError("shape", f"tensor shape {shape} must have at least one dim and positive sizes")
    name_dt = dtypes.dtype_name(dtype)
    region = buffer.value
    limits = ctx.limits
    site = site or kernel_site(2)
    use = None
    if region in ONCHIP:
        if shape[0] > limits.pmax:
            raise NkiValidationError(
                "partition-dim",
                f"an {region.upper()} tensor of shape {shape} has {shape[0]} partitions; the partition dim (dim 0) "
                f"holds at most {limits.pmax}. Tile it into {limits.pmax}-row pieces",
                site,
            )
        per_partition = math.prod(shape[1:]) * dtypes.itemsize(name_dt)
        if region == "sbuf":
            capacity, banks = limits.sbuf_partition_bytes, 0
        else:
            capacity = limits.psum_partition_bytes
            banks = -(-per_partition // limits.psum_bank_bytes)
        if per_partition > capacity:
            raise NkiValidationError(
                f"{region}-capacity",
                f"{region.upper()} tensor {name or ''}{shape} {name_dt} needs {per_partition} bytes per partition; "
                f"{ctx.target} has {capacity} bytes per partition",
                site,
            )
        use = Allocation(region, per_partition, banks, site, name)
        ctx.allocations.append(use)
    elif region == "shared_hbm" and ctx.launch.num_programs > 1:
        shared = ctx.launch.shared_hbm
        k = ctx.shared_seen
        ctx.shared_seen += 1
        if k < len(shared):  # the other program instance already made this tensor: both address the same HBM
            storage = shared[k]
            if storage.data.shape != shape or storage.data.dtype != dtypes.STORAGE[name_dt]:
                raise NkiValidationError(
                    "shared-hbm",
                    f"program instances allocate different shared_hbm tensors at the same point ({shape} {name_dt} vs "
                    f"{storage.data.shape}); allocate shared tensors identically in every instance",
                    site,
                )
            return NkiTensor(storage.data, storage, name_dt)
    value = dtypes.fill_value(name_dt) if fill is None else fill
    storage_dtype = dtypes.STORAGE[name_dt]
    if use is not None:  # on-chip tiles come and go by the thousand: reuse the memory of dead ones (warm pages)
        key = (shape, storage_dtype)
        data = ctx.launch.tile(key, shape, storage_dtype)
        data.fill(value)
        storage, life = Storage(data, region, name, site, use), Lifetime()
        weakref.finalize(life, _recycle, ctx.launch, key, data)
        _recorded(ctx, storage, value)
        return NkiTensor(data, storage, name_dt, life=life)
    data = np.full(shape, value, dtype=storage_dtype)
    storage = Storage(data, region, name, site, use)
    _recorded(ctx, storage, value)
    if region == "shared_hbm" and ctx.launch.num_programs > 1:
        ctx.launch.shared_hbm.append(storage)
    return NkiTensor(data, storage, name_dt)


def _recorded(ctx, storage: Storage, value) -> None:
    recording = ctx.launch.recording
    if recording is not None:
        recording.allocated(storage, value)


def _recycle(launch, key, data: np.ndarray) -> None:
    """Keep a dead tile's array for the launch's next allocation of the same shape and dtype (a few per shape;
    once the launch is over, `Launch.release` has handed every array back)."""
    bucket = launch.free_tiles.setdefault(key, [])
    if not launch.finished and len(bucket) < 8:
        bucket.append(data)


def wrap_array(array: np.ndarray, dtype: str, buffer: str, name: str) -> NkiTensor:
    """An HBM kernel argument backed by `array` (already in storage layout)."""
    storage = Storage(array, buffer, name, None, None)
    return NkiTensor(array, storage, dtype)


def check_capacity(allocations: list[Allocation], limits) -> None:
    """Reject the run if live SBUF bytes or live PSUM banks ever exceed the target's capacity."""
    for region, key, capacity, unit in (
        ("sbuf", "bytes", limits.sbuf_partition_bytes, "bytes per partition"),
        ("psum", "banks", limits.psum_num_banks, "PSUM banks"),
    ):
        events = []
        for k, a in enumerate(allocations):
            if a.buffer == region and a.first >= 0:
                amount = getattr(a, key)
                events.append((a.first, 1, k, amount))
                events.append((a.last + 1, 0, k, -amount))
        events.sort()
        live = 0
        for _, _, k, amount in events:
            live += amount
            if live > capacity:
                a = allocations[k]
                raise NkiValidationError(
                    f"{region}-capacity",
                    f"live {region.upper()} tensors need {live} {unit} when this {a.name or 'tensor'} "
                    f"({a.bytes} bytes per partition) becomes live; {limits.name} has {capacity}. "
                    "Free earlier tiles sooner (allocate inside the loop that uses them) or use smaller tiles",
                    a.site,
                )
