"""Gathering an asynchronous run's device jobs into few, large leaf calls, and sending predicted jobs early.

Sending each dispatch to its leaf at once costs one leaf call per device job (the K/B/O scheduler refills
one slot per arrival when O = 1), and a call costs far more than training one small device. A
:class:`JobGatherer` holds jobs until ``send_at`` are gathered, or until the server needs the result of one
of them, or until one more base version would make a call carry more than ``max_call_versions`` models, and
then hands them over as one batch (one call per leaf, several base versions stacked).

With :func:`devsim.clock.lookahead.dispatches_ahead` the server also *guesses* the jobs its scheduler will
dispatch from the current version and gathers them at once (:meth:`JobGatherer.guess`), so they train while
the arrivals that will dispatch them are still being taken. A guessed job counts only when the real dispatch
equals it (:meth:`JobGatherer.dispatched`); a wrong guess is dropped (unsent) or its result marked ``stale``
(sent). What is gathered and when it is sent depends only on the scheduler's seeded sequence, so two runs
with the same seed send the same calls and train the same batched groups.
"""

from __future__ import annotations

from devsim.clock.scheduler import DeviceJob

JobKey = tuple[int, int, int]


def job_key(job: DeviceJob) -> JobKey:
    """What identifies a job's training: (job id, device, base version); its seed follows from the job id."""
    return (job.job_id, job.device_id, job.base_version)


class JobGatherer:
    """Held jobs, guessed jobs and the batches ready to send.

    Args:
        send_at: jobs gathered before a batch is ready (>= 1; 1 sends every dispatch at once).
        max_call_versions: most distinct base versions one batch may need (>= 1).
    """

    def __init__(self, send_at: int, max_call_versions: int):
        if send_at < 1 or max_call_versions < 1:
            raise ValueError(f"send_at and max_call_versions must be >= 1, got {send_at}, {max_call_versions}")
        self.send_at = int(send_at)
        self.max_call_versions = int(max_call_versions)
        self._held: dict[JobKey, DeviceJob] = {}
        self._held_versions: set[int] = set()
        self._guessed: dict[int, DeviceJob] = {}
        self._ready: list[list[DeviceJob]] = []
        self.stale: set[JobKey] = set()

    @property
    def held(self) -> int:
        """Jobs gathered and not yet handed over."""
        return len(self._held)

    def holds(self, job: DeviceJob) -> bool:
        """Whether ``job`` is gathered and not yet handed over."""
        return job_key(job) in self._held

    def add(self, jobs: list[DeviceJob]) -> None:
        """Gather ``jobs`` (ones the caller will send); batches become ready as the limits are reached."""
        for job in jobs:
            if job.base_version not in self._held_versions and len(self._held_versions) >= self.max_call_versions:
                self.flush()
            self._held[job_key(job)] = job
            self._held_versions.add(job.base_version)
            if len(self._held) >= self.send_at:
                self.flush()

    def dispatched(self, jobs: list[DeviceJob], sendable: list[bool]) -> bool:
        """Real dispatches: those equal to a guess are already gathered or sent; the rest (when ``sendable``)
        are gathered. Returns whether any job had not been guessed right."""
        fresh: list[DeviceJob] = []
        unguessed = False
        for job, send in zip(jobs, sendable, strict=True):
            guess = self._guessed.pop(job.job_id, None)
            if guess == job:
                continue
            unguessed = True
            if guess is not None:
                self._forget(guess)
            if send:
                fresh.append(job)
        self.add(fresh)
        return unguessed

    def guess(self, jobs: list[DeviceJob], sendable: list[bool]) -> None:
        """Jobs the scheduler is expected to dispatch: gather the new ones (when ``sendable``); a different
        earlier guess under the same job id is forgotten."""
        new = []
        for job, send in zip(jobs, sendable, strict=True):
            known = self._guessed.get(job.job_id)
            if known == job:
                continue
            if known is not None:
                self._forget(known)
            self._guessed[job.job_id] = job
            if send:
                new.append(job)
        self.add(new)

    def flush(self) -> None:
        """Make everything held one ready batch (the server needs one of them now, or a limit was reached)."""
        if self._held:
            self._ready.append(list(self._held.values()))
        self._held, self._held_versions = {}, set()

    def take_ready(self) -> list[list[DeviceJob]]:
        """The batches ready to send, oldest first; they are handed over (not returned again)."""
        ready, self._ready = self._ready, []
        return ready

    def clear(self) -> None:
        """Forget everything (end of the run)."""
        self._held, self._held_versions, self._guessed, self._ready = {}, set(), {}, []
        self.stale.clear()

    def _forget(self, guess: DeviceJob) -> None:
        """A guess the real run did not make: unsent, it is dropped; sent, its result is stale."""
        key = job_key(guess)
        if key in self._held:
            del self._held[key]
            self._held_versions = {job.base_version for job in self._held.values()}
            return
        for batch in self._ready:
            if guess in batch:
                batch.remove(guess)
                return
        self.stale.add(key)
