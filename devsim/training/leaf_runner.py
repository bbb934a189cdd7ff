"""One leaf's synchronous round: train its assigned devices in a persistent thread pool and sum.

Each worker thread owns one device worker (its own model and optimizer) for the whole job.
Devices are split over workers statically (worker ``w`` takes every ``W``-th device of the sorted
list; on a GPU leaf that batches, near-equal groups of consecutive devices, see
:mod:`devsim.resources.leaf_plan`) and each worker accumulates ``num_samples * delta`` in a private
buffer; the buffers are summed in worker order. The result is therefore bit-identical however the threads interleave.

Every device update goes through the leaf's :class:`~devsim.compression.UplinkCompressor` (the
device -> leaf uplink) before it is checked and summed; with the ``none`` codec it passes untouched.
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from devsim.codec import numpy_to_tensors, tensors_to_numpy
from devsim.compression import CodecSpec, Encoded, UplinkCompressor, UplinkStats, split_rows, stack_rows
from devsim.observe.cpu import TRAINING
from devsim.population.dropout import DROPPED, SILENT, DropoutModel
from devsim.population.faults import FaultInjector
from devsim.privacy.device import DevicePrivacy
from devsim.resources.leaf_plan import balanced_groups, deal_groups
from devsim.training.admission import ChunkResult, RoundChecks, admit, admit_rows
from devsim.training.local import DeviceMetrics, DeviceWorker

MAX_REPORTED_REJECTIONS = 20


@dataclass
class LeafRoundResult:
    """Sum of sample-weighted deltas of a leaf's devices, their total weight, metrics and timings (s)."""

    delta_sum: dict[str, np.ndarray]
    total_weight: float
    device_metrics: list[DeviceMetrics]
    timing: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    rejections: list[str] = field(default_factory=list)

    def to_payload(self) -> dict:
        """Wire form: NumPy arrays and plain numbers only (no lists of floats)."""
        m = self.device_metrics
        return {
            "delta_sum": self.delta_sum,
            "total_weight": float(self.total_weight),
            "device_metrics": {
                "device_id": np.array([x.device_id for x in m], dtype=np.int64),
                "num_samples": np.array([x.num_samples for x in m], dtype=np.int64),
                "steps": np.array([x.steps for x in m], dtype=np.int64),
                "loss": np.array([x.loss for x in m], dtype=np.float32),
                "accuracy": np.array([x.accuracy for x in m], dtype=np.float32),
                "compute_seconds": np.array([x.compute_seconds for x in m], dtype=np.float64),
            },
            "timing": dict(self.timing),
            "counts": dict(self.counts),
            "rejections": list(self.rejections[:MAX_REPORTED_REJECTIONS]),
        }


class LeafRoundRunner:
    """Runs rounds for one leaf over a fixed set of device workers (one thread per worker).

    With ``device_batch`` > 1 a worker trains its devices ``device_batch`` at a time as one batched
    computation (``train_devices_batched``); each device's batches and result are those it would get
    alone, up to float rounding. ``fill_groups`` (a GPU leaf's plan, :mod:`devsim.resources.leaf_plan`)
    cuts the devices into ``ceil(N / device_batch)`` near-equal groups first and deals the groups over at
    most that many workers; without it the devices are dealt over the workers first (the pool rule).
    """

    def __init__(
        self,
        workers: list[DeviceWorker],
        device_batch: int = 1,
        uplink: UplinkCompressor | None = None,
        fill_groups: bool = False,
    ):
        if not workers:
            raise ValueError("a leaf needs at least one device worker")
        if int(device_batch) < 1:
            raise ValueError(f"device_batch must be >= 1, got {device_batch}")
        self.device_batch = int(device_batch)
        self.fill_groups = bool(fill_groups) and self.device_batch > 1
        self.uplink = uplink if uplink is not None else UplinkCompressor(CodecSpec("none"))
        self.workers = workers
        self.keys = workers[0].keys
        self.torch_device = workers[0].torch_device
        self._pool = ThreadPoolExecutor(max_workers=len(workers), thread_name_prefix="device-worker")
        self._idle: queue.SimpleQueue[DeviceWorker] = queue.SimpleQueue()
        for worker in workers:
            self._idle.put(worker)

    def run_round(
        self,
        round_num: int,
        global_weights: dict[str, np.ndarray],
        device_ids: list[int],
        dropout: DropoutModel | None = None,
        faults: FaultInjector | None = None,
        max_norm: float | None = None,
        privacy: DevicePrivacy | None = None,
    ) -> LeafRoundResult:
        """Train ``device_ids`` (any order; sorted internally) from ``global_weights``.

        Devices that ``dropout`` makes silent are not trained; dropped ones are trained and discarded.
        A device whose delta is non-finite or (with ``max_norm``) whose L2 norm exceeds it is rejected
        and reported with its id; only accepted devices enter the sum and the total weight. With ``privacy`` each
        device's update is clipped (and noised, local DP) before it leaves the device and enters the sum unweighted;
        ``counts["dp_below_clip"]`` then counts the accepted devices whose norm was within the clip norm.
        """
        started = time.perf_counter()
        devices = sorted(int(d) for d in device_ids)
        if not devices:
            raise ValueError("run_round needs at least one device id")
        global_tensors = numpy_to_tensors(global_weights, self.keys, self.torch_device)
        chunks = deal_groups(devices, len(self.workers), self.device_batch, self.fill_groups)
        num_workers = len(chunks)
        futures = [
            self._pool.submit(
                _train_chunk,
                self.workers[w],
                chunks[w],
                round_num,
                global_tensors,
                RoundChecks(dropout, faults, max_norm, self.uplink, privacy),
                self.device_batch,
            )
            for w in range(num_workers)
        ]
        partials = [f.result() for f in futures]
        compute_done = time.perf_counter()
        accumulator = partials[0].accumulator
        for partial in partials[1:]:
            torch._foreach_add_(accumulator, partial.accumulator)
        metrics = sorted((m for p in partials for m in p.metrics), key=lambda m: m.device_id)
        counts = {k: sum(p.counts.get(k, 0) for p in partials) for k in ("dropped", "silent", "rejected")}
        if privacy is not None:
            counts["dp_below_clip"] = sum(p.counts.get("dp_below_clip", 0) for p in partials)
        rejections = [r for p in partials for r in p.rejections]
        uplink = UplinkStats()
        for partial in partials:
            uplink.add(partial.uplink)
        self.uplink.sweep(round_num)
        counts.update({k: int(v) for k, v in uplink.to_counts().items() if k != "codec_seconds"})
        counts.update(self.uplink.residual_counts())
        total_weight = float(sum(m.num_samples for m in metrics))
        delta_sum = tensors_to_numpy(self.keys, self.uplink.fold_aggregate(accumulator, total_weight))
        finished = time.perf_counter()
        compute = [m.compute_seconds for m in metrics] or [0.0]
        return LeafRoundResult(
            delta_sum=delta_sum,
            total_weight=total_weight,
            device_metrics=metrics,
            timing={
                "leaf_wall": finished - started,
                "leaf_train_wall": compute_done - started,
                "leaf_aggregate": finished - compute_done,
                "device_compute_sum": float(sum(compute)),
                "device_compute_max": float(max(compute)),
                "num_workers": float(num_workers),
                "codec_seconds": uplink.encode_seconds + uplink.decode_seconds,
            },
            counts=counts,
            rejections=rejections,
        )

    def run_jobs(
        self,
        global_weights: dict[str, np.ndarray],
        job_ids: list[int],
        device_ids: list[int],
        train_seeds: list[int],
        with_histograms: bool = False,
        version: int = 0,
        job_bases: list[int] | None = None,
        base_versions: list[int] | None = None,
        privacy: DevicePrivacy | None = None,
    ) -> dict:
        """Train independent device jobs from one base model, or from several; each job's delta is returned on
        its own.

        With ``job_bases`` every entry of ``global_weights`` is stacked over V base models, (V, *shape), job ``i``
        starts from base ``job_bases[i]`` and ``base_versions`` (V,) are those bases' model versions; jobs of
        different bases in one group are trained together from their own rows (asynchronous jobs of several
        versions sent in one call). Without it, every job starts from ``global_weights`` of ``version``.

        Safe to call from several threads at once (calls for different model versions overlap in
        asynchronous runs): a job takes whichever worker is idle; with ``device_batch`` > 1 the jobs are
        cut into groups of at most ``device_batch``, at least one group per worker (with ``fill_groups``:
        ``ceil(n / device_batch)`` near-equal groups, however many workers). Results depend only on
        each job's ``(device_id, train_seed)`` and the base weights. Returns the wire payload: ``job_id``,
        the updates, per-job metrics, optional ``label_hist`` (n, num_classes), per-job ``uplink_bytes`` and
        ``uplink_raw_bytes`` (int64, n: as sent, and as float32) and timing. The updates are ``deltas`` (per
        entry, float32 stacked over jobs: shape (n, *entry_shape)) with the lossless ``none`` codec; with a
        lossy codec they are forwarded as they crossed the uplink: ``encoded`` (:func:`stack_rows`) with
        ``delta_keys`` (the entries in flattening order), for the server to decode (:func:`decode_row`).
        ``version`` (the base model's) stamps error-feedback residuals. With ``privacy`` (DP-FedBuff) each update
        is clipped, and noised when the mechanism says so (keyed by the job's train seed), before its uplink.
        """
        started = time.perf_counter()
        bases = _JobBases(
            numpy_to_tensors(global_weights, self.keys, self.torch_device),
            job_bases,
            [int(version)] if base_versions is None else [int(v) for v in base_versions],
        )
        jobs = [
            (int(d), int(s), b) for d, s, b in zip(device_ids, train_seeds, bases.of_jobs(len(job_ids)), strict=True)
        ]
        if self.fill_groups:
            groups = balanced_groups(jobs, self.device_batch)
        else:
            size = max(1, min(self.device_batch, -(-len(jobs) // len(self.workers))))
            groups = [jobs[i : i + size] for i in range(0, len(jobs), size)]
        futures = [self._pool.submit(self._train_jobs, bases, group, with_histograms, privacy) for group in groups]
        results = [f.result() for f in futures]
        outputs = [output for group_outputs, _ in results for output in group_outputs]
        self.uplink.sweep(max(bases.versions))
        trained = time.perf_counter()
        if self.uplink.spec.lossless:
            parts = [part for _, group_parts in results for part in group_parts]
            deltas = parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in self.keys}
            updates: dict = {"deltas": deltas}
        else:
            updates = {"encoded": stack_rows([o[3] for o in outputs]), "delta_keys": list(self.keys)}
        payload = {
            "job_id": np.asarray(job_ids, dtype=np.int64),
            **updates,
            "num_samples": np.array([o[0].num_samples for o in outputs], dtype=np.int64),
            "loss": np.array([o[0].loss for o in outputs], dtype=np.float32),
            "accuracy": np.array([o[0].accuracy for o in outputs], dtype=np.float32),
            "compute_seconds": np.array([o[0].compute_seconds for o in outputs], dtype=np.float64),
            "uplink_bytes": np.array([o[2].bytes_sent for o in outputs], dtype=np.int64),
            "uplink_raw_bytes": np.array([o[2].raw_bytes for o in outputs], dtype=np.int64),
            "counts": self.uplink.residual_counts(),
        }
        if with_histograms:
            payload["label_hist"] = np.stack([o[1] for o in outputs])
        finished = time.perf_counter()
        compute = payload["compute_seconds"]
        payload["timing"] = {
            "leaf_wall": finished - started,
            "leaf_train_wall": trained - started,
            "leaf_aggregate": finished - trained,
            "device_compute_sum": float(compute.sum()),
            "device_compute_max": float(compute.max()),
            "codec_seconds": float(sum(o[2].encode_seconds + o[2].decode_seconds for o in outputs)),
        }
        return payload

    def _train_jobs(
        self,
        bases: _JobBases,
        jobs: list[tuple[int, int, int]],
        with_histogram: bool,
        privacy: DevicePrivacy | None = None,
    ):
        """Train ``jobs`` ((device id, train seed, base) triples) on one idle worker and send each update over the
        uplink. Returns (per job: metrics, histogram, uplink stats, encoded row; the received float32 deltas as
        parts): the encoded row (its parts, what the leaf forwards) with a lossy codec, else None; the parts (dicts
        of (m, *shape) host arrays, jobs in order: one for a batched group, one per job otherwise) with the lossless
        codec, else none. Residuals are stamped with the newest base version among ``jobs``."""
        worker = self._idle.get()
        encoded: list[Encoded] | None = None if self.uplink.spec.lossless else []
        version = max(bases.versions[b] for _, _, b in jobs)
        try:
            ids = [d for d, _, _ in jobs]
            if self.device_batch > 1:
                seeds = [s for _, s, _ in jobs]
                start, shared = bases.for_group([b for _, _, b in jobs])
                with TRAINING.measure():
                    deltas, metrics = worker.train_devices_batched(ids, seeds, start, per_device_base=not shared)
                if privacy is not None:
                    privacy.apply_rows_(deltas, seeds, ids)
                group = UplinkStats()
                rows = self.uplink.transmit_rows(ids, version, deltas, group, encoded)
                # one copy to the host per entry of the group's rows, not per job and entry
                parts = [tensors_to_numpy(self.keys, rows)] if encoded is None else []
                count = len(jobs)  # every row of a group costs the same bytes; seconds are shared out evenly
                share = (group.bytes_sent // count, group.raw_bytes // count)
                seconds = (group.encode_seconds / count, group.decode_seconds / count)
                stats = [UplinkStats(1, *share, *seconds) for _ in jobs]
            else:
                parts, metrics, stats = [], [], []
                for device_id, train_seed, base in jobs:
                    start = bases.of(base)
                    with TRAINING.measure():
                        metrics.append(worker.train_with_seed(device_id, train_seed, start))
                    stats.append(UplinkStats())
                    update = worker.delta(start)
                    if privacy is not None:
                        privacy.apply_(update, train_seed, device_id)
                    sent = self.uplink.transmit(device_id, version, update, stats[-1], encoded)
                    if encoded is None:
                        parts.append({k: a[np.newaxis] for k, a in tensors_to_numpy(self.keys, sent).items()})
            # lossy: the rows go on as they crossed the uplink (the leaf's decoded copy is not needed)
            rows_out = [None] * len(jobs) if encoded is None else split_rows(encoded)
            per_job = [
                (m, worker.label_histogram(d) if with_histogram else None, st, row)
                for d, row, m, st in zip(ids, rows_out, metrics, stats, strict=True)
            ]
            return per_job, parts
        finally:
            self._idle.put(worker)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class _JobBases:
    """The base models of one :meth:`LeafRoundRunner.run_jobs` call: one shared model, or V stacked ones."""

    def __init__(self, tensors: list[torch.Tensor], job_bases: list[int] | None, versions: list[int]):
        self.stacked = job_bases is not None
        self.tensors = tensors
        self.job_bases = None if job_bases is None else [int(b) for b in job_bases]
        self.versions = versions
        count = int(tensors[0].shape[0]) if self.stacked and tensors else 1
        if len(versions) != count:
            raise ValueError(f"{len(versions)} base versions for {count} base models")
        if self.stacked and any(not 0 <= b < count for b in self.job_bases):
            raise ValueError(f"job_bases must index the {count} base models")

    def of_jobs(self, count: int) -> list[int]:
        """Each job's base index (0 for every job of a one-model call)."""
        if not self.stacked:
            return [0] * count
        if len(self.job_bases) != count:
            raise ValueError(f"{len(self.job_bases)} job_bases for {count} jobs")
        return self.job_bases

    def of(self, base: int) -> list[torch.Tensor]:
        """The tensors of base ``base``, one per key (views, not copies)."""
        return [t[base] for t in self.tensors] if self.stacked else self.tensors

    def for_group(self, group: list[int]) -> tuple[list[torch.Tensor], bool]:
        """Start state for a batched group of jobs with these bases: (shared tensors, True) when they share one
        base, else ((D, *shape) rows, False)."""
        if len(set(group)) == 1:
            return self.of(group[0]), True
        rows = torch.tensor(group, dtype=torch.int64, device=self.tensors[0].device)
        return [t.index_select(0, rows) for t in self.tensors], False


def _train_chunk(
    worker: DeviceWorker,
    groups: list[list[int]],
    round_num: int,
    global_tensors: list[torch.Tensor],
    checks: RoundChecks,
    device_batch: int,
) -> ChunkResult:
    result = ChunkResult(
        [torch.zeros_like(t) for t in global_tensors], [], {"dropped": 0, "silent": 0, "rejected": 0}, []
    )
    answering_groups = []
    for device_ids in groups:
        answering = []
        for device_id in device_ids:
            outcome = checks.outcome(round_num, device_id)
            if outcome == SILENT:
                result.counts["silent"] += 1
            else:
                answering.append((device_id, outcome))
        answering_groups.append(answering)
    if device_batch > 1:
        for answering in answering_groups:
            for start in range(0, len(answering), device_batch):
                group = answering[start : start + device_batch]
                ids = [d for d, _ in group]
                seeds = [worker.round_seed(d, round_num) for d in ids]
                with TRAINING.measure():
                    deltas, metrics = worker.train_devices_batched(ids, seeds, global_tensors)
                admit_rows(result, deltas, metrics, [outcome for _, outcome in group], round_num, checks)
        return result
    answering = [pair for group in answering_groups for pair in group]
    delta = [torch.empty_like(t) for t in global_tensors]
    for device_id, outcome in answering:
        with TRAINING.measure():
            metrics = worker.train_device(device_id, round_num, global_tensors)
        if outcome != DROPPED:
            worker.delta_into(delta, global_tensors)
        admit(result, delta, metrics, outcome, round_num, checks)
    return result
