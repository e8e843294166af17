"""The on-disk store: atomic entries, corruption as a miss, one compile per key across processes, LRU, failures."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuron_dynamo.cache import CachedCompileFailure, CacheError, CompileCache, make_key

KEY = make_key({"graph": "mm(x, w)", "shape": [4, 8]})


def compile_payload(payload=b"kernel bytes"):
    return lambda: (payload, {"kind": "test"})


def test_round_trip_and_hit_counts(tmp_path):
    cache = CompileCache(root=tmp_path)
    entry = cache.get_or_compile(KEY, compile_payload())
    assert entry.payload == b"kernel bytes" and entry.meta["kind"] == "test"
    again = cache.get_or_compile(KEY, lambda: pytest.fail("a hit must not compile"))
    assert again.payload == b"kernel bytes"
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)
    assert cache.stats.seconds_saved >= 0.0
    fresh = CompileCache(root=tmp_path)  # another process sees the same entry
    assert fresh.get(KEY).payload == b"kernel bytes"


def test_key_is_independent_of_order():
    # Stability across PYTHONHASHSEED is tested end to end, in fresh processes, in test_cache_program.py.
    assert make_key({"b": [1, 2], "a": {"y": 1, "x": 2}}) == make_key({"a": {"x": 2, "y": 1}, "b": [1, 2]})
    assert make_key({"shape": [4, 8]}) != make_key({"shape": [4, 9]})


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_corrupt_entry_is_a_quarantined_miss_and_recovers(tmp_path, damage):
    cache = CompileCache(root=tmp_path)
    cache.put(KEY, b"x" * 1000, {})
    path = next(tmp_path.glob("v1/entries/*/*.entry"))
    raw = path.read_bytes()
    path.write_bytes({"truncate": raw[:-10], "flip": raw[:-1] + b"y", "garbage": b"\x00" * 7}[damage])
    entry = cache.get_or_compile(KEY, compile_payload(b"recompiled"))
    assert entry.payload == b"recompiled"
    assert cache.stats.corrupt == 1 and cache.stats.misses == 1
    assert len(list(tmp_path.glob("v1/quarantine/*.entry"))) == 1
    assert CompileCache(root=tmp_path).get(KEY).payload == b"recompiled"


def test_verify_finds_corrupt_entries(tmp_path):
    cache = CompileCache(root=tmp_path)
    good, bad = make_key({"n": 1}), make_key({"n": 2})
    cache.put(good, b"good", {})
    cache.put(bad, b"bad", {})
    path = next(tmp_path.glob(f"v1/entries/*/{bad}.entry"))
    path.write_bytes(path.read_bytes()[:-1])
    assert cache.verify() == [bad]
    assert [info.key for info in cache.entries()] == [good]


def test_no_temp_files_left_behind(tmp_path):
    cache = CompileCache(root=tmp_path)
    for n in range(5):
        cache.put(make_key({"n": n}), b"p" * 100, {})
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_lru_eviction_keeps_the_size_cap(tmp_path):
    keys = [make_key({"n": n}) for n in range(6)]
    cache = CompileCache(root=tmp_path)
    for n, key in enumerate(keys[:3]):
        cache.put(key, bytes(1000), {})
        os.utime(next(tmp_path.glob(f"v1/entries/*/{key}.entry")), (1000.0 + n, 1000.0 + n))
    cache.get(keys[0])  # now the most recently used
    capped = CompileCache(root=tmp_path, max_bytes=4 * 1300)
    for key in keys[3:]:
        capped.put(key, bytes(1000), {})
    remaining = {info.key for info in capped.entries()}
    assert sum(info.size for info in capped.entries()) <= 4 * 1300
    assert keys[0] in remaining and keys[1] not in remaining and keys[2] not in remaining
    assert capped.stats.evicted == 2


def test_prune_older_than(tmp_path):
    cache = CompileCache(root=tmp_path)
    old, new = make_key({"age": "old"}), make_key({"age": "new"})
    cache.put(old, b"o", {})
    cache.put(new, b"n", {})
    os.utime(next(tmp_path.glob(f"v1/entries/*/{old}.entry")), (time.time() - 7200,) * 2)
    assert cache.prune(older_than=3600) == 1
    assert [info.key for info in cache.entries()] == [new]


def test_failures_are_cached_with_ttl_and_retry(tmp_path):
    cache = CompileCache(root=tmp_path, failure_ttl=60)

    def broken():
        raise RuntimeError("neuronx-cc exited with 70")

    with pytest.raises(RuntimeError):
        cache.get_or_compile(KEY, broken)
    with pytest.raises(CachedCompileFailure, match="neuronx-cc exited with 70.*retry_failed"):
        cache.get_or_compile(KEY, compile_payload())
    assert cache.get_or_compile(KEY, compile_payload(), retry_failed=True).payload == b"kernel bytes"
    expired = CompileCache(root=tmp_path / "other", failure_ttl=1e-6)
    with pytest.raises(RuntimeError):
        expired.get_or_compile(KEY, broken)
    time.sleep(0.01)
    assert expired.get_or_compile(KEY, compile_payload()).payload == b"kernel bytes"


def test_readonly_and_off_modes_never_write(tmp_path):
    CompileCache(root=tmp_path).put(KEY, b"shared", {})
    readonly = CompileCache(root=tmp_path, mode="readonly")
    assert readonly.get_or_compile(KEY, lambda: pytest.fail("hit expected")).payload == b"shared"
    other = make_key({"other": 1})
    readonly.get_or_compile(other, compile_payload())
    assert readonly.get(other) is None and readonly.stats.misses == 1
    off = CompileCache(root=tmp_path / "never", mode="off")
    off.get_or_compile(KEY, compile_payload())
    assert off.stats.bypasses == 1 and not (tmp_path / "never").exists()
    missing = CompileCache(root=tmp_path / "not yet shared", mode="readonly")
    assert missing.get_or_compile(KEY, compile_payload()).payload == b"kernel bytes"
    assert missing.entries() == [] and not (tmp_path / "not yet shared").exists()


def test_directory_is_private_and_world_writable_is_refused(tmp_path):
    CompileCache(root=tmp_path / "private")
    assert (tmp_path / "private" / "v1").stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(CacheError, match="writable by group or others.*chmod go-w"):
        CompileCache(root=shared)


def test_bad_mode_and_key_are_clear_errors(tmp_path):
    with pytest.raises(CacheError, match="'on', 'off' or 'readonly'"):
        CompileCache(root=tmp_path, mode="sometimes")
    with pytest.raises(CacheError, match="make_key"):
        CompileCache(root=tmp_path).get("../../etc/passwd")


# Four processes compiling one key: tested end to end (compile_static) in test_cache_program.py.


def test_lock_of_a_dead_holder_is_released(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys, time; from neuron_dynamo.cache import CompileCache\n"
            "c = CompileCache(root=sys.argv[1])\n"
            "c.get_or_compile(sys.argv[2], lambda: (print('locked', flush=True), time.sleep(60), (b'', {}))[2])",
            str(tmp_path), KEY,
        ],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    cache = CompileCache(root=tmp_path, lock_timeout=30)
    assert [lock["pid"] for lock in cache.locks()] == [holder.pid]
    holder.kill()
    holder.wait()
    assert cache.get_or_compile(KEY, compile_payload()).payload == b"kernel bytes"
    assert cache.locks() == []


def test_clear_locks(tmp_path):
    cache = CompileCache(root=tmp_path)
    lock = tmp_path / "v1" / "locks" / f"{KEY}.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "since": 0}))
    assert cache.clear_locks() == 1 and not Path(lock).exists()
