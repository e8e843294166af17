"""Entries are authenticated: a reader serves only entries tagged (HMAC-SHA256) with its own key or a key it lists.

The attacker of these tests can write the cache and recompute every checksum, but does not hold a trusted key. Each
planted entry must be a miss, quarantined and counted, with nothing of it decoded. Every test has a private key
(conftest.py points XDG_CONFIG_HOME at a fresh directory).
"""

import hashlib
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import neuron_dynamo.cache as cache_module
import neuron_dynamo.program_cache as program_cache
from neuron_dynamo import counters
from neuron_dynamo.cache import MAGIC, CacheError, CompileCache, encode_entry, make_key
from neuron_dynamo.cache_auth import CacheKeyError, Keyring, default_key_path, key_id, load_keyring, user_key
from neuron_dynamo.cli import main
from neuron_dynamo.options import resolve_options

KEY = make_key({"auth": 1})
NOBODY = 65534
REPO = Path(__file__).resolve().parent.parent


def stranger_keyring():
    """The keys of someone the reader does not trust."""
    key = secrets.token_bytes(32)
    return Keyring(keys={key_id(key): key}, own=key_id(key))


def header_for(payload, key=KEY):
    return {"key": key, "sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload), "created": 1.0,
            "meta": {}}


@pytest.fixture
def decoded(monkeypatch):
    """The calls of the header decoder: none may happen for an entry that does not authenticate."""
    calls = []
    real = cache_module._split
    monkeypatch.setattr(cache_module, "_split", lambda body: calls.append(body) or real(body))
    return calls


def use_config(monkeypatch, path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(path))
    return path / "neuron_dynamo" / "cache-key"


# ------------------------------------------------------------------------------------------------ the format
def test_a_round_trip_hits_and_the_entry_names_its_signer_not_the_key(tmp_path):
    cache = CompileCache(root=tmp_path)
    cache.put(KEY, b"payload", {"a": 1})
    assert cache.get(KEY).payload == b"payload"
    assert cache.get_or_compile(KEY, lambda: pytest.fail("hit expected")).meta == {"a": 1}
    raw = cache._entry_path(KEY).read_bytes()
    _, own, _ = user_key()
    assert raw.startswith(MAGIC + key_id(own).encode()) and MAGIC == b"NDCACHE2"
    assert own not in raw and own.hex().encode() not in raw
    assert cache.stats.corrupt == cache.stats.unauthenticated == 0
    assert not any(tmp_path.rglob("cache-key"))  # the key never lives in the cache


def test_a_forged_tag_with_a_valid_checksum_is_a_quarantined_miss_never_decoded(tmp_path, decoded):
    cache = CompileCache(root=tmp_path)
    cache.put(KEY, b"genuine")
    path = cache._entry_path(KEY)
    genuine = path.read_bytes()
    header = json.dumps(header_for(b"planted"), sort_keys=True).encode()
    body = len(header).to_bytes(8, "big") + header + b"planted"
    signed = len(MAGIC) + 16
    path.write_bytes(genuine[:signed] + genuine[signed:signed + 32] + body)  # the genuine tag, a new body
    decoded.clear()
    assert cache.get(KEY) is None and not decoded
    assert cache.stats.unauthenticated == 1 and cache.stats.corrupt == 1
    assert not path.exists() and len(list((tmp_path / "v1" / "quarantine").iterdir())) == 1
    assert cache.get_or_compile(KEY, lambda: (b"recompiled", {})).payload == b"recompiled"
    assert CompileCache(root=tmp_path).get(KEY).payload == b"recompiled"


def test_an_entry_tagged_by_another_key_is_a_quarantined_miss(tmp_path, decoded, caplog):
    cache = CompileCache(root=tmp_path)
    path = cache._entry_path(KEY)
    path.parent.mkdir(mode=0o700, parents=True)
    stranger = stranger_keyring()
    path.write_bytes(encode_entry(header_for(b"planted"), b"planted", stranger))
    assert cache.get(KEY) is None and not decoded
    assert cache.stats.unauthenticated == 1 and cache.stats.corrupt == 1 and not path.exists()
    assert f"signed by key '{stranger.own}', which is neither yours nor listed in cache_trusted_keys" in caplog.text


def test_old_format_entries_are_misses(tmp_path, decoded):
    cache = CompileCache(root=tmp_path)
    path = cache._entry_path(KEY)
    path.parent.mkdir(mode=0o700, parents=True)
    header = json.dumps(header_for(b"old")).encode()
    path.write_bytes(b"NDCACHE1" + len(header).to_bytes(8, "big") + header + b"old")
    assert cache.get(KEY) is None and not decoded
    assert cache.stats.unauthenticated == 1 and not path.exists()


def test_a_planted_program_is_never_decoded_and_the_model_is_right(cache_dir, monkeypatch):
    def model(x):
        return torch.relu(x @ x.T) * 2

    x = torch.randn(5, 5)
    torch._dynamo.reset()
    torch.compile(model, backend="neuron")(x)
    (entry,) = cache_dir.glob("v1/entries/*/*.entry")
    header, payload = cache_module._split(cache_module._unseal(entry.read_bytes(), load_keyring()))
    planted = json.dumps({**json.loads(payload), "planted": True}).encode()
    header.update(sha256=hashlib.sha256(planted).hexdigest(), size=len(planted))  # a valid checksum, a stranger's tag
    entry.write_bytes(encode_entry(header, planted, stranger_keyring()))
    loads = []
    real = program_cache.decode_program
    monkeypatch.setattr(program_cache, "decode_program", lambda *args: loads.append(args) or real(*args))
    counters.reset_stats()
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(model, backend="neuron")(x), model(x))
    stats = counters.stats()
    assert loads and not any(args[0] == planted for args in loads)  # only the recompiled program's read-back
    assert stats["cache.unauthenticated"] == 1 and stats["cache.corrupt"] == 1
    assert stats["cache.misses"] == 1 and not stats.get("cache.hits")


# ------------------------------------------------------------------------------------------------ the key file
def test_the_key_file_is_0600_in_0700_parents_whatever_the_umask(tmp_path, monkeypatch):
    key_path = use_config(monkeypatch, tmp_path / "a" / "config")
    old = os.umask(0)
    try:
        path, key, created = user_key()
    finally:
        os.umask(old)
    assert path == key_path == default_key_path() and created and len(key) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for directory in (tmp_path / "a", tmp_path / "a" / "config", path.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert user_key() == (path, key, False)  # made once, then read
    assert [p.name for p in path.parent.iterdir()] == ["cache-key"]  # no temporary file left


def test_without_xdg_config_home_the_key_is_under_dot_config(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_key_path() == tmp_path / ".config" / "neuron_dynamo" / "cache-key"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_key_file_open_to_group_or_others_is_refused(tmp_path, mode):
    path, _, _ = user_key()
    os.chmod(path, mode)
    with pytest.raises(CacheError, match=rf"open to group or others \(mode {mode:04o}\).*chmod 600"):
        CompileCache(root=tmp_path)
    cache = CompileCache(root=tmp_path, strict=False)  # the backend's choice: uncached, with the reason
    assert not cache.active and "chmod 600" in cache.unusable
    cache.put(KEY, b"p")
    assert cache.get(KEY) is None and not list(tmp_path.rglob("*.entry"))


def test_a_symlinked_key_file_is_refused(tmp_path):
    path, _, _ = user_key()
    real = path.with_name("real-key")
    path.rename(real)
    path.symlink_to(real)
    with pytest.raises(CacheError, match="is a symbolic link.*Replace the link by a copy"):
        CompileCache(root=tmp_path)
    with pytest.raises(CacheKeyError):
        user_key()


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another user needs root (chown)")
def test_a_key_file_of_another_user_is_refused(tmp_path):
    path, _, _ = user_key()
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(CacheError, match="belongs to uid 65534, not to you.*install -m 600"):
        CompileCache(root=tmp_path)


def test_a_damaged_key_file_names_the_fix(tmp_path):
    path, _, _ = user_key()
    path.write_text("not a key\n")
    with pytest.raises(CacheError, match="64 hex digits.*delete it"):
        CompileCache(root=tmp_path)


def test_a_key_file_inside_the_cache_directory_is_refused(tmp_path, monkeypatch):
    use_config(monkeypatch, tmp_path / "cache" / "config")
    with pytest.raises(CacheError, match="lies inside the cache directory"):
        CompileCache(root=tmp_path / "cache")


def test_a_lost_key_makes_every_entry_miss_and_compile_again(tmp_path):
    CompileCache(root=tmp_path).put(KEY, b"old")
    default_key_path().unlink()
    cache = CompileCache(root=tmp_path)  # a new key
    assert cache.get_or_compile(KEY, lambda: (b"new", {})).payload == b"new"
    assert cache.stats.unauthenticated == 1 and cache.stats.misses == 1


# --------------------------------------------------------------------------------------- shared read-only caches
def test_a_readonly_cache_verifies_for_another_reader_only_through_a_listed_key(tmp_path, monkeypatch):
    use_config(monkeypatch, tmp_path / "writer")
    root = tmp_path / "shared"
    CompileCache(root=root).put(KEY, b"team payload")
    writer_key = default_key_path()
    use_config(monkeypatch, tmp_path / "reader")
    copy = tmp_path / "reader-copy.key"
    shutil.copy(writer_key, copy)
    os.chmod(copy, 0o600)

    stranger = CompileCache(root=root, mode="readonly")
    assert stranger.get(KEY) is None and stranger.stats.unauthenticated == 1
    assert (root / "v1" / "entries").rglob("*.entry")  # and moves nothing: the entry is still there
    trusting = CompileCache(root=root, mode="readonly", trusted_keys=(str(copy),))
    assert trusting.get(KEY).payload == b"team payload" and trusting.stats.unauthenticated == 0


def test_the_option_reaches_the_store(tmp_path, monkeypatch):
    _, other, _ = user_key()
    copy = tmp_path / "ci.key"
    shutil.copy(default_key_path(), copy)
    os.chmod(copy, 0o600)
    use_config(monkeypatch, tmp_path / "mine")
    monkeypatch.setenv("NEURON_DYNAMO_CACHE_TRUSTED_KEYS", f"{copy}, ")
    options = resolve_options({"cache_dir": str(tmp_path / "cache")})
    assert options.cache_trusted_keys == (str(copy),)
    assert key_id(other) in program_cache.cache_for(options).keys.keys
    with pytest.raises(CacheError, match="does not exist"):
        CompileCache(root=tmp_path / "c2", trusted_keys=(str(tmp_path / "missing.key"),))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="a second real user needs root and setpriv")
def test_two_real_users_share_a_readonly_cache_through_a_listed_key():
    tmp_path = Path(tempfile.mkdtemp(prefix="neuron_dynamo_auth_", dir="/tmp"))  # pytest's is closed to others
    try:
        _two_users(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _two_users(tmp_path):
    root = tmp_path / "shared"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    CompileCache(root=root).put(KEY, b"team payload")  # written by root, with root's key
    home = tmp_path / "nobody"
    home.mkdir(mode=0o700)
    copy = home / "ci.key"
    shutil.copy(default_key_path(), copy)
    os.chmod(copy, 0o600)
    for path in (home, copy):
        os.chown(path, NOBODY, NOBODY)
    os.chmod(tmp_path, 0o755)
    code = ("import sys\nfrom neuron_dynamo.cache import CompileCache\n"
            f"c = CompileCache(root={str(root)!r}, mode='readonly', trusted_keys=tuple(sys.argv[1:]))\n"
            f"e = c.get({KEY!r})\nprint(e.payload.decode() if e else 'miss', c.stats.unauthenticated)\n")

    def read_as_nobody(*trusted):
        env = {**os.environ, "XDG_CONFIG_HOME": str(home / "config"), "HOME": str(home),
               "PYTHONPATH": str(REPO)}
        return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                               sys.executable, "-c", code, *trusted], env=env, cwd=home, capture_output=True,
                              text=True, check=True).stdout.split()

    assert read_as_nobody() == ["miss", "1"]
    assert read_as_nobody(str(copy)) == ["team", "payload", "0"]


# ------------------------------------------------------------------------------------------------ the commands
def test_verify_reports_unauthenticated_entries_and_ls_leaves_them_out(cache_dir, capsys):
    cache = CompileCache(root=cache_dir)
    cache.put(KEY, b"mine", {"target": "reference"})
    other = make_key({"auth": 2})
    cache._entry_path(other).parent.mkdir(mode=0o700, exist_ok=True)
    cache._entry_path(other).write_bytes(encode_entry(header_for(b"x", other), b"x", stranger_keyring()))
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert KEY[:16] in out and other[:16] not in out and "1 entries" in out
    assert "1 entry file(s) not shown: they do not verify" in out
    assert main(["ls", "--json"]) == 0
    assert [e["key"] for e in json.loads(capsys.readouterr().out)] == [KEY]
    assert main(["verify"]) == 1
    out = capsys.readouterr().out
    assert f"corrupt: {other} (moved to quarantine)" in out and "verified 2 entries: 1 corrupt" in out
    assert main(["verify"]) == 0


def test_prune_weighs_every_entry_file_without_reading_it(tmp_path, decoded):
    cache = CompileCache(root=tmp_path)
    cache.put(KEY, b"x" * 100)
    other = make_key({"auth": 3})
    cache._entry_path(other).parent.mkdir(mode=0o700, exist_ok=True)
    cache._entry_path(other).write_bytes(encode_entry(header_for(b"y" * 100, other), b"y" * 100, stranger_keyring()))
    decoded.clear()
    assert cache.prune(max_bytes=0) == 2 and not decoded


def test_the_key_command_prints_the_key_id(capsys, tmp_path, monkeypatch):
    assert main(["key"]) == 0
    out = capsys.readouterr().out
    path, own, _ = user_key(create=False)
    assert f"key file: {path} (created now, mode 0600)" in out and f"key id:   {key_id(own)}" in out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    copy = tmp_path / "ci.key"
    shutil.copy(path, copy)
    monkeypatch.setenv("NEURON_DYNAMO_CACHE_TRUSTED_KEYS", str(copy))
    assert main(["key", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == {"path": str(path), "key_id": key_id(own), "created": False,
                      "trusted": [{"path": str(copy), "key_id": key_id(own)}]}
    os.chmod(copy, 0o644)
    assert main(["key"]) == 2
    assert "chmod 600" in capsys.readouterr().err
