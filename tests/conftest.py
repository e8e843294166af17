import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _fresh_compile_state():
    """Every test compiles from scratch: Dynamo's code cache and the shared bucket programs would otherwise carry
    one test's compiled graphs into the next."""
    import torch._dynamo

    from neuron_dynamo.bucket_dispatch import forget_generalized_graphs

    torch._dynamo.reset()
    forget_generalized_graphs()


@pytest.fixture(autouse=True)
def _private_compile_cache(tmp_path_factory, monkeypatch):
    """Every test starts with an empty compile cache of its own (and never touches ~/.cache)."""
    monkeypatch.setenv("NEURON_DYNAMO_CACHE_DIR", str(tmp_path_factory.mktemp("neuron_dynamo_cache")))


@pytest.fixture
def pinned_sources(tmp_path, monkeypatch):
    """Subprocesses (and their workers) compute keys with a pinned source hash.

    The key includes a hash of the package sources (tested on its own); other code may be edited while a test's
    processes run one after the other, so the test pins that one fact, through a sitecustomize every process loads.
    """
    site = tmp_path / "pinned_site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import neuron_dynamo.cache_key as _key\n_key.source_hash = lambda: 'pinned-for-test'\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("NEURON_DYNAMO_CACHE_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def _private_cache_key(tmp_path_factory, monkeypatch):
    """Every test signs cache entries with a key of its own (never ~/.config): a config directory per test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))


def pytest_addoption(parser):
    parser.addoption("--fuzz-long", action="store_true", default=False,
                     help="tests/passes/test_padding_fuzz.py: many random examples (not derandomized), and a summary")


@torch.library.custom_op("neuron_tests::eager_only", mutates_args=())
def _eager_only(x: torch.Tensor) -> torch.Tensor:
    """An op no backend can lower, ever (`torch.ops.neuron_tests.eager_only`): the tests of fallback paths use it
    where any real op might gain a lowering one day. Computes 2·x + 1."""
    return x * 2 + 1


@_eager_only.register_fake
def _(x):
    return torch.empty_like(x)


# Longest files first: `make test` spreads whole files over two workers (`--dist loadfile`) in collection order, so
# a long file collected last runs alone at the end while the other worker idles. Order within a file is unchanged.
_LONG_FIRST = ("opinfo", "hf", "distributed", "test_", "passes", "lowering", "nki", "kernels", "toolchain")


def _file_rank(item) -> int:
    part = Path(str(item.path)).relative_to(Path(__file__).parent).parts[0]
    return next((rank for rank, prefix in enumerate(_LONG_FIRST) if part.startswith(prefix)), len(_LONG_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_file_rank)  # stable: files keep their order within a rank, tests theirs within a file


# ---------------------------------------------------------------------------------------------- the fake Trainium
# tests/fakes/site holds a fake `neuron` device and `torch_neuronx` written from AWS's documentation. The device is a
# once-per-process rename of PrivateUse1, so each check runs in a subprocess: the `fake_device` fixture is
# `run_on_fake_device(code, ...)`, which runs `code` with the fake on its path and returns the JSON object it printed
# last.
FAKE_SITE = Path(__file__).resolve().parent / "fakes" / "site"


def fake_env(extra: dict | None = None, fake_last: bool = False, scratch: Path | None = None) -> dict:
    """The environment a fake-device process gets (also handy for starting one by hand).

    By default the fake site comes first on the path, as PYTHONPATH does. With ``fake_last`` it is added after
    site-packages (a ``sitecustomize`` in ``scratch`` calls ``site.addsitedir``), as for a package installed after
    this one: entry points are discovered in path order, so that decides which package owns ``neuron``.
    """
    env = dict(os.environ)
    first = str(FAKE_SITE)
    if fake_last:
        (scratch / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(FAKE_SITE)!r})\n")
        first = str(scratch)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [first, env.get("PYTHONPATH")]))
    env["HF_HUB_OFFLINE"] = "1"
    env.update(extra or {})
    return env


def run_on_fake_device(code: str, timeout: float = 600, env: dict | None = None, fake_last: bool = False) -> dict:
    """Run ``code`` on the fake device; return the JSON it printed last. Fails on a non-zero exit.

    It runs in an empty scratch directory: the working directory is first on the path, and a checkout's
    ``*.egg-info`` there would decide the order of entry points.
    """
    with tempfile.TemporaryDirectory(prefix="fake_neuron_") as scratch:
        proc = subprocess.run(
            [sys.executable, "-c", code], env=fake_env(env, fake_last, Path(scratch)), capture_output=True,
            text=True, timeout=timeout, cwd=scratch,
        )
    if proc.returncode != 0:
        pytest.fail(f"fake-device subprocess exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        pytest.fail(f"fake-device subprocess printed nothing; stderr:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


@pytest.fixture(scope="session")
def fake_device():
    return run_on_fake_device
