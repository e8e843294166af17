"""The `neuron_dynamo.nki` shim: genuine-package detection, toolchain_info, make_importable, cheap import."""

import subprocess
import sys
import textwrap

import pytest

import neuron_dynamo.nki as shim


@pytest.fixture
def fresh_detection(monkeypatch, tmp_path):
    """Put `tmp_path` first on sys.path and forget the cached detection result (restored afterwards)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(shim, "_genuine_cache", [])
    return tmp_path


def test_toolchain_info_reports_the_interpreter(monkeypatch):
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    assert shim.toolchain_info() == {"genuine": False, "provider": "interpreter", "version": "0.6.0",
                                     "target": "trn2"}
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen4")
    assert shim.toolchain_info()["target"] == "trn3"


def test_placeholder_package_is_not_mistaken_for_nki(fresh_detection):
    pkg = fresh_detection / "nki"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('raise ImportError("WRONG PACKAGE: install the Neuron SDK")\n')
    (pkg / "language").mkdir()
    (pkg / "isa.py").write_text("")
    assert shim.genuine_available() is False


def test_single_file_module_named_nki_is_not_genuine(fresh_detection):
    (fresh_detection / "nki.py").write_text("x = 1\n")
    assert shim.genuine_available() is False


def test_a_real_looking_package_is_detected_without_importing_it(fresh_detection):
    pkg = fresh_detection / "nki"
    (pkg / "language").mkdir(parents=True)
    (pkg / "isa").mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('detection must not import the package')\n")
    assert shim.genuine_available() is True


def test_make_importable_is_idempotent_and_routes_to_the_interpreter():
    shim.make_importable()
    shim.make_importable()
    import nki
    import nki.isa as nisa
    import nki.language as nl

    assert nki is shim and nl is shim.language and nisa is shim.isa
    assert nki.jit is shim.jit and callable(nki.simulate)
    assert nl.add is shim.language.add


def test_make_importable_replaces_an_imported_placeholder(monkeypatch):
    placeholder = type(sys)("nki")
    monkeypatch.setitem(sys.modules, "nki", placeholder)
    shim.make_importable()
    assert sys.modules["nki"] is shim


def test_importing_the_shim_is_cheap_and_side_effect_free():
    code = textwrap.dedent(
        """
        import sys, importlib.util
        spec = importlib.util.spec_from_file_location("shim_only", {path!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        heavy = [m for m in ("numpy", "ml_dtypes", "torch", "neuron_dynamo.nki.runtime") if m in sys.modules]
        print(heavy, "nki" in sys.modules)
        """
    ).format(path=shim.__file__)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[] False"
