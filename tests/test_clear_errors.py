"""Mistakes in options and in `neuron-precompile warm` arguments: a clear error naming the problem and the fix, before
any work is done (no compile, no cache directory, no traceback)."""

import json
import os
import textwrap

import pytest
import torch

import neuron_dynamo
from neuron_dynamo.cli import main
from neuron_dynamo.options import OptionError, resolve_options

ONE_LINE_ERROR = "neuron-precompile: error: "


# ------------------------------------------------------------------------------------------------ options
@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ("target=reference", "options must be a dict like {'target': 'reference'}"),
        ("target=reference,fallback=error", "{'target': 'reference', 'fallback': 'error'}"),
        (["target", "reference"], "options must be a dict like {'target': 'reference'}, got list"),
    ],
)
def test_options_that_are_not_a_dict_say_how_to_write_them(options, fragment):
    with pytest.raises(OptionError) as error:
        resolve_options(options, environ={})
    assert fragment in str(error.value)
    assert "dictionary update sequence" not in str(error.value)


def test_torch_compile_with_a_string_of_options_names_the_dict_form():
    compiled = torch.compile(lambda x: x + 1, backend="neuron", options="target=reference")
    with pytest.raises(Exception, match=r"options must be a dict like \{'target': 'reference'\}") as error:
        compiled(torch.ones(2))
    assert isinstance(getattr(error.value, "inner_exception", error.value), OptionError)


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        ("aten.not_an_op", ["'aten.not_an_op'", "not a registered op", "'aten.mm'", "'aten.mm.default'"]),
        ("mm", ["'mm'", "no namespace", "did you mean 'aten.mm'"]),
        ("not_an_op", ["'not_an_op'", "no namespace", "namespace.op"]),
        ("aten.mm.not_an_overload", ["no overload of aten.mm", "'aten.mm.default'"]),
        ("no_such_namespace.mm", ["not a registered op", "torch.ops.no_such_namespace"]),
        ("aten.mm.default.extra", ["is not an op name"]),
        ("aten..mm", ["is not an op name"]),
        ("__class__.mro", ["is not an op name"]),
    ],
)
def test_unknown_eager_ops_name_the_entry_and_the_expected_form(name, fragments):
    with pytest.raises(OptionError) as error:
        resolve_options({"eager_ops": ["aten.add", name]}, environ={})
    message = str(error.value)
    for fragment in fragments:
        assert fragment in message, message
    assert "namespace.op.overload" in message


def test_real_op_names_are_accepted_in_every_form():
    names = ["aten.mm", "aten.mm.default", "aten.add.Tensor", "aten.__and__.Tensor", "prims.convert_element_type"]
    assert resolve_options({"eager_ops": names}, environ={}).eager_ops == tuple(names)
    environ = {"NEURON_DYNAMO_EAGER_OPS": "aten.mm, aten.nope"}
    with pytest.raises(OptionError, match="'aten.nope'.*NEURON_DYNAMO_EAGER_OPS"):
        resolve_options(environ=environ)


@pytest.mark.parametrize("lnc", [0, 1, 2])
def test_lnc_accepts_0_1_2(lnc):
    assert resolve_options({"lnc": lnc}, environ={}).lnc == lnc


@pytest.mark.parametrize("lnc", [3, 5, 64])
def test_lnc_refuses_other_degrees(lnc):
    with pytest.raises(OptionError, match="'lnc' must be 0, 1 or 2"):
        resolve_options({"lnc": lnc}, environ={})
    with pytest.raises(OptionError, match="NEURON_DYNAMO_LNC"):
        resolve_options(environ={"NEURON_DYNAMO_LNC": str(lnc)})


def test_environment_values_are_stripped_of_surrounding_whitespace():
    environ = {
        "NEURON_DYNAMO_TARGET": " simulator ", "NEURON_DYNAMO_FALLBACK": "error\n", "NEURON_DYNAMO_CACHE": "\toff",
        "NEURON_DYNAMO_CACHE_TAG": " nightly ", "NEURON_DYNAMO_EAGER_OPS": "  aten.mm ,  aten.add.Tensor ",
        "NEURON_DYNAMO_BUCKETS": " 128, 256 ", "NEURON_DYNAMO_LNC": " 2 ", "NEURON_DYNAMO_BUCKETING": " false ",
    }
    options = resolve_options(environ=environ)
    assert (options.target, options.fallback, options.cache, options.cache_tag) == ("simulator", "error", "off",
                                                                                    "nightly")
    assert options.eager_ops == ("aten.mm", "aten.add.Tensor")
    assert (options.buckets, options.lnc, options.bucketing) == ((128, 256), 2, False)


def test_a_bad_environment_choice_names_the_variable():
    with pytest.raises(OptionError, match="got 'bogus'.*environment variable NEURON_DYNAMO_TARGET"):
        resolve_options(environ={"NEURON_DYNAMO_TARGET": "bogus"})


def test_backend_info_reports_a_bad_environment_option_instead_of_raising(monkeypatch):
    assert neuron_dynamo.backend_info()["options_error"] is None
    monkeypatch.setenv("NEURON_DYNAMO_TARGET", "bogus")
    info = neuron_dynamo.backend_info()
    assert "NEURON_DYNAMO_TARGET" in info["options_error"] and "'bogus'" in info["options_error"]
    assert info["neuron_is_neuron_dynamo"] is True and info["version"]
    assert info["target_option"] is None and "options_error" in info["target"]

    monkeypatch.setenv("NEURON_DYNAMO_TARGET", "reference")
    monkeypatch.setenv("NEURON_DYNAMO_LNC", "5")  # another variable is bad: the target is still resolved
    info = neuron_dynamo.backend_info()
    assert "NEURON_DYNAMO_LNC" in info["options_error"]
    assert (info["target_option"], info["target"]) == ("reference", "reference")


# ------------------------------------------------------------------------------------- neuron-precompile warm
def _factory_module(tmp_path, monkeypatch, name, body):
    """A module `name` in tmp_path (the cwd, as for a user running the tool next to their script)."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}"


def _error(capsys):
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ONE_LINE_ERROR), captured.err
    return lines[0]


GOOD = """
    import pathlib
    import torch

    def tiny():
        pathlib.Path("factory_was_called").touch()
        return torch.nn.Linear(4, 2), lambda batch, seq: (torch.randn(batch, seq, 4),)
"""


@pytest.mark.parametrize(
    ("factory", "fragments"),
    [
        ("def make():\n    raise RuntimeError('no weights here\\nsecond line')\n",
         ["model factory", "raised RuntimeError: no weights here", "must return (model, make_inputs)"]),
        ("import torch\ndef make():\n    return torch.nn.Linear(2, 2)\n",
         ["returned a Linear instead of a pair", "(model, make_inputs)", "make_inputs(batch_size, seq_len)"]),
        ("import torch\ndef make():\n    return torch.nn.Linear(2, 2), None, 3\n",
         ["returned a 3-tuple instead of a pair"]),
        ("import torch\ndef make():\n    return torch.nn.Linear(2, 2), [1, 2]\n",
         ["a list as make_inputs, which is not a function"]),
        ("def make():\n    return 'model', lambda b, s: ()\n",
         ["a str as the model, which cannot be called"]),
        ("make = 42\n", ["is not a function (it is of type int)", "(model, make_inputs)"]),
        ("raise ValueError('broken at import')\ndef make():\n    pass\n",
         ["importing", "raised ValueError: broken at import"]),
    ],
)
def test_a_bad_factory_is_a_one_line_error(tmp_path, monkeypatch, capsys, cache_dir, factory, fragments):
    name = f"bad_factory_{abs(hash(factory)) % 10**8}"
    _factory_module(tmp_path, monkeypatch, name, factory)
    assert main(["warm", f"{name}:make", "-o", "target=reference"]) == 2
    line = _error(capsys)
    for fragment in fragments:
        assert fragment in line, line
    assert "second line" not in line
    assert not cache_dir.exists()


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        ('{"model_type": "llama", ', ["cannot read the model config", "config.json", "valid JSON"]),
        ('{"model_type": "no_such_architecture"}', ["cannot read the model config", "no_such_architecture",
                                                    "model_type"]),
        ('{"hidden_size": 8}', ["cannot read the model config", "model_type"]),
        ("[1, 2]", ["cannot read the model config"]),
    ],
)
def test_a_broken_hugging_face_directory_is_a_one_line_error(tmp_path, capsys, cache_dir, config, fragments):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(config)
    assert main(["warm", str(model_dir), "-o", "target=reference"]) == 2
    line = _error(capsys)
    for fragment in fragments:
        assert fragment in line, line
    assert not cache_dir.exists()


def test_a_directory_without_config_json_is_a_one_line_error(tmp_path, capsys, cache_dir):
    assert main(["warm", str(tmp_path), "-o", "target=reference"]) == 2
    assert "holds no config.json" in _error(capsys)


@pytest.mark.parametrize("case", ["missing parent", "parent is a file", "a directory"])
def test_an_unwritable_summary_fails_before_anything_is_compiled(tmp_path, monkeypatch, capsys, cache_dir, case):
    name = _factory_module(tmp_path, monkeypatch, "summary_factory", GOOD)
    (tmp_path / "a_file").write_text("")
    summary = {"missing parent": tmp_path / "no" / "such" / "dir" / "summary.json",
               "parent is a file": tmp_path / "a_file" / "summary.json",
               "a directory": tmp_path}[case]
    assert main(["warm", f"{name}:tiny", "-o", "target=reference", "--summary", str(summary)]) == 2
    line = _error(capsys)
    assert "--summary" in line and "existing, writable directory" in line
    assert not (tmp_path / "factory_was_called").exists()
    assert not cache_dir.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_summary_in_a_read_only_directory_fails_before_anything_is_compiled(tmp_path, monkeypatch, capsys,
                                                                              cache_dir):
    name = _factory_module(tmp_path, monkeypatch, "summary_factory", GOOD)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert main(["warm", f"{name}:tiny", "-o", "target=reference", "--summary", str(locked / "s.json")]) == 2
    finally:
        locked.chmod(0o700)
    assert "cannot be written" in _error(capsys)
    assert not (tmp_path / "factory_was_called").exists()


def test_a_writable_summary_is_checked_without_leaving_a_file(tmp_path, monkeypatch, capsys, cache_dir):
    name = _factory_module(tmp_path, monkeypatch, "summary_factory", GOOD)
    summary = tmp_path / "summary.json"
    # the run fails later (workers < 1): the check itself left nothing behind
    assert main(["warm", f"{name}:tiny", "--workers", "0", "--summary", str(summary)]) == 2
    assert "--workers" in _error(capsys)
    assert not summary.exists()
    assert main(["warm", f"{name}:tiny", "-o", "target=reference", "--dynamic", "false", "--seq-lens", "3",
                 "--summary", str(summary)]) == 0
    assert json.loads(summary.read_text())["totals"]["done"] == 1


@pytest.mark.parametrize(("argv", "env", "fragments"), [
    (["-o", "cache=off"], {}, ["cache is off (-o cache=off)", "drop that -o option"]),
    ([], {"NEURON_DYNAMO_CACHE": "off"}, ["cache is off (NEURON_DYNAMO_CACHE=off)", "unset NEURON_DYNAMO_CACHE"]),
    ([], {"NEURON_DYNAMO_CACHE": " off "}, ["cache is off (NEURON_DYNAMO_CACHE=off)"]),
    (["-o", "cache=readonly"], {}, ["cache is read-only (-o cache=readonly)", "store nothing"]),
])
def test_warming_a_disabled_cache_is_refused_up_front(tmp_path, monkeypatch, capsys, cache_dir, argv, env,
                                                      fragments):
    name = _factory_module(tmp_path, monkeypatch, "off_factory", GOOD)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    assert main(["warm", f"{name}:tiny", "-o", "target=reference", *argv]) == 2
    line = _error(capsys)
    for fragment in fragments:
        assert fragment in line, line
    assert not (tmp_path / "factory_was_called").exists()
    assert not cache_dir.exists()


def test_warm_refuses_bad_eager_ops_and_lnc_before_loading_the_model(tmp_path, monkeypatch, capsys, cache_dir):
    name = _factory_module(tmp_path, monkeypatch, "option_factory", GOOD)
    assert main(["warm", f"{name}:tiny", "-o", "eager_ops=mm"]) == 2
    assert "did you mean 'aten.mm'" in _error(capsys)
    assert main(["warm", f"{name}:tiny", "-o", "lnc=5"]) == 2
    assert "'lnc' must be 0, 1 or 2" in _error(capsys)
    assert not (tmp_path / "factory_was_called").exists()
