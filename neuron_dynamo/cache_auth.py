"""Who wrote a cache entry: per-user secret keys, and the HMAC-SHA256 tags that authenticate entries.

A checksum proves that an entry is whole, not who wrote it: anyone who can write a cache file can recompute it. So
every entry also carries an HMAC-SHA256 tag under a secret key, and a reader serves only entries whose tag verifies
under a key it trusts: its user's own key, and the keys it lists in the option `cache_trusted_keys` (a team's CI
key, for a shared read-only cache). HMAC is a shared secret among the trusting group, not a public-key signature:
the Python standard library has no asymmetric signatures, and the cache adds no dependency for one.

The user's key is 32 random bytes (`secrets`), written as 64 hex digits to `$XDG_CONFIG_HOME/neuron_dynamo/
cache-key` (else `~/.config/neuron_dynamo/cache-key`) on first use: mode 0600, parents created 0700, never inside a
cache directory. A key file is refused if it is a symbolic link, not yours, or open to group or others in any way.
Entries name their signer by a key id (`key_id`), never by the key: the key bytes exist only in key files.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from neuron_dynamo.cache_files import CacheError, make_dir

__all__ = ["KEY_ID_LEN", "TAG_LEN", "CacheKeyError", "Keyring", "default_key_path", "key_id", "load_keyring",
           "read_key", "user_key"]

KEY_BYTES = 32
KEY_ID_LEN = 16  # hex digits, stored as ASCII in each entry
TAG_LEN = hashlib.sha256().digest_size
_ID_LABEL = b"neuron-dynamo key id"


class CacheKeyError(CacheError):
    """A cache key file that cannot be read or trusted."""


def default_key_path() -> Path:
    """`$XDG_CONFIG_HOME/neuron_dynamo/cache-key` (an absolute XDG_CONFIG_HOME), else `~/.config/...`."""
    config = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(config) if os.path.isabs(config) else Path.home() / ".config"
    return base / "neuron_dynamo" / "cache-key"


def key_id(key: bytes) -> str:
    """The public identity of a key: 16 hex digits of sha256(HMAC(key, label)); reveals nothing of the key."""
    identity = hmac.new(key, _ID_LABEL, hashlib.sha256).digest()
    return hashlib.sha256(identity).hexdigest()[:KEY_ID_LEN]


@dataclass(frozen=True)
class Keyring:
    """The keys a reader trusts, by key id; `own` is the id of the user's key, which signs what this process writes
    (None: no key of the user's is loaded, as in a cache that is off)."""

    keys: Mapping[str, bytes]
    own: str | None

    def signer(self) -> bytes:
        """The id of the user's key, as the ASCII an entry names its signer with."""
        if self.own is None:
            raise CacheKeyError("no cache key of yours is loaded, so nothing can be signed; load the keys with "
                                "load_keyring(), which creates your key if it is missing")
        return self.own.encode()

    def sign(self, data: bytes) -> bytes:
        """The tag of `data` under the user's key."""
        self.signer()
        return hmac.new(self.keys[self.own], data, hashlib.sha256).digest()

    def verify(self, signer: bytes, data: bytes, tag: bytes) -> bool:
        """Whether `tag` is the tag of `data` under the trusted key whose id is `signer` (constant-time compare)."""
        key = self.keys.get(signer.decode("ascii", "replace"))
        return key is not None and hmac.compare_digest(hmac.new(key, data, hashlib.sha256).digest(), tag)


def read_key(path: Path, what: str = "cache key file") -> bytes:
    """The key in `path`, a regular file of yours that group and others cannot access at all."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CacheKeyError(f"the {what} {path} does not exist; check the path (option cache_trusted_keys or "
                            "NEURON_DYNAMO_CACHE_TRUSTED_KEYS)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CacheKeyError(f"the {what} {path} is a symbolic link, which is refused: whoever can change the "
                                "link chooses your key. Replace the link by a copy of the file, mode 0600 "
                                f"(`cp --remove-destination \"$(readlink -f {path})\" {path}`)") from None
        raise CacheKeyError(f"cannot read the {what} {path}: {exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheKeyError(f"the {what} {path} is not a regular file; remove it or point at the key file")
        if st.st_uid != os.getuid():
            raise CacheKeyError(f"the {what} {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): "
                                "its owner could change the key you trust. Keep a copy of your own: "
                                f"`install -m 600 {path} ~/.config/neuron_dynamo/<name>.key`, and list that copy")
        if st.st_mode & 0o077:
            raise CacheKeyError(f"the {what} {path} is open to group or others (mode {stat.S_IMODE(st.st_mode):04o}):"
                                " whoever reads it can forge cache entries you trust. Run `chmod 600 "
                                f"{path}` (and, if others may have read it, replace the key)")
        data = os.read(fd, 256)
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise CacheKeyError(f"the {what} {path} does not hold a neuron-dynamo cache key (64 hex digits). Restore "
                            "it; or, for your own key, delete it: a new key is made on next use, and every entry "
                            "the old key signed then misses and is compiled again")
    return key


def user_key(create: bool = True) -> tuple[Path, bytes | None, bool]:
    """(path, key, created) of the user's own key; without `create`, a missing key is (path, None, False)."""
    path = default_key_path()
    created = False
    if not os.path.lexists(path):
        if not create:
            return path, None, False
        try:
            created = _create(path)
        except OSError as exc:
            raise CacheKeyError(f"cannot create your cache key {path}: {exc}. Set XDG_CONFIG_HOME to a directory of "
                                "yours that you can write, or pass cache='off'") from None
    _check_directory(path.parent)
    return path, read_key(path, "cache key file"), created


def load_keyring(trusted: Iterable[str | Path] = (), create: bool = True, cache_root: Path | None = None) -> Keyring:
    """The user's key (created if missing and `create`) and the `trusted` key files, none inside `cache_root`."""
    path, own, _ = user_key(create)
    keys, paths = {}, [path] if own is not None else []
    if own is not None:
        keys[key_id(own)] = own
    for trusted_path in trusted:
        trusted_path = Path(trusted_path).expanduser()
        key = read_key(trusted_path, "trusted cache key file")
        keys[key_id(key)] = key
        paths.append(trusted_path)
    if cache_root is not None:
        root = os.path.realpath(cache_root)
        for key_path in paths:
            if os.path.commonpath([root, os.path.realpath(key_path)]) == root:
                raise CacheKeyError(f"the cache key file {key_path} lies inside the cache directory {cache_root}: "
                                    "whoever can write the cache could replace it. Keep key files outside the cache "
                                    "(set XDG_CONFIG_HOME elsewhere, or list a copy kept in ~/.config)")
    return Keyring(keys=keys, own=key_id(own) if own is not None else None)


def _create(path: Path) -> bool:
    """Write a new random key to `path` (mode 0600, parents 0700); False if another process made one first."""
    missing = []
    parent = path.parent
    while not os.path.lexists(parent):
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        make_dir(directory, 0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cache-key.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(secrets.token_hex(KEY_BYTES) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # never replaces a key that another process created meanwhile
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _check_directory(directory: Path) -> None:
    st = os.stat(directory)
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise CacheKeyError(f"the directory {directory} of your cache key must be yours and writable by no one else "
                            f"(it is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): whoever can write it "
                            f"can replace your key. Run `chmod 700 {directory}`, or set XDG_CONFIG_HOME to a "
                            "directory of your own")
