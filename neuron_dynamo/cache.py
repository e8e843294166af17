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
* nothing below the root is done by path: the root is opened once (after it and its parents are checked) and every
  directory below it is opened from its parent's descriptor without following a link and checked on its own
  descriptor; files are created, read, renamed, listed and unlinked relative to those descriptors. A directory
  swapped for a link after a check is refused (counted in `stats.errors`), and `prune` removes a file only from the
  very directory it listed. The root's descriptor is held until `close()` (or until the cache is collected);
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
import fnmatch
import hashlib
import json
import logging
import os
import shutil
import socket
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from neuron_dynamo.cache_auth import KEY_ID_LEN, TAG_LEN, Keyring, load_keyring
from neuron_dynamo.cache_files import (
    CacheError,
    Directory,
    Place,
    UntrustedPathError,
    atomic_write,
    check_parents,
    list_names,
    lstat_at,
    make_dir,
    make_parents,
    move,
    open_dir,
    open_root,
    open_trusted,
    read_trusted,
    remove,
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
        self._base = self.root / LAYOUT_VERSION  # for messages: everything below the root goes through descriptors
        self._owners = frozenset({os.getuid(), 0})
        self._dir_mode, self._file_mode = 0o700, 0o600
        self._root: Directory | None = None  # the root, opened once it and its parents are checked
        self._closer: weakref.finalize | None = None
        self._closed = False
        self._opening = threading.Lock()  # a read-only cache missing at first is opened by the first use that finds it
        self._set_aside: set[str] = set()  # keys found bad where they cannot be moved (read-only): never read again
        self.unusable: str | None = None  # why the cache is not used at all (strict=False only)
        self.keys = Keyring(keys={}, own=None)  # who may have written the entries this cache serves
        if self.mode == "off":
            return
        try:
            self.keys = load_keyring(self.trusted_keys, cache_root=self.root)
            self._prepare_root()
        except (CacheError, OSError) as exc:
            self._release()
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

    def close(self) -> None:
        """Close the root's descriptor (also done when the cache is collected). Every later read misses and every
        later write is counted in `stats.errors`. Call it only when no other thread uses the cache."""
        self._closed = True
        self._release()

    def _release(self) -> None:
        closer, self._closer, self._root = self._closer, None, None
        if closer is not None:
            closer()

    def __enter__(self) -> CompileCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------------- reading
    def get(self, key: str) -> CacheEntry | None:
        """The entry for `key`, or None. A corrupt entry is quarantined and reads as None."""
        name = self._entry_name(key)
        if not self.active or key in self._set_aside:
            return None
        try:
            directory = self._open("entries", key[:2])
        except FileNotFoundError:
            return None
        except (OSError, CacheError) as exc:  # e.g. the directory swapped for a link: never followed
            self._problem("read", exc)
            return None
        with directory:
            return self._read_entry(Place(directory, name), key)

    def _read_entry(self, place: Place, key: str) -> CacheEntry | None:
        try:
            fd = open_trusted(place, os.O_RDONLY, self._owners)
        except FileNotFoundError:
            return None
        except UntrustedPathError as exc:  # a planted file in a directory of ours: move it aside
            self._quarantine(place, key, str(exc))
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
            self._unauthenticated(place, key, raw)
        elif entry is None:
            self._quarantine(place, key, "checksum, size or header does not match")
        return entry

    def failure(self, key: str) -> str | None:
        """The reason of a cached, unexpired compile failure of `key`, or None (a malformed record is ignored)."""
        name = f"{self._entry_name(key).removesuffix('.entry')}.json"
        try:
            with self._open("failures") as directory:
                record = json.loads(read_trusted(Place(directory, name), self._owners))
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
        name = self._entry_name(key)
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
            with self._open("entries", key[:2], create=True) as directory:
                atomic_write(Place(directory, name), blob, self._file_mode)
        except (OSError, CacheError) as exc:
            self._problem("write", exc)
            return
        if self.max_bytes is not None:
            self.prune(max_bytes=self.max_bytes)

    def record_failure(self, key: str, reason: str) -> None:
        """Remember that compiling `key` failed, for `failure_ttl` seconds."""
        name = f"{self._entry_name(key).removesuffix('.entry')}.json"
        if self.mode != "on" or self.unusable or self.failure_ttl <= 0:
            return
        now = time.time()
        record = {"key": key, "reason": reason, "created": now, "expires": now + self.failure_ttl}
        try:
            with self._open("failures", create=True) as directory:
                atomic_write(Place(directory, name), json.dumps(record).encode(), self._file_mode)
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
        name = self._entry_name(key)
        try:
            directory = self._open("entries", key[:2]) if self.active else None
        except FileNotFoundError:  # nothing left to move
            directory = None
        except (OSError, CacheError) as exc:
            self._quarantine(None, key, reason)
            self._problem("write", exc)
            return
        if directory is None:
            self._quarantine(None, key, reason)
            return
        with directory:
            self._quarantine(Place(directory, name), key, reason)

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
        name = f"{self._entry_name(key).removesuffix('.entry')}.lock"
        try:
            directory = self._open("locks", create=True)
        except (OSError, CacheError) as exc:
            self._problem("lock", exc)
            yield
            return
        with directory:
            place = Place(directory, name)
            fd = self._acquire(place)
            if fd is None:
                yield
                return
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
                    remove(place)
                os.close(fd)

    def _acquire(self, place: Place) -> int | None:
        """The locked descriptor of `place`, or None: lock unusable, holder gone, or `lock_timeout` passed."""
        deadline = time.monotonic() + self.lock_timeout
        waited = False
        while True:
            try:
                fd = open_trusted(place, os.O_RDWR | os.O_CREAT, self._owners, self._file_mode)
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
                holder = _read_holder(place)
                if _holder_gone(holder):
                    log.warning("cache lock %s is held for process %s, which no longer runs; compiling without it",
                                place, holder.get("pid"))
                    return None
                if time.monotonic() > deadline:
                    self.stats.lock_timeouts += 1
                    log.warning("cache lock %s still held by %s after %.0f s (option cache_lock_timeout); compiling "
                                "without it", place, holder, self.lock_timeout)
                    return None
                time.sleep(0.05)
                continue
            if _same_file(fd, place):  # not a lock file that `clear_locks` or a holder unlinked while we waited
                return fd
            os.close(fd)

    # ------------------------------------------------------------------------------------------ maintenance
    def entries(self) -> list[EntryInfo]:
        """Every entry that reads and verifies (tag, then header), oldest use first; the others are left out."""
        infos = []
        for place in self._entry_files():
            found = _read_header(place, self._owners, self.keys)
            if found is not None:
                header, st = found
                infos.append(EntryInfo(key=header["key"], path=place.path, size=st.st_size,
                                       created=header["created"], last_used=st.st_mtime, meta=header["meta"]))
        return sorted(infos, key=lambda info: info.last_used)

    def verify(self) -> list[str]:
        """Check every entry's tag, then re-hash it; quarantine and return the keys of those that fail."""
        corrupt = []
        for place in self._entry_files():
            key = place.name.removesuffix(".entry")
            try:
                raw = read_trusted(place, self._owners)
            except FileNotFoundError:  # evicted meanwhile
                continue
            except UntrustedPathError:
                raw = b""
            except OSError as exc:
                self._problem("read", exc)
                continue
            body = _unseal(raw, self.keys)
            if raw and body is None:
                self._unauthenticated(place, key, raw)
                corrupt.append(key)
            elif body is None or _decode(body, key) is None:
                self._quarantine(place, key, "does not verify")
                corrupt.append(key)
        return corrupt

    def prune(self, max_bytes: int | None = None, older_than: float | None = None) -> int:
        """Evict entries unused for `older_than` seconds, then least recently used ones above `max_bytes`.

        Also removes the quarantine and temporary files that writers which died left behind. Returns the number of
        entries evicted. Everything is removed through the descriptors of the directories listed: never through a
        link, and never from a directory that was swapped after it was listed (counted in `stats.errors`).
        """
        if self.mode != "on":
            raise CacheError(f"cannot prune a cache opened with mode={self.mode!r}; open it with cache='on'")
        if self.unusable:
            return 0
        found = self._stored()
        now = time.time()
        keep, evict = [], []
        for item in found:
            (evict if older_than is not None and now - item[0].last_used > older_than else keep).append(item)
        if max_bytes is not None:
            total = sum(info.size for info, *_ in keep)
            while keep and total > max_bytes:
                oldest = keep.pop(0)
                total -= oldest[0].size
                evict.append(oldest)
        evicted = self._evict(evict)
        self.stats.evicted += evicted
        self._remove_leftovers(now)
        return evicted

    def clear_locks(self) -> int:
        """Remove every lock file (for locks left on file systems where flock locks do not die with the holder)."""
        directory = self._subdir("locks")
        if directory is None:
            return 0
        with directory:
            return sum(self._remove(Place(directory, name)) for name in _names(directory, "*.lock"))

    def locks(self) -> list[dict]:
        """The lock files present, with their holders."""
        directory = self._subdir("locks")
        if directory is None:
            return []
        with directory:
            return [{"key": name.removesuffix(".lock"), **_read_holder(Place(directory, name))}
                    for name in _names(directory, "*.lock")]

    # ---------------------------------------------------------------------------------------------- internals
    def _prepare_root(self, quiet: bool = False) -> None:
        if self.mode == "readonly":  # never create anything: a missing shared cache just misses (until it exists)
            if not self._base.is_dir():
                if not quiet:
                    log.info("read-only compile cache %s does not exist: every program is compiled until it does",
                             self._base)
                return
            self._owners |= {self.root.stat().st_uid}  # a shared cache: its owner is the one the reader trusts
        else:
            make_parents(self.root)
            make_dir(self.root, 0o700)
        check_parents(self.root, self._owners)
        root = open_root(self.root, self._owners)  # checks the root, then the descriptor it opens
        self._root, self._closer = root, weakref.finalize(self, root.close)
        shared = root.st.st_mode & 0o055  # what the root grants group and others, its entries grant too
        self._dir_mode, self._file_mode = 0o700 | shared, 0o600 | (shared & 0o044)
        with self._open(create=self.mode == "on"):
            pass

    def _open(self, *parts: str, create: bool = False) -> Directory:
        """`v1/<parts>`, opened level by level from the root's descriptor, never following a link, each level checked
        on its descriptor (and created with the cache's mode if `create`). The caller closes it."""
        if self._closed:
            raise CacheError(f"the compile cache {self.root} is closed")
        root = self._root
        if root is None and self.mode == "readonly" and self.unusable is None:
            root = self._open_late()
        if root is None:  # a read-only cache that does not exist (yet), or an unusable one: nothing to read
            raise FileNotFoundError(errno.ENOENT, "the cache directory is not open", str(self._base))
        current, opened = root, None
        try:
            for part in (LAYOUT_VERSION, *parts):
                place = Place(current, part)
                try:
                    current = open_dir(place, self._owners)
                except FileNotFoundError:
                    if not create:
                        raise
                    make_dir(place, self._dir_mode)
                    current = open_dir(place, self._owners)
                if opened is not None:
                    opened.close()
                opened = current
        except BaseException:
            if opened is not None:
                opened.close()
            raise
        return current

    def _open_late(self) -> Directory | None:
        """Open a read-only cache that did not exist when this object was made, once it does: the same checks of the
        parents, the root and `v1` as at first, then the root's descriptor is kept as if opened then."""
        with self._opening:
            if self._root is None and not self._closed:
                try:
                    self._prepare_root(quiet=True)
                except BaseException:
                    self._release()
                    raise
            return self._root

    def _subdir(self, subdir: str) -> Directory | None:
        """The open `v1/<subdir>`, or None if it is missing or untrusted (counted)."""
        try:
            return self._open(subdir)
        except FileNotFoundError:
            return None
        except (OSError, CacheError) as exc:
            self._problem("read", exc)
            return None

    def stored(self) -> list[EntryInfo]:
        """Every entry file, verified or not, with its size and last use from `lstat` alone: what `prune` weighs
        (it reads nothing of an entry; a planted file takes space too, and evicting it is harmless)."""
        return [info for info, *_ in self._stored()]

    def _stored(self) -> list[tuple[EntryInfo, str, tuple[int, int]]]:
        """`stored()`, each entry with its directory's name and identity (what `_evict` removes it from)."""
        found = []
        for directory, kk in self._entry_dirs():
            for name in _names(directory, "*.entry"):
                place = Place(directory, name)
                with contextlib.suppress(OSError):
                    st = lstat_at(place)
                    if stat.S_ISREG(st.st_mode):
                        info = EntryInfo(key=name.removesuffix(".entry"), path=place.path, size=st.st_size,
                                         created=st.st_mtime, last_used=st.st_mtime, meta={})
                        found.append((info, kk, directory.identity))
        return sorted(found, key=lambda item: item[0].last_used)

    def _evict(self, evict: list[tuple[EntryInfo, str, tuple[int, int]]]) -> int:
        """Unlink the entries `_stored` found, each in the very directory it was listed in: the directory is opened
        again without following a link, and must be the one listed (device and inode), else nothing is removed."""
        by_directory: dict[tuple[str, tuple[int, int]], list[str]] = {}
        for info, kk, identity in evict:
            by_directory.setdefault((kk, identity), []).append(f"{info.key}.entry")
        if not by_directory:
            return 0
        try:
            entries = self._open("entries")
        except (OSError, CacheError) as exc:
            self._problem("evict", exc)
            return 0
        removed = 0
        with entries:
            for (kk, identity), names in by_directory.items():
                try:
                    directory = open_dir(Place(entries, kk), self._owners)
                except FileNotFoundError:
                    continue
                except (OSError, CacheError) as exc:  # swapped for a link, or no longer trusted: refused
                    self._problem("evict", exc)
                    continue
                with directory:
                    if directory.identity != identity:
                        self._problem("evict", UntrustedPathError(
                            f"the cache directory {directory.path} was replaced while it was pruned; nothing is "
                            "removed from it"))
                        continue
                    removed += sum(self._remove(Place(directory, name)) for name in names)
        return removed

    def _entry_dirs(self) -> Iterator[tuple[Directory, str]]:
        """Each `v1/entries/<kk>` directory, open and checked, with its name; closed when the caller moves on."""
        entries = self._subdir("entries")
        if entries is None:
            return
        with entries:
            for kk in _names(entries, "*"):
                try:
                    directory = open_dir(Place(entries, kk), self._owners)
                except FileNotFoundError:
                    continue
                except (OSError, CacheError) as exc:
                    self._problem("read", exc)
                    continue
                with directory:
                    yield directory, kk

    def _entry_files(self) -> Iterator[Place]:
        """Each `*.entry` name, in its open directory (valid until the caller takes the next one)."""
        for directory, _ in self._entry_dirs():
            for name in _names(directory, "*.entry"):
                yield Place(directory, name)

    def _remove_leftovers(self, now: float) -> None:
        quarantine = self._subdir("quarantine")
        if quarantine is not None:
            with quarantine:
                for name in _names(quarantine, "*"):
                    place = Place(quarantine, name)
                    try:
                        is_dir = stat.S_ISDIR(lstat_at(place).st_mode)
                    except OSError:
                        continue
                    if is_dir:  # removed through descriptors, never following a link (shutil's fd-based walk)
                        shutil.rmtree(name, dir_fd=quarantine.fd, ignore_errors=True)
                    else:
                        self._remove(place)
        for directory, _ in self._entry_dirs():
            self._remove_orphans(directory, now)
        failures = self._subdir("failures")
        if failures is not None:
            with failures:
                self._remove_orphans(failures, now)

    def _remove_orphans(self, directory: Directory, now: float) -> None:
        """Remove the temporary files of writers that died (older than ORPHAN_SECONDS)."""
        for name in _names(directory, ".*.tmp"):
            place = Place(directory, name)
            with contextlib.suppress(OSError):
                if now - lstat_at(place).st_mtime > ORPHAN_SECONDS:
                    self._remove(place)

    def _remove(self, place: Place) -> int:
        """Unlink `place` (never following a link); 1 if this call removed it, 0 if it was gone already."""
        try:
            remove(place)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            log.debug("cannot remove %s: %s", place, exc)
            return 0
        return 1

    def _entry_name(self, key: str) -> str:
        """The entry file's name of a valid key (a lowercase hex digest: one path component, nothing to escape)."""
        if not isinstance(key, str) or len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
            raise CacheError(f"cache key {key!r} is not a lowercase hex digest; build keys with make_key()")
        return f"{key}.entry"

    def _entry_path(self, key: str) -> Path:
        """Where the entry of `key` is, for messages and tests only: the cache never operates on this path."""
        return self._base / "entries" / key[:2] / self._entry_name(key)

    def _unauthenticated(self, place: Place, key: str, raw: bytes) -> None:
        """Count and quarantine an entry whose tag does not verify, saying why (the key id is only reported)."""
        self.stats.unauthenticated += 1
        signer = raw[len(MAGIC):_SIGNED].decode("ascii", "replace")
        if len(raw) < _BODY or not raw.startswith(MAGIC):
            reason = "not an authenticated entry (truncated, or of another format or version)"
        elif signer in self.keys.keys:
            reason = "its tag does not verify: altered or forged"
        else:
            reason = f"signed by key {signer!r}, which is neither yours nor listed in cache_trusted_keys"
        self._quarantine(place, key, f"not authenticated: {reason}")

    def _quarantine(self, place: Place | None, key: str, reason: str) -> None:
        """Count a corrupt entry and move it (`place`, None: nothing to move) into `v1/quarantine`, by descriptors."""
        self.stats.corrupt += 1
        shown = place if place is not None else self._entry_path(key)
        if self.mode != "on" or self.unusable:
            self._set_aside.add(key)
            log.warning("corrupt cache entry %s (%s): treated as a miss and ignored by this process (the cache is "
                        "read-only, so it stays in place)", shown, reason)
            return
        log.warning("corrupt cache entry %s (%s): treated as a miss and moved to quarantine", shown, reason)
        if place is None:
            return
        try:
            with self._open("quarantine", create=True) as quarantine:
                move(place, Place(quarantine, f"{key}.{time.time_ns()}.entry"))
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
                   "lock": "compile cache %s: cannot lock (%s); compiling without the lock",
                   "evict": "compile cache %s: cannot evict or clean up (%s); the files stay in place"}[kind]
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


def _names(directory: Directory, pattern: str) -> list[str]:
    """The names in an open directory matching `pattern` (as glob does: `*` skips dot files), read through its
    descriptor."""
    hidden = pattern.startswith(".")
    return [name for name in list_names(directory)
            if fnmatch.fnmatchcase(name, pattern) and (hidden or not name.startswith("."))]


def _read_header(place: Place, owners: frozenset[int], keys: Keyring) -> tuple[dict, os.stat_result] | None:
    """The header of an entry that verifies (the whole file is read: the tag covers the payload too), or None."""
    try:
        fd = open_trusted(place, os.O_RDONLY, owners)
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


def _read_holder(place: Place) -> dict:
    try:
        fd = os.open(place.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=place.directory.fd)
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


def _same_file(fd: int, place: Place) -> bool:
    try:
        return os.fstat(fd).st_ino == lstat_at(place).st_ino
    except FileNotFoundError:
        return False
