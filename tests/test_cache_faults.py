"""Fault injection: whatever happens to the cache, the model's answer is eager's, nothing is torn, nothing hangs.

Disk full (ENOSPC), read-only media (EROFS) and unreadable entries (EACCES) are injected as the `OSError`s the
system calls raise; FIFOs, directories and malformed but checksum-valid entries are planted for real; lock holders
are real processes that are stopped, killed, or that die leaving the lock to a child; eviction races and `kill -9`
run real concurrent writer processes.
"""

import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import neuron_dynamo.cache as cache_module
from neuron_dynamo import counters
from neuron_dynamo.cache import CachedCompileFailure, CompileCache, encode_entry, make_key
from neuron_dynamo.cache_auth import load_keyring

KEY = make_key({"faults": 1})


def model(x):
    return torch.nn.functional.gelu(x @ x.T) * 0.5 + x.sum()


def check_model(x=None):
    """Compile and run `model` as a user does; its answer must be eager's."""
    x = torch.randn(6, 6) if x is None else x
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(model, backend="neuron")(x), model(x))


def cache_counters():
    return {k: v for k, v in counters.stats().items() if k.startswith("cache.")}


@contextlib.contextmanager
def no_hang(seconds=60):
    def expire(*_):
        raise TimeoutError(f"hung for {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def failing(real, suffix, code):
    """`real` (an open/write function of the store) failing with `code` for paths ending in `suffix`."""

    def wrapper(path, *args, **kwargs):
        if str(path).endswith(suffix):
            raise OSError(code, os.strerror(code), str(path))
        return real(path, *args, **kwargs)

    return wrapper


# ------------------------------------------------------------------------------------- unusable disks and files
def test_disk_full_runs_the_model_uncached_and_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(cache_module, "atomic_write", failing(cache_module.atomic_write, ".entry", errno.ENOSPC))
    counters.reset_stats()
    with caplog.at_level("WARNING", logger="neuron_dynamo.cache"):
        check_model()
        check_model(torch.randn(7, 7))
    assert cache_counters()["cache.errors"] == 2 and cache_counters()["cache.misses"] == 2
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1
    assert "No space left on device" in caplog.text


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.EISDIR])
def test_an_unusable_lock_compiles_without_it(monkeypatch, code):
    monkeypatch.setattr(cache_module, "open_trusted", failing(cache_module.open_trusted, ".lock", code))
    counters.reset_stats()
    check_model()
    assert cache_counters()["cache.errors"] == 1


@pytest.mark.parametrize("mode", ["on", "readonly"])
def test_entries_unreadable_to_this_user_are_misses(monkeypatch, mode):
    check_model()  # writes the entry
    monkeypatch.setattr(cache_module, "open_trusted", failing(cache_module.open_trusted, ".entry", errno.EACCES))
    monkeypatch.setenv("NEURON_DYNAMO_CACHE", mode)
    counters.reset_stats()
    check_model()
    assert cache_counters()["cache.errors"] >= 1 and cache_counters().get("cache.hits", 0) == 0


def test_a_read_only_directory_on_a_miss(monkeypatch):
    monkeypatch.setattr(cache_module, "make_dir", failing(cache_module.make_dir, "", errno.EROFS))
    counters.reset_stats()
    check_model()
    assert cache_counters()["cache.errors"] >= 1


def planted_entry(cache, key=KEY):
    return cache._entry_path(key)


def read_signed(path):
    """(header, payload) of an entry signed with this user's key (the tests' own, see conftest.py)."""
    return cache_module._split(cache_module._unseal(path.read_bytes(), load_keyring()))


def write_signed(path, header, payload):
    """What someone holding the user's key writes: these entries pass authentication, and must still be checked."""
    path.write_bytes(encode_entry(header, payload, load_keyring()))


def test_a_fifo_named_like_an_entry_hangs_nothing(tmp_path):
    cache = CompileCache(root=tmp_path)
    cache.put(KEY, b"payload")
    other = make_key({"fifo": 1})
    path = planted_entry(cache, other)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    os.mkfifo(path, 0o600)
    with no_hang(30):
        assert cache.get(other) is None
        assert [info.key for info in cache.entries()] == [KEY]
        cache.put(other, b"replaced")
        os.mkfifo(tmp_path / "v1" / "entries" / other[:2] / f"{make_key({'fifo': 2})}.entry", 0o600)
        assert len(cache.verify()) == 1
        cache.prune(max_bytes=10**6)
    assert cache.get(other).payload == b"replaced"


def test_a_fifo_entry_under_the_model(cache_dir):
    check_model()
    (entry,) = cache_dir.glob("v1/entries/*/*.entry")
    entry.unlink()
    os.mkfifo(entry, 0o600)
    counters.reset_stats()
    with no_hang(60):
        check_model()
    assert cache_counters()["cache.corrupt"] == 1


def test_directories_where_an_entry_or_a_lock_should_be(tmp_path):
    cache = CompileCache(root=tmp_path)
    planted_entry(cache).mkdir(parents=True)
    (tmp_path / "v1" / "locks" / f"{KEY}.lock").mkdir(parents=True)
    assert cache.get_or_compile(KEY, lambda: (b"payload", {})).payload == b"payload"
    assert cache.stats.corrupt == 1 and cache.stats.errors == 1  # the entry dir quarantined, the lock dir skipped
    assert CompileCache(root=tmp_path).get(KEY).payload == b"payload"


@pytest.mark.parametrize("field, value", [("size", "12"), ("meta", []), ("created", "yesterday"), ("key", 5),
                                          ("sha256", None), ("created", True)])
def test_malformed_but_checksum_valid_headers_are_quarantined(tmp_path, field, value):
    cache = CompileCache(root=tmp_path)
    cache.put(KEY, b"payload", {"a": 1})
    path = planted_entry(cache)
    header, payload = read_signed(path)
    write_signed(path, {**header, field: value}, payload)
    assert cache.get(KEY) is None and cache.stats.corrupt == 1
    assert cache.entries() == []


def test_failure_records_are_honoured_only_as_written(tmp_path):
    cache = CompileCache(root=tmp_path, failure_ttl=60)
    failures = tmp_path / "v1" / "failures"
    failures.mkdir(mode=0o700)
    planted = {"reason": "planted", "expires": time.time() + 3600}
    for record in (planted, {**planted, "key": make_key({"other": 1})}, {**planted, "key": KEY, "expires": "never"},
                   [1, 2]):
        (failures / f"{KEY}.json").write_text(json.dumps(record))
        assert cache.get_or_compile(make_key({"x": str(record)}), lambda: (b"p", {})).payload == b"p"
        assert cache.failure(KEY) is None

    def broken():
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError):
        cache.get_or_compile(KEY, broken)
    with pytest.raises(CachedCompileFailure, match="compiler crashed"):
        cache.get_or_compile(KEY, broken)
    # Callers that do not record failures (the program cache) never read them.
    assert cache.get_or_compile(KEY, lambda: (b"p", {}), record_failures=False).payload == b"p"


def test_an_entry_failing_at_run_time_is_quarantined_and_compiled_again(cache_dir):
    import base64

    check_model()
    (entry,) = cache_dir.glob("v1/entries/*/*.entry")
    header, payload = read_signed(entry)
    document = json.loads(payload)
    (name, region), = document["regions"].items()
    rows = json.loads(base64.b64decode(region["artifact"])[1:])
    mm = next(row for row in rows if row[0] == "call_function" and row[2].get("kernel") == "aten.mm.default")
    mm[3] = {"tuple": [{"node": 0}, {"node": 0}, {"node": 0}]}  # decodes, fails when it runs
    region["artifact"] = base64.b64encode(bytes([2]) + json.dumps(rows).encode()).decode()
    payload = json.dumps(document).encode()
    import hashlib

    header.update(sha256=hashlib.sha256(payload).hexdigest(), size=len(payload))
    write_signed(entry, header, payload)
    counters.reset_stats()
    check_model()
    stats = cache_counters()
    assert stats["cache.hits"] == 1 and stats["cache.runtime_failures"] == 1 and stats["cache.misses"] == 1
    assert counters.stats().get("graphs_failed", 0) == 0  # recompiled, not run eagerly
    counters.reset_stats()
    check_model()
    assert cache_counters()["cache.hits"] == 1 and "cache.runtime_failures" not in cache_counters()


# ------------------------------------------------------------------------------------------------ lock holders
HOLDER = textwrap.dedent("""
    import os, sys, time
    from neuron_dynamo.cache import CompileCache
    cache = CompileCache(root=sys.argv[1])

    def compile_fn():
        if sys.argv[3] == "fork":  # die, leaving the locked descriptor to a child that sleeps
            child = os.fork()
            if child == 0:
                time.sleep(120)
                os._exit(0)
            print("locked", child, flush=True)
            os._exit(0)
        print("locked", os.getpid(), flush=True)
        time.sleep(120)
        return b"", {}

    cache.get_or_compile(sys.argv[2], compile_fn)
""")


def start_holder(tmp_path, how):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), KEY, how], stdout=subprocess.PIPE,
                              text=True)
    word, pid = holder.stdout.readline().split()
    assert word == "locked"
    return holder, int(pid)


def test_a_stopped_lock_holder_costs_at_most_the_lock_timeout(tmp_path):
    holder, pid = start_holder(tmp_path, "sleep")
    os.kill(pid, signal.SIGSTOP)
    try:
        cache = CompileCache(root=tmp_path, lock_timeout=1.0)
        start = time.monotonic()
        assert cache.get_or_compile(KEY, lambda: (b"payload", {})).payload == b"payload"
        assert time.monotonic() - start < 15
        assert cache.stats.lock_waits == 1 and cache.stats.lock_timeouts == 1
    finally:
        os.kill(pid, signal.SIGKILL)
        holder.wait()


def test_a_holder_that_died_leaving_the_lock_to_a_child_is_detected(tmp_path):
    holder, child = start_holder(tmp_path, "fork")
    holder.wait()
    try:
        cache = CompileCache(root=tmp_path, lock_timeout=120.0)
        start = time.monotonic()
        assert cache.get_or_compile(KEY, lambda: (b"payload", {})).payload == b"payload"
        assert time.monotonic() - start < 15 and cache.stats.lock_timeouts == 0
    finally:
        os.kill(child, signal.SIGKILL)


def test_the_lock_timeout_is_an_option(tmp_path, monkeypatch):
    from neuron_dynamo.options import resolve_options
    from neuron_dynamo.program_cache import cache_for

    assert resolve_options({}).cache_lock_timeout == 30
    monkeypatch.setenv("NEURON_DYNAMO_CACHE_LOCK_TIMEOUT", "2")
    assert cache_for(resolve_options({"cache_dir": str(tmp_path)})).lock_timeout == 2.0


# ------------------------------------------------------------------------------------- concurrent writers, kill -9
WRITER = textwrap.dedent("""
    import os, sys
    from neuron_dynamo.cache import CompileCache, make_key
    cache = CompileCache(root=sys.argv[1], max_bytes=int(sys.argv[3]))
    failures = 0
    for n in range(int(sys.argv[2])):
        key = make_key({"writer": os.getpid(), "n": n})
        try:
            cache.put(key, os.urandom(2000), {"n": n})
            cache.get(key)
            if n == 0:
                print("ready", flush=True)
        except Exception as exc:
            failures += 1
            print(type(exc).__name__, exc, file=sys.stderr)
    print(failures, cache.stats.errors, flush=True)
""")

WRITERS, PUTS = 4, 150


def test_concurrent_eviction_never_fails_a_put(tmp_path):
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(PUTS), "20000"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(WRITERS)]
    results = [writer.communicate(timeout=300) for writer in writers]
    for (out, err), writer in zip(results, writers, strict=True):
        assert writer.returncode == 0, err
        assert out.split()[-2] == "0", err  # no put() or get() raised
    cache = CompileCache(root=tmp_path)
    assert cache.verify() == []
    assert sum(info.size for info in cache.entries()) <= 20000 + 4 * 2500


KILLS = 10


def test_kill_minus_nine_tears_nothing(tmp_path, monkeypatch):
    rng = random.Random(0)
    for _ in range(KILLS):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "100000", "60000"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.3))  # somewhere in the middle of a put, a get or an eviction
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    cache = CompileCache(root=tmp_path)
    assert cache.entries() and cache.verify() == []
    monkeypatch.setattr(cache_module, "ORPHAN_SECONDS", 0.0)
    cache.prune()
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.glob("v1/quarantine/*"))


def test_prune_removes_quarantine_and_orphan_temporaries(tmp_path):
    cache = CompileCache(root=tmp_path)
    cache.put(KEY, b"payload")
    cache.discard(KEY, "test")
    orphan = planted_entry(cache).parent / f".{KEY}.entry.abc.tmp"
    orphan.write_bytes(b"half")
    os.utime(orphan, (time.time() - 7200,) * 2)
    fresh = planted_entry(cache).parent / f".{KEY}.entry.def.tmp"  # a live writer's: kept
    fresh.write_bytes(b"half")
    cache.prune()
    assert not list(tmp_path.glob("v1/quarantine/*")) and not orphan.exists() and fresh.exists()


# ---------------------------------------------------------------------------------- graphs with 0-dim constants
def _index_put(x):
    x = x.clone()
    x[:, 0] = 5.0
    return x


def _masked_assign(y):
    y = y.clone()
    y[y > 0] = 0.0
    return y


@pytest.mark.parametrize("fn", [
    _index_put, _masked_assign, lambda x: x * torch.tensor(0.5), lambda x: torch.where(x > 0, x, torch.tensor(-1.0)),
], ids=["index_put", "masked_assign", "mul_0dim", "where_0dim"])
def test_zero_dim_constants_run_with_the_cache_on(fn):
    x = torch.randn(4, 6)
    torch._dynamo.reset()
    for _ in range(2):  # a miss, then a hit
        torch.testing.assert_close(torch.compile(fn, backend="neuron")(x), fn(x))
