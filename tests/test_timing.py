"""Round timing breakdown: disjoint non-negative parts that sum to the wall time."""

import math
import random

import pytest

from devsim.observe.timing import PART_NAMES, RoundTiming, ServerStamps, WindowTiming, summarize

T0 = 1_700_000_000.0


def _leaf(received, replied, train, aggregate, compute_sum=1.0, compute_max=0.5):
    return {
        "leaf_wall": train + aggregate,
        "leaf_train_wall": train,
        "leaf_aggregate": aggregate,
        "device_compute_sum": compute_sum,
        "device_compute_max": compute_max,
        "num_workers": 2.0,
        "leaf_received_at": received,
        "leaf_replied_at": replied,
    }


def _round(skew_b: float = 0.0) -> tuple[ServerStamps, dict]:
    stamps = ServerStamps(
        round_start=T0,
        dispatch_start=T0 + 0.010,
        results_in=T0 + 2.530,
        aggregate_end=T0 + 2.600,
        eval_end=T0 + 3.100,
    )
    leaves = {
        "leaf-1": _leaf(T0 + 0.050, T0 + 1.500, train=1.300, aggregate=0.050, compute_sum=4.0, compute_max=0.9),
        "leaf-2": _leaf(T0 + 0.060 + skew_b, T0 + 2.500 + skew_b, train=2.200, aggregate=0.100, compute_sum=5.0),
    }
    return stamps, leaves


def _assert_sums_to_wall(timing: RoundTiming) -> None:
    parts = timing.parts()
    assert list(parts) == list(PART_NAMES)
    assert math.isclose(math.fsum(parts.values()), timing.wall, rel_tol=0.0, abs_tol=1e-9)


def test_parts_are_non_negative_and_sum_to_wall():
    stamps, leaves = _round()
    timing = RoundTiming.from_round(stamps, leaves)
    parts = timing.parts()
    assert timing.wall == pytest.approx(3.1, abs=1e-6)
    assert all(parts[name] >= 0.0 for name in PART_NAMES if name != "remainder")
    _assert_sums_to_wall(timing)
    assert abs(parts["remainder"]) < 1e-9
    assert parts["server_prepare"] == pytest.approx(0.010, abs=1e-6)
    assert parts["dispatch"] == pytest.approx(0.050, abs=1e-6)
    assert parts["leaf_compute"] == pytest.approx(2.200)
    assert parts["leaf_aggregate"] == pytest.approx(0.100)
    assert parts["leaf_overhead"] == pytest.approx(2.440 - 2.300, abs=1e-6)
    assert parts["return"] == pytest.approx(0.030, abs=1e-6)
    assert parts["server_aggregate"] == pytest.approx(0.070, abs=1e-6)
    assert parts["evaluation"] == pytest.approx(0.500, abs=1e-6)
    assert not timing.skewed()


def test_slowest_leaf_is_the_last_to_reply_and_info_covers_all_leaves():
    stamps, leaves = _round()
    timing = RoundTiming.from_round(stamps, leaves)
    assert timing.critical_leaf == "leaf-2"
    assert timing.info["device_compute_sum"] == pytest.approx(9.0)
    assert timing.info["device_compute_max"] == pytest.approx(0.9)
    leaves["leaf-1"]["leaf_replied_at"] = T0 + 2.520
    assert RoundTiming.from_round(stamps, leaves).critical_leaf == "leaf-1"


def test_clock_skew_goes_to_the_remainder_not_to_negative_parts():
    stamps, leaves = _round(skew_b=-0.200)
    timing = RoundTiming.from_round(stamps, leaves)
    parts = timing.parts()
    assert all(parts[name] >= 0.0 for name in PART_NAMES if name != "remainder")
    assert parts["dispatch"] == 0.0
    assert parts["return"] == pytest.approx(0.230, abs=1e-6)
    assert parts["remainder"] == pytest.approx(-0.150, abs=1e-6)
    _assert_sums_to_wall(timing)
    assert timing.skewed()

    ahead = RoundTiming.from_round(*_round(skew_b=0.500))
    assert ahead.parts()["return"] == 0.0
    assert ahead.parts()["remainder"] == pytest.approx(-0.470, abs=1e-6)
    _assert_sums_to_wall(ahead)


def test_skew_that_keeps_the_order_only_moves_time_between_dispatch_and_return():
    timing = RoundTiming.from_round(*_round(skew_b=0.020))
    assert timing.parts()["dispatch"] == pytest.approx(0.070, abs=1e-6)
    assert timing.parts()["return"] == pytest.approx(0.010, abs=1e-6)
    assert abs(timing.remainder) < 1e-9


def test_round_trip_through_dict_and_missing_leaf_keys():
    timing = RoundTiming.from_round(*_round())
    again = RoundTiming.from_dict(timing.to_dict())
    assert again.parts() == pytest.approx(timing.parts())
    assert again.critical_leaf == "leaf-2" and again.info == timing.info
    with pytest.raises(ValueError, match="leaf-x.*leaf_replied_at"):
        RoundTiming.from_round(_round()[0], {"leaf-x": {"leaf_received_at": T0, "leaf_train_wall": 1.0}})
    empty = RoundTiming.from_round(_round()[0], {})  # no reply: every selected device was on a lost leaf
    assert empty.critical_leaf is None and sum(empty.parts().values()) == pytest.approx(empty.wall)
    assert all(empty.measured[part] == 0.0 for part in ("dispatch", "leaf_compute", "return"))


def test_summary_mentions_every_part():
    timings = [RoundTiming.from_round(*_round()), RoundTiming.from_round(*_round(skew_b=-0.2))]
    table = summarize(timings)
    for name in (*PART_NAMES, "wall", "device_compute_sum", "device_compute_max"):
        assert name in table
    assert "2 rounds" in table
    assert "100.0%" in table
    assert "leaf-2 2x" in table
    assert "clock skew" in table
    assert "no rounds" in summarize([])


def test_codec_seconds_sum_over_leaves_and_the_critical_leafs_share_is_printed():
    stamps, leaves = _round()
    leaves["leaf-1"]["codec_seconds"] = 0.093
    leaves["leaf-2"]["codec_seconds"] = 0.062
    timing = RoundTiming.from_round(stamps, leaves)
    assert timing.info["codec_seconds"] == pytest.approx(0.155)
    assert timing.info["critical_leaf_codec_seconds"] == pytest.approx(0.062)  # leaf-2 replied last
    table = summarize([timing, timing])
    codec_line = next(line for line in table.splitlines() if line.startswith("codec_seconds "))
    critical_line = next(line for line in table.splitlines() if line.startswith("critical_leaf_codec_seconds "))
    assert codec_line.split()[1:] == ["0.1550", "5.0%"]  # 0.155 s of a 3.1 s round
    assert critical_line.split()[1:] == ["0.0620", "2.0%"]
    assert "%" not in next(line for line in table.splitlines() if line.startswith("device_compute_sum"))


def test_window_timing_splits_blocked_time_over_call_parts():
    window = WindowTiming(start=T0)
    window.add("server_prepare", 0.1)
    window.add("server_aggregate", 0.2)
    window.add("evaluation", 0.3)
    window.add_wait(1.0)
    # Two overlapping calls: 2.0 busy seconds during 1.0 s of waiting.
    window.add_call(T0 + 0.1, T0 + 1.1, _leaf(T0 + 0.2, T0 + 1.0, train=0.6, aggregate=0.0, compute_max=0.4))
    window.add_call(T0 + 0.1, T0 + 1.1, _leaf(T0 + 0.2, T0 + 1.0, train=0.6, aggregate=0.0, compute_max=0.7))
    timing = window.close(end=T0 + 1.6)
    parts = timing.parts()
    assert timing.wall == pytest.approx(1.6, abs=1e-6)
    assert all(parts[name] >= 0.0 for name in PART_NAMES if name != "remainder")
    _assert_sums_to_wall(timing)
    assert parts["leaf_compute"] == pytest.approx(0.6, abs=1e-6)
    assert parts["dispatch"] == pytest.approx(0.1, abs=1e-6)
    assert parts["leaf_overhead"] == pytest.approx(0.2, abs=1e-6)
    assert parts["return"] == pytest.approx(0.1, abs=1e-6)
    assert abs(parts["remainder"]) < 1e-6
    assert timing.critical_leaf is None
    assert timing.info["calls"] == 2.0
    assert timing.info["concurrency"] == pytest.approx(2.0, abs=1e-6)
    assert timing.info["device_compute_max"] == pytest.approx(0.7)
    assert timing.info["server_decode_seconds"] == 0.0
    assert "1 window:" in summarize([timing], unit="window")
    with pytest.raises(ValueError, match="unknown server part"):
        window.add("dispatch", 1.0)


def test_window_counts_the_servers_decoding_apart_from_its_parts():
    window = WindowTiming(start=T0)
    window.add("server_prepare", 0.25)
    window.add_server_decode(0.05)
    window.add_server_decode(-1.0)  # a clock step back counts as nothing
    timing = window.close(end=T0 + 1.0)
    assert timing.info["server_decode_seconds"] == pytest.approx(0.05)
    assert timing.parts()["server_prepare"] == pytest.approx(0.25)
    _assert_sums_to_wall(timing)
    line = next(row for row in summarize([timing], unit="window").splitlines() if row.startswith("server_decode"))
    assert line.rstrip().endswith("5.0%")


def test_window_without_calls_leaves_blocked_time_in_the_remainder():
    window = WindowTiming(start=T0)
    window.add("server_prepare", 0.25)
    window.add_wait(0.5)
    timing = window.close(end=T0 + 1.0)
    assert timing.parts()["remainder"] == pytest.approx(0.75, abs=1e-6)
    _assert_sums_to_wall(timing)


def test_random_consistent_rounds_have_no_negative_part_and_no_remainder():
    rng = random.Random(5)
    for _ in range(500):
        start = T0 + rng.uniform(0, 1e6)
        dispatch_start = start + rng.uniform(0, 0.1)
        stamps_leaves = {}
        latest_reply = dispatch_start
        for leaf in range(rng.randint(1, 4)):
            received = dispatch_start + rng.uniform(0, 0.2)
            train, aggregate = rng.uniform(0, 5), rng.uniform(0, 0.5)
            replied = received + train + aggregate + rng.uniform(0, 0.1)
            latest_reply = max(latest_reply, replied)
            stamps_leaves[f"leaf-{leaf}"] = _leaf(received, replied, train, aggregate)
        results_in = latest_reply + rng.uniform(0, 0.2)
        aggregate_end = results_in + rng.uniform(0, 0.3)
        stamps = ServerStamps(start, dispatch_start, results_in, aggregate_end, aggregate_end + rng.uniform(0, 2))
        timing = RoundTiming.from_round(stamps, stamps_leaves)
        assert all(timing.parts()[name] >= 0.0 for name in PART_NAMES if name != "remainder")
        assert abs(timing.remainder) < 1e-9
        _assert_sums_to_wall(timing)
