"""Which device jobs an asynchronous run will dispatch from its current model version, before it does.

The K/B/O scheduler is a pure function of the seed and of which arrivals are accepted, so a copy of it, driven
forward with a guess of the acceptances, names the jobs the real run will dispatch from the current version
until the version changes: their job ids, devices, seeds and base version, all known now, while the version's
weights are too. A server can send them to the leaves at once, so they train while the server is still taking
the arrivals that lead to them. A wrong guess (an update rejected, a leaf lost) only wastes the jobs predicted
after it: the real scheduler still decides, and a predicted job counts only when the real one equals it.
"""

from __future__ import annotations

from collections.abc import Callable

from devsim.clock.scheduler import AsyncScheduler, DeviceJob


def dispatches_ahead(scheduler: AsyncScheduler, accepted: Callable[[DeviceJob], bool], limit: int) -> list[DeviceJob]:
    """The jobs ``scheduler`` will dispatch from its current version, in dispatch order, at most ``limit``.

    ``accepted(job)`` guesses whether an arriving job's update will be accepted. Stops when the version would
    change (later dispatches start from weights not known yet), when the run would end or nothing is in flight.
    ``scheduler`` itself is not changed.
    """
    twin = scheduler.fork()
    jobs: list[DeviceJob] = []
    while len(jobs) < limit:
        job = twin.next_arrival()
        if job is None:
            break
        if accepted(job) and twin.record_accepted(job):
            break
        jobs.extend(twin.dispatch_open())
    return jobs[:limit]
