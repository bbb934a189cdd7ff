"""How the asynchronous server talks to its leaves: jobs gathered and sent in calls, results taken as calls finish
(in host order) and held until the virtual clock reaches their arrival, bytes counted per hop, and leaves dropped
when a call fails. A mixin of :class:`~devsim_flare.servers.async_server.AsyncServer`, whose run state
(``calls``, ``gather``, ``snapshots``, ``_waiting``, ``_in_flight``, ``traffic``, ``dead_leaves``) it reads."""

from __future__ import annotations

import time

import numpy as np

from devsim.clock import DeviceJob
from devsim.clock.gather import JobKey, job_key
from devsim.clock.lookahead import dispatches_ahead
from devsim.compression import row_of
from devsim.observe.timing import WindowTiming
from devsim.observe.traffic import array_bytes
from devsim.shared_arrays import reply_arrays_taken, shared_or_inline, weights_for_call
from devsim_flare.leaf_calls import LeafCallError
from devsim_flare.wire import per_job_field

Weights = dict[str, np.ndarray]


class AsyncRunError(RuntimeError):
    """A leaf failed or stopped answering during an asynchronous run."""


class AsyncLeafTraffic:
    """Dispatch, result collection and leaf loss for :class:`AsyncServer` (methods only; state lives there)."""

    def _dispatch(self, jobs: list[DeviceJob]) -> None:
        """Retain the current version for newly dispatched jobs, gather them (see :class:`JobGatherer`) and send
        what is ready; when some were not guessed, guess the rest of this version's dispatches and gather them."""
        if not jobs:
            return
        self.snapshots.retain(self.scheduler.version, self.weights, len(jobs))
        unguessed = self.gather.dispatched(jobs, [self._sendable(job) for job in jobs])
        if unguessed and self.config.dispatch_lookahead:
            ahead = dispatches_ahead(self.scheduler, self._guess_accepted, self.config.concurrency)
            self.gather.guess(ahead, [self._sendable(job) for job in ahead])
        self._send_ready()

    def _sendable(self, job: DeviceJob) -> bool:
        """Whether a job is worth training: it arrives within the run, its device answers, its leaf is alive."""
        limit = self.config.max_sim_time
        if job.dropped or (limit is not None and job.arrival_time > limit):
            return False
        if self.leaves[self.population.leaf_of(job.device_id)] in self.dead_leaves:
            return False
        return self.dropout.outcome(job.job_id, job.device_id) == "ok"

    def _guess_accepted(self, job: DeviceJob) -> bool:
        """The lookahead's guess of whether an arriving job's update will be accepted (the checks on the update
        itself cannot be known before it is trained; an injected fault is guessed to be rejected)."""
        return self._sendable(job) and self.faults.any_fault(job.job_id, job.device_id) is None

    def _send_ready(self) -> None:
        """One call per leaf for each ready batch, carrying each base version its jobs start from once (stacked)
        and each job's index into them."""
        for batch in self.gather.take_ready():
            by_leaf: dict[str, list[DeviceJob]] = {}
            for job in batch:
                leaf = self.leaves[self.population.leaf_of(job.device_id)]
                if leaf not in self.dead_leaves:
                    by_leaf.setdefault(leaf, []).append(job)
            for leaf, leaf_jobs in by_leaf.items():
                self._send(leaf, leaf_jobs)

    def _send(self, leaf: str, jobs: list[DeviceJob]) -> None:
        versions = sorted({j.base_version for j in jobs})
        index = {v: i for i, v in enumerate(versions)}
        bases = [self.snapshots.get(v) if v in self.snapshots else self.weights for v in versions]
        self.traffic.add("server_to_leaf", self.model_bytes * len(versions))
        self.traffic.add("leaf_to_device", self.model_bytes * len(jobs))
        self._in_flight.update(job_key(j) for j in jobs)
        parts = {k: [base[k] for base in bases] for k in bases[0]}  # (V, *shape) each, written without a stacked copy
        folder = self.exchange.path if self.exchange is not None else None  # the leaf replies the same way
        shared = shared_or_inline(folder, parts)
        weights = {} if shared else {k: _stacked(stack) for k, stack in parts.items()}
        arrays = weights_for_call(weights, folder, shared)
        self.calls.submit(
            leaf,
            "train_jobs",
            tag=(time.time(), tuple(job_key(j) for j in jobs)),
            version=versions[-1],
            **arrays,
            job_ids=per_job_field([j.job_id for j in jobs]),
            device_ids=per_job_field([j.device_id for j in jobs]),
            train_seeds=per_job_field([j.train_seed for j in jobs]),
            with_histograms=self.wants_histograms(),
            job_bases=per_job_field([index[j.base_version] for j in jobs]),
            base_versions=per_job_field(versions),
            **({"dp": self.privacy.job_privacy()} if self.privacy is not None else {}),
        )

    def _wait_for(self, key: JobKey, window: WindowTiming) -> dict | None:
        """The result of the job ``key`` names, taking finished calls (in host order) until it is among them;
        None when the call carrying it failed (its leaf is then dropped from the run). Results of wrongly
        guessed jobs (``gather.stale``) are dropped as they come."""
        while key not in self._waiting and key not in self._failed_jobs:
            waited = time.time()
            self.calls.call_timeout = self.round_timeout.seconds
            try:
                outcome = self.calls.next()
            except LeafCallError as error:
                raise AsyncRunError(f"waiting for job {key[0]}: {error} ({self.round_timeout.describe()})") from error
            window.add_wait(time.time() - waited)
            dispatched_at, keys = outcome.tag
            if outcome.error is None:
                self.round_timeout.observe(time.time() - dispatched_at)
            self._in_flight.difference_update(keys)
            if outcome.error is not None:
                self._lose_leaf(outcome.leaf, outcome.error, keys)
                continue
            payload = outcome.result
            try:
                reply_arrays_taken(payload, "deltas", self.exchange)
            except (ValueError, OSError) as error:
                self._lose_leaf(outcome.leaf, error, keys)
                continue
            self._startup.leaf_reply(outcome.leaf, payload)
            self._count_reply(outcome.leaf, payload)
            self.cpu.leaf_reply(outcome.leaf, payload["timing"])
            window.add_call(dispatched_at, time.time(), payload["timing"], name=outcome.leaf)
            for row, job in enumerate(keys):
                if job in self.gather.stale:
                    self.gather.stale.discard(job)
                    continue
                if "encoded" in payload:  # decoded on arrival (_arrival_result): held here at the uplink's size
                    update = {"encoded": row_of(payload["encoded"], row), "delta_keys": payload["delta_keys"]}
                else:
                    update = {"delta": {k: v[row] for k, v in payload["deltas"].items()}}
                self._waiting[job] = {
                    **update,
                    "num_samples": int(payload["num_samples"][row]),
                    "loss": float(payload["loss"][row]),
                    "label_hist": payload["label_hist"][row] if "label_hist" in payload else None,
                }
        self._failed_jobs.discard(key)
        return self._waiting.pop(key, None)

    def _count_reply(self, leaf: str, payload: dict) -> None:
        """Bytes of one leaf reply: the device updates as they crossed the uplink (and their float32 size), and
        as the leaf sent them on (encoded with a lossy codec, float32 with ``none``)."""
        if "encoded" in payload:
            forwarded = array_bytes(payload["encoded"])
            float32 = int(np.sum(payload["uplink_raw_bytes"]))
        else:
            forwarded = float32 = array_bytes(payload["deltas"])
        self.traffic.add("device_to_leaf", int(np.sum(payload.get("uplink_bytes", 0))))
        self.traffic.add("device_to_leaf_float32", float32)
        self.traffic.add("leaf_to_server", forwarded)
        self._residual_counts[leaf] = dict(payload.get("counts", {}))

    def _traffic_fields(self) -> dict:
        """Record fields: the window's ``bytes`` per hop, run totals, and the leaves' residual-store counts."""
        counts = self._residual_counts.values()
        return {
            "bytes": self.traffic.drain(),
            "bytes_total": dict(self.traffic.totals),
            "residual_evictions": sum(int(c.get("residual_evictions", 0)) for c in counts),
            "residuals_held": sum(int(c.get("residuals_held", 0)) for c in counts),
        }

    def _apply_planned_losses(self) -> None:
        """Lose the leaves ``--lose-leaf`` names at the version just made (at the simulated time now)."""
        for leaf, version in self.planned_losses.items():
            if version <= self.scheduler.version and leaf not in self.lost_at:
                self.lost_at[leaf] = self.scheduler.now
                self._mark_dead(leaf, f"--lose-leaf {leaf}@{version}")

    def _lose_leaf(self, leaf: str, error: BaseException, keys: list[JobKey]) -> None:
        """Drop a leaf whose call failed; its jobs count as lost. Stops the run below ``--min-leaves``."""
        self._failed_jobs.update(keys)
        if leaf not in self.dead_leaves:
            self._mark_dead(leaf, f"stopped answering ({error})")

    def _mark_dead(self, leaf: str, why: str) -> None:
        """Drop ``leaf`` from the run; stops the run below ``--min-leaves``."""
        self.dead_leaves.add(leaf)
        self.new_losses[leaf] = why.splitlines()[0] if why else why
        alive = len(self.leaves) - len(self.dead_leaves)
        if alive < self.config.min_leaves:
            raise AsyncRunError(
                f"leaf {leaf} {why}; only {alive} of {len(self.leaves)} leaves remain, fewer than "
                f"--min-leaves {self.config.min_leaves}"
            )
        print(
            f"[server] version {self.scheduler.version}: leaf {leaf} {why}; continuing with {alive} leaves", flush=True
        )

    def _drain(self) -> None:
        """Wait for calls still running at the end so no leaf is left mid-call; their results are dropped."""
        while self.calls.pending:
            try:
                self.calls.next()
            except LeafCallError:
                break
        self._waiting.clear()
        self._in_flight.clear()
        self.gather.clear()
        self.snapshots.prune(set())


def _stacked(arrays: list[np.ndarray]) -> np.ndarray:
    """(V, *shape) of V same-shape arrays; one array becomes a view with a leading axis, not a copy."""
    return arrays[0][np.newaxis] if len(arrays) == 1 else np.stack(arrays)
