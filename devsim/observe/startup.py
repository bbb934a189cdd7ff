"""Where a run's start-up goes: wall-clock stamps from the user's command to the first round, and after the last.

The job command stamps its own process start into the environment (:data:`COMMAND_STARTED_ENV`), which the
processes it starts inherit (the simulator's server and leaves, POC sites started by it). The server marks its
own process start, the start of its run (NVFlare started it, the leaves have connected and set up: a Collab
server's ``main`` runs after every site's ``init``), when the task and model are ready, and the first and last
rounds (sync rounds, or async evaluation windows). The command adds, once the job has ended, the time from the
last round to its exit. Stamps are ``time.time()`` seconds; durations are differences of stamps on one host.
"""

from __future__ import annotations

import os
import time
from typing import Any

COMMAND_STARTED_ENV = "DEVSIM_COMMAND_STARTED"

STAGES = (
    ("command_to_server_process", "command_started", "server_process_started"),
    ("server_process_to_run", "server_process_started", "server_run_started"),
    ("run_to_ready", "server_run_started", "server_ready"),
    ("ready_to_first_round", "server_ready", "first_round_started"),
    ("first_round", "first_round_started", "first_round_finished"),
    ("command_to_first_round", "command_started", "first_round_started"),
)


def process_started() -> float:
    """This process's start time (``time.time()`` seconds), from the OS when it can tell, else now."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - without psutil or /proc the stamp is only less early
        return time.time()


def stamp_command_start() -> None:
    """Record the job command's process start for the processes it starts (kept when already set: a wrapper
    script that sets up an environment and then runs Python with ``exec`` sets it itself, since the process it
    replaced started before the set-up)."""
    os.environ.setdefault(COMMAND_STARTED_ENV, repr(process_started()))


class StartupClock:
    """Named stamps of one server process; the first stamp of each name counts."""

    def __init__(self) -> None:
        command = os.environ.get(COMMAND_STARTED_ENV)
        self.stamps: dict[str, float | None] = {
            "command_started": float(command) if command else None,
            "server_process_started": process_started(),
        }

    def mark(self, name: str) -> None:
        """Stamp ``name`` now unless it was stamped before."""
        self.stamps.setdefault(name, time.time())

    def round_finished(self, at: float) -> None:
        """A round (sync) or evaluation window (async) ended at ``at``: the first one's end and the latest."""
        self.stamps.setdefault("first_round_finished", at)
        self.stamps["last_round_finished"] = at

    def record(self) -> dict[str, Any]:
        """The stamps and the seconds between them (None where a stamp is missing)."""
        seconds = {}
        for stage, start, end in STAGES:
            first, last = self.stamps.get(start), self.stamps.get(end)
            seconds[stage] = None if first is None or last is None else last - first
        return {"stamps": dict(self.stamps), "seconds": seconds}


def add_exit(record: dict[str, Any], exited: float) -> dict[str, Any]:
    """``record`` (a results file's ``startup``) with the command's exit and ``last_round_to_exit`` seconds."""
    stamps = dict(record.get("stamps", {}))
    stamps["command_exit"] = exited
    last = stamps.get("last_round_finished")
    seconds = dict(record.get("seconds", {}))
    seconds["last_round_to_exit"] = None if last is None else exited - last
    return {"stamps": stamps, "seconds": seconds}
