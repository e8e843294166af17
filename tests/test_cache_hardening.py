"""The cache's own faults and its directories (issue 29): parents made and checked, a full disk in the lock, a warm
that stored nothing, workers outliving a killed `warm`, a read-only entry that fails at run time, and options."""

import errno
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch

import neuron_dynamo
import neuron_dynamo.cache as cache_module
from neuron_dynamo import counters
from neuron_dynamo.cache import CompileCache, make_key
from neuron_dynamo.cache_files import CacheError
from neuron_dynamo.cli import main
from neuron_dynamo.options import OptionError, resolve_options


def test_missing_parents_are_made_0700_whatever_the_umask(tmp_path):
    root = tmp_path / "a" / "b" / "cache"
    old = os.umask(0)
    try:
        CompileCache(root=root)
    finally:
        os.umask(old)
    for path in (tmp_path / "a", tmp_path / "a" / "b", root):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


def test_a_parent_others_may_write_is_refused_and_a_sticky_one_is_not(tmp_path):
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o775)  # a group-writable team directory: a member could swap the tree after the checks
    with pytest.raises(CacheError, match="writable by group or others"):
        CompileCache(root=team / "cache")
    team.chmod(0o1777)  # sticky, as /tmp: no one may rename what is not theirs
    CompileCache(root=team / "cache")


def test_a_full_disk_while_writing_the_lock_holder_costs_the_record_only(tmp_path, monkeypatch):
    cache = CompileCache(root=tmp_path / "cache")
    real_write = os.write

    def full(fd, data):
        if b'"pid"' in bytes(data):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(cache_module.os, "write", full)
    entry = cache.get_or_compile(make_key({"k": 1}), lambda: (b"payload", {}))
    assert entry.payload == b"payload" and cache.stats.errors == 1
    assert cache.get(make_key({"k": 1})).payload == b"payload"  # stored all the same


FACTORY = textwrap.dedent("""
    import multiprocessing, os, time, torch

    def linear():
        return torch.nn.Linear(4, 2), lambda batch, seq: (torch.randn(batch, seq, 4),)

    def slow():
        def make_inputs(batch, seq):
            if multiprocessing.current_process().name != "MainProcess":  # a worker: busy for long
                with open(os.environ["WARM_PIDS"], "a") as f:
                    f.write(f"{os.getpid()}\\n")
                time.sleep(120)
            return (torch.randn(batch, seq, 4),)
        return torch.nn.Linear(4, 2), make_inputs
""")


@pytest.mark.parametrize("failure", [errno.ENOSPC, errno.EROFS])
def test_a_warm_that_could_not_store_exits_non_zero_with_the_count(tmp_path, cache_dir, monkeypatch, capsys,
                                                                   failure):
    """A full disk, or a file system mounted read-only: the shapes run, nothing is stored, and warm says so."""
    (tmp_path / "warm_models.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    def full_disk(*args, **kwargs):
        raise OSError(failure, os.strerror(failure))

    monkeypatch.setattr(cache_module, "atomic_write", full_disk)
    status = main(["warm", "warm_models:linear", "--seq-lens", "8", "--dynamic", "false", "-o", "target=reference",
                   "--summary", str(tmp_path / "summary.json")])
    out = capsys.readouterr().out
    assert status == 1 and "1 compiled program(s) were not stored" in out


def test_workers_die_with_a_killed_warm(tmp_path, cache_dir):
    (tmp_path / "warm_models.py").write_text(FACTORY)
    pids = tmp_path / "pids"
    env = {**os.environ, "WARM_PIDS": str(pids), "PYTHONPATH": os.pathsep.join(
        filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    parent = subprocess.Popen(
        [sys.executable, "-m", "neuron_dynamo.cli", "warm", "warm_models:slow", "--seq-lens", "8,16",
         "--dynamic", "false", "--workers", "2", "-o", "target=reference"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(workers) < 2:
            time.sleep(0.5)
            workers = {int(line) for line in pids.read_text().split()} - {parent.pid} if pids.exists() else set()
        assert len(workers) == 2, "the workers did not start"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in workers), "a worker outlived its warm"
    finally:
        for pid in (parent.pid, *workers):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has died
    except FileNotFoundError:
        return False


def test_a_read_only_entry_that_fails_at_run_time_is_set_aside_not_run_again(cache_dir, monkeypatch, caplog):
    fn = lambda x: torch.softmax(x @ x.T, -1)  # noqa: E731
    x = torch.randn(8, 8)
    torch.compile(fn, backend="neuron_dynamo")(x)  # stored
    (entry,) = cache_dir.glob("v1/entries/*/*.entry")
    torch._dynamo.reset()
    counters.reset_stats()
    from neuron_dynamo.toolchain import simulator

    real, failed = simulator.simulate, []

    def fails_once(*args, **kwargs):
        if not failed:
            failed.append(True)
            raise RuntimeError("the loaded program fails at run time")
        return real(*args, **kwargs)

    monkeypatch.setattr(simulator, "simulate", fails_once)
    compiled = torch.compile(fn, backend="neuron_dynamo", options={"cache": "readonly"})
    with caplog.at_level(logging.WARNING, logger="neuron_dynamo"):
        torch.testing.assert_close(compiled(x), fn(x))
        torch.testing.assert_close(compiled(x), fn(x))
    stats = neuron_dynamo.stats()
    assert stats["cache.hits"] == 1 and stats["cache.runtime_failures"] == 1  # loaded once, never again
    assert entry.exists() and "moved to quarantine" not in caplog.text and "stays in place" in caplog.text


def test_cache_dir_options_nul_bytes_paths_and_misspelt_variables(tmp_path):
    with pytest.raises(OptionError, match="NUL byte"):
        resolve_options({"cache_dir": "/tmp/a\0b"})
    with pytest.raises(Exception, match="NUL byte"):  # an option error, before anything is traced
        torch.compile(lambda t: t + 1, backend="neuron", options={"cache_dir": "/tmp/a\0b"})(torch.ones(2))
    assert resolve_options({"cache_dir": Path(tmp_path)}).cache_dir == str(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resolve_options(environ={"NEURON_DYNAMO_CACHE_DRI": "/x", "NEURON_DYNAMO_LOG": "info"})
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "did you mean NEURON_DYNAMO_CACHE_DIR" in messages[0]
