"""Trust on disk: the cache refuses what another user could have planted, and never follows a planted link.

The ownership checks are unit-tested as any user (a set of trusted uids that excludes the file's owner stands for a
stranger). Where the tests run as root, files really owned by another user are made with chown, and the attacker's
own steps run as `nobody` through `setpriv` (shell commands only: the attacker needs no Python).
"""

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from neuron_dynamo import counters
from neuron_dynamo.cache import CacheError, CompileCache, make_key
from neuron_dynamo.cache_files import UntrustedPathError, check_dir, check_root, open_trusted

KEY = make_key({"trust": 1})
NOBODY = 65534
AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="making files of another user needs root (chown, setpriv)")


def as_nobody(command):
    """Run a shell command as the unprivileged user `nobody` (the attacker)."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: cannot act as another user")
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-c", command],
                   check=True)


@pytest.fixture
def shared_tmp():
    """A directory like /tmp (sticky, anyone may create names in it) that `nobody` can reach."""
    path = tempfile.mkdtemp(prefix="neuron_dynamo_shared_", dir="/tmp")
    os.chmod(path, 0o1777)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def model(x):
    return torch.tanh(x @ x.T) + 1


def run_model(x):
    torch._dynamo.reset()
    return torch.compile(model, backend="neuron")(x)


# ------------------------------------------------------------------------------------------- the checks alone
def test_a_directory_of_another_owner_is_refused(tmp_path):
    stranger = frozenset({os.getuid() + 1})  # the directory's real owner is not in the trusted set
    with pytest.raises(UntrustedPathError, match="belongs to .*not to you.*cache_dir"):
        check_dir(tmp_path, stranger)
    check_dir(tmp_path, frozenset({os.getuid()}))


@pytest.mark.parametrize("mode", [0o770, 0o720, 0o702, 0o777])
def test_group_or_world_writable_directories_are_refused(tmp_path, mode):
    directory = tmp_path / "cache"
    directory.mkdir()
    directory.chmod(mode)
    with pytest.raises(UntrustedPathError, match=f"writable by group or others.*chmod go-w {directory}"):
        check_root(directory, frozenset({os.getuid()}))
    with pytest.raises(CacheError, match="writable by group or others"):
        CompileCache(root=directory)


def test_symlinks_fifos_and_directories_are_not_cache_files(tmp_path):
    owners = frozenset({os.getuid()})
    notes = tmp_path / "notes"
    notes.write_text("mine")
    (tmp_path / "link").symlink_to(notes)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name, match in (("link", "symbolic link"), ("fifo", "not a regular file"), ("dir", "not a regular file")):
        with pytest.raises(UntrustedPathError, match=match):
            open_trusted(tmp_path / name, os.O_RDONLY, owners)
    writable = tmp_path / "writable"
    writable.write_text("x")
    writable.chmod(0o666)
    with pytest.raises(UntrustedPathError, match="writable by group or others"):
        open_trusted(writable, os.O_RDONLY, owners)


def test_a_symlinked_layout_directory_is_refused(tmp_path):
    CompileCache(root=tmp_path / "elsewhere")
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    (root / "v1").symlink_to(tmp_path / "elsewhere" / "v1")
    with pytest.raises(CacheError, match="symbolic link"):
        CompileCache(root=root)


def test_the_root_may_be_your_own_symlink(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    cache = CompileCache(root=tmp_path / "link")
    cache.put(KEY, b"payload")
    assert CompileCache(root=tmp_path / "link").get(KEY).payload == b"payload"


@pytest.mark.parametrize("umask", [0o000, 0o077, 0o022])
def test_modes_are_explicit_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        cache = CompileCache(root=tmp_path / "cache")
        cache.put(KEY, b"payload")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700
    for path in (tmp_path / "cache").rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
    assert CompileCache(root=tmp_path / "cache").get(KEY).payload == b"payload"  # and it is not refused after


def test_a_shared_root_shares_its_entries_read_only(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o755)
    CompileCache(root=root).put(KEY, b"payload")
    for path in root.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644), path


# ------------------------------------------------------------------------------ planted files in your own cache
def test_a_planted_lock_symlink_never_writes_through(tmp_path):
    notes = tmp_path / "notes"
    notes.write_text("my notes")
    cache = CompileCache(root=tmp_path / "cache")
    (tmp_path / "cache" / "v1" / "locks").mkdir(mode=0o700)
    (tmp_path / "cache" / "v1" / "locks" / f"{KEY}.lock").symlink_to(notes)
    entry = cache.get_or_compile(KEY, lambda: (b"payload", {}))
    assert entry.payload == b"payload" and notes.read_text() == "my notes"
    assert cache.stats.errors == 1  # compiled without the lock, counted


def test_a_planted_entry_symlink_is_quarantined_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"NDCACHE1 not yours")
    cache = CompileCache(root=tmp_path / "cache")
    cache.put(KEY, b"payload")
    (entry,) = (tmp_path / "cache").glob("v1/entries/*/*.entry")
    entry.unlink()
    entry.symlink_to(secret)
    assert cache.get(KEY) is None and cache.stats.corrupt == 1
    assert secret.read_bytes() == b"NDCACHE1 not yours" and not entry.is_symlink()


# ------------------------------------------------------------------------------------------ another real user
@needs_root
def test_a_cache_directory_squatted_by_another_user_is_not_used(shared_tmp, monkeypatch):
    root = shared_tmp / "neuron_cache"
    as_nobody(f"mkdir -m 700 {root} && mkdir -m 700 {root}/v1")
    with pytest.raises(CacheError, match=f"belongs to .*{NOBODY}"):
        CompileCache(root=root)
    monkeypatch.setenv("NEURON_DYNAMO_CACHE_DIR", str(root))
    x = torch.randn(4, 4)
    counters.reset_stats()
    torch.testing.assert_close(run_model(x), model(x))  # the backend runs uncached, with a warning
    assert counters.stats().get("cache.bypasses", 0) >= 1 and counters.stats().get("cache.errors", 0) >= 1
    assert sorted(os.listdir(root / "v1")) == []  # nothing written into the stranger's directory


@needs_root
def test_a_root_symlink_planted_by_another_user_is_refused(tmp_path, shared_tmp):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    as_nobody(f"ln -s {mine} {shared_tmp}/cache")
    with pytest.raises(CacheError, match="root link .*belongs to"):
        CompileCache(root=shared_tmp / "cache")


@needs_root
def test_an_entry_of_another_user_is_quarantined(tmp_path):
    cache = CompileCache(root=tmp_path / "cache")
    cache.put(KEY, b"payload")
    (entry,) = (tmp_path / "cache").glob("v1/entries/*/*.entry")
    os.chown(entry, NOBODY, NOBODY)
    assert cache.get(KEY) is None and cache.stats.corrupt == 1


@needs_root
def test_the_attacker_cannot_write_into_a_private_cache(tmp_path):
    cache = CompileCache(root=tmp_path / "cache")
    cache.put(KEY, b"payload")
    (tmp_path).chmod(0o755)
    with pytest.raises(subprocess.CalledProcessError):
        as_nobody(f"touch {tmp_path}/cache/v1/planted")


@needs_root
def test_a_readonly_cache_trusts_the_owner_of_its_root(tmp_path):
    """A cache shared by a trusted user: written by its owner, opened by others with cache='readonly'."""
    root = tmp_path / "team_cache"
    root.mkdir()
    root.chmod(0o755)
    CompileCache(root=root).put(KEY, b"team payload")
    for path in [root, *root.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)  # the cache now belongs to the team's user, not to the reader
    with pytest.raises(CacheError, match="belongs to"):
        CompileCache(root=root)  # writing into someone else's cache: refused
    assert CompileCache(root=root, mode="readonly").get(KEY).payload == b"team payload"
    (entry,) = root.glob("v1/entries/*/*.entry")
    os.chown(entry, NOBODY + 1, NOBODY + 1)  # a file of a third user inside the shared cache
    readonly = CompileCache(root=root, mode="readonly")
    assert readonly.get(KEY) is None and readonly.stats.corrupt == 1
