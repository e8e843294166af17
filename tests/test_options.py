import dataclasses

import pytest
import torch

from neuron_dynamo import NeuronDynamoError, Options
from neuron_dynamo.options import OptionError, options_table, resolve_options


def test_defaults():
    options = resolve_options(environ={})
    assert options == Options()
    assert (options.target, options.fallback, options.min_region_size, options.eager_ops) == ("auto", "eager", 1, ())


def test_unknown_option_lists_the_valid_keys():
    with pytest.raises(OptionError) as error:
        resolve_options({"fallbak": "error"}, environ={})
    message = str(error.value)
    assert "'fallbak'" in message
    for name in Options.names():
        assert name in message
    assert isinstance(error.value, NeuronDynamoError)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"target": "tpu"}, "'auto', 'neuron', 'simulator', 'reference'"),
        ({"fallback": "ignore"}, "'eager', 'error'"),
        ({"min_region_size": 0}, "at least 1"),
        ({"min_region_size": "many"}, "must be an integer"),
        ({"min_region_size": True}, "must be an integer"),
        ({"eager_ops": [1, 2]}, "list of strings"),
    ],
)
def test_bad_values_name_the_problem(options, fragment):
    with pytest.raises(OptionError, match="option") as error:
        resolve_options(options, environ={})
    assert fragment in str(error.value)


def test_environment_overrides_defaults_and_options_override_environment():
    environ = {"NEURON_DYNAMO_FALLBACK": "error", "NEURON_DYNAMO_MIN_REGION_SIZE": "3",
               "NEURON_DYNAMO_EAGER_OPS": "aten.mm, aten.add.Tensor"}
    options = resolve_options(environ=environ)
    assert options.fallback == "error"
    assert options.min_region_size == 3
    assert options.eager_ops == ("aten.mm", "aten.add.Tensor")
    assert resolve_options({"fallback": "eager"}, environ=environ).fallback == "eager"


def test_bad_environment_value_names_the_variable():
    with pytest.raises(OptionError, match="NEURON_DYNAMO_MIN_REGION_SIZE"):
        resolve_options(environ={"NEURON_DYNAMO_MIN_REGION_SIZE": "lots"})
    with pytest.raises(OptionError, match="fallback"):
        resolve_options(environ={"NEURON_DYNAMO_FALLBACK": "maybe"})


@pytest.mark.parametrize("mode", [None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_torch_compile_modes_are_accepted(mode):
    assert resolve_options(mode=mode, environ={}) == Options()


def test_unknown_mode_is_an_error():
    with pytest.raises(OptionError, match="reduce-overhead"):
        resolve_options(mode="fastest", environ={})


def test_options_are_frozen_and_lists_become_tuples():
    options = resolve_options({"eager_ops": ["aten.mm"]}, environ={})
    assert options.eager_ops == ("aten.mm",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.target = "reference"


def test_options_table_lists_every_option():
    table = options_table()
    for name in Options.names():
        assert f"`{name}`" in table
        assert f"NEURON_DYNAMO_{name.upper()}" in table


def test_torch_compile_rejects_unknown_option_before_running():
    compiled = torch.compile(lambda x: x + 1, backend="neuron", options={"colour": "blue"})
    with pytest.raises(Exception, match="valid options: target"):
        compiled(torch.ones(2))
