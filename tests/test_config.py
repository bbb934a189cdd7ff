"""Configuration validation: bad values are refused with the flag named and what is allowed."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devsim.config import ConfigError, SimulationConfig


def test_defaults_are_valid():
    SimulationConfig().validate()


@pytest.mark.parametrize(
    "changes, flag, allowed",
    [
        (
            {"device_selection_size": 101, "num_leaf_nodes": 2, "devices_per_leaf": 50},
            "--device-selection-size",
            "1..100",
        ),
        ({"alpha": 0.0}, "--alpha", "> 0"),
        ({"alpha": -1.0}, "--alpha", "> 0"),
        ({"dataset": "mnist"}, "--dataset", "synthetic, cifar10, cifar100"),
        ({"model": "vgg"}, "--model", "cnn, resnet18"),
        ({"num_rounds": -1}, "--num-rounds", "minimum of 0"),
        ({"partition": "shards"}, "--partition", "iid, dirichlet"),
        ({"momentum": 1.0}, "--momentum", "[0, 1)"),
        ({"lr": float("nan")}, "--lr", "> 0"),
        ({"num_workers": 0}, "--num-workers", "minimum of 1"),
        ({"local_iterations": 0}, "--local-iterations", "minimum of 1"),
        ({"dataset": "cifar10"}, "--data-root", "--dataset synthetic"),
        ({"dataset": "cifar10", "data_root": "/nonexistent/cifar"}, "--data-root", "--download"),
        ({"batch_size": "32"}, "--batch-size", "expected int"),
    ],
)
def test_bad_values_name_flag_and_allowed(changes, flag, allowed):
    values = SimulationConfig().to_dict() | changes
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_dict(values)
    assert flag in str(info.value)
    assert allowed in str(info.value)


def test_unknown_key_is_refused():
    with pytest.raises(ConfigError, match="unknown setting"):
        SimulationConfig.from_dict({"num_round": 3})


def test_round_trip_through_dict():
    config = SimulationConfig(num_rounds=3, alpha=0.1)
    assert SimulationConfig.from_dict(config.to_dict()) == config


_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=8))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(list(SimulationConfig().to_dict()) + ["bogus"]), _values, max_size=6))
def test_random_configs_validate_or_fail_clearly(changes):
    values = SimulationConfig().to_dict() | changes
    try:
        config = SimulationConfig.from_dict(values)
    except ConfigError as error:
        assert str(error).startswith("--")
    else:
        assert config.device_selection_size <= config.num_devices
