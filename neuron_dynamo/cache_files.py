"""The compile cache's file primitives: directories and files that cannot be turned against the process reading them.

Whoever can write into a cache directory decides what the reading process runs (entries are decoded as data, see
lowering/artifact.py, but a planted entry could still change answers). So every directory of a cache must belong to
a trusted owner and be writable by no one else, and every file is opened without following symbolic links
(`O_NOFOLLOW`), without blocking on a FIFO (`O_NONBLOCK`), and is used only if it is a regular file of a trusted
owner that no one else may write. Trusted owners are the current user and root; a read-only shared cache also
trusts the owner of its root directory (the reader chose that directory). Files and directories are created with
explicit modes, whatever the umask: the owner's read and write bits, plus the read (and search) bits the root
directory grants to group and others, so a cache shared by `chmod 755` shares its entries read-only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from neuron_dynamo.errors import NeuronDynamoError

_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class CacheError(NeuronDynamoError):
    """The cache directory or an option is unusable."""


class UntrustedPathError(CacheError):
    """A cache path that another user could have planted or could change: refused, never read."""


def _describe_owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_mode(path: Path, st: os.stat_result, owners: frozenset[int], kind: str) -> None:
    """Raise UntrustedPathError unless `st` is owned by one of `owners` and not writable by group or others."""
    if st.st_uid not in owners:
        raise UntrustedPathError(
            f"the cache {kind} {path} belongs to {_describe_owner(st.st_uid)}, not to you; whoever owns it decides "
            "what your process runs. Use a cache directory of your own (option cache_dir or NEURON_DYNAMO_CACHE_DIR), "
            "or open a cache shared by a trusted user with cache='readonly'"
        )
    if st.st_mode & 0o022:
        raise UntrustedPathError(
            f"the cache {kind} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}), so "
            f"anyone in them could plant an entry. Run `chmod go-w {path}` or choose another cache directory"
        )


def check_dir(path: Path, owners: frozenset[int]) -> None:
    """A real directory (not a symbolic link) of a trusted owner, writable by no one else."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedPathError(
            f"the cache directory {path} is a symbolic link; below the cache root only real directories are used. "
            "Remove it (the cache recreates it)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedPathError(f"{path} should be a cache directory but is not a directory; remove it")
    check_mode(path, st, owners, "directory")


def check_root(root: Path, owners: frozenset[int]) -> None:
    """The cache root: a trusted directory, or a symbolic link of a trusted owner to one."""
    st = os.lstat(root)
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in owners:  # a link's own mode bits mean nothing: its owner decides where it points
            raise UntrustedPathError(
                f"the cache root link {root} belongs to {_describe_owner(st.st_uid)}, not to you, so it decides "
                "where your entries come from. Remove it, or choose another cache directory"
            )
        st = os.stat(root)
        if not stat.S_ISDIR(st.st_mode):
            raise UntrustedPathError(f"the cache root {root} links to something that is not a directory")
    elif not stat.S_ISDIR(st.st_mode):
        raise UntrustedPathError(f"the cache root {root} is not a directory; remove it or choose another cache_dir")
    check_mode(root, st, owners, "root directory")


def check_parents(root: Path, owners: frozenset[int]) -> None:
    """Every directory above the root (as the kernel walks it, links resolved): owned by a trusted owner, and
    writable by no one else unless sticky (as /tmp is: there no one may rename what is not theirs). Whoever may rename
    in a parent can swap the whole tree after the checks below it."""
    for parent in Path(os.path.realpath(root)).parents:
        st = os.stat(parent)
        if st.st_uid not in owners:
            raise UntrustedPathError(
                f"{parent}, above the cache root {root}, belongs to {_describe_owner(st.st_uid)}, who could swap the "
                "cache tree after it is checked. Choose a cache_dir whose parents are yours or root's "
                "(e.g. ~/.cache/neuron_dynamo)")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UntrustedPathError(
                f"{parent}, above the cache root {root}, is writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}), so someone else could swap the cache tree after it is checked. Run "
                f"`chmod go-w {parent}`, or choose a cache_dir whose parents only you (or root) can write")


def make_parents(path: Path) -> None:
    """Create the missing directories of `path` (not `path` itself) with mode 0700, whatever the umask."""
    missing = [parent for parent in Path(path).parents if not parent.exists()]
    for parent in reversed(missing):
        make_dir(parent, 0o700)


def make_dir(path: Path, mode: int) -> bool:
    """Create `path` with exactly `mode` (umask notwithstanding); False if it existed already."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        return False
    os.chmod(path, mode)
    return True


def open_trusted(path: Path, flags: int, owners: frozenset[int], mode: int = 0o600) -> int:
    """A file descriptor of `path` if it is a regular file of a trusted owner, writable by no one else.

    Never follows a symbolic link and never blocks on a FIFO. A file this call creates gets exactly `mode`.
    """
    try:
        fd = os.open(path, flags | _OPEN_FLAGS, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedPathError(f"{path} is a symbolic link; a cache file never is. Remove it") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedPathError(f"{path} is not a regular file (mode {st.st_mode:o}); remove it")
        check_mode(path, st, owners, "file")
        if flags & os.O_CREAT and stat.S_IMODE(st.st_mode) != mode and st.st_uid == os.getuid():
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_trusted(path: Path, owners: frozenset[int]) -> bytes:
    """The whole content of a trusted regular file (see `open_trusted`)."""
    fd = open_trusted(path, os.O_RDONLY, owners)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def touch(path: Path, owners: frozenset[int]) -> None:
    """Set the file's modification time to now (the LRU clock), through a checked descriptor."""
    fd = open_trusted(path, os.O_RDONLY, owners)
    try:
        os.utime(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to `path` whole or not at all: a private temporary file, fsynced, given `mode`, renamed."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
