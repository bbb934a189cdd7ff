"""CPU seconds the server process and the leaf processes spend in each round or version window.

Wall-time parts (:mod:`devsim.observe.timing`) say where the server *waits*; CPU seconds say what the work
costs, and together they show whether a run is bound by its processes' CPU or by the gaps between them.
Divided by the window's device updates they give CPU milliseconds per update, comparable across methods
(``benchmarks/async_throughput.py``); over ``wall x cores`` they give how busy the machine was.

- The server's figure is its own process's CPU time (``time.process_time()``: every thread, NVFlare's
  messaging included; in ``sim`` mode that process also runs NVFlare's simulator server).
- Each leaf puts its process CPU time at the moment it replies into the reply's ``timing``
  (``leaf_cpu_seconds``, :func:`leaf_cpu_now`). A window's leaf figure is, summed over leaves, the growth of
  that value since the last reply counted before the window. A leaf's first reply only sets its
  baseline (its start-up is not a window's work), and a leaf that does not reply in a window adds its
  CPU to the window of its next reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

LEAF_CPU_KEY = "leaf_cpu_seconds"


def leaf_cpu_now() -> float:
    """This process's CPU seconds so far (user + system, every thread), for a reply's ``timing``."""
    return time.process_time()


class CpuLedger:
    """Server and leaf CPU seconds per window; memory is one float per leaf.

    Args:
        clock: the server process's CPU clock in seconds (tests inject one).
    """

    def __init__(self, clock: Callable[[], float] = time.process_time):
        self._clock = clock
        self._server_mark = clock()
        self._leaf_latest: dict[str, float] = {}
        self._leaf_mark: dict[str, float] = {}

    def leaf_reply(self, leaf: str, timing: Mapping[str, float]) -> None:
        """Note a leaf reply's ``timing`` (replies without ``leaf_cpu_seconds`` are ignored)."""
        value = timing.get(LEAF_CPU_KEY)
        if value is None:
            return
        value = float(value)
        self._leaf_latest[leaf] = max(value, self._leaf_latest.get(leaf, value))
        self._leaf_mark.setdefault(leaf, value)

    def close(self) -> dict[str, float]:
        """The window's ``server_cpu_seconds`` and ``leaf_cpu_seconds`` (s, >= 0); the next window starts now."""
        now = self._clock()
        server, self._server_mark = max(0.0, now - self._server_mark), now
        leaves = sum(max(0.0, latest - self._leaf_mark[leaf]) for leaf, latest in self._leaf_latest.items())
        self._leaf_mark = dict(self._leaf_latest)
        return {"server_cpu_seconds": server, "leaf_cpu_seconds": leaves}
