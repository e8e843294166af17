"""Kernel entry points: `nki.jit`, `kernel[lnc]`, `nki.simulate`, `kernel.profile`.

A call converts torch tensors / NumPy arrays into HBM tensors (copies, so a kernel that fails leaves its inputs
untouched), runs the kernel function once per LNC program instance with that instance's `ProgramContext`
(instances share `shared_hbm` and synchronise through `core_barrier`/`sendrecv` under the deterministic schedule of
`context.Launch`), checks the SBUF/PSUM capacity over the run, writes back the inputs the kernel wrote, and returns the
outputs as the caller's array type. Non-tensor arguments pass through as compile-time constants.

The first call at a signature is recorded while it runs in full; later calls at that signature replay the recording
(`nki.replay`; `NEURON_DYNAMO_NKI_REPLAY=0` turns that off).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import logging
import threading

import numpy as np
import torch

from neuron_dynamo.nki import dtypes, replay
from neuron_dynamo.nki.context import DEVICE, Launch, ProgramContext, active, set_current
from neuron_dynamo.nki.costmodel import Profile, combine_profiles
from neuron_dynamo.nki.errors import NkiValidationError
from neuron_dynamo.nki.target import current_limits
from neuron_dynamo.nki.tensor import NkiTensor, check_capacity, wrap_array

log = logging.getLogger("neuron_dynamo.nki")

_TORCH_VIEW = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "float8_e8m0fnu": "uint8"}


_TORCH_TYPES = frozenset((torch.Tensor, torch.nn.Parameter))  # plain tensors only: not fake or functional ones


def _is_torch(x) -> bool:
    return type(x) in _TORCH_TYPES


def _torch_to_numpy(t) -> tuple[np.ndarray, str]:

    t = t.detach().cpu().contiguous()
    try:
        name = dtypes.dtype_name(t.dtype)
    except TypeError:
        raise _arg_dtype_error(t.dtype) from None
    if name in _TORCH_VIEW:
        bits = t.view(getattr(torch, _TORCH_VIEW[name])).numpy()
        return bits.view(dtypes.STORAGE[name]).copy(), name
    if name == "bool":
        return t.numpy().astype(np.uint8), name
    return t.numpy().copy(), name


def _numpy_to_torch(a: np.ndarray, name: str):
    if name in _TORCH_VIEW:
        return torch.from_numpy(a.view(getattr(np, _TORCH_VIEW[name]))).view(getattr(torch, name))
    if name == "bool":
        return torch.from_numpy(a.astype(np.bool_))
    if name == "float8_e4m3":  # no torch dtype carries the trn cFP8 format: hand back its exact fp32 values
        return torch.from_numpy(a.astype(np.float32))
    return torch.from_numpy(a)


def _arg_dtype_error(dtype) -> NkiValidationError:
    hint = {"int64": "int32", "float64": "float32"}.get(str(dtype).replace("torch.", ""), "a supported NKI dtype")
    return NkiValidationError(
        "argument-dtype", f"kernel argument dtype {dtype} is not an NKI dtype; cast it to {hint} before the call"
    )


_threads_lock = threading.Lock()
_threads_state = {"runs": 0, "saved": 1}
_scope = threading.local()  # per thread: the depth of nested launch scopes, what the outermost one set up


def _pin_threads() -> None:
    """Hold torch at one intra-op thread while kernels run (restored when the last concurrent holder ends): tiles
    are small, one thread per GEMM or cast beats a thread pool, above all on a loaded machine."""
    with _threads_lock:
        if _threads_state["runs"] == 0:
            _threads_state["saved"] = torch.get_num_threads()
            if _threads_state["saved"] != 1:
                torch.set_num_threads(1)
        _threads_state["runs"] += 1


def _unpin_threads() -> None:
    with _threads_lock:
        _threads_state["runs"] -= 1
        if _threads_state["runs"] == 0 and _threads_state["saved"] != 1:
            torch.set_num_threads(_threads_state["saved"])


class _LaunchScope:
    """What every kernel run needs around it: the target's limits and the replay switch read from the environment,
    torch on one thread (`_pin_threads`), NumPy's floating-point warnings off (engines produce inf/NaN silently, as
    the hardware does). Only a thread's outermost scope does that work; a compiled region holds one over all its
    launches (`launch_scope()`), so a launch inside it pays a counter. Entering gives (limits, replay enabled)."""

    def __enter__(self):
        depth = getattr(_scope, "depth", 0)
        if depth == 0:
            settings = (current_limits(), replay.enabled())  # may raise (an unknown target): nothing set up yet
            _pin_threads()
            quiet = np.errstate(all="ignore")
            quiet.__enter__()
            _scope.settings, _scope.quiet = settings, quiet
        _scope.depth = depth + 1
        return _scope.settings

    def __exit__(self, *exc) -> None:
        _scope.depth -= 1
        if _scope.depth == 0:
            _scope.quiet.__exit__(None, None, None)
            _unpin_threads()


_launch_scope = _LaunchScope()


def launch_scope() -> _LaunchScope:
    """Hold the launch setup over a block of kernel launches (a compiled region's run): the environment is read
    once at its start, and torch stays on one thread throughout."""
    return _launch_scope


class _Argument:
    """A tensor argument: the caller's object (let go when the call is kept for replays) and the HBM tensor the
    kernel sees."""

    __slots__ = ("original", "tensor", "name", "alias")

    def __init__(self, original, tensor: NkiTensor, name: str) -> None:
        self.original = original
        self.tensor = tensor
        self.name = name
        self.alias = None  # a torch tensor sharing the array, in the caller's shape (made when first needed)

    def _torch_alias(self, value):
        """The argument's array as a torch tensor of `value`'s shape, or None when torch has no such dtype."""
        if self.alias is None:
            shared = _torch_alias(self.tensor._s.data, self.name)
            self.alias = False if shared is None else shared.reshape(tuple(value.shape))
        return self.alias if self.alias is not False else None

    def write_back(self, original) -> None:
        data = self.tensor._s.data
        if _is_torch(original):
            alias = self._torch_alias(original)
            if alias is not None:
                original.copy_(alias)
            else:
                original.copy_(_numpy_to_torch(data, self.name).to(original.dtype))
        elif self.name == "bool":
            original[...] = data.astype(np.bool_)
        else:
            original[...] = data


def _torch_alias(array: np.ndarray, name: str):
    """A torch tensor sharing `array`'s memory with the dtype the caller sees (bool: its uint8 storage), or None."""
    if name in _TORCH_VIEW:
        return torch.from_numpy(array.view(getattr(np, _TORCH_VIEW[name]))).view(getattr(torch, name))
    try:
        return torch.from_numpy(array)
    except TypeError:  # an ml_dtypes storage type torch does not know (the trn cFP8 format)
        return None


class Kernel:
    """A jitted NKI kernel. Call it with torch tensors or NumPy arrays; `kernel[2]` runs it with LNC=2."""

    def __init__(self, fn, lnc: int = 1, options: dict | None = None) -> None:
        self.fn = fn
        self.lnc = lnc
        self.options = dict(options or {})
        self._param_names: list[str] | None = None  # filled (and the signature checked) at the first call
        self._variants: dict[int, Kernel] = {}  # kernel[lnc] objects, made once
        self._programs = replay.Programs()  # recorded calls by signature
        functools.update_wrapper(self, fn)

    def __getitem__(self, lnc) -> Kernel:
        if isinstance(lnc, tuple) and len(lnc) == 1:
            lnc = lnc[0]
        if isinstance(lnc, bool) or not isinstance(lnc, int) or lnc not in (1, 2):
            raise NkiValidationError("lnc", f"kernel[{lnc!r}]: the logical NeuronCore degree must be 1 or 2")
        if lnc == self.lnc:
            return self
        variant = self._variants.get(lnc)
        if variant is None:
            variant = self._variants[lnc] = Kernel(self.fn, lnc, self.options)
        return variant

    def __call__(self, *args, **kwargs):
        return self._run(args, kwargs, False)[0]

    def profile(self, *args, **kwargs) -> tuple[object, Profile]:
        """Run the kernel and also return its estimated device-time `Profile`."""
        result, profile, kept = self._run(args, kwargs, True)
        return result, _copy_profile(profile) if kept else profile

    def estimated(self, *args, **kwargs) -> tuple[object, float]:
        """Run the kernel and also return its estimated device time in ns (`profile(...)[1].estimated_ns`, without
        copying a replayed call's profile)."""
        result, profile, _ = self._run(args, kwargs, True)
        return result, profile.estimated_ns

    def __repr__(self) -> str:
        return f"<nki.jit kernel {self.fn.__qualname__} lnc={self.lnc}>"

    # ------------------------------------------------------------------------------------------ running
    def _site(self) -> tuple[str, int]:
        code = self.fn.__code__
        return code.co_filename, code.co_firstlineno

    def _check_signature(self) -> list[str]:
        if self._param_names is None:
            params = inspect.signature(self.fn).parameters.values()
            if any(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params):
                raise NkiValidationError(
                    "kernel-signature",
                    f"kernel {self.fn.__name__} has keyword-only parameters (a `*` separator); NKI kernels may not: "
                    "make them ordinary parameters",
                    self._site(),
                )
            self._param_names = [p.name for p in params]
        return self._param_names

    def _run(self, args, kwargs, priced: bool):
        """(results, profile, whether the profile is a kept one the caller must not change). The profile is None
        for an unpriced call that was not recorded (computing it is not free). A call at a recorded signature
        replays it, every other call runs in full (`_full_run`)."""
        if active() is not None:
            raise NkiValidationError(
                "nested-jit",
                f"kernel {self.fn.__name__} is decorated with @nki.jit but was called from inside another kernel; "
                "sub-kernels must be plain functions (remove @nki.jit from the callee)",
            )
        if not getattr(_scope, "depth", 0):  # no scope held (a call outside a compiled region): set one up
            with _launch_scope:
                return self._run(args, kwargs, priced)
        limits, replaying = _scope.settings
        values: list = []  # the tensor arguments, as the signature met them
        key = _signature(args, kwargs, limits.name, self.lnc, values) if replaying else None
        with DEVICE.lock:  # launches run one at a time: they share the device's tile arrays
            recording = None
            if key is not None:
                program = self._programs.get(key)
                if program is replay.MISSING:
                    recording = replay.Recording()
                elif program is not None:
                    try:
                        return self._replay(program, values), program.profile, True
                    except replay.ReplayDiverged as exc:
                        log.debug("kernel %s: replay diverged (%s); it runs in full from now on", self.fn.__name__,
                                  exc)
                        self._programs.put(key, None)
            return self._full_run(args, kwargs, priced, limits, key, recording)

    def _full_run(self, args, kwargs, priced: bool, limits, key, recording: replay.Recording | None):
        """Interpret the kernel's Python, every rule checked and priced (and recorded when `recording` is given)."""
        names = self._check_signature()
        if self.lnc > 1 and limits.nc_version < 3:
            raise NkiValidationError(
                "lnc", f"LNC={self.lnc} needs trn2 or newer; the target is {limits.name}", self._site()
            )
        hbm = "shared_hbm" if self.lnc > 1 else "private_hbm"
        arguments: list[_Argument] = []
        use_torch = False

        def convert(value, where: str):
            nonlocal use_torch
            if _is_torch(value):
                use_torch = True
                array, name = _torch_to_numpy(value)
            elif isinstance(value, np.ndarray):
                try:
                    name = dtypes.dtype_name(value.dtype)
                except TypeError:
                    raise _arg_dtype_error(value.dtype) from None
                array = np.array(value, dtype=dtypes.STORAGE[name], order="C", copy=True)
            elif isinstance(value, tuple):
                return tuple(convert(v, where) for v in value)
            elif isinstance(value, list):
                raise NkiValidationError(
                    "list-argument", f"kernel argument {where} is a list; NKI kernels take tuples, not lists",
                    self._site(),
                )
            elif isinstance(value, dict) and any(not isinstance(k, str) for k in value):
                raise NkiValidationError(
                    "dict-argument", f"kernel argument {where}: dict keys must be strings", self._site()
                )
            else:
                return value
            if array.ndim == 0:
                array = array.reshape(1)
            tensor = wrap_array(array, name, hbm, where)
            arguments.append(_Argument(value, tensor, name))
            return tensor

        call_args = tuple(convert(a, names[i] if i < len(names) else f"#{i}") for i, a in enumerate(args))
        call_kwargs = {k: convert(v, k) for k, v in kwargs.items()}

        launch = Launch(self.lnc)
        launch.recording = recording
        contexts = [ProgramContext(limits, pid, launch, self.fn.__name__) for pid in range(self.lnc)]
        results: dict[int, object] = {}

        def body(ctx: ProgramContext):
            def run_instance():
                set_current(ctx)
                try:
                    with np.errstate(all="ignore"):  # engines produce inf/NaN silently, as the hardware does
                        results[ctx.program_id] = self.fn(*call_args, **call_kwargs)
                finally:
                    set_current(None)
                check_capacity(ctx.allocations, limits)

            return run_instance

        try:
            launch.run([body(ctx) for ctx in contexts])
        finally:
            launch.release()
        result = results[0]
        kept = recording is not None and recording.reason is None
        profile = _profile(contexts) if priced or kept else None
        arg_storages = {id(arg.tensor._s) for arg in arguments}
        converted = self._convert_outputs(result, use_torch, set(), arg_storages, kept)
        written = [i for i, arg in enumerate(arguments) if arg.tensor._s.written]
        for i in written:
            arguments[i].write_back(arguments[i].original)
        if recording is not None:
            loads = _loads(arguments) if kept else None
            if loads is not None:
                copy_out = _copier(result, use_torch)
                self._programs.put(key, replay.Program(recording, arguments, written, result, contexts, profile,
                                                       loads, copy_out))
            else:
                log.debug("kernel %s is not replayed: %s", self.fn.__name__,
                          recording.reason or "torch cannot share an argument's array")
                self._programs.put(key, None)
        return converted, profile, kept

    def _replay(self, program: replay.Program, values: list):
        """A later call at a recorded signature: load its inputs (`values`, the tensor arguments in conversion order)
        into the recorded arrays, rerun the recorded steps, hand out copies of the results."""
        loads = program.loads
        sources = values
        if loads.arrays:  # a NumPy caller's arguments
            for i, array in loads.arrays:
                array[...] = values[i].reshape(array.shape)
            sources = [values[i] for i in loads.positions]
        if sources:
            if torch.is_grad_enabled():  # a copy from a tensor that requires grad must not be recorded
                sources = [v.detach() if v.requires_grad else v for v in sources]
            torch._foreach_copy_(loads.aliases, sources)  # one call for all: cheaper than a copy_ per argument
        program.run()
        converted = program.copy_out()
        for i in program.written:
            program.arguments[i].write_back(values[i])
        return converted

    def _convert_outputs(self, out, use_torch: bool, handed_out: set[int], arg_storages: set[int], kept: bool):
        """The kernel's results as the caller's arrays. A kernel may return one of its own arguments (an output
        passed in, as AWS's scatter example does): that tensor is the caller's, whatever its HBM kind. The
        allocations of a recorded call are `kept` for its replays: the caller gets copies."""
        if out is None:
            return None
        if isinstance(out, (tuple, list)):
            return type(out)(self._convert_outputs(o, use_torch, handed_out, arg_storages, kept) for o in out)
        if not isinstance(out, NkiTensor):
            raise NkiValidationError(
                "kernel-output", f"kernel {self.fn.__name__} returned {type(out).__name__}; return NKI tensors",
                self._site(),
            )
        if out._s.buffer != "shared_hbm" and id(out._s) not in arg_storages:
            raise NkiValidationError(
                "output-shared-hbm",
                f"kernel {self.fn.__name__} returns a tensor in {out._s.buffer}; kernel outputs must be allocated "
                "with buffer=nl.shared_hbm",
                out._s.site or self._site(),
            )
        a = out._a
        whole = a is not None and a.shape == out._s.data.shape and a.dtype == out._s.data.dtype and out.offset == 0
        if whole and not kept and id(out._s) not in handed_out:  # the run is over: hand the allocation itself out
            handed_out.add(id(out._s))
            data = out._s.data
        else:
            data = np.array(out._read())
        return _to_caller(data, out.dtype, use_torch)


def _to_caller(data: np.ndarray, dtype: str, use_torch: bool):
    """A result array (the caller's own) as the caller's array type."""
    if use_torch:
        return _numpy_to_torch(data, dtype)
    return data.astype(np.bool_) if dtype == "bool" else data


def _copier(out, use_torch: bool):
    """A function giving fresh copies of a recorded call's results, in the structure the kernel returned (checked by
    the recorded call's `_convert_outputs`). The caller type is the recorded call's: a replay's arguments are of the
    same kinds (the signature keys torch and NumPy apart)."""
    if out is None:
        return lambda: None
    if isinstance(out, (tuple, list)):
        if type(out) is tuple and all(_plain(o, use_torch) for o in out):  # the commonest: a tuple of tiles
            arrays = tuple(o._a for o in out)
            if use_torch:
                return lambda: tuple([torch.from_numpy(np.array(a)) for a in arrays])
            return lambda: tuple([np.array(a) for a in arrays])
        parts = [_copier(o, use_torch) for o in out]
        return lambda: type(out)(part() for part in parts)
    a, dtype = out._a, out.dtype
    if _plain(out, use_torch):
        if use_torch:
            return lambda: torch.from_numpy(np.array(a))  # np.array + from_numpy beats torch's clone on tiles
        return lambda: np.array(a)
    return lambda: _to_caller(np.array(a), dtype, use_torch)


def _plain(out, use_torch: bool) -> bool:
    """Whether the caller takes a copy of the result's array as it is (torch: no bit view, no cast; NumPy: any
    dtype but bool)."""
    if not isinstance(out, NkiTensor):
        return False
    if use_torch:
        return out.dtype not in _TORCH_VIEW and out.dtype not in ("bool", "float8_e4m3")
    return out.dtype != "bool"


class _Loads:
    """Where a replay copies the tensor arguments: a torch one into a torch alias of its array (in the caller's shape
    and dtype), a NumPy one into the array itself. A program's callers pass the kinds the recorded call passed (the
    signature keys torch and NumPy apart)."""

    __slots__ = ("aliases", "positions", "arrays")

    def __init__(self, aliases: list, positions: list[int], arrays: tuple) -> None:
        self.aliases = aliases  # of the torch arguments
        self.positions = positions  # their places among the tensor arguments
        self.arrays = arrays  # (place, array) of the NumPy arguments


def _loads(arguments: list[_Argument]) -> _Loads | None:
    """The loads of a recorded call's replays, or None when torch cannot share an argument's array (such a call is
    not replayed). The recorded call's objects are let go: a program must not keep them alive."""
    aliases, positions, arrays = [], [], []
    for i, arg in enumerate(arguments):
        if _is_torch(arg.original):
            alias = arg._torch_alias(arg.original)
            if alias is None:
                return None
            aliases.append(alias)
            positions.append(i)
        else:
            arrays.append((i, arg.tensor._s.data))
        arg.original = None
    return _Loads(aliases, positions, tuple(arrays))


def _profile(contexts) -> Profile:
    profiles = [ctx.cost.profile() for ctx in contexts]
    return profiles[0] if len(profiles) == 1 else combine_profiles(profiles)


def _copy_profile(profile: Profile) -> Profile:
    """A recorded profile for one caller (its dicts are the caller's to change)."""
    mine = copy.copy(profile)
    for f in dataclasses.fields(mine):
        value = getattr(mine, f.name)
        if isinstance(value, dict):
            setattr(mine, f.name, dict(value))
    return mine


def _signature(args, kwargs, target: str, lnc: int, tensors: list):
    """What a kernel call's instruction stream can depend on, or None when an argument cannot be keyed. Appends the
    tensor arguments to `tensors` in the order the interpreter converts them (positional, then keyword; into
    tuples)."""
    try:
        keys = []
        for a in args:  # `_key`, with its two commonest cases inline (a launch's hot path)
            kind = type(a)
            if kind in _TORCH_TYPES:
                tensors.append(a)
                keys.append(("torch", a.dtype, a.shape))
            else:
                keys.append((kind, a) if kind in _SCALARS else _key(a, tensors))
        return (target, lnc, tuple(keys),
                tuple([(k, _key(v, tensors)) for k, v in kwargs.items()]) if kwargs else ())
    except (replay.Unkeyable, TypeError):
        return None


_SCALARS = frozenset((int, str, bool, type(None)))  # keyed as `replay.static_key` keys them, without its checks


def _key(value, tensors: list):
    kind = type(value)
    if kind in _TORCH_TYPES:
        tensors.append(value)
        return "torch", value.dtype, value.shape
    if kind in _SCALARS:
        return kind, value
    if isinstance(value, np.ndarray):
        tensors.append(value)
        return "numpy", value.dtype.str, value.dtype.name, value.shape
    if isinstance(value, tuple):
        return tuple, tuple([_key(v, tensors) for v in value])
    return replay.static_key(value)


def jit(fn=None, **kwargs):
    """`@nki.jit` / `@nki.jit(...)`: make `fn` a `Kernel` (options are kept, not interpreted; `mode=` is ignored as
    in NKI 0.3+; `platform_target=` raises as in NKI 0.3+, the migration guide's breaking change)."""
    if "platform_target" in kwargs:
        raise NkiValidationError(
            "removed-api",
            f"nki.jit(platform_target={kwargs['platform_target']!r}) was removed in NKI 0.3; set the target with "
            "the environment variable NEURON_PLATFORM_TARGET_OVERRIDE=trn1|trn2|trn3 instead",
        )
    if fn is None:
        return lambda f: Kernel(f, options=kwargs)
    return Kernel(fn, options=kwargs)


def simulate(kernel, profile: bool = False):
    """`nki.simulate(kernel)(*args)`: run on the CPU interpreter; with `profile=True` return (result, Profile)."""
    if not isinstance(kernel, Kernel):
        kernel = Kernel(kernel)

    def run(*args, **kwargs):
        return kernel.profile(*args, **kwargs) if profile else kernel(*args, **kwargs)

    functools.update_wrapper(run, kernel.fn)
    return run


__all__ = ["Kernel", "jit", "simulate"]
