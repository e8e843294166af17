"""What a fresh install contains, and what a checkout must not shadow."""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
# Import names of packages the backend or its users import next to this repository's folders.
THIRD_PARTY = ("kernels", "transformers", "diffusers", "accelerate", "trl", "torch", "nki")


def test_every_subpackage_is_installed():
    """An editable install hides a package missing from the list; a wheel would not have it (this happened twice)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "neuron_dynamo").rglob("__init__.py")}
    assert on_disk <= listed, sorted(on_disk - listed)
    for package, folder in config.get("package-dir", {}).items():
        assert (ROOT / folder / "__init__.py").exists(), (package, folder)


def test_no_folder_or_script_shadows_a_dependency():
    """`python -m pytest` puts the checkout on sys.path and `python benchmarks/x.py` puts benchmarks/ there: a
    `kernels` folder or `kernels.py` would shadow Hugging Face's `kernels`, which Transformers imports."""
    for folder in (ROOT, ROOT / "benchmarks", ROOT / "examples"):
        for name in THIRD_PARTY:
            assert not (folder / name / "__init__.py").exists() and not (folder / f"{name}.py").exists(), (folder, name)
