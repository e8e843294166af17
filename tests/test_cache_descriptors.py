"""Directories held by descriptor (issue 29): a tree swapped after its checks cannot redirect any cache operation.

Below the cache root every walk, create, open, rename, list and delete goes through directory descriptors, one
checked name at a time and never through a link. So a directory of the cache replaced by a symbolic link to another
directory of the user's (before an operation, or in the middle of `prune`), or a root moved away and replanted after
the cache opened it, never costs a file outside the cache: the swap is counted or refused, never followed.
"""

import errno
import os
import shutil
import time
from pathlib import Path

import pytest

import neuron_dynamo.cache as cache_module
from neuron_dynamo.cache import CacheError, CompileCache, make_key
from neuron_dynamo.cache_files import CacheError as FilesCacheError
from neuron_dynamo.cache_files import Place, check_name, open_root

KEY = make_key({"descriptors": 1})
OTHER = make_key({"descriptors": 2})
OLD = time.time() - 7200


def plant_victim(directory: Path, key: str = KEY) -> Path:
    """A directory of the user's, outside the cache, holding files named like every kind of cache file."""
    directory.mkdir(mode=0o700)
    for name in (f"{key}.entry", f".{key}.entry.abc.tmp", f"{key}.lock", f"{key}.json", f"{key}.1.entry",
                 "notes.txt"):
        (directory / name).write_bytes(b"the victim's own " + name.encode())
        os.utime(directory / name, (OLD, OLD))  # old enough for any eviction or orphan clean-up
    (directory / "keep").mkdir(mode=0o700)
    (directory / "keep" / "deep.txt").write_text("deep")
    return directory


def snapshot(top: Path, skip: Path | None = None) -> dict:
    """Every name below `top` (links not followed, `skip` left out) with its type, mode, size, mtime and content."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        if skip is not None and Path(dirpath) == skip.parent:
            dirnames[:] = [d for d in dirnames if Path(dirpath, d) != skip]
            filenames = [f for f in filenames if Path(dirpath, f) != skip]
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            st = path.lstat()
            content = path.read_bytes() if path.is_file() and not path.is_symlink() else os.readlink(path) \
                if path.is_symlink() else None
            found[str(path.relative_to(top))] = (st.st_mode, st.st_size, st.st_mtime_ns, content)
    return found


def swap_for_link(directory: Path, target: Path) -> None:
    """Replace a directory of the cache by a symbolic link to `target` (what a writer on the way could do)."""
    shutil.rmtree(directory)
    directory.symlink_to(target, target_is_directory=True)


def every_operation(cache: CompileCache) -> None:
    """Each public operation of the store, as a user or `neuron-precompile` runs them; none may raise."""
    cache.put(KEY, b"payload", {"n": 1})
    cache.put(OTHER, b"other payload")
    cache.get(KEY)
    cache.get(OTHER)
    cache.get_or_compile(make_key({"descriptors": 3}), lambda: (b"compiled", {}))
    cache.record_failure(KEY, "boom")
    cache.failure(KEY)
    cache.entries()
    cache.stored()
    cache.verify()
    cache.locks()
    cache.discard(KEY, "test")
    cache.prune(max_bytes=0)
    cache.prune(older_than=0)
    cache.clear_locks()


# ---------------------------------------------------------------------------------------- swapped before use
LEVELS = ["v1", "v1/entries", f"v1/entries/{KEY[:2]}", "v1/quarantine", "v1/failures", "v1/locks"]


@pytest.mark.parametrize("level", LEVELS)
def test_a_cache_directory_swapped_for_a_link_never_costs_a_file_outside(tmp_path, monkeypatch, level):
    monkeypatch.setattr(cache_module, "ORPHAN_SECONDS", 0.0)
    root = tmp_path / "cache"
    cache = CompileCache(root=root, max_bytes=10)  # every put prunes
    every_operation(cache)  # every directory exists now
    cache.put(KEY, b"payload")
    (root / level).mkdir(exist_ok=True)
    victim = plant_victim(tmp_path / "victim")
    outside = snapshot(tmp_path, skip=root)
    swap_for_link(root / level, victim)
    errors = cache.stats.errors

    every_operation(cache)
    every_operation(CompileCache(root=root, max_bytes=10, strict=False))  # a process that starts after the swap

    assert snapshot(tmp_path, skip=root) == outside, "a file outside the cache was changed"
    assert (root / level).is_symlink()  # refused, not replaced: the user sees what happened
    assert cache.stats.errors > errors  # counted


def test_the_attack_of_the_issue_prune_after_a_put(tmp_path):
    """`v1/entries/ab` replaced by a link to another directory of the victim's: unlinking `ab/<key>.entry` there
    would remove the victim's file. With `cache_max_mb` every put prunes, so the attack needs no maintenance run."""
    root = tmp_path / "cache"
    cache = CompileCache(root=root, max_bytes=1)
    cache.put(KEY, b"payload")
    victim = plant_victim(tmp_path / "documents")
    swap_for_link(root / "v1" / "entries" / KEY[:2], victim)
    before = snapshot(victim)

    cache.put(OTHER, b"x" * 100)  # prunes: everything is over one byte
    cache.prune(max_bytes=0)
    assert cache.get(KEY) is None and cache.verify() == [] and cache.entries() == []
    assert all(info.key != KEY for info in cache.stored())

    assert snapshot(victim) == before and (victim / f"{KEY}.entry").read_bytes().startswith(b"the victim's")
    assert cache.stats.errors >= 1


def test_a_symlinked_layout_directory_is_refused_at_open_and_a_regular_file_too(tmp_path):
    root = tmp_path / "cache"
    CompileCache(root=root)
    (root / "v1").rename(tmp_path / "old")
    (root / "v1").symlink_to(tmp_path / "old")
    with pytest.raises(CacheError, match="symbolic link"):
        CompileCache(root=root)
    (root / "v1").unlink()
    (root / "v1").write_text("not a directory")
    with pytest.raises(CacheError, match="not a directory"):
        CompileCache(root=root)


# ---------------------------------------------------------------------------------------- swapped during prune
def link_after_moving(away: Path, victim: Path):
    """A `replace` for `swapping_listing`: the listed directory moves to `away`, a link to `victim` takes its place."""

    def replace(directory: Path) -> None:
        directory.rename(away)
        directory.symlink_to(victim, target_is_directory=True)

    return replace


def swapping_listing(monkeypatch, directory: Path, pattern: str, replace):
    """Make the cache's own listing of `directory` (with `pattern`) swap it right after it was listed, once."""
    real = cache_module._names
    done = []

    def listing(opened, wanted):
        names = real(opened, wanted)
        if not done and wanted == pattern and Path(opened.path) == directory:
            done.append(True)
            replace(directory)
        return names

    monkeypatch.setattr(cache_module, "_names", listing)
    return done


@pytest.mark.parametrize("replacement", ["link", "directory"])
def test_an_entry_directory_swapped_while_prune_lists_it(tmp_path, monkeypatch, replacement):
    root = tmp_path / "cache"
    cache = CompileCache(root=root)
    cache.put(KEY, b"payload")
    kk = root / "v1" / "entries" / KEY[:2]
    victim = plant_victim(tmp_path / "victim")
    outside = snapshot(tmp_path, skip=root)
    away = tmp_path / "cache" / "away"

    def replace(directory):
        directory.rename(away)  # the real directory, moved away (inside the root: the snapshot skips it)
        if replacement == "link":
            directory.symlink_to(victim, target_is_directory=True)
        else:  # a real directory of the user's, holding a file named like the entry
            directory.mkdir(mode=0o700)
            (directory / f"{KEY}.entry").write_bytes(b"planted in a new directory")

    done = swapping_listing(monkeypatch, kk, "*.entry", replace)
    assert cache.prune(max_bytes=0) == 0  # evicts nothing: the directory listed is not the one there now
    assert done and cache.stats.errors >= 1  # the eviction refused (and, for a link, the clean-up's listing)
    assert snapshot(tmp_path, skip=root) == outside
    assert (away / f"{KEY}.entry").exists()
    if replacement == "directory":
        assert (kk / f"{KEY}.entry").read_bytes() == b"planted in a new directory"


def test_the_quarantine_swapped_while_prune_empties_it(tmp_path, monkeypatch):
    """The quarantine is emptied through the descriptor it was listed by: the files removed are the cache's."""
    root = tmp_path / "cache"
    cache = CompileCache(root=root)
    cache.put(KEY, b"payload")
    cache.discard(KEY, "test")
    quarantine = root / "v1" / "quarantine"
    (name,) = os.listdir(quarantine)
    victim = plant_victim(tmp_path / "victim")
    (victim / name).write_bytes(b"the victim's file named like the quarantined entry")
    outside = snapshot(tmp_path, skip=root)
    away = root / "away"

    replace = link_after_moving(away, victim)
    done = swapping_listing(monkeypatch, quarantine, "*", replace)
    cache.prune()
    assert done and snapshot(tmp_path, skip=root) == outside
    assert not (away / name).exists()  # removed from the directory that was listed, wherever it is now


def test_orphans_swapped_while_prune_removes_them(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_module, "ORPHAN_SECONDS", 0.0)
    root = tmp_path / "cache"
    cache = CompileCache(root=root)
    cache.put(KEY, b"payload")
    kk = root / "v1" / "entries" / KEY[:2]
    orphan = kk / f".{KEY}.entry.abc.tmp"
    orphan.write_bytes(b"half")
    os.utime(orphan, (OLD, OLD))
    victim = plant_victim(tmp_path / "victim")
    outside = snapshot(tmp_path, skip=root)
    away = root / "away"

    replace = link_after_moving(away, victim)
    done = swapping_listing(monkeypatch, kk, ".*.tmp", replace)
    cache.prune()
    assert done and snapshot(tmp_path, skip=root) == outside
    assert not (away / orphan.name).exists() and (away / f"{KEY}.entry").exists()


def test_a_get_whose_directory_is_swapped_after_the_check_reads_nothing_through_the_link(tmp_path, monkeypatch):
    """Each level is checked on the descriptor that is then used: there is no window between check and use."""
    root = tmp_path / "cache"
    cache = CompileCache(root=root)
    cache.put(KEY, b"payload")
    kk = root / "v1" / "entries" / KEY[:2]
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    stranger = CompileCache(root=tmp_path / "stranger")
    stranger.put(KEY, b"what the link would serve")
    shutil.copy(tmp_path / "stranger" / "v1" / "entries" / KEY[:2] / f"{KEY}.entry", victim)
    real_open = cache_module.open_trusted

    def swap_then_open(place, *args, **kwargs):
        if str(place).endswith(".entry") and not kk.is_symlink():
            kk.rename(root / "away")
            kk.symlink_to(victim, target_is_directory=True)
        return real_open(place, *args, **kwargs)

    monkeypatch.setattr(cache_module, "open_trusted", swap_then_open)
    assert cache.get(KEY).payload == b"payload"  # read from the directory that was opened and checked
    monkeypatch.undo()
    assert cache.get(KEY) is None and cache.stats.errors == 1  # the link: refused


# ------------------------------------------------------------------------------------------------ the root
@pytest.mark.parametrize("planted", ["link", "directory"])
def test_a_root_moved_and_replanted_after_opening_is_never_used(tmp_path, planted):
    root = tmp_path / "cache"
    cache = CompileCache(root=root, max_bytes=10**6)
    cache.put(KEY, b"payload")
    moved = tmp_path / "moved"
    root.rename(moved)
    elsewhere = tmp_path / "elsewhere"
    CompileCache(root=elsewhere).put(KEY, b"the planted tree's")
    plant_victim(elsewhere / "v1" / "entries" / OTHER[:2], OTHER)
    if planted == "link":
        root.symlink_to(elsewhere, target_is_directory=True)
    else:
        shutil.copytree(elsewhere, root, symlinks=True)
    planted_tree = root if planted == "directory" else elsewhere
    before = snapshot(planted_tree)

    assert cache.get(KEY).payload == b"payload"  # the directory it opened, wherever it is now
    cache.put(OTHER, b"other")
    assert (moved / "v1" / "entries" / OTHER[:2] / f"{OTHER}.entry").exists()
    cache.prune(max_bytes=0)
    assert not list(moved.glob("v1/entries/*/*.entry"))
    every_operation(cache)
    assert snapshot(planted_tree) == before


def test_open_root_refuses_a_root_that_is_not_the_one_checked(tmp_path, monkeypatch):
    import neuron_dynamo.cache_files as files

    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    real = files.check_root

    def check_then_swap(path, owners):
        st = real(path, owners)
        root.rename(tmp_path / "checked")
        root.symlink_to(other, target_is_directory=True)
        return st

    monkeypatch.setattr(files, "check_root", check_then_swap)
    with pytest.raises(FilesCacheError, match="changed while it was checked"):
        open_root(root, frozenset({os.getuid()}))


# ------------------------------------------------------------------------------------------------ names, fds
@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "/etc", "a\0b", "../x"])
def test_names_below_a_directory_are_single_components(name):
    with pytest.raises(FilesCacheError, match="single file name"):
        check_name(name)


def test_a_key_never_becomes_a_path(tmp_path):
    cache = CompileCache(root=tmp_path)
    for key in ("../../../etc/passwd", "ab/../../x", KEY.upper(), "abc"):
        with pytest.raises(CacheError, match="make_key"):
            cache.get(key)
        with pytest.raises(CacheError, match="make_key"):
            cache.put(key, b"x")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_no_descriptor_leaks_over_many_caches(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_module, "ORPHAN_SECONDS", 0.0)
    roots = [tmp_path / f"cache{n}" for n in range(5)]
    (tmp_path / "bad").mkdir(mode=0o700)
    (tmp_path / "bad" / "v1").symlink_to(tmp_path)
    CompileCache(root=roots[0]).put(KEY, b"warm up")  # imports, the key file, the logger
    before = open_fds()
    for n in range(200):
        cache = CompileCache(root=roots[n % 5], max_bytes=4000)
        if n % 10 == 0:
            every_operation(cache)
        else:
            cache.put(make_key({"n": n}), b"p" * 100)
            cache.get(make_key({"n": n}))
        with pytest.raises(CacheError):
            CompileCache(root=tmp_path / "bad")  # refused after the root was opened: closed again
        assert not CompileCache(root=tmp_path / "bad", strict=False).active
        del cache
    assert open_fds() <= before
    with CompileCache(root=roots[0]) as cache:
        cache.put(KEY, b"payload")
        assert open_fds() == before + 1  # the root's descriptor, held while the cache is open
    assert open_fds() == before


def test_a_closed_cache_misses_and_counts_never_crashes(tmp_path):
    cache = CompileCache(root=tmp_path)
    cache.put(KEY, b"payload")
    cache.close()
    cache.close()
    assert cache.get(KEY) is None
    cache.put(OTHER, b"x")
    assert cache.entries() == [] and cache.locks() == [] and cache.prune(max_bytes=0) == 0
    assert cache.get_or_compile(OTHER, lambda: (b"compiled", {})).payload == b"compiled"
    assert cache.stats.errors >= 3
    assert CompileCache(root=tmp_path).get(KEY).payload == b"payload"


def test_the_cache_operates_only_on_places(tmp_path, monkeypatch):
    """No file primitive of the store is handed a path: each gets a name in an open directory."""
    seen = []
    for name in ("open_trusted", "read_trusted", "atomic_write", "make_dir", "remove", "move", "lstat_at"):
        real = getattr(cache_module, name)

        def spy(where, *args, _real=real, _name=name, **kwargs):
            seen.append((_name, type(where)))
            return _real(where, *args, **kwargs)

        monkeypatch.setattr(cache_module, name, spy)
    cache = CompileCache(root=tmp_path / "cache")  # the root itself is made by path, before it is checked
    seen.clear()
    every_operation(cache)
    assert seen and {kind for _, kind in seen} == {Place}, seen


def test_a_full_disk_leaves_no_temporary_and_the_error_says_so(tmp_path, monkeypatch):
    cache = CompileCache(root=tmp_path)
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, fd, *args, **kwargs):
            self.file = real_fdopen(fd, *args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    import neuron_dynamo.cache_files as files

    monkeypatch.setattr(files.os, "fdopen", lambda fd, mode="r", *a, **k: Full(fd, mode, *a, **k)
                        if "w" in mode else real_fdopen(fd, mode, *a, **k))
    cache.put(KEY, b"payload")
    monkeypatch.undo()
    assert cache.stats.errors == 1 and not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_a_read_only_cache_that_did_not_exist_opens_it_once_it_does_with_the_same_checks(tmp_path):
    root = tmp_path / "shared"
    early = CompileCache(root=root, mode="readonly")  # as the backend keeps one per directory for the process
    assert early.get(KEY) is None and not root.exists()
    CompileCache(root=root).put(KEY, b"payload")
    assert early.get(KEY).payload == b"payload"
    late = tmp_path / "late"
    refused = CompileCache(root=late, mode="readonly")
    late.mkdir(mode=0o700)
    (late / "v1").symlink_to(root / "v1", target_is_directory=True)
    assert refused.get(KEY) is None and refused.stats.errors == 1  # the link is refused, as at first
