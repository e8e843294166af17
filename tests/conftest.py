import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _private_compile_cache(tmp_path_factory, monkeypatch):
    """Every test starts with an empty compile cache of its own (and never touches ~/.cache)."""
    monkeypatch.setenv("NEURON_DYNAMO_CACHE_DIR", str(tmp_path_factory.mktemp("neuron_dynamo_cache")))
