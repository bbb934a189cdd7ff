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
- Of that, the CPU its threads spent training devices (``leaf_train_cpu_seconds``: each training call's own
  thread CPU, :data:`TRAINING`) and how many training calls it made (``leaf_training_groups``: one per batched
  group, one per device trained alone) are counted the same way. So a window splits a leaf's CPU into training
  and everything else (NVFlare's messaging, decoding, the leaf's bookkeeping), and ``updates /
  leaf_training_groups`` is the mean size of the groups the leaves trained: small groups pay the batched
  step's fixed cost over fewer devices.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

LEAF_CPU_KEY = "leaf_cpu_seconds"
TRAIN_CPU_KEY = "leaf_train_cpu_seconds"
GROUPS_KEY = "leaf_training_groups"
LEAF_COUNTERS = (LEAF_CPU_KEY, TRAIN_CPU_KEY, GROUPS_KEY)


def leaf_cpu_now() -> float:
    """This process's CPU seconds so far (user + system, every thread), for a reply's ``timing``."""
    return time.process_time()


class TrainingTally:
    """Thread CPU seconds spent in device training calls, and how many calls, since the process started.

    Safe to add to from several training threads at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cpu_seconds = 0.0
        self.groups = 0

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Count the body as one training call: its calling thread's CPU seconds (``time.thread_time``)."""
        started = time.thread_time()
        try:
            yield
        finally:
            spent = time.thread_time() - started
            with self._lock:
                self.cpu_seconds += spent
                self.groups += 1

    def counters(self) -> dict[str, float]:
        """``leaf_train_cpu_seconds`` and ``leaf_training_groups`` so far, for a reply's ``timing``."""
        with self._lock:
            return {TRAIN_CPU_KEY: self.cpu_seconds, GROUPS_KEY: float(self.groups)}


TRAINING = TrainingTally()
"""This process's training tally (leaf processes report it with every reply)."""


def leaf_counters_now() -> dict[str, float]:
    """Every cumulative counter a leaf reply carries in its ``timing``: process CPU and the training tally."""
    return {LEAF_CPU_KEY: leaf_cpu_now(), **TRAINING.counters()}


class CpuLedger:
    """Server and leaf CPU seconds per window, and the leaves' training CPU and groups; memory is three floats
    per leaf.

    Args:
        clock: the server process's CPU clock in seconds (tests inject one).
    """

    def __init__(self, clock: Callable[[], float] = time.process_time):
        self._clock = clock
        self._server_mark = clock()
        self._leaf_latest: dict[tuple[str, str], float] = {}
        self._leaf_mark: dict[tuple[str, str], float] = {}

    def leaf_reply(self, leaf: str, timing: Mapping[str, float]) -> None:
        """Note a leaf reply's ``timing``: each of :data:`LEAF_COUNTERS` it carries (others are ignored)."""
        for key in LEAF_COUNTERS:
            value = timing.get(key)
            if value is None:
                continue
            value = float(value)
            slot = (leaf, key)
            self._leaf_latest[slot] = max(value, self._leaf_latest.get(slot, value))
            self._leaf_mark.setdefault(slot, value)

    def close(self) -> dict[str, float]:
        """The window's ``server_cpu_seconds`` and, summed over leaves, the growth of each of :data:`LEAF_COUNTERS`
        (``leaf_cpu_seconds``, ``leaf_train_cpu_seconds`` in s, ``leaf_training_groups``; all >= 0); the next
        window starts now."""
        now = self._clock()
        server, self._server_mark = max(0.0, now - self._server_mark), now
        grown = dict.fromkeys(LEAF_COUNTERS, 0.0)
        for (leaf, key), latest in self._leaf_latest.items():
            grown[key] += max(0.0, latest - self._leaf_mark[(leaf, key)])
        self._leaf_mark = dict(self._leaf_latest)
        return {"server_cpu_seconds": server, **grown}
