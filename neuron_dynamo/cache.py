"""A persistent, content-addressed store of compiled artifacts that many processes can trust.

On Trainium one kernel compile costs seconds to minutes, and PyTorch's own persistent caches only serve Inductor
(reference/peers.md §0.3), so the backend brings its own. This module stores *keys and bytes*: it knows nothing of
graphs or lowering (the caller computes the key from everything that changes the artifact, see `make_key`).

Layout under the cache root (versioned, so a format change never misreads old entries)::

    v1/entries/<kk>/<key>.entry     immutable entries, <kk> = the key's first two hex digits
    v1/failures/<key>.json          cached compile failures, each with an expiry time
    v1/locks/<key>.lock             per-key compile locks (flock), holding pid, host and start time
    v1/quarantine/<key>.<n>.entry   corrupt entries, moved aside for inspection (removed by `prune`)

An entry file is ``MAGIC`` + the signer's key id (16 ASCII hex digits) + an HMAC-SHA256 tag (32 bytes) + an 8-byte
big-endian header length + a JSON header (key, sha256 and size of the payload, creation time, caller metadata) + the
payload. The tag covers every other byte (magic, key id, header length, header, payload) under the signer's secret key
(cache_auth.py). Guarantees:

* writes go to a temporary name in the same directory, are fsynced, then `os.replace`d: readers see a whole entry or
  none, never a torn one;
* entries are authenticated: the tag is checked before any field of an entry is read, under the user's own key or a
  key listed in `trusted_keys`; an entry whose tag does not verify (planted, forged, signed by a stranger, or of
  an older format) is a miss, counted in `stats.unauthenticated` and `stats.corrupt`, and quarantined;
* a corrupt, truncated or malformed entry (and anything that is not a regular file where an entry should be) is a
  miss: it is moved to quarantine and counted, never served and never a crash;
* trust (cache_files.py): directories of a trusted owner that no one else may write, files opened without following
  links or blocking, explicit modes whatever the umask;
* the cache never takes the model down: a failure to read, write, lock or evict (disk full, read-only media,
  permissions, a racing eviction) is counted in `stats.errors`, logged once per process and kind, and the program
  is compiled without the cache. An unusable root makes the constructor raise, unless `strict=False` (the
  backend's choice): the cache is then `unusable` and every compile runs uncached;
* N processes that need one key compile it once: the others wait on the key's lock, then read the entry. A lock
  whose holder died is released by the kernel; a holder that died but left the lock to a forked child (same host,
  pid gone) is detected, and a lock held past `lock_timeout` is logged and ignored (compiling twice is slower but
  still correct, since entries are replaced atomically);
* failures are cached only for `failure_ttl` seconds, honoured only by callers that record them, and
  `retry_failed=True` retries at once;
* with `max_bytes`, least-recently-*used* entries are evicted first. The last-use time lives in the entry file's
  mtime, set on every hit: entries never change after writing, and the file system's own atime is unreliable.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from neuron_dynamo.cache_auth import KEY_ID_LEN, TAG_LEN, Keyring, load_keyring
from neuron_dynamo.cache_files import (
    CacheError,
    UntrustedPathError,
    atomic_write,
    check_dir,
    check_parents,
    check_root,
    make_dir,
    make_parents,
    open_trusted,
    read_trusted,
)
from neuron_dynamo.errors import NeuronDynamoError

__all__ = ["CacheEntry", "CacheError", "CachedCompileFailure", "CompileCache", "EntryInfo", "encode_entry",
           "make_key"]

log = logging.getLogger("neuron_dynamo.cache")

LAYOUT_VERSION = "v1"
MAGIC = b"NDCACHE2"  # 2: authenticated entries (NDCACHE1 entries are misses)
_SIGNED = len(MAGIC) + KEY_ID_LEN  # the magic and the signer's key id, then the tag
_BODY = _SIGNED + TAG_LEN  # then the header length, the header and the payload
MODES = ("on", "off", "readonly")
ORPHAN_SECONDS = 3600.0  # a temporary file older than this belongs to a writer that died: `prune` removes it

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


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
    unauthenticated: int = 0  # entries whose tag did not verify under a trusted key (also counted as corrupt)
    evicted: int = 0
    failures_cached: int = 0
    lock_waits: int = 0
    lock_timeouts: int = 0
    errors: int = 0  # reads, writes, locks or evictions that failed and were worked around
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
    lock_timeout: float = 30.0
    strict: bool = True  # an unusable root raises CacheError; False: warn once and run uncached
    trusted_keys: tuple[str | Path, ...] = ()  # key files of other signers whose entries this reader serves
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise CacheError(f"cache mode {self.mode!r} is not one of {MODES}; pass cache='on', 'off' or 'readonly'")
        self.root = Path(self.root).expanduser()
        self._base = self.root / LAYOUT_VERSION
        self._owners = frozenset({os.getuid(), 0})
        self._dir_mode, self._file_mode = 0o700, 0o600
        self._checked: set[Path] = set()
        self._set_aside: set[str] = set()  # keys found bad where they cannot be moved (read-only): never read again
        self.unusable: str | None = None  # why the cache is not used at all (strict=False only)
        self.keys = Keyring(keys={}, own=None)  # who may have written the entries this cache serves
        if self.mode == "off":
            return
        try:
            self.keys = load_keyring(self.trusted_keys, cache_root=self.root)
            self._prepare_root()
        except (CacheError, OSError) as exc:
            reason = str(exc) if isinstance(exc, CacheError) else (
                f"cannot create the cache directory {self._base}: {exc}. Set NEURON_DYNAMO_CACHE_DIR or the option "
                "cache_dir to a writable directory, or pass cache='off'")
            if self.strict:
                raise CacheError(reason) from exc
            self.unusable = reason
            self._problem("root", reason)

    @property
    def active(self) -> bool:
        """Whether this cache reads anything at all (not off, not unusable)."""
        return self.mode != "off" and self.unusable is None

    # ----------------------------------------------------------------------------------------------- reading
    def get(self, key: str) -> CacheEntry | None:
        """The entry for `key`, or None. A corrupt entry is quarantined and reads as None."""
        path = self._entry_path(key)
        if not self.active or key in self._set_aside:
            return None
        try:
            self._directory("entries", key[:2])
            fd = open_trusted(path, os.O_RDONLY, self._owners)
        except FileNotFoundError:
            return None
        except UntrustedPathError as exc:
            if path.parent in self._checked:  # a planted file in a directory of ours: move it aside
                self._quarantine(path, key, str(exc))
            else:
                self._problem("read", exc)
            return None
        except OSError as exc:
            self._problem("read", exc)
            return None
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                raw = f.read()
            body = _unseal(raw, self.keys)
            entry = None if body is None else _decode(body, key)
            if entry is not None and self.mode == "on":
                with contextlib.suppress(OSError):  # read-only media: the LRU order is then best effort
                    os.utime(fd)
        except OSError as exc:
            self._problem("read", exc)
            return None
        finally:
            os.close(fd)
        if body is None:
            self._unauthenticated(path, key, raw)
        elif entry is None:
            self._quarantine(path, key, "checksum, size or header does not match")
        return entry

    def failure(self, key: str) -> str | None:
        """The reason of a cached, unexpired compile failure of `key`, or None (a malformed record is ignored)."""
        path = self._base / "failures" / f"{key}.json"
        try:
            self._directory("failures")
            record = json.loads(read_trusted(path, self._owners))
        except FileNotFoundError:
            return None
        except (OSError, CacheError, ValueError) as exc:
            self._problem("read", exc)
            return None
        if (not isinstance(record, dict) or record.get("key") != key or not isinstance(record.get("reason"), str)
                or not isinstance(record.get("expires"), float | int) or record["expires"] < time.time()):
            return None
        return record["reason"]

    # ----------------------------------------------------------------------------------------------- writing
    def put(self, key: str, payload: bytes, meta: Mapping | None = None) -> None:
        """Store `payload` under `key` atomically (no-op unless mode is "on"; a failed write is counted)."""
        path = self._entry_path(key)
        if self.mode != "on" or self.unusable:
            return
        header = {
            "key": key,
            "sha256": hashlib.sha256(payload).hexdigest(),
            "size": len(payload),
            "created": time.time(),
            "meta": dict(meta or {}),
        }
        try:
            blob = encode_entry(header, payload, self.keys)
            self._directory("entries", key[:2], create=True)
            atomic_write(path, blob, self._file_mode)
        except (OSError, CacheError) as exc:
            self._problem("write", exc)
            return
        if self.max_bytes is not None:
            self.prune(max_bytes=self.max_bytes)

    def record_failure(self, key: str, reason: str) -> None:
        """Remember that compiling `key` failed, for `failure_ttl` seconds."""
        if self.mode != "on" or self.unusable or self.failure_ttl <= 0:
            return
        now = time.time()
        record = {"key": key, "reason": reason, "created": now, "expires": now + self.failure_ttl}
        try:
            directory = self._directory("failures", create=True)
            atomic_write(directory / f"{key}.json", json.dumps(record).encode(), self._file_mode)
        except (OSError, CacheError) as exc:
            self._problem("write", exc)
            return
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
        replaced. With `record_failures`, an exception of `compile_fn` is cached as a failure for `failure_ttl`
        and a cached failure is raised as `CachedCompileFailure`; without it, failure records are ignored.
        """
        if not self.active:
            return self._compile(key, compile_fn, store=False, record=False)
        hit = self._hit(key, accept)
        if hit is not None:
            return hit
        reason = self.failure(key) if record_failures and not retry_failed else None
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
        self._quarantine(self._entry_path(key), key, reason)

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
        if payload is None or not self.active:
            self.stats.bypasses += 1
        else:
            self.stats.misses += 1
            if store:
                self.put(key, payload, meta)
        return CacheEntry(key=key, payload=payload, meta=meta, created=time.time())

    @contextlib.contextmanager
    def _lock(self, key: str) -> Iterator[None]:
        """An exclusive flock on the key's lock file; without it (logged) when it cannot be had in time."""
        fd = self._acquire(self._base / "locks" / f"{key}.lock")
        if fd is None:
            yield
            return
        path = self._base / "locks" / f"{key}.lock"
        try:
            try:  # who holds it, for waiters to detect a dead holder; a full disk only costs that detection
                os.ftruncate(fd, 0)
                record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
                os.write(fd, json.dumps(record).encode())
            except OSError as exc:
                self._problem("lock", exc)
            yield
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
            os.close(fd)

    def _acquire(self, path: Path) -> int | None:
        """The locked descriptor of `path`, or None: lock unusable, holder gone, or `lock_timeout` passed."""
        try:
            self._directory("locks", create=True)
        except (OSError, CacheError) as exc:
            self._problem("lock", exc)
            return None
        deadline = time.monotonic() + self.lock_timeout
        waited = False
        while True:
            try:
                fd = open_trusted(path, os.O_RDWR | os.O_CREAT, self._owners, self._file_mode)
            except (OSError, CacheError) as exc:
                self._problem("lock", exc)
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    self._problem("lock", exc)
                    return None
                if not waited:
                    waited = True
                    self.stats.lock_waits += 1
                holder = _read_holder(path)
                if _holder_gone(holder):
                    log.warning("cache lock %s is held for process %s, which no longer runs; compiling without it",
                                path, holder.get("pid"))
                    return None
                if time.monotonic() > deadline:
                    self.stats.lock_timeouts += 1
                    log.warning("cache lock %s still held by %s after %.0f s (option cache_lock_timeout); compiling "
                                "without it", path, holder, self.lock_timeout)
                    return None
                time.sleep(0.05)
                continue
            if _same_file(fd, path):  # not a lock file that `clear_locks` or a holder unlinked while we waited
                return fd
            os.close(fd)

    # ------------------------------------------------------------------------------------------ maintenance
    def entries(self) -> list[EntryInfo]:
        """Every entry that reads and verifies (tag, then header), oldest use first; the others are left out."""
        infos = []
        for path in self._entry_files():
            found = _read_header(path, self._owners, self.keys)
            if found is not None:
                header, st = found
                infos.append(EntryInfo(key=header["key"], path=path, size=st.st_size, created=header["created"],
                                       last_used=st.st_mtime, meta=header["meta"]))
        return sorted(infos, key=lambda info: info.last_used)

    def verify(self) -> list[str]:
        """Check every entry's tag, then re-hash it; quarantine and return the keys of those that fail."""
        corrupt = []
        for path in self._entry_files():
            key = path.name.removesuffix(".entry")
            try:
                raw = read_trusted(path, self._owners)
            except FileNotFoundError:  # evicted meanwhile
                continue
            except UntrustedPathError:
                raw = b""
            except OSError as exc:
                self._problem("read", exc)
                continue
            body = _unseal(raw, self.keys)
            if raw and body is None:
                self._unauthenticated(path, key, raw)
                corrupt.append(key)
            elif body is None or _decode(body, key) is None:
                self._quarantine(path, key, "does not verify")
                corrupt.append(key)
        return corrupt

    def prune(self, max_bytes: int | None = None, older_than: float | None = None) -> int:
        """Evict entries unused for `older_than` seconds, then least recently used ones above `max_bytes`.

        Also removes the quarantine and temporary files that writers which died left behind. Returns the number of
        entries evicted.
        """
        if self.mode != "on":
            raise CacheError(f"cannot prune a cache opened with mode={self.mode!r}; open it with cache='on'")
        if self.unusable:
            return 0
        infos = self.stored()
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
        evicted = sum(_remove(info.path) for info in evict)
        self.stats.evicted += evicted
        self._remove_leftovers(now)
        return evicted

    def clear_locks(self) -> int:
        """Remove every lock file (for locks left on file systems where flock locks do not die with the holder)."""
        return sum(_remove(path) for path in self._listing("locks", "*.lock"))

    def locks(self) -> list[dict]:
        """The lock files present, with their holders."""
        return [{"key": p.name.removesuffix(".lock"), **_read_holder(p)} for p in self._listing("locks", "*.lock")]

    # ---------------------------------------------------------------------------------------------- internals
    def _prepare_root(self) -> None:
        if self.mode == "readonly":  # never create anything: a missing shared cache just misses
            if not self._base.is_dir():
                log.info("read-only compile cache %s does not exist: every program is compiled", self._base)
                return
            self._owners |= {self.root.stat().st_uid}  # a shared cache: its owner is the one the reader trusts
        else:
            make_parents(self.root)
            make_dir(self.root, 0o700)
        check_parents(self.root, self._owners)
        check_root(self.root, self._owners)
        shared = self.root.stat().st_mode & 0o055  # what the root grants group and others, its entries grant too
        self._dir_mode, self._file_mode = 0o700 | shared, 0o600 | (shared & 0o044)
        self._directory(create=self.mode == "on")

    def _directory(self, *parts: str, create: bool = False) -> Path:
        """`v1/<parts>`, each level checked once per process (and created with the cache's mode if `create`)."""
        path = self._base
        for part in ("", *parts):
            path = path / part if part else path
            if path in self._checked:
                continue
            if create:
                make_dir(path, self._dir_mode)
            check_dir(path, self._owners)
            self._checked.add(path)
        return path

    def stored(self) -> list[EntryInfo]:
        """Every entry file, verified or not, with its size and last use from `lstat` alone: what `prune` weighs
        (it reads nothing of an entry; a planted file takes space too, and evicting it is harmless)."""
        infos = []
        for path in self._entry_files():
            with contextlib.suppress(OSError):
                st = path.lstat()
                if stat.S_ISREG(st.st_mode):
                    infos.append(EntryInfo(key=path.name.removesuffix(".entry"), path=path, size=st.st_size,
                                           created=st.st_mtime, last_used=st.st_mtime, meta={}))
        return sorted(infos, key=lambda info: info.last_used)

    def _entry_files(self) -> list[Path]:
        paths = []
        for directory in self._listing("entries", "*"):
            try:
                check_dir(directory, self._owners)
            except FileNotFoundError:
                continue
            except (OSError, CacheError) as exc:
                self._problem("read", exc)
                continue
            paths.extend(sorted(directory.glob("*.entry")))
        return paths

    def _listing(self, subdir: str, pattern: str) -> list[Path]:
        """The names matching `pattern` in a checked `v1/<subdir>` (none if it is missing or untrusted)."""
        try:
            return sorted(self._directory(subdir).glob(pattern))
        except FileNotFoundError:
            return []
        except (OSError, CacheError) as exc:
            self._problem("read", exc)
            return []

    def _remove_leftovers(self, now: float) -> None:
        for path in self._listing("quarantine", "*"):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                _remove(path)
        for path in [*self._listing("entries", "*/.*.tmp"), *self._listing("failures", ".*.tmp")]:
            with contextlib.suppress(OSError):
                if now - path.lstat().st_mtime > ORPHAN_SECONDS:
                    _remove(path)

    def _entry_path(self, key: str) -> Path:
        if len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
            raise CacheError(f"cache key {key!r} is not a lowercase hex digest; build keys with make_key()")
        return self._base / "entries" / key[:2] / f"{key}.entry"

    def _unauthenticated(self, path: Path, key: str, raw: bytes) -> None:
        """Count and quarantine an entry whose tag does not verify, saying why (the key id is only reported)."""
        self.stats.unauthenticated += 1
        signer = raw[len(MAGIC):_SIGNED].decode("ascii", "replace")
        if len(raw) < _BODY or not raw.startswith(MAGIC):
            reason = "not an authenticated entry (truncated, or of another format or version)"
        elif signer in self.keys.keys:
            reason = "its tag does not verify: altered or forged"
        else:
            reason = f"signed by key {signer!r}, which is neither yours nor listed in cache_trusted_keys"
        self._quarantine(path, key, f"not authenticated: {reason}")

    def _quarantine(self, path: Path, key: str, reason: str) -> None:
        self.stats.corrupt += 1
        if self.mode != "on" or self.unusable:
            self._set_aside.add(key)
            log.warning("corrupt cache entry %s (%s): treated as a miss and ignored by this process (the cache is "
                        "read-only, so it stays in place)", path, reason)
            return
        log.warning("corrupt cache entry %s (%s): treated as a miss and moved to quarantine", path, reason)
        try:
            target = self._directory("quarantine", create=True) / f"{key}.{time.time_ns()}.entry"
            os.replace(path, target)
        except FileNotFoundError:
            pass
        except (OSError, CacheError) as exc:
            self._problem("write", exc)

    def _problem(self, kind: str, error: object) -> None:
        """Count a cache failure that was worked around; warn once per process, cache root and kind."""
        self.stats.errors += 1
        with _warned_lock:
            first = (str(self.root), kind) not in _warned
            _warned.add((str(self.root), kind))
        message = {"root": "compile cache %s is not used: %s", "read": "compile cache %s: cannot read (%s); compiling",
                   "write": "compile cache %s: cannot write (%s); the program runs uncached",
                   "lock": "compile cache %s: cannot lock (%s); compiling without the lock"}[kind]
        (log.warning if first else log.debug)(message, self.root, error)


def encode_entry(header: Mapping, payload: bytes, keys: Keyring) -> bytes:
    """The bytes of an entry file: `header` (as JSON) and `payload`, signed with the user's key in `keys`."""
    header_bytes = json.dumps(header, sort_keys=True).encode()
    return _seal(len(header_bytes).to_bytes(8, "big") + header_bytes + payload, keys)


def _seal(body: bytes, keys: Keyring) -> bytes:
    """An entry of `body` (header length, header, payload) signed with the user's key."""
    signed = MAGIC + keys.signer()
    return signed + keys.sign(signed + body) + body


def _unseal(raw: bytes, keys: Keyring) -> bytes | None:
    """The body of an entry whose tag verifies under a key of `keys`, else None; nothing of the body is read."""
    if len(raw) < _BODY or not raw.startswith(MAGIC):
        return None
    if not keys.verify(raw[len(MAGIC):_SIGNED], raw[:_SIGNED] + raw[_BODY:], raw[_SIGNED:_BODY]):
        return None
    return raw[_BODY:]


def _decode(body: bytes, key: str) -> CacheEntry | None:
    """The entry of an authenticated `body` (see `_unseal`), or None unless header and checksum match."""
    parts = _split(body)
    if parts is None:
        return None
    header, payload = parts
    if (
        header.get("key") != key
        or header.get("size") != len(payload)
        or header.get("sha256") != hashlib.sha256(payload).hexdigest()
    ):
        return None
    return CacheEntry(key=key, payload=payload, meta=header["meta"], created=header["created"])


def _split(body: bytes) -> tuple[dict, bytes] | None:
    """The header and payload of an authenticated body, or None unless the header has every field with its type."""
    if len(body) < 8:
        return None
    header_len = int.from_bytes(body[:8], "big")
    try:
        header = json.loads(body[8 : 8 + header_len])
    except (ValueError, RecursionError):
        return None
    if not _well_formed(header):
        return None
    return header, body[8 + header_len :]


def _well_formed(header: object) -> bool:
    return (isinstance(header, dict) and isinstance(header.get("key"), str) and isinstance(header.get("meta"), dict)
            and type(header.get("size")) is int and isinstance(header.get("sha256"), str)
            and isinstance(header.get("created"), float | int) and not isinstance(header.get("created"), bool))


def _read_header(path: Path, owners: frozenset[int], keys: Keyring) -> tuple[dict, os.stat_result] | None:
    """The header of an entry that verifies (the whole file is read: the tag covers the payload too), or None."""
    try:
        fd = open_trusted(path, os.O_RDONLY, owners)
    except (OSError, CacheError):
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        try:
            body = _unseal(f.read(), keys)
        except OSError:
            return None
    parts = None if body is None else _split(body)
    return None if parts is None else (parts[0], st)


def _read_holder(path: Path) -> dict:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        record = json.loads(os.read(fd, 4096) or b"{}")
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    return record if isinstance(record, dict) else {}


def _holder_gone(holder: dict) -> bool:
    """The lock's recorded holder ran on this host and is no longer running."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.lstat(path).st_ino
    except FileNotFoundError:
        return False


def _remove(path: Path) -> int:
    """Unlink `path` (never following a link); 1 if this call removed it, 0 if it was gone already."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log.debug("cannot remove %s: %s", path, exc)
        return 0
    return 1
