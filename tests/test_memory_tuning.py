"""The server's memory tuning: garbage collection with frozen start-up objects."""

from __future__ import annotations

import gc
import weakref

import pytest

from devsim.resources.collection import PeriodicCollector


def test_periodic_collector_collects_only_after_its_interval():
    now = [100.0]
    collector = PeriodicCollector(5.0, clock=lambda: now[0])
    assert not collector.maybe_collect()
    now[0] += 4.9
    assert not collector.maybe_collect()
    now[0] += 0.2
    assert collector.maybe_collect() and collector.collections == 1
    assert not collector.maybe_collect()
    with pytest.raises(ValueError, match="interval"):
        PeriodicCollector(0)


def test_collector_freezes_start_up_objects_for_the_loop_only():
    gc.unfreeze()
    collector = PeriodicCollector(60.0).start()
    try:
        assert gc.get_freeze_count() > 0
        assert not collector.maybe_collect()
    finally:
        collector.stop()
    assert gc.get_freeze_count() == 0


def test_collector_still_frees_cycles_made_during_the_loop():
    class Node:
        pass

    now = [0.0]
    collector = PeriodicCollector(1.0, clock=lambda: now[0]).start()
    try:
        node = Node()
        node.self = node
        ref = weakref.ref(node)
        del node
        assert ref() is not None
        now[0] += 1.5
        assert collector.maybe_collect()
        assert ref() is None
    finally:
        collector.stop()
