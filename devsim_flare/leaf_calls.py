"""Nonblocking Collab calls to single leaves, with every outcome collected in one queue.

Each call goes to one leaf with its own arguments (its own model in cluster runs, its own device
jobs in async runs). A reused daemon thread makes the (blocking) call and puts its outcome into a shared
queue, so the server waits in one place, with a timeout, for whichever leaf answers next.

The pool matters for speed: a nonblocking Collab call starts a thread of its own and a thread to drain
it would be a second; each ``Thread.start`` waits until the new thread holds the GIL, which, with the
reply threads busy decoding, cost the asynchronous server about 5 ms per call (py-spy). Reused threads
are started once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nvflare.collab import collab

PER_CALL_LOGGERS = ("nvflare.collab.runtime.cell_dispatcher.CellDispatcher", "nvflare.collab.api.group.Group")
"""NVFlare loggers that write INFO lines on every Collab call (three per leaf call on the server: an asynchronous
run of 100,000 device updates at 5 a call would log 60,000 lines), each line formatted and written while the run
waits."""


def quiet_per_call_logs() -> None:
    """Log only warnings and errors of :data:`PER_CALL_LOGGERS` in this process (failed calls are still logged)."""
    for name in PER_CALL_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


class LeafCallError(RuntimeError):
    """A leaf call failed or no answer came in time."""


class RunStopped(Exception):
    """A stop of the run was requested (a signal to the command) while the server waited for its leaves."""


class LeafLost(LeafCallError):
    """NVFlare reported the leaf gone (see :mod:`devsim_flare.leaf_liveness`) while a call to it was pending."""


POLL_SECONDS = 0.2
"""How often :meth:`LeafCalls.next` looks at the leaves' liveness and at the stop callback while it waits."""

LOSS_SETTLE_SECONDS = 1.0
"""How long a failed call waits for the liveness check to explain it: a leaf killed mid-call (or between calls)
fails its call with NVFlare's bare communication error, sometimes before NVFlare has dropped the leaf's cell."""


@dataclass
class LeafOutcome:
    """The answer (or failure) of one call: ``tag`` is whatever the caller attached to it."""

    leaf: str
    tag: Any
    result: Any = None
    error: BaseException | None = None


class _DaemonThreads:
    """Reused daemon threads for blocking calls: a thread is started only when none is idle. Daemon threads, unlike
    ``ThreadPoolExecutor``'s, never hold up the process's exit behind a call that is still waiting for its leaf."""

    def __init__(self, name: str):
        self.name = name
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0

    def submit(self, function: Callable[..., None], *args: Any) -> None:
        with self._lock:
            start = self._idle == 0
            if start:
                self._threads += 1
            else:
                self._idle -= 1
        self._work.put((function, args))
        if start:
            threading.Thread(target=self._serve, daemon=True, name=f"{self.name}-{self._threads}").start()

    def close(self) -> None:
        """Let every thread end once it is idle (calls in progress finish first)."""
        with self._lock:
            count, self._threads, self._idle = self._threads, 0, 0
        for _ in range(count):
            self._work.put(None)

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            function, args = item
            function(*args)
            with self._lock:
                self._idle += 1


class LeafCalls:
    """Submit calls to leaves; take outcomes in completion order. :meth:`close` ends the pool's threads.

    ``call_timeout`` (seconds) bounds each call and may be changed between calls (see
    :class:`devsim.observe.round_timeout.RoundTimeout`). ``liveness``
    (a :class:`~devsim_flare.leaf_liveness.LeafLiveness`) is polled while waiting: a call to a leaf NVFlare reports
    gone ends at once with :class:`LeafLost`. ``stop`` is polled too: when it returns a reason, :meth:`next` raises
    :class:`RunStopped`.
    """

    def __init__(self, call_timeout: float, liveness=None, stop: Callable[[], str | None] | None = None):
        self.call_timeout = float(call_timeout)
        self.liveness = liveness
        self.stop = stop
        self._outcomes: queue.Queue[LeafOutcome] = queue.Queue()
        self._outstanding: dict = {}  # tag -> leaf
        self._threads = _DaemonThreads("leaf-call")

    @property
    def pending(self) -> int:
        """Calls submitted and neither answered nor forgotten."""
        return len(self._outstanding)

    def forget(self, tags) -> None:
        """Stop waiting for calls with these tags; their late outcomes are dropped when they arrive."""
        for tag in tags:
            self._outstanding.pop(tag, None)

    def submit(self, leaf: str, method: str, tag: Any, **kwargs: Any) -> None:
        """Start ``leaf.method(**kwargs)`` without waiting; its outcome will carry ``tag`` (hashable, unique
        among pending calls)."""
        group = collab.get_clients([leaf])(blocking=True, timeout=self.call_timeout)  # in the caller's context
        self._outstanding[tag] = leaf
        self._threads.submit(self._call, leaf, tag, getattr(group, method), kwargs)

    def next(self, timeout: float | None = None) -> LeafOutcome:
        """The next finished call; raises LeafCallError when none finishes within ``timeout`` seconds.

        A pending call to a leaf that the liveness check finds gone finishes with a :class:`LeafLost` error (one
        outcome per such call); the stop callback ends the wait with :class:`RunStopped`."""
        if not self._outstanding:
            raise LeafCallError("no leaf call is pending")
        wait = self.call_timeout + 30.0 if timeout is None else timeout
        deadline = time.monotonic() + wait
        while True:
            lost = self._lost_call()
            if lost is not None:
                return lost
            reason = self.stop() if self.stop is not None else None
            if reason:
                raise RunStopped(reason)
            left = deadline - time.monotonic()
            try:
                outcome = self._outcomes.get(timeout=max(0.0, min(left, POLL_SECONDS)))
            except queue.Empty as error:
                if left > POLL_SECONDS:
                    continue
                raise LeafCallError(f"no leaf answered within {wait:g}s ({self.pending} calls pending)") from error
            if outcome.tag in self._outstanding:
                del self._outstanding[outcome.tag]
                if outcome.error is not None:
                    outcome.error = self._explained(outcome.leaf, outcome.error)
                return outcome

    def _explained(self, leaf: str, error: BaseException) -> BaseException:
        """``error`` as a :class:`LeafLost` naming NVFlare's signal when the liveness check finds ``leaf`` gone within
        :data:`LOSS_SETTLE_SECONDS`; otherwise ``error`` unchanged (a leaf that is alive and failed its call)."""
        if self.liveness is None or isinstance(error, LeafLost):
            return error
        deadline = time.monotonic() + LOSS_SETTLE_SECONDS
        while True:
            self.liveness.check()
            if leaf in self.liveness.lost:
                detail = str(error) or type(error).__name__
                return LeafLost(f"{self.liveness.lost[leaf]}; its call failed with: {detail}")
            if time.monotonic() >= deadline:
                return error
            time.sleep(0.05)

    def _lost_call(self) -> LeafOutcome | None:
        """A pending call to a leaf the liveness check reports lost, ended with a :class:`LeafLost` error (no
        longer pending); None when there is none."""
        if self.liveness is None:
            return None
        self.liveness.check()
        lost = self.liveness.lost
        for tag, leaf in list(self._outstanding.items()):
            if leaf in lost:
                del self._outstanding[tag]
                return LeafOutcome(leaf, tag, error=LeafLost(lost[leaf]))
        return None

    def close(self) -> None:
        """Forget pending calls and let the threads end; calls in progress end by their own timeout, and their
        outcomes are dropped."""
        self._outstanding.clear()
        self._threads.close()

    def _call(self, leaf: str, tag: Any, call, kwargs: dict) -> None:
        try:
            results = call(**kwargs)
            for _, value in results:
                self._outcomes.put(LeafOutcome(leaf, tag, result=value))
                return
            failures = getattr(results, "failures", {}) or {}
            error = failures.get(leaf) or LeafCallError(f"leaf {leaf} returned no result")
            self._outcomes.put(LeafOutcome(leaf, tag, error=error))
        except BaseException as error:  # noqa: BLE001 - every failure must reach the waiting server
            self._outcomes.put(LeafOutcome(leaf, tag, error=error))
