"""The README's options table stays the one the code validates against."""

import dataclasses
from pathlib import Path

from neuron_dynamo.options import Options, options_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_options_table_is_current():
    text = README.read_text()
    assert options_table() in text, "regenerate the README options table with neuron_dynamo.options.options_table()"
    assert all(f"`{field.name}`" in text for field in dataclasses.fields(Options))


def test_readme_opens_with_the_two_setup_commands():
    head = README.read_text()[:800]
    assert "make demo" in head and "make test" in head
