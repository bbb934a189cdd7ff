"""Frequent, cheap full garbage collection for long-running server and leaf processes.

NVFlare 2.9 allocates a chunk-sized buffer for every message stream it sends, held in a reference
cycle between the stream's sender and its result, so it is freed only by a full (generation 2)
collection. In a process with a few hundred thousand long-lived objects (NVFlare plus PyTorch,
~195,000 tracked objects) such a collection takes ~50 ms and Python runs it rarely; between two of
them a fast job (a round every 0.1 s) leaves tens of MB of dead buffers, which glibc then keeps as
resident memory (``benchmarks/memory_growth.py``). The leaves send a reply stream every round and
keep their buffers the same way.

:class:`PeriodicCollector` therefore moves every object alive when the loop starts into the permanent
generation (``gc.freeze``, after one full collection so that nothing dead is frozen) for the length
of the loop. A full collection then only traverses objects created since, which takes microseconds to
a few milliseconds, so it can run every ``interval`` seconds (default 1 s). :meth:`PeriodicCollector.stop`
unfreezes them, so objects that die later are collected as usual. The servers freeze for their run
loop; a leaf freezes after its start-up for the rest of its (per-job) process and collects at the
start of each call.

A process that starts by importing NVFlare and PyTorch (a job command, a fork server, a warm parent) grows from
nothing to a few hundred thousand objects, and Python runs a full collection each time the long-lived objects have
grown by a quarter: five or six collections of a growing heap, 0.15-0.5 s of CPU a process on the 2-core CPU, that
found 0-25 objects to free. :func:`pause_for_imports` turns automatic collection off for that phase and
:func:`resume_after_imports` freezes what it imported and turns collection back on: a job command once it reads its
flags, a fork server or warm parent once its imports are taken. A child forked before that turns it on itself, as a
new interpreter would (:func:`devsim_flare.launch.forked_child.become`).
"""

from __future__ import annotations

import gc
import time

DEFAULT_INTERVAL_S = 1.0

_paused_for_imports: list[bool] = []
"""Holds one entry while :func:`pause_for_imports` has automatic collection off."""


def pause_for_imports() -> None:
    """Turn automatic garbage collection off while this process imports what it needs to start (see the module
    docstring); :func:`resume_after_imports` turns it back on. Does nothing when it is already off."""
    if gc.isenabled() and not _paused_for_imports:
        gc.disable()
        _paused_for_imports.append(True)


def resume_after_imports() -> None:
    """After :func:`pause_for_imports`: move every object alive now into the permanent generation (the imported
    modules, classes and functions, which later collections then skip) and turn automatic collection back on.
    Does nothing when collection was not paused here."""
    if _paused_for_imports:
        _paused_for_imports.clear()
        gc.freeze()
        gc.enable()


class PeriodicCollector:
    """Runs ``gc.collect()`` when at least ``interval`` seconds have passed since the last one.

    :meth:`start` collects and freezes the objects alive then (see the module docstring); :meth:`stop`
    unfreezes them.

    Args:
        interval: seconds between full collections (> 0).
        clock: monotonic clock in seconds (tests inject one).
    """

    def __init__(self, interval: float = DEFAULT_INTERVAL_S, clock=time.monotonic):
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self.interval = float(interval)
        self._clock = clock
        self._last = clock()
        self.collections = 0

    def start(self) -> PeriodicCollector:
        """Collect once, then freeze every surviving object until :meth:`stop`; returns self."""
        gc.collect()
        gc.freeze()
        self._last = self._clock()
        return self

    def stop(self) -> None:
        """Unfreeze: objects frozen by :meth:`start` are collected as usual again."""
        gc.unfreeze()

    def maybe_collect(self) -> bool:
        """Collect if the interval has passed; True when a collection ran."""
        now = self._clock()
        if now - self._last < self.interval:
            return False
        gc.collect()
        self._last = self._clock()
        self.collections += 1
        return True
