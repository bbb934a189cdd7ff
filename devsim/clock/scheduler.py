"""The K/B/O asynchronous scheduler on a seeded virtual clock (no networking, no wall-clock time).

``K`` (``concurrency``) logical device jobs are in flight; a new global version is made after ``B``
(``buffer_size``) accepted updates; new jobs are dispatched only once ``O`` (``min_open_slots``)
slots are open, and then all open slots are filled. FedAvg-like synchronous rounds are
``K = B = O``; FedBuff in the paper is ``B = 2, O = 1``.

A job's arrival time is fixed when it is dispatched (download + train + upload sampled from the
device's profile with ``derive_rng(seed, "delay", job_id)``, plus, with a network model, the transfer
of ``download_bytes`` and ``upload_bytes`` over the device's link, see :mod:`devsim.clock.network`),
so the whole sequence of
dispatches and arrivals is a pure function of the seed and of which arrivals the caller accepts.
The caller may therefore train every in-flight job physically in parallel as soon as it is
dispatched, and consume results in the order :meth:`AsyncScheduler.next_arrival` gives.

Driving loop (the strategy is applied by the caller)::

    for job in scheduler.start(): launch(job)
    while (job := scheduler.next_arrival()) is not None:
        result = wait_for(job)
        staleness = scheduler.staleness(job)          # before record_accepted
        strategy.add(result.delta, staleness)
        if scheduler.record_accepted(job):            # version was just incremented
            global_weights = strategy.apply(global_weights)
        for new_job in scheduler.dispatch_open(): launch(new_job)

Memory: only the in-flight jobs (at most ``K``) are stored; nothing per device or per past job.

With a population model (``population``, :class:`devsim.population.heterogeneity.PopulationModel`),
only devices online at the dispatch time are picked, a job takes the model's ``download + work / speed
+ upload``, and a device whose session ends before its job arrives is ``dropped``: its slot opens when
the session ends (the server sees the device disconnect) and its result never counts. When nobody
is online and nothing is in flight, the clock jumps to the next time somebody is.

This module is longer than 400 lines on purpose: dispatch, arrival ordering, the optional population
and network models and the checkpoint state all act on the same heap of in-flight jobs, and split
apart they would share its private invariants.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from devsim.clock.network import NetworkModel
from devsim.clock.profiles import DelaySchedule, load_schedule, profile_for
from devsim.seeding import derive_rng, derive_seed


@dataclass(frozen=True)
class DeviceJob:
    """One logical device job: train ``device_id`` from global ``base_version``.

    Times are simulated seconds. ``arrival_time = dispatch_time + download_time + train_time +
    upload_time``; ``train_seed`` seeds the device's local training for this job. ``dropped``: the
    device's online session ended first (population model); ``arrival_time`` is then the session end.
    """

    job_id: int
    device_id: int
    base_version: int
    dispatch_time: float
    arrival_time: float
    train_seed: int
    download_time: float
    train_time: float
    upload_time: float
    dropped: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceJob:
        return cls(
            job_id=int(data["job_id"]),
            device_id=int(data["device_id"]),
            base_version=int(data["base_version"]),
            dispatch_time=float(data["dispatch_time"]),
            arrival_time=float(data["arrival_time"]),
            train_seed=int(data["train_seed"]),
            download_time=float(data["download_time"]),
            train_time=float(data["train_time"]),
            upload_time=float(data["upload_time"]),
            dropped=bool(data.get("dropped", False)),
        )


def _require_int(field: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{field} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {value}")
    return int(value)


class AsyncScheduler:
    """K/B/O dispatch and arrival ordering over a population of ``population_size`` devices.

    Args:
        population_size: devices ``0 .. population_size - 1``.
        schedule: a :class:`DelaySchedule` or a preset name / JSON path for :func:`load_schedule`.
        seed: run seed; every random draw derives from it.
        concurrency: ``K``, jobs in flight (``1 <= K <= population_size``).
        buffer_size: ``B``, accepted updates per new global version (``>= 1``).
        min_open_slots: ``O``, open slots needed before dispatching (``1 <= O <= K``).
        max_versions: stop once ``version >= max_versions`` (None: no version budget).
        max_time: stop once the clock reaches ``max_time`` simulated seconds (None: no time budget).
            An arrival later than ``max_time`` is never returned.
        network: link model; each job's download and upload times grow by the transfer of
            ``download_bytes`` / ``upload_bytes`` over its device's link (None: no transfer time).
        download_bytes: bytes a device downloads per job (the model).
        upload_bytes: bytes a device uploads per job (its encoded update).
        population: optional population model (availability, speeds, network classes); None: every
            device always online, delays from ``schedule``.
        work: samples one job processes (used by ``population`` to turn speeds into seconds).
    """

    def __init__(
        self,
        population_size: int,
        schedule: DelaySchedule | str,
        seed: int,
        concurrency: int,
        buffer_size: int,
        min_open_slots: int,
        max_versions: int | None = None,
        max_time: float | None = None,
        network: NetworkModel | None = None,
        download_bytes: int = 0,
        upload_bytes: int = 0,
        population: Any = None,
        work: float = 0.0,
    ):
        self.population = population
        self.work = float(work)
        self.population_size = _require_int("population_size", population_size, 1)
        self.concurrency = _require_int("concurrency", concurrency, 1)
        if self.concurrency > self.population_size:
            raise ValueError(f"concurrency (K={self.concurrency}) must be <= population_size ({self.population_size})")
        self.buffer_size = _require_int("buffer_size", buffer_size, 1)
        self.min_open_slots = _require_int("min_open_slots", min_open_slots, 1)
        if self.min_open_slots > self.concurrency:
            raise ValueError(f"min_open_slots (O={self.min_open_slots}) must be <= concurrency (K={self.concurrency})")
        if max_versions is None and max_time is None:
            raise ValueError("at least one of max_versions / max_time must be set")
        self.max_versions = None if max_versions is None else _require_int("max_versions", max_versions, 1)
        if max_time is not None and not (math.isfinite(max_time) and max_time > 0):
            raise ValueError(f"max_time must be a finite number > 0 (simulated seconds), got {max_time!r}")
        self.max_time = None if max_time is None else float(max_time)
        self.schedule = schedule if isinstance(schedule, DelaySchedule) else load_schedule(schedule)
        self.seed = int(seed)
        self.network = network if network is not None and network.enabled else None
        self.download_bytes = _require_int("download_bytes", download_bytes, 0)
        self.upload_bytes = _require_int("upload_bytes", upload_bytes, 0)

        self._heap: list[tuple[float, int, DeviceJob]] = []
        self._busy: dict[int, int] = {}  # in-flight device id -> its job id
        self._now = 0.0
        self._version = 0
        self._buffer_count = 0
        self._next_job_id = 0
        self._dispatch_counter = 0
        self._started = False
        self._arrived_total = 0
        self._accepted_total = 0
        self._dispatch_memo: dict[tuple, tuple[float, int, list[DeviceJob]]] | None = None
        """Dispatches a :meth:`fork` computed, by the state they started from: the real run takes one that matches
        its own state instead of drawing it again (a lookahead's twin dispatches what the run will)."""
        self._records_dispatches = False

    @property
    def now(self) -> float:
        """The virtual clock (simulated seconds)."""
        return self._now

    @property
    def version(self) -> int:
        """Current global model version (0 before the first aggregation)."""
        return self._version

    @property
    def in_flight(self) -> int:
        """Number of jobs dispatched and not yet arrived."""
        return len(self._heap)

    @property
    def open_slots(self) -> int:
        return self.concurrency - len(self._heap)

    @property
    def buffer_count(self) -> int:
        """Accepted updates since the last version increment."""
        return self._buffer_count

    @property
    def dispatched_total(self) -> int:
        return self._next_job_id

    @property
    def arrived_total(self) -> int:
        return self._arrived_total

    @property
    def accepted_total(self) -> int:
        return self._accepted_total

    @property
    def done(self) -> bool:
        """True once the version or time budget is reached."""
        if self.max_versions is not None and self._version >= self.max_versions:
            return True
        return self.max_time is not None and self._now >= self.max_time

    def start(self) -> list[DeviceJob]:
        """Dispatch ``K`` jobs at time 0 from version 0 (call once, not after ``load_state_dict``)."""
        if self._started:
            raise RuntimeError("AsyncScheduler.start() was already called")
        self._started = True
        return self._dispatch(self.concurrency)

    def next_arrival(self) -> DeviceJob | None:
        """Pop the earliest in-flight arrival (ties by ``job_id``) and advance the clock to it.

        The device becomes idle and its slot opens. Returns None when the budget is reached or
        nothing is in flight; when the earliest arrival is later than ``max_time`` the clock
        advances to ``max_time`` instead and None is returned (the job stays in flight).
        """
        self._require_started()
        if self.done or not self._heap:
            return None
        arrival_time, _, job = self._heap[0]
        if self.max_time is not None and arrival_time > self.max_time:
            self._now = self.max_time
            return None
        heapq.heappop(self._heap)
        self._busy.pop(job.device_id, None)
        self._now = arrival_time
        self._arrived_total += 1
        return job

    def staleness(self, job: DeviceJob) -> int:
        """Versions made since ``job`` was dispatched; call before :meth:`record_accepted`."""
        return self._version - job.base_version

    def record_accepted(self, job: DeviceJob) -> bool:
        """Count an accepted update of an arrived ``job``.

        Returns True when the buffer reached ``B``: the version has just been incremented (the
        caller applies the strategy now) and the buffer count is reset. Arrivals the caller rejects
        are simply not recorded.
        """
        self._require_started()
        if not 0 <= job.job_id < self._next_job_id:
            raise ValueError(f"job {job.job_id} was never dispatched by this scheduler")
        if self._busy.get(job.device_id) == job.job_id:
            raise ValueError(f"job {job.job_id} is still in flight; only arrived jobs can be accepted")
        self._accepted_total += 1
        self._buffer_count += 1
        if self._buffer_count < self.buffer_size:
            return False
        self._buffer_count = 0
        self._version += 1
        return True

    def dispatch_open(self) -> list[DeviceJob]:
        """Fill all open slots at ``now`` from the current version when at least ``O`` are open.

        Returns [] when fewer than ``O`` slots are open or the budget is reached.
        """
        self._require_started()
        if self.done or self.open_slots < self.min_open_slots:
            return []
        return self._dispatch(self.open_slots)

    def fork(self) -> AsyncScheduler:
        """An independent copy of the current state (in-flight jobs, clock, counters) sharing the immutable
        parts (schedule, network, population model): drive it to see which jobs this scheduler will dispatch."""
        twin = copy.copy(self)
        twin._heap = list(self._heap)
        twin._busy = dict(self._busy)
        twin._dispatch_memo = self._dispatch_memo = {}  # the last fork's only: at most its dispatches are held
        twin._records_dispatches = True
        return twin

    def base_versions_in_flight(self) -> set[int]:
        """Versions some in-flight job was dispatched from (the snapshots still needed)."""
        return {job.base_version for _, _, job in self._heap}

    def in_flight_jobs(self) -> list[DeviceJob]:
        """In-flight jobs in arrival order (e.g. to relaunch their training after a resume)."""
        return [job for _, _, job in sorted(self._heap)]

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able state; with the same constructor arguments, :meth:`load_state_dict`
        resumes the identical future sequence. Budgets (``max_versions``, ``max_time``) are not
        part of the state and may differ on resume."""
        return {
            "population_size": self.population_size,
            "seed": self.seed,
            "concurrency": self.concurrency,
            "buffer_size": self.buffer_size,
            "min_open_slots": self.min_open_slots,
            "schedule": self.schedule.to_dict(),
            **self._network_state(),
            "now": self._now,
            "version": self._version,
            "buffer_count": self._buffer_count,
            "next_job_id": self._next_job_id,
            "dispatch_counter": self._dispatch_counter,
            "started": self._started,
            "arrived_total": self._arrived_total,
            "accepted_total": self._accepted_total,
            "in_flight": [job.to_dict() for job in self.in_flight_jobs()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; raises ValueError if the configuration differs."""
        for key in ("population_size", "seed", "concurrency", "buffer_size", "min_open_slots"):
            if state[key] != getattr(self, key):
                raise ValueError(f"checkpoint has {key}={state[key]!r} but this scheduler has {getattr(self, key)!r}")
        if DelaySchedule.from_dict(state["schedule"]) != self.schedule:
            raise ValueError("checkpoint has a different delay schedule than this scheduler")
        network = {k: state[k] for k in ("network", "download_bytes", "upload_bytes") if k in state}
        if network != self._network_state():
            raise ValueError("checkpoint has a different network model or payload size than this scheduler")
        jobs = [DeviceJob.from_dict(entry) for entry in state["in_flight"]]
        if len(jobs) > self.concurrency or len({job.device_id for job in jobs}) != len(jobs):
            raise ValueError("checkpoint in_flight jobs exceed concurrency or repeat a device")
        self._heap = [(job.arrival_time, job.job_id, job) for job in jobs]
        heapq.heapify(self._heap)
        self._busy = {job.device_id: job.job_id for job in jobs}
        self._now = float(state["now"])
        self._version = int(state["version"])
        self._buffer_count = int(state["buffer_count"])
        self._next_job_id = int(state["next_job_id"])
        self._dispatch_counter = int(state["dispatch_counter"])
        self._started = bool(state["started"])
        self._arrived_total = int(state["arrived_total"])
        self._accepted_total = int(state["accepted_total"])

    def _network_state(self) -> dict[str, Any]:
        """The network part of the state (empty without a network model, as in older checkpoints)."""
        if self.network is None:
            return {}
        return {
            "network": self.network.to_dict(),
            "download_bytes": self.download_bytes,
            "upload_bytes": self.upload_bytes,
        }

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("call AsyncScheduler.start() (or load_state_dict) first")

    def _select_idle(self, count: int, counter: int, now: float) -> list[int]:
        """``count`` distinct idle devices at simulated time ``now``, uniform without replacement from the stream of
        dispatch ``counter``, sorted ascending (fewer when a population model has fewer idle devices online).

        Samples ranks among the ``population_size - in_flight`` idle devices and maps rank ``r``
        to the ``r``-th idle device id via the sorted busy ids (O(K log K), no per-device array).
        """
        rng = derive_rng(self.seed, "async-select", counter)
        busy = np.array(sorted(self._busy), dtype=np.int64)
        if self.population is not None and self.population.availability is not None:
            return self.population.select_online(rng, now, count, exclude=busy).tolist()
        ranks = np.sort(rng.choice(self.population_size - busy.size, size=count, replace=False))
        idle_before_busy = busy - np.arange(busy.size, dtype=np.int64)
        return (ranks + np.searchsorted(idle_before_busy, ranks, side="right")).astype(np.int64).tolist()

    def _dispatch(self, count: int) -> list[DeviceJob]:
        """Dispatch up to ``count`` jobs now. The jobs are a pure function of the state in ``key``, so one a fork
        computed from the same state is taken as it is (same ids, devices, delays and seeds)."""
        key = (count, self._dispatch_counter, self._next_job_id, self._now, self._version, len(self._heap))
        key += (frozenset(self._busy.items()),)
        memo = self._dispatch_memo
        planned = memo.pop(key, None) if memo is not None and not self._records_dispatches else None
        if planned is None:
            planned = self._plan_dispatch(count)
            if self._records_dispatches:
                memo[key] = planned
        self._now, self._dispatch_counter, jobs = planned
        self._next_job_id += len(jobs)
        for job in jobs:
            heapq.heappush(self._heap, (job.arrival_time, job.job_id, job))
            self._busy[job.device_id] = job.job_id
        return list(jobs)

    def _plan_dispatch(self, count: int) -> tuple[float, int, list[DeviceJob]]:
        """What :meth:`_dispatch` does, without changing the scheduler: (the clock after it, the dispatch counter
        after it, the jobs)."""
        now, counter = self._now, self._dispatch_counter
        devices = self._select_idle(count, counter, now)
        counter += 1
        while not devices and not self._heap and self.population is not None:
            later = self.population.next_online_time(now)
            if later <= now or (self.max_time is not None and later >= self.max_time):
                return (now if later <= now else float(self.max_time)), counter, []
            now = later
            devices = self._select_idle(count, counter, now)
            counter += 1
        jobs = []
        for job_id, device_id in enumerate(devices, start=self._next_job_id):
            rng = derive_rng(self.seed, "delay", job_id)
            if self.population is None:
                download, train, upload = profile_for(self.schedule, self.seed, device_id).sample_delays(rng)
                session_end = math.inf
            else:
                download, train, upload = self.population.job_delays(device_id, rng, self.work)
                session_end = float(self.population.session_end(np.array([device_id]), now)[0])
            if self.network is not None:
                link = self.network.link_for(self.seed, device_id)
                download += link.download_seconds(self.download_bytes)
                upload += link.upload_seconds(self.upload_bytes)
            finish = now + download + train + upload
            job = DeviceJob(
                job_id=job_id,
                device_id=device_id,
                base_version=self._version,
                dispatch_time=now,
                arrival_time=min(finish, session_end),
                train_seed=derive_seed(self.seed, "train-job", job_id),
                download_time=download,
                train_time=train,
                upload_time=upload,
                dropped=finish > session_end,
            )
            jobs.append(job)
        return now, counter, jobs
