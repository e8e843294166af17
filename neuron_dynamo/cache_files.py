"""The compile cache's file primitives: directories and files that cannot be turned against the process reading them.

Whoever can write into a cache directory decides what the reading process runs (entries are decoded as data, see
lowering/artifact.py, but a planted entry could still change answers). So every directory of a cache must belong to
a trusted owner and be writable by no one else, and every file is opened without following symbolic links
(`O_NOFOLLOW`), without blocking on a FIFO (`O_NONBLOCK`), and is used only if it is a regular file of a trusted
owner that no one else may write. Trusted owners are the current user and root; a read-only shared cache also
trusts the owner of its root directory (the reader chose that directory). Files and directories are created with
explicit modes, whatever the umask: the owner's read and write bits, plus the read (and search) bits the root
directory grants to group and others, so a cache shared by `chmod 755` shares its entries read-only.

A check of a path is only as good as the path's stability: whoever can write a directory on the way could swap the
tree after it was checked. So below the cache root nothing is done by path. The root (once it and its parents are
checked) is opened as a directory descriptor (`open_root`), and every level below is opened relative to its
parent's descriptor, one validated name at a time, without following links (`open_dir`), then checked on the
descriptor itself (`fstat`). Files are created, opened, renamed, listed and unlinked relative to those descriptors
(`Place`: an open `Directory` and a single name), so a directory swapped for a symbolic link after a check fails
(ELOOP/ENOTDIR, refused as untrusted) instead of redirecting the operation. Paths survive only for messages.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from neuron_dynamo.errors import NeuronDynamoError

_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class CacheError(NeuronDynamoError):
    """The cache directory or an option is unusable."""


class UntrustedPathError(CacheError):
    """A cache path that another user could have planted or could change: refused, never read."""


class Directory:
    """An open, checked directory: its descriptor, its `fstat` when checked, and the path it was reached by (for
    messages only: nothing operates on `path`). Closed by `close()`, by leaving a `with` block, or when collected."""

    __slots__ = ("fd", "path", "st")

    def __init__(self, fd: int, path: Path, st: os.stat_result) -> None:
        self.fd, self.path, self.st = fd, Path(path), st

    @property
    def identity(self) -> tuple[int, int]:
        """(device, inode): which directory this is, whatever its path is now."""
        return self.st.st_dev, self.st.st_ino

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        return f"Directory({str(self.path)!r}, fd={self.fd})"


def check_name(name: str) -> str:
    """`name` if it is one path component (no `/`, no NUL, not `.` or `..`): what is looked up below a directory."""
    if not isinstance(name, str) or not name or "/" in name or "\0" in name or name in (".", ".."):
        raise CacheError(f"{name!r} is not a single file name; cache names are one path component")
    return name


class Place:
    """A name in an open `Directory`: what the file primitives below operate on, never a path.

    `str()` and `path` give the path it was reached by, for messages and listings only.
    """

    __slots__ = ("directory", "name")

    def __init__(self, directory: Directory, name: str) -> None:
        self.directory, self.name = directory, check_name(name)

    @property
    def path(self) -> Path:
        return self.directory.path / self.name

    def __str__(self) -> str:
        return os.path.join(str(self.directory.path), self.name)

    def __repr__(self) -> str:
        return f"Place({str(self)!r})"


def _at(where: Place | Path | str) -> tuple[int | None, str | Path]:
    """(directory descriptor, name) of a `Place`; (None, path) of a path (the legacy, path-based form)."""
    if isinstance(where, Place):
        if where.directory.fd < 0:
            raise CacheError(f"the directory of {where} is closed")
        return where.directory.fd, where.name
    return None, Path(where)


def lstat_at(where: Place) -> os.stat_result:
    """The `lstat` of a name in an open directory (never following a link)."""
    dir_fd, name = _at(where)
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def list_names(directory: Directory) -> list[str]:
    """The names in an open directory, sorted (read through its descriptor)."""
    return sorted(os.listdir(directory.fd))


def remove(where: Place) -> None:
    """Unlink a name in an open directory (a link is removed itself, never followed)."""
    dir_fd, name = _at(where)
    os.unlink(name, dir_fd=dir_fd)


def move(source: Place, target: Place) -> None:
    """Rename `source` to `target` (each a name in an open directory), replacing `target`; links are moved, not
    followed."""
    src_fd, src = _at(source)
    dst_fd, dst = _at(target)
    os.replace(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)


def open_dir(where: Place, owners: frozenset[int]) -> Directory:
    """Open the directory `where` (a name below an open directory) without following a link, and check it on its
    descriptor: a real directory of a trusted owner, writable by no one else."""
    dir_fd, name = _at(where)
    try:
        fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            link = exc.errno == errno.ELOOP
        if link:
            raise UntrustedPathError(
                f"the cache directory {where} is a symbolic link; below the cache root only real directories are "
                "used. Remove it (the cache recreates it)") from None
        raise UntrustedPathError(f"{where} should be a cache directory but is not a directory; remove it") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise UntrustedPathError(f"{where} should be a cache directory but is not a directory; remove it")
        check_mode(where, st, owners, "directory")
    except BaseException:
        os.close(fd)
        raise
    return Directory(fd, where.path, st)


def open_root(root: Path, owners: frozenset[int]) -> Directory:
    """Check the cache root (`check_root`: it may be a trusted link to a trusted directory), open it as a directory
    descriptor, and check the descriptor too: the directory opened is the one checked, or it is refused."""
    checked = check_root(root, owners)
    fd = os.open(root, _DIR_FLAGS | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != (checked.st_dev, checked.st_ino):
            raise UntrustedPathError(f"the cache root {root} changed while it was checked; it is not used")
        check_mode(root, st, owners, "root directory")
    except BaseException:
        os.close(fd)
        raise
    return Directory(fd, root, st)


def _describe_owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_mode(path: Path | Place, st: os.stat_result, owners: frozenset[int], kind: str) -> None:
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


def check_root(root: Path, owners: frozenset[int]) -> os.stat_result:
    """The cache root: a trusted directory, or a symbolic link of a trusted owner to one (its `stat` is returned)."""
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
    return st


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


def make_dir(where: Place | Path, mode: int) -> bool:
    """Create `where` with exactly `mode` (umask notwithstanding); False if it existed already."""
    dir_fd, name = _at(where)
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        return False
    if dir_fd is None:
        os.chmod(name, mode)
        return True
    fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return True


def open_trusted(where: Place | Path, flags: int, owners: frozenset[int], mode: int = 0o600) -> int:
    """A file descriptor of `where` if it is a regular file of a trusted owner, writable by no one else.

    Never follows a symbolic link and never blocks on a FIFO. A file this call creates gets exactly `mode`. A
    `Place` is opened relative to its directory's descriptor (a path, as tests use, by path).
    """
    dir_fd, name = _at(where)
    try:
        fd = os.open(name, flags | _OPEN_FLAGS, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedPathError(f"{where} is a symbolic link; a cache file never is. Remove it") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedPathError(f"{where} is not a regular file (mode {st.st_mode:o}); remove it")
        check_mode(where, st, owners, "file")
        if flags & os.O_CREAT and stat.S_IMODE(st.st_mode) != mode and st.st_uid == os.getuid():
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_trusted(where: Place | Path, owners: frozenset[int]) -> bytes:
    """The whole content of a trusted regular file (see `open_trusted`)."""
    fd = open_trusted(where, os.O_RDONLY, owners)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def touch(where: Place | Path, owners: frozenset[int]) -> None:
    """Set the file's modification time to now (the LRU clock), through a checked descriptor."""
    fd = open_trusted(where, os.O_RDONLY, owners)
    try:
        os.utime(fd)
    finally:
        os.close(fd)


def atomic_write(where: Place | Path, data: bytes, mode: int) -> None:
    """Write `data` to `where` whole or not at all: a private temporary file (a fresh random name, created
    exclusively in the same directory), fsynced, given `mode`, renamed over `where` (relative to the directory's
    descriptor for a `Place`)."""
    if isinstance(where, Place):
        dir_fd, name = _at(where)
        owned = None
    else:
        path = Path(where)
        dir_fd = owned = os.open(path.parent, _DIR_FLAGS)
        name = check_name(path.name)
    try:
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        if owned is not None:
            os.close(owned)
