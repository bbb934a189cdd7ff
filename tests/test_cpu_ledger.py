"""CpuLedger: server and leaf CPU seconds per window."""

from __future__ import annotations

import threading
import time

import pytest

from devsim.observe.cpu import (
    GROUPS_KEY,
    LEAF_CPU_KEY,
    TRAIN_CPU_KEY,
    CpuLedger,
    TrainingTally,
    leaf_counters_now,
    leaf_cpu_now,
)


class FakeClock:
    def __init__(self):
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def test_server_cpu_is_the_growth_since_the_last_window():
    clock = FakeClock()
    ledger = CpuLedger(clock)
    clock.now = 12.5
    assert ledger.close()["server_cpu_seconds"] == pytest.approx(2.5)
    clock.now = 13.0
    assert ledger.close()["server_cpu_seconds"] == pytest.approx(0.5)


def test_a_leafs_first_reply_is_its_baseline_and_later_replies_count():
    ledger = CpuLedger(FakeClock())
    ledger.leaf_reply("site-1", {LEAF_CPU_KEY: 100.0})
    ledger.leaf_reply("site-2", {LEAF_CPU_KEY: 50.0})
    assert ledger.close()["leaf_cpu_seconds"] == 0.0
    ledger.leaf_reply("site-1", {LEAF_CPU_KEY: 101.0})
    ledger.leaf_reply("site-1", {LEAF_CPU_KEY: 101.5})
    ledger.leaf_reply("site-2", {LEAF_CPU_KEY: 50.25})
    assert ledger.close()["leaf_cpu_seconds"] == pytest.approx(1.75)


def test_a_silent_leaf_adds_its_cpu_to_the_window_of_its_next_reply():
    ledger = CpuLedger(FakeClock())
    ledger.leaf_reply("site-1", {LEAF_CPU_KEY: 1.0})
    ledger.close()
    assert ledger.close()["leaf_cpu_seconds"] == 0.0
    ledger.leaf_reply("site-1", {LEAF_CPU_KEY: 4.0})
    assert ledger.close()["leaf_cpu_seconds"] == pytest.approx(3.0)


def test_replies_without_cpu_and_out_of_order_replies_are_harmless():
    ledger = CpuLedger(FakeClock())
    ledger.leaf_reply("site-1", {"leaf_replied_at": 5.0})
    ledger.leaf_reply("site-1", {LEAF_CPU_KEY: 2.0})
    ledger.close()
    ledger.leaf_reply("site-1", {LEAF_CPU_KEY: 3.0})
    ledger.leaf_reply("site-1", {LEAF_CPU_KEY: 2.5})  # an earlier call's reply taken later
    assert ledger.close()["leaf_cpu_seconds"] == pytest.approx(1.0)


def test_leaf_cpu_now_grows_with_work():
    before = leaf_cpu_now()
    sum(i * i for i in range(200_000))
    assert leaf_cpu_now() > before


def test_training_cpu_and_groups_are_windowed_like_the_leaf_cpu():
    ledger = CpuLedger(FakeClock())
    ledger.leaf_reply("site-1", {LEAF_CPU_KEY: 10.0, TRAIN_CPU_KEY: 8.0, GROUPS_KEY: 40.0})
    ledger.leaf_reply("site-2", {LEAF_CPU_KEY: 11.0})  # a leaf without the tally counts its CPU alone
    first = ledger.close()
    assert (first[LEAF_CPU_KEY], first[TRAIN_CPU_KEY], first[GROUPS_KEY]) == (0.0, 0.0, 0.0)
    ledger.leaf_reply("site-1", {LEAF_CPU_KEY: 12.0, TRAIN_CPU_KEY: 9.5, GROUPS_KEY: 43.0})
    ledger.leaf_reply("site-2", {LEAF_CPU_KEY: 11.5})
    window = ledger.close()
    assert window[LEAF_CPU_KEY] == pytest.approx(2.5)
    assert window[TRAIN_CPU_KEY] == pytest.approx(1.5)
    assert window[GROUPS_KEY] == 3.0


def test_the_training_tally_counts_each_call_and_its_own_threads_cpu_only():
    tally = TrainingTally()
    busy = threading.Event()

    def spin_elsewhere():
        while not busy.is_set():
            sum(i * i for i in range(1000))

    other = threading.Thread(target=spin_elsewhere)
    other.start()
    own = 0.0
    try:
        for _ in range(3):
            with tally.measure():
                started = time.thread_time()
                sum(i * i for i in range(100_000))
                own += time.thread_time() - started
    finally:
        busy.set()
        other.join(timeout=10)
    counters = tally.counters()
    assert counters[GROUPS_KEY] == 3.0
    assert counters[TRAIN_CPU_KEY] == pytest.approx(own, abs=0.005)  # not the spinning thread's CPU
    with pytest.raises(RuntimeError), tally.measure():
        raise RuntimeError("a failed training call still counts")
    assert tally.counters()[GROUPS_KEY] == 4.0
    assert set(leaf_counters_now()) == {LEAF_CPU_KEY, TRAIN_CPU_KEY, GROUPS_KEY}
