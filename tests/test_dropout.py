"""Seeded device failures: probabilities respected, deterministic, clear errors."""

from __future__ import annotations

import pytest

from devsim.population.dropout import (
    DROPPED,
    OK,
    OUTCOMES,
    SILENT,
    DropoutModel,
    RoundFailedError,
    min_devices_check,
    min_devices_needed,
)

DRAWS = 20_000


def test_probabilities_are_respected():
    model = DropoutModel(drop_probability=0.2, never_answer_probability=0.1, seed=5)
    outcomes = [model.outcome(r, d) for r in range(20) for d in range(DRAWS // 20)]
    assert set(outcomes) <= set(OUTCOMES)
    # Binomial standard deviation at p=0.2, n=20k is ~0.0028; allow > 4 sigma.
    assert outcomes.count(DROPPED) / DRAWS == pytest.approx(0.2, abs=0.012)
    assert outcomes.count(SILENT) / DRAWS == pytest.approx(0.1, abs=0.01)


def test_deterministic_per_seed_round_and_device():
    a = DropoutModel(0.3, 0.2, seed=7)
    b = DropoutModel(0.3, 0.2, seed=7)
    assert [a.outcome(3, d) for d in range(200)] == [b.outcome(3, d) for d in range(200)]
    assert a.outcomes(3, [5, 1]) == {5: a.outcome(3, 5), 1: a.outcome(3, 1)}
    assert [a.outcome(3, d) for d in range(200)] != [a.outcome(4, d) for d in range(200)]
    assert [a.outcome(3, d) for d in range(200)] != [DropoutModel(0.3, 0.2, seed=8).outcome(3, d) for d in range(200)]


def test_zero_probability_is_always_ok():
    model = DropoutModel(seed=3)
    assert not model.enabled
    assert {model.outcome(r, d) for r in range(10) for d in range(100)} == {OK}


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"drop_probability": 1.0}, "device_dropout"),
        ({"drop_probability": -0.1}, "device_dropout"),
        ({"drop_probability": float("nan")}, "device_dropout"),
        ({"never_answer_probability": 1.5}, "device_never_answer"),
        ({"never_answer_probability": "0.1"}, "device_never_answer"),
        ({"drop_probability": 0.6, "never_answer_probability": 0.5}, "device_never_answer"),
    ],
)
def test_bad_probabilities_name_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DropoutModel(**kwargs)


def test_min_devices_check_message():
    with pytest.raises(RoundFailedError) as info:
        min_devices_check(2, 20, 0.5, round_num=3)
    assert str(info.value) == ("round 3: only 2 of 20 selected devices answered; --min-devices-fraction 0.5 needs 10")
    min_devices_check(10, 20, 0.5, round_num=3)
    min_devices_check(3, 10, 0.3)
    assert min_devices_needed(10, 0.3) == 3
    assert min_devices_needed(20, 0.0) == 1
    with pytest.raises(RoundFailedError, match="only 0 of 5"):
        min_devices_check(0, 5, 0.0)
    with pytest.raises(RoundFailedError, match=r"^round 51: only 0 of 20 selected devices answered \(why\); --min"):
        min_devices_check(0, 20, 0.5, round_num=51, why="why")


def test_min_devices_check_bad_arguments():
    with pytest.raises(ValueError, match="min_devices_fraction"):
        min_devices_check(1, 2, 1.5)
    with pytest.raises(ValueError, match="answered"):
        min_devices_check(3, 2, 0.5)
