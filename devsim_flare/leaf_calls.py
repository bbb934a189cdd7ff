"""Nonblocking Collab calls to single leaves, with every outcome collected in one queue.

Each call goes to one leaf with its own arguments (its own model in cluster runs, its own device
jobs in async runs). A short-lived thread drains the call's result stream into a shared queue,
so the server waits in one place, with a timeout, for whichever leaf answers next.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from nvflare.collab import collab


class LeafCallError(RuntimeError):
    """A leaf call failed or no answer came in time."""


@dataclass
class LeafOutcome:
    """The answer (or failure) of one call: ``tag`` is whatever the caller attached to it."""

    leaf: str
    tag: Any
    result: Any = None
    error: BaseException | None = None


class LeafCalls:
    """Submit calls to leaves; take outcomes in completion order."""

    def __init__(self, call_timeout: float):
        self.call_timeout = float(call_timeout)
        self._outcomes: queue.Queue[LeafOutcome] = queue.Queue()
        self._outstanding: set = set()

    @property
    def pending(self) -> int:
        """Calls submitted and neither answered nor forgotten."""
        return len(self._outstanding)

    def forget(self, tags) -> None:
        """Stop waiting for calls with these tags; their late outcomes are dropped when they arrive."""
        self._outstanding.difference_update(tags)

    def submit(self, leaf: str, method: str, tag: Any, **kwargs: Any) -> None:
        """Start ``leaf.method(**kwargs)`` without waiting; its outcome will carry ``tag`` (hashable, unique
        among pending calls)."""
        group = collab.get_clients([leaf])(blocking=False, timeout=self.call_timeout)
        stream = getattr(group, method)(**kwargs)
        self._outstanding.add(tag)
        threading.Thread(target=self._drain, args=(leaf, tag, stream), daemon=True, name=f"leaf-call-{leaf}").start()

    def next(self, timeout: float | None = None) -> LeafOutcome:
        """The next finished call; raises LeafCallError when none finishes within ``timeout`` seconds."""
        if not self._outstanding:
            raise LeafCallError("no leaf call is pending")
        wait = self.call_timeout + 30.0 if timeout is None else timeout
        deadline = time.monotonic() + wait
        while True:
            try:
                outcome = self._outcomes.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty as error:
                raise LeafCallError(f"no leaf answered within {wait:g}s ({self.pending} calls pending)") from error
            if outcome.tag in self._outstanding:
                self._outstanding.discard(outcome.tag)
                return outcome

    def _drain(self, leaf: str, tag: Any, stream) -> None:
        try:
            for _, value in stream:
                self._outcomes.put(LeafOutcome(leaf, tag, result=value))
                return
            failures = getattr(stream, "failures", {}) or {}
            error = failures.get(leaf) or LeafCallError(f"leaf {leaf} returned no result")
            self._outcomes.put(LeafOutcome(leaf, tag, error=error))
        except BaseException as error:  # noqa: BLE001 - every failure must reach the waiting server
            self._outcomes.put(LeafOutcome(leaf, tag, error=error))
