"""A stop of a running job, asked by the command that started it and honoured by the server between rounds.

The command (sim, POC: the server runs on this host and writes into the run's ``--output-dir``) writes
:data:`STOP_FILE` into the run folder when it gets SIGINT or SIGTERM; the server polls for the file, ends the run
at the next safe point (a synchronous round in flight is abandoned, an asynchronous run stops at its next model
version), writes its checkpoint and results, and records ``stopped`` in ``results.json`` so the command knows it
may stop the processes. A file is a signal both sides can see across NVFlare's process tree, whatever process
groups and sessions NVFlare puts its processes in.
"""

from __future__ import annotations

import contextlib
import os
import time

STOP_FILE = "stop_requested"
"""Name of the request file inside the run's output folder; it holds one line: why (e.g. ``SIGINT``)."""


def request_stop(output_dir: str, reason: str) -> str:
    """Ask the server writing into ``output_dir`` to stop (atomic write); returns the file's path."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, STOP_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as stream:
        stream.write(reason + "\n")
    os.replace(tmp, path)
    return path


def clear_stop(output_dir: str | None) -> None:
    """Remove a stop request left in ``output_dir`` (before a run starts there, and once it has ended)."""
    if output_dir:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(output_dir, STOP_FILE))


class StopRequest:
    """Callable: the reason of a pending stop request in ``output_dir``, or None. Looks at the folder at most once
    every ``min_interval`` seconds (a stat call), so the server may call it as often as it likes."""

    def __init__(self, output_dir: str, min_interval: float = 0.1):
        self.path = os.path.join(output_dir, STOP_FILE)
        self.min_interval = min_interval
        self._checked = float("-inf")
        self.reason: str | None = None

    def __call__(self) -> str | None:
        if self.reason is None and time.monotonic() - self._checked >= self.min_interval:
            self._checked = time.monotonic()
            with contextlib.suppress(OSError):
                with open(self.path, encoding="utf-8") as stream:
                    self.reason = stream.read().strip() or "stop requested"
        return self.reason
