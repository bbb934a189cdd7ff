"""The server's memory tuning: garbage collection with frozen start-up objects."""

from __future__ import annotations

import gc
import weakref

import pytest

from devsim.resources.collection import PeriodicCollector, pause_for_imports, resume_after_imports


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


def test_imports_pause_automatic_collection_and_its_end_freezes_what_they_left(monkeypatch):
    assert gc.isenabled()
    freezes = []
    monkeypatch.setattr(gc, "freeze", lambda: freezes.append(True))  # counted (frozen objects can die meanwhile)
    try:
        pause_for_imports()
        assert not gc.isenabled()
        pause_for_imports()  # a second pause changes nothing
        resume_after_imports()
        assert gc.isenabled() and freezes == [True]
        resume_after_imports()  # no pause left: nothing happens
        assert gc.isenabled() and freezes == [True]
    finally:
        gc.enable()


def test_a_process_that_had_collection_off_keeps_it_off(monkeypatch):
    freezes = []
    monkeypatch.setattr(gc, "freeze", lambda: freezes.append(True))
    gc.disable()
    try:
        pause_for_imports()
        resume_after_imports()
        assert not gc.isenabled() and freezes == []
    finally:
        gc.enable()


def test_a_job_command_collects_again_once_it_reads_its_flags(tmp_path, monkeypatch, capsys):
    from devsim_flare.api import FedAvgRecipe

    monkeypatch.chdir(tmp_path)
    gc.unfreeze()
    pause_for_imports()  # as the job script does before its imports
    try:
        assert FedAvgRecipe.command_line(["--check", "--dataset", "digits", "--workspace", "ws"]) == 0
        assert gc.isenabled()
    finally:
        resume_after_imports()  # whatever happened above, the next test finds no pause left
        gc.enable()
        gc.unfreeze()
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("check: the flags, the task and the data pass")
