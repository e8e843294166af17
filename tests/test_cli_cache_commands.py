"""`neuron-precompile ls | verify | prune | clear-locks`: a missing cache is reported, never created; `verify` counts
each entry once."""

import json
import subprocess
import sys

import pytest

from neuron_dynamo.cache import CompileCache, make_key
from neuron_dynamo.cli import main


@pytest.mark.parametrize(
    ("argv", "what"),
    [(["ls"], "nothing to list"), (["verify"], "nothing to verify"),
     (["prune", "--max-size", "1G"], "nothing to prune"), (["clear-locks"], "nothing to clear")],
)
def test_a_missing_cache_is_reported_and_not_created(tmp_path, capsys, argv, what):
    missing = tmp_path / "no" / "cache"
    assert main(["--cache-dir", str(missing), *argv]) == 0
    out = capsys.readouterr().out
    assert f"no compile cache at {missing} (missing): {what}" in out
    assert not missing.exists() and not (tmp_path / "no").exists()


def test_a_missing_cache_from_the_environment_is_not_created(cache_dir, capsys):
    assert main(["ls"]) == 0
    assert "no compile cache" in capsys.readouterr().out
    assert not cache_dir.exists()


def test_ls_json_of_a_missing_cache_is_an_empty_list(cache_dir, capsys):
    assert main(["ls", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == [] and "no compile cache" in captured.err
    assert not cache_dir.exists()


def test_prune_still_needs_a_limit_on_a_missing_cache(cache_dir, capsys):
    assert main(["prune"]) == 2
    assert "--max-size" in capsys.readouterr().err
    assert not cache_dir.exists()


def test_a_file_as_the_cache_directory_is_an_error(tmp_path, capsys):
    not_a_dir = tmp_path / "cache"
    not_a_dir.write_text("")
    assert main(["--cache-dir", str(not_a_dir), "ls"]) == 2
    assert "is a file" in capsys.readouterr().err


def test_ls_of_an_existing_empty_cache_creates_nothing_in_it(tmp_path, capsys):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    assert main(["--cache-dir", str(root), "ls"]) == 0
    assert "0 entries" in capsys.readouterr().out
    assert list(root.iterdir()) == []


def _three_entries(cache_dir):
    cache = CompileCache(root=cache_dir)
    keys = [make_key({"n": n}) for n in range(3)]
    for key in keys:
        cache.put(key, bytes(100), {"target": "reference"})
    return keys


@pytest.mark.parametrize("damage", ["payload", "header"])
def test_verify_counts_a_corrupt_entry_once(cache_dir, capsys, damage):
    keys = _three_entries(cache_dir)
    assert main(["verify"]) == 0
    assert "verified 3 entries: 0 corrupt" in capsys.readouterr().out
    path = next(cache_dir.glob(f"v1/entries/*/{keys[1]}.entry"))
    raw = path.read_bytes()
    # payload: the header still reads (ls lists it), only the hash tells; header: not even ls lists it
    path.write_bytes(raw[:-5] if damage == "payload" else raw[:12])
    assert main(["verify"]) == 1
    out = capsys.readouterr().out
    assert f"corrupt: {keys[1]}" in out
    assert "verified 3 entries: 1 corrupt" in out
    assert main(["verify"]) == 0  # quarantined: what is left is healthy
    assert "verified 2 entries: 0 corrupt" in capsys.readouterr().out


def test_maintenance_commands_still_work_on_an_existing_cache(cache_dir, capsys):
    keys = _three_entries(cache_dir)
    assert main(["ls"]) == 0
    assert "3 entries" in capsys.readouterr().out
    assert main(["prune", "--max-size", "0"]) == 0
    assert "evicted 3 entries; 0 left" in capsys.readouterr().out
    assert not CompileCache(root=cache_dir).entries() and keys
    assert main(["clear-locks"]) == 0
    assert "removed 0 lock(s)" in capsys.readouterr().out


def test_cache_commands_start_without_importing_torch(tmp_path):
    """`ls`, `verify`, `prune` and the cache module itself need no torch: they answer in a fraction of a second."""
    script = ("import sys; from neuron_dynamo.cli import main; from neuron_dynamo.cache import CompileCache; "
              f"main(['--cache-dir', {str(tmp_path)!r}, 'verify']); "
              "assert 'torch' not in sys.modules, 'torch was imported'")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
