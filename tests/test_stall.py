"""An asynchronous run that accepts nothing ends with a reason instead of going on forever."""

from __future__ import annotations

import pytest

from devsim.aggregation.stall import MIN_STALL_ARRIVALS, PRINTED_REJECTIONS, StallError, StallGuard


class Counters:
    def __init__(self):
        self.failures = {"dropped": 0, "silent": 0, "rejected": 0, "leaf_lost": 0}
        self.kinds = {"non_finite": 0, "norm": 0}

    def __call__(self):
        return self.failures, self.kinds


def test_the_limit_is_the_larger_of_the_minimum_and_ten_times_the_concurrency():
    assert StallGuard(20, Counters()).limit == MIN_STALL_ARRIVALS
    assert StallGuard(1000, Counters()).limit == 10_000
    with pytest.raises(ValueError, match="limit"):
        StallGuard(20, Counters(), limit=0)


def test_a_streak_ends_the_run_naming_what_grew_since_the_last_accepted_update():
    counters = Counters()
    counters.failures["rejected"] = 7  # before the streak: not part of the reason
    guard = StallGuard(8, counters, limit=5)
    guard.reset()
    for _ in range(4):
        counters.failures["dropped"] += 1
        guard.missed(3)
    guard.accepted()
    for kind in ("non_finite", "non_finite", "norm", "non_finite"):
        counters.failures["rejected"] += 1
        counters.kinds[kind] += 1
        guard.missed(3)
    counters.failures["leaf_lost"] += 1
    with pytest.raises(StallError) as raised:
        guard.missed(3)
    message = str(raised.value)
    assert message.startswith("version 3: none of the last 5 arriving device updates was accepted (rejected 4: ")
    assert "non-finite 3, norm 1; leaf lost 1)" in message and "dropped" not in message


def test_rejections_print_the_first_of_each_version_then_say_the_rest_are_counted():
    guard = StallGuard(8, Counters())
    lines = [guard.printable(0, f"line {i}") for i in range(PRINTED_REJECTIONS + 3)]
    assert lines[: PRINTED_REJECTIONS - 1] == [f"line {i}" for i in range(PRINTED_REJECTIONS - 1)]
    assert lines[PRINTED_REJECTIONS - 1].endswith(
        "(further rejections at version 0 are counted in failed_rejected, not printed)"
    )
    assert lines[PRINTED_REJECTIONS:] == [None, None, None]
    assert guard.printable(1, "next version") == "next version"
