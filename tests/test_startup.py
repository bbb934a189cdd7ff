"""The start-up clock's stamps and stages (no NVFlare)."""

from __future__ import annotations

from devsim.observe.startup import COMMAND_STARTED_ENV, StartupClock, add_exit, stamp_command_start


def test_stages_are_differences_of_first_stamps(monkeypatch):
    monkeypatch.setenv(COMMAND_STARTED_ENV, "100.0")
    clock = StartupClock()
    clock.stamps.update(server_process_started=102.0, server_run_started=110.0)
    clock.mark("server_ready")
    clock.stamps["server_ready"] = 111.5
    clock.mark("server_ready")
    clock.stamps.update(first_round_started=111.5, first_round_finished=112.0, last_round_finished=130.0)
    seconds = clock.record()["seconds"]
    assert seconds["command_to_server_process"] == 2.0 and seconds["server_process_to_run"] == 8.0
    assert seconds["run_to_ready"] == 1.5 and seconds["command_to_first_round"] == 11.5
    ended = add_exit(clock.record(), 133.0)
    assert ended["seconds"]["last_round_to_exit"] == 3.0 and ended["stamps"]["command_exit"] == 133.0


def test_without_the_command_stamp_its_stages_are_none(monkeypatch):
    monkeypatch.delenv(COMMAND_STARTED_ENV, raising=False)
    seconds = StartupClock().record()["seconds"]
    assert seconds["command_to_server_process"] is None and seconds["command_to_first_round"] is None


def test_the_command_stamp_is_kept_once_set(monkeypatch):
    monkeypatch.setenv(COMMAND_STARTED_ENV, "5.0")
    stamp_command_start()
    assert StartupClock().stamps["command_started"] == 5.0
