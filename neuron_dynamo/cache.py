"""A persistent, content-addressed store of compiled artifacts that many processes can trust.

On Trainium one kernel compile costs seconds to minutes, and PyTorch's own persistent caches only serve Inductor
(reference/peers.md §0.3), so the backend brings its own. This module stores *keys and bytes*: it knows nothing of
graphs or lowering (the caller computes the key from everything that changes the artifact, see `make_key`).

Layout under the cache root (versioned, so a format change never misreads old entries)::

    v1/entries/<kk>/<key>.entry     immutable entries, <kk> = the key's first two hex digits
    v1/failures/<key>.json          cached compile failures, each with an expiry time
    v1/locks/<key>.lock             per-key compile locks (fcntl), holding pid, host and start time
    v1/quarantine/<key>.<n>.entry   corrupt entries, moved aside for inspection

An entry file is ``MAGIC`` + an 8-byte big-endian header length + a JSON header (key, sha256 and size of the payload,
creation time, caller metadata) + the payload. Guarantees:

* writes go to a temporary name in the same directory, are fsynced, then `os.replace`d: readers see a whole entry or
  none, never a torn one;
* a corrupt or truncated entry is a miss: it is moved to quarantine and counted, never served and never a crash;
* N processes that need one key compile it once: the others wait on the key's lock, then read the entry. A lock
  whose holder died is released by the kernel (fcntl); a lock held past `lock_timeout` is logged and ignored
  (compiling twice is slower but still correct, since entries are replaced atomically);
* failures are cached only for `failure_ttl` seconds and `retry_failed=True` retries at once;
* with `max_bytes`, least-recently-*used* entries are evicted first. The last-use time lives in the entry file's
  mtime, set on every hit: entries never change after writing, and the file system's own atime is unreliable
  (`noatime`, `relatime`, and our own header reads would move it);
* the cache directory is created 0700 and a world-writable one is refused, since entries hold code.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from neuron_dynamo.errors import NeuronDynamoError

log = logging.getLogger("neuron_dynamo.cache")

LAYOUT_VERSION = "v1"
MAGIC = b"NDCACHE1"
MODES = ("on", "off", "readonly")


class CacheError(NeuronDynamoError):
    """The cache directory or an option is unusable."""


class CachedCompileFailure(NeuronDynamoError):
    """A compile of this key failed recently and the failure is still cached."""


def default_cache_dir() -> Path:
    """`$NEURON_DYNAMO_CACHE_DIR`, else `~/.cache/neuron_dynamo`."""
    env = os.environ.get("NEURON_DYNAMO_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "neuron_dynamo"


def make_key(parts: Mapping[str, object]) -> str:
    """A stable hex key for named key parts (JSON-serialisable values).

    Sorted keys and no Python `hash()` make it independent of `PYTHONHASHSEED` and of dict insertion order.
    """
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    key: str
    payload: bytes | None  # None: compiled, but not storable (a bypass)
    meta: dict
    created: float


@dataclass(frozen=True)
class EntryInfo:
    """What `ls` shows of an entry without reading its payload."""

    key: str
    path: Path
    size: int
    created: float
    last_used: float
    meta: dict


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    corrupt: int = 0
    evicted: int = 0
    failures_cached: int = 0
    lock_waits: int = 0
    seconds_saved: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CompileCache:
    """The on-disk store. `mode`: "on" reads and writes, "readonly" only reads (shared caches), "off" bypasses."""

    root: Path = field(default_factory=default_cache_dir)
    mode: str = "on"
    max_bytes: int | None = None
    failure_ttl: float = 3600.0
    lock_timeout: float = 600.0
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise CacheError(f"cache mode {self.mode!r} is not one of {MODES}; pass cache='on', 'off' or 'readonly'")
        self.root = Path(self.root).expanduser()
        self._base = self.root / LAYOUT_VERSION
        if self.mode != "off":
            self._prepare_root()

    # ----------------------------------------------------------------------------------------------- reading
    def get(self, key: str) -> CacheEntry | None:
        """The entry for `key`, or None. A corrupt entry is quarantined and reads as None."""
        if self.mode == "off":
            return None
        path = self._entry_path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        entry = _decode(raw, key)
        if entry is None:
            self._quarantine(path, key)
            return None
        with contextlib.suppress(OSError):  # read-only media: the LRU order is then best effort
            os.utime(path)
        return entry

    def failure(self, key: str) -> str | None:
        """The reason of a cached, unexpired compile failure of `key`, or None."""
        path = self._base / "failures" / f"{key}.json"
        try:
            record = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        if record.get("expires", 0) < time.time():
            return None
        return str(record.get("reason", "unknown"))

    # ----------------------------------------------------------------------------------------------- writing
    def put(self, key: str, payload: bytes, meta: Mapping | None = None) -> None:
        """Store `payload` under `key` atomically (no-op unless mode is "on")."""
        if self.mode != "on":
            return
        header = {
            "key": key,
            "sha256": hashlib.sha256(payload).hexdigest(),
            "size": len(payload),
            "created": time.time(),
            "meta": dict(meta or {}),
        }
        header_bytes = json.dumps(header, sort_keys=True).encode()
        blob = MAGIC + len(header_bytes).to_bytes(8, "big") + header_bytes + payload
        path = self._entry_path(key)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _atomic_write(path, blob)
        if self.max_bytes is not None:
            self.prune(max_bytes=self.max_bytes)

    def record_failure(self, key: str, reason: str) -> None:
        """Remember that compiling `key` failed, for `failure_ttl` seconds."""
        if self.mode != "on" or self.failure_ttl <= 0:
            return
        record = {"reason": reason, "created": time.time(), "expires": time.time() + self.failure_ttl}
        path = self._base / "failures" / f"{key}.json"
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _atomic_write(path, json.dumps(record).encode())
        self.stats.failures_cached += 1

    # ---------------------------------------------------------------------------------------- compile once
    def get_or_compile(
        self,
        key: str,
        compile_fn: Callable[[], tuple[bytes | None, Mapping]],
        retry_failed: bool = False,
        *,
        accept: Callable[[CacheEntry], bool] | None = None,
        record_failures: bool = True,
    ) -> CacheEntry:
        """The entry for `key`, compiling it with `compile_fn() -> (payload, meta)` on a miss.

        Under the key's lock, so that concurrent processes compile a key once. The entry's meta gains
        `compile_seconds`, which later hits add to `stats.seconds_saved`. A `compile_fn` whose result cannot be
        stored returns `(None, meta)`: the result is counted as a bypass and the returned entry's payload is None.
        An entry that `accept` refuses (e.g. a partial result whose retry time has come) is compiled again and
        replaced. An exception of `compile_fn` is cached as a failure (for `failure_ttl`) if `record_failures`.
        """
        if self.mode == "off":
            return self._compile(key, compile_fn, store=False, record=False)
        hit = self._hit(key, accept)
        if hit is not None:
            return hit
        reason = None if retry_failed else self.failure(key)
        if reason is not None:
            raise CachedCompileFailure(
                f"compiling cache key {key[:16]}… failed less than {self.failure_ttl:.0f} s ago: {reason}. "
                "Fix the cause, or pass retry_failed=True (option `retry_failed`) to compile again now."
            )
        if self.mode == "readonly":
            return self._compile(key, compile_fn, store=False, record=False)
        with self._lock(key):
            hit = self._hit(key, accept)  # another process may have compiled it while we waited
            if hit is not None:
                return hit
            return self._compile(key, compile_fn, store=True, record=record_failures)

    def discard(self, key: str, reason: str) -> None:
        """Quarantine an entry that reads back whole but cannot be used (counted as corrupt, compiled again)."""
        log.warning("cache entry %s… is unusable (%s)", key[:16], reason)
        self._quarantine(self._entry_path(key), key)

    def _hit(self, key: str, accept: Callable[[CacheEntry], bool] | None = None) -> CacheEntry | None:
        entry = self.get(key)
        if entry is not None and accept is not None and not accept(entry):
            return None
        if entry is not None:
            self.stats.hits += 1
            self.stats.seconds_saved += float(entry.meta.get("compile_seconds", 0.0))
        return entry

    def _compile(
        self, key: str, compile_fn: Callable[[], tuple[bytes | None, Mapping]], store: bool, record: bool
    ) -> CacheEntry:
        start = time.perf_counter()
        try:
            payload, meta = compile_fn()
        except Exception as exc:
            if record:
                self.record_failure(key, f"{type(exc).__name__}: {exc}")
            raise
        meta = {**meta, "compile_seconds": time.perf_counter() - start}
        if payload is None or self.mode == "off":
            self.stats.bypasses += 1
        else:
            self.stats.misses += 1
            if store:
                self.put(key, payload, meta)
        return CacheEntry(key=key, payload=payload, meta=meta, created=time.time())

    @contextlib.contextmanager
    def _lock(self, key: str) -> Iterator[None]:
        """An exclusive fcntl lock on the key's lock file; gives up after `lock_timeout` (logged)."""
        path = self._base / "locks" / f"{key}.lock"
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        deadline = time.monotonic() + self.lock_timeout
        waited = False
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                waited = True
                if time.monotonic() > deadline:
                    log.warning(
                        "cache lock %s still held by %s after %.0f s; compiling without it",
                        path, _read_holder(path), self.lock_timeout,
                    )
                    yield
                    return
                time.sleep(0.05)
                continue
            if _same_file(fd, path):  # not a lock file that `clear_locks` unlinked while we waited
                break
            os.close(fd)
        if waited:
            self.stats.lock_waits += 1
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode())
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.close(fd)

    # ------------------------------------------------------------------------------------------ maintenance
    def entries(self) -> list[EntryInfo]:
        """Every readable entry, oldest use first (headers only)."""
        infos = []
        for path in sorted((self._base / "entries").glob("*/*.entry")):
            header = _read_header(path)
            if header is None:
                continue
            st = path.stat()
            infos.append(
                EntryInfo(
                    key=header["key"], path=path, size=st.st_size, created=header["created"],
                    last_used=st.st_mtime, meta=header["meta"],
                )
            )
        return sorted(infos, key=lambda info: info.last_used)

    def verify(self) -> list[str]:
        """Re-hash every entry; quarantine and return the keys of the corrupt ones."""
        corrupt = []
        for path in sorted((self._base / "entries").glob("*/*.entry")):
            key = path.stem
            if _decode(path.read_bytes(), key) is None:
                self._quarantine(path, key)
                corrupt.append(key)
        return corrupt

    def prune(self, max_bytes: int | None = None, older_than: float | None = None) -> int:
        """Evict entries unused for `older_than` seconds, then least recently used ones above `max_bytes`."""
        if self.mode != "on":
            raise CacheError(f"cannot prune a cache opened with mode={self.mode!r}; open it with cache='on'")
        infos = self.entries()
        now = time.time()
        keep, evict = [], []
        for info in infos:
            (evict if older_than is not None and now - info.last_used > older_than else keep).append(info)
        if max_bytes is not None:
            total = sum(info.size for info in keep)
            while keep and total > max_bytes:
                oldest = keep.pop(0)
                total -= oldest.size
                evict.append(oldest)
        for info in evict:
            with contextlib.suppress(FileNotFoundError):
                info.path.unlink()
        self.stats.evicted += len(evict)
        return len(evict)

    def clear_locks(self) -> int:
        """Remove every lock file (for locks left on file systems where fcntl locks do not die with the holder)."""
        paths = list((self._base / "locks").glob("*.lock"))
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return len(paths)

    def locks(self) -> list[dict]:
        """The lock files present, with their holders."""
        return [{"key": p.stem, **_read_holder(p)} for p in sorted((self._base / "locks").glob("*.lock"))]

    # ---------------------------------------------------------------------------------------------- internals
    def _prepare_root(self) -> None:
        if self.mode == "readonly":  # never create anything: a missing shared cache just misses
            if not self._base.is_dir():
                log.info("read-only compile cache %s does not exist: every program is compiled", self._base)
                return
        else:
            self._create_base()
        for directory in (self.root, self._base):
            mode = directory.stat().st_mode
            if mode & 0o002:
                raise CacheError(
                    f"the cache directory {directory} is world-writable; cache entries hold code, so anyone could "
                    f"plant a kernel. Run `chmod o-w {directory}` or choose another cache_dir"
                )

    def _create_base(self) -> None:
        try:
            self._base.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(
                f"cannot create the cache directory {self._base}: {exc}. Set NEURON_DYNAMO_CACHE_DIR or the option "
                "cache_dir to a writable directory, or pass cache='off'"
            ) from exc

    def _entry_path(self, key: str) -> Path:
        if len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
            raise CacheError(f"cache key {key!r} is not a lowercase hex digest; build keys with make_key()")
        return self._base / "entries" / key[:2] / f"{key}.entry"

    def _quarantine(self, path: Path, key: str) -> None:
        self.stats.corrupt += 1
        log.warning("corrupt cache entry %s: treated as a miss and moved to quarantine", path)
        if self.mode != "on":
            return
        target_dir = self._base / "quarantine"
        target_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = target_dir / f"{key}.{time.time_ns()}.entry"
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, target)


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _split(raw: bytes) -> tuple[dict, bytes] | None:
    if len(raw) < len(MAGIC) + 8 or not raw.startswith(MAGIC):
        return None
    start = len(MAGIC) + 8
    header_len = int.from_bytes(raw[len(MAGIC) : start], "big")
    try:
        header = json.loads(raw[start : start + header_len])
    except ValueError:
        return None
    if not isinstance(header, dict):
        return None
    return header, raw[start + header_len :]


def _decode(raw: bytes, key: str) -> CacheEntry | None:
    parts = _split(raw)
    if parts is None:
        return None
    header, payload = parts
    if (
        header.get("key") != key
        or header.get("size") != len(payload)
        or header.get("sha256") != hashlib.sha256(payload).hexdigest()
    ):
        return None
    return CacheEntry(key=key, payload=payload, meta=header.get("meta", {}), created=header.get("created", 0.0))


def _read_header(path: Path) -> dict | None:
    with contextlib.suppress(OSError), open(path, "rb") as f:
        prefix = f.read(len(MAGIC) + 8)
        if len(prefix) == len(MAGIC) + 8 and prefix.startswith(MAGIC):
            header_len = int.from_bytes(prefix[len(MAGIC) :], "big")
            parts = _split(prefix + f.read(header_len))
            if parts is not None and {"key", "created", "meta"} <= parts[0].keys():
                return parts[0]
    return None


def _read_holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False
