"""When an asynchronous run can no longer learn: too many arrivals in a row without an accepted update.

A synchronous round fails when too few of its devices answered (:func:`~devsim.population.dropout.min_devices_check`).
An asynchronous run has no round: every arrival that is dropped, lost or rejected frees its slot and the scheduler
dispatches another job from the same model version. If every update is rejected (a learning rate that turns every
update into NaN, an injected fault on every device), no version ever comes and the run would go on forever.
:class:`StallGuard` ends it with a reason instead, and keeps the console readable meanwhile by printing only the
first rejections of each version.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from devsim.population.dropout import RoundFailedError

MIN_STALL_ARRIVALS = 1000
"""Arrivals in a row without an accepted update that end a run, at least; :class:`StallGuard` takes the larger of
this and 10 x the concurrency. With devices that fail at random (``--device-dropout 0.9``, one answer in ten), such a
streak has a probability of about 1e-46."""

PRINTED_REJECTIONS = 10
"""Rejections printed per model version; the rest are counted (``failed_rejected`` in the run's records)."""


class StallError(RoundFailedError):
    """An asynchronous run stopped accepting updates: nothing it trains can become a new version."""


class StallGuard:
    """Counts arrivals since the last accepted update and raises :class:`StallError` past the limit.

    ``concurrency`` is the run's K (jobs in flight); the limit is ``max(MIN_STALL_ARRIVALS, 10 * concurrency)``
    arrivals. ``counts`` returns the run's failure counters so far (name -> count, e.g. ``{"rejected": 12,
    "dropped": 3}``) and its rejections by category (e.g. ``{"non_finite": 12}``); the error names how each grew
    since the last accepted update. Call :meth:`reset` once the counters hold the run's start (after a resume).
    """

    def __init__(
        self,
        concurrency: int,
        counts: Callable[[], tuple[Mapping[str, int], Mapping[str, int]]],
        limit: int | None = None,
    ):
        if limit is None:
            limit = max(MIN_STALL_ARRIVALS, 10 * int(concurrency))
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = int(limit)
        self._counts = counts
        self.streak = 0
        """Arrivals since the last accepted update."""
        self._since: tuple[dict[str, int], dict[str, int]] = ({}, {})
        self._printed: tuple[int, int] = (-1, 0)

    def reset(self) -> None:
        """The streak starts again from the counters as they are now."""
        self.streak = 0
        failures, rejections = self._counts()
        self._since = (dict(failures), dict(rejections))

    def accepted(self) -> None:
        """An update was accepted: a streak ends (:meth:`reset`). Without one the counters have not moved since the
        last reset (only a missed arrival moves them), so there is nothing to take again."""
        if self.streak:
            self.reset()

    def missed(self, version: int) -> None:
        """An arrival gave no update: count it; at the limit raise :class:`StallError` naming the counters' growth
        since the last accepted update."""
        self.streak += 1
        if self.streak < self.limit:
            return
        failures, rejections = self._counts()
        grown = {name: int(count) - self._since[0].get(name, 0) for name, count in failures.items()}
        kinds = {kind: int(count) - self._since[1].get(kind, 0) for kind, count in rejections.items()}
        detail = ", ".join(f"{kind.replace('_', '-')} {count}" for kind, count in kinds.items() if count > 0)
        parts = [
            f"{name} {count}: {detail}" if name == "rejected" and detail else f"{name.replace('_', ' ')} {count}"
            for name, count in grown.items()
            if count > 0
        ]
        raise StallError(
            f"version {version}: none of the last {self.streak} arriving device updates was accepted "
            f"({'; '.join(parts) or 'no failure counted'}), so no new version can come; see the lines above "
            "(a learning rate too high, a fault on every device, every leaf lost)"
        )

    def printable(self, version: int, line: str) -> str | None:
        """``line`` (a rejection at ``version``) as it should be printed: as is for the first
        :data:`PRINTED_REJECTIONS` of a version, the last of them saying the rest are counted, None after."""
        seen_version, count = self._printed
        count = count + 1 if seen_version == version else 1
        self._printed = (version, count)
        if count < PRINTED_REJECTIONS:
            return line
        if count == PRINTED_REJECTIONS:
            return f"{line} (further rejections at version {version} are counted in failed_rejected, not printed)"
        return None
