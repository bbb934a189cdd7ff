"""Shorter waits in NVFlare's simulator process on the way to the first round.

NVFlare 2.9's simulator runner (``nvflare.private.fed.app.simulator.simulator_runner``) waits with fixed
one-second sleeps at three points before a leaf can start: it polls for the server app's start every 1.0 s,
each client thread sleeps 1.0 s before it launches its leaf's worker process, and it retries the connection
to that worker every 1.0 s while the worker imports. Each is a poll for something that happens in a fraction of
a second, so a run pays up to ~3 s of sleeping before its leaves set up.

:func:`shorten_simulator_polls` swaps the ``time`` module that the runner module sees for one whose ``sleep``
lasts at most :data:`POLL_SECONDS`; every other ``time`` function is the real one. Only waits in that module
change, and each of them is a loop that re-checks its condition, so the run is the same, only sooner.

The ``devsim_flare`` package calls :func:`shorten_simulator_polls_by_default` when it is first imported.
In the simulator's server process that happens when NVFlare scans the server app's classes, a tenth of a
second after it deploys the app and before the first of those polls ends; the runner module is loaded there and
the polls become short. Where it is not loaded (the job command, POC, production, the leaves) nothing changes.
``DEVSIM_RUNTIME_ENV_DEFAULTS=0`` keeps NVFlare's waits. The leaf worker module is left alone: its sleeps
pace the worker's task polling for the whole run.
"""

from __future__ import annotations

import sys
import time
from types import ModuleType
from typing import Any

from devsim_flare.runtime_defaults import runtime_defaults_enabled

RUNNER_MODULE = "nvflare.private.fed.app.simulator.simulator_runner"
POLL_SECONDS = 0.05


class _ShortSleepTime:
    """The ``time`` module with ``sleep`` capped at ``cap`` seconds."""

    def __init__(self, cap: float) -> None:
        self.cap = cap

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.cap))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def shorten_simulator_polls(cap: float = POLL_SECONDS) -> bool:
    """Cap the sleeps of NVFlare's simulator runner at ``cap`` seconds when it runs in this process.

    Returns True when the runner module is loaded here (a simulator process) and now sleeps briefly.
    Idempotent.
    """
    runner: ModuleType | None = sys.modules.get(RUNNER_MODULE)
    if runner is None or not hasattr(runner, "time"):
        return False
    if not isinstance(runner.time, _ShortSleepTime):
        runner.time = _ShortSleepTime(cap)
    return True


def shorten_simulator_polls_by_default() -> bool:
    """:func:`shorten_simulator_polls` unless ``DEVSIM_RUNTIME_ENV_DEFAULTS=0``."""
    return runtime_defaults_enabled() and shorten_simulator_polls()
