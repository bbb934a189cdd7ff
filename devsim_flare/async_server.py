"""The server of asynchronous runs (FedBuff, FedRevive): the K/B/O scheduler on a virtual clock.

Logical order and physical execution are separate. The scheduler decides, on its seeded virtual
clock, which device trains from which version and when its update *arrives*; every job is sent to
its leaf as soon as it is dispatched, so leaves train as many jobs in parallel as their pools
allow, and results that come back early wait (at most K of them) until the virtual clock reaches
their arrival. Updates are therefore applied in simulated-arrival order, never in host order, and
a run is reproducible from its seed without sleeping. Each delta is taken against the exact
snapshot its device started from; staleness is the number of versions since.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from nvflare.collab import collab

from devsim.asyncfl import AsyncScheduler, DeviceJob, SnapshotStore, load_schedule
from devsim.checkpoint import weights_to_tensors
from devsim.codec import load_numpy_into_model, model_to_numpy
from devsim.config import AsyncConfig
from devsim.evaluation import EvalResult
from devsim.metrics import MetricsWriter
from devsim.population import DevicePopulation
from devsim.progress import ProgressLine, format_duration
from devsim.results import RunRecorder
from devsim.strategies.fedbuff import FedBuff
from devsim.timing import RoundTiming, WindowTiming, summarize
from devsim_flare.leaf import DEFAULT_PROCESSOR
from devsim_flare.leaf_calls import LeafCallError, LeafCalls
from devsim_flare.server_common import central_evaluator, connected_leaves, initial_model, output_dir_for
from processors.cifar10_fedavg_task_processor import default_torch_device

Weights = dict[str, np.ndarray]


class AsyncRunError(RuntimeError):
    """A leaf failed or stopped answering during an asynchronous run."""


class AsyncServer:
    """Server-side Collab object for FedBuff; :class:`FedReviveServer` extends the arrival step."""

    method = "fedbuff"
    processor = DEFAULT_PROCESSOR
    config_cls = AsyncConfig

    def __init__(self, settings: dict):
        self.settings = settings

    def wants_histograms(self) -> bool:
        """Whether leaves should return each job's label histogram (FedRevive's true class proportions)."""
        return False

    def model_args(self) -> dict:
        """Extra model constructor arguments (FedRevive: feature trackers)."""
        return {}

    def setup_method(self, config: AsyncConfig, device: torch.device) -> None:
        """Create method-specific state (FedRevive: the reviver)."""

    def revise_delta(self, job: DeviceJob, result: dict, staleness: int, base: Weights) -> Weights:
        """The delta that enters the buffer for an accepted arrival (FedBuff: the device's own)."""
        return result["delta"]

    def method_record(self) -> dict:
        """Extra fields for each results record."""
        return {}

    def evaluate(self) -> EvalResult:
        load_numpy_into_model(self.model, self.weights)
        return self.evaluator.evaluate(self.model)

    @collab.main
    def run(self) -> None:
        config = self.config_cls.from_dict(self.settings)
        self.config = config
        self.leaves = connected_leaves(config)
        output_dir = output_dir_for(config)
        device = default_torch_device()
        self.model = initial_model(config, device, **self.model_args())
        self.weights = model_to_numpy(self.model)
        self.evaluator = central_evaluator(config, device)
        self.population = DevicePopulation(config.num_leaf_nodes, config.devices_per_leaf, seed=config.seed)
        self.scheduler = AsyncScheduler(
            population_size=config.num_devices,
            schedule=load_schedule(config.delay_schedule),
            seed=config.seed,
            concurrency=config.concurrency,
            buffer_size=config.buffer_size,
            min_open_slots=config.min_open_slots,
            max_versions=config.max_versions,
            max_time=config.max_sim_time,
        )
        self.buffer = FedBuff(
            buffer_size=config.buffer_size,
            global_lr=config.global_lr,
            staleness_weighting=config.staleness_weighting,
            staleness_exponent=config.staleness_exponent,
        )
        self.setup_method(config, device)
        self.snapshots = SnapshotStore()
        self.calls = LeafCalls(call_timeout=config.round_timeout)
        self._waiting: dict[int, dict] = {}
        recorder = RunRecorder(output_dir, config.to_dict(), method=self.method)
        metrics = MetricsWriter(output_dir)
        progress = ProgressLine(config.max_versions, unit="version") if config.max_versions else None
        print(
            f"[server] {self.method}: {config.num_leaf_nodes} leaves x {config.devices_per_leaf} devices, "
            f"K={config.concurrency} B={config.buffer_size} O={config.min_open_slots}, delays {config.delay_schedule}, "
            f"until version {config.max_versions} / simulated time {config.max_sim_time}; model {config.model}, "
            f"dataset {config.dataset}; results in {output_dir}",
            flush=True,
        )
        run_started = time.time()
        timings: list[RoundTiming] = []
        window = WindowTiming(run_started)
        window_staleness: list[int] = []
        evaluation = self.evaluate()
        recorder.add_round(
            {"version": 0, "simulated_time": 0.0, "accuracy": evaluation.accuracy, "loss": evaluation.loss}
        )
        accepted = 0
        arrivals = open(os.path.join(output_dir, "arrivals.csv"), "w", encoding="utf-8")  # noqa: SIM115
        arrivals.write("job_id,device_id,base_version,dispatch_time,arrival_time,staleness\n")
        try:
            self._dispatch(self.scheduler.start())
            while True:
                job = self.scheduler.next_arrival()
                if job is None:
                    break
                result = self._wait_for(job.job_id, window)
                started = time.time()
                staleness = self.scheduler.staleness(job)
                base = self.snapshots.get(job.base_version)
                delta = self.revise_delta(job, result, staleness, base)
                self.buffer.add(delta, staleness)
                self.snapshots.release(job.base_version)
                accepted += 1
                window_staleness.append(staleness)
                arrivals.write(
                    f"{job.job_id},{job.device_id},{job.base_version},{job.dispatch_time!r},{job.arrival_time!r},"
                    f"{staleness}\n"
                )
                new_version = self.scheduler.record_accepted(job)
                if new_version:
                    self.weights = self.buffer.apply(self.weights)
                window.add("server_aggregate", time.time() - started)
                if new_version and (self.scheduler.version % config.eval_frequency == 0 or self.scheduler.done):
                    eval_started = time.time()
                    evaluation = self.evaluate()
                    window.add("evaluation", time.time() - eval_started)
                    timing = window.close(time.time())
                    timings.append(timing)
                    record = {
                        "version": self.scheduler.version,
                        "simulated_time": self.scheduler.now,
                        "accuracy": evaluation.accuracy,
                        "loss": evaluation.loss,
                        "accepted_updates": accepted,
                        "staleness_mean": float(np.mean(window_staleness)),
                        "staleness_max": int(np.max(window_staleness)),
                        "round_seconds": timing.wall,
                        "timing": timing.to_dict(),
                        "snapshots_held": len(self.snapshots),
                        **self.method_record(),
                    }
                    recorder.add_round(record)
                    metrics.after_round(self.scheduler.version, record, prefix="version")
                    metrics.histogram(self.scheduler.version, "async/staleness", np.asarray(window_staleness))
                    window_staleness = []
                    window = WindowTiming(time.time())
                    self._print_progress(progress, record, run_started)
                dispatch_started = time.time()
                self._dispatch(self.scheduler.dispatch_open())
                window.add("server_prepare", time.time() - dispatch_started)
            self._drain()
        finally:
            metrics.close()
            arrivals.close()
        if timings:
            print(summarize(timings, unit="window"), flush=True)
        self._finish(recorder, output_dir, evaluation, run_started, accepted)

    def _dispatch(self, jobs: list[DeviceJob]) -> None:
        """Send dispatched jobs to their leaves (one call per leaf); jobs that can never arrive are skipped."""
        if not jobs:
            return
        version = self.scheduler.version
        self.snapshots.retain(version, self.weights, len(jobs))
        limit = self.config.max_sim_time
        by_leaf: dict[str, list[DeviceJob]] = {}
        for job in jobs:
            if limit is None or job.arrival_time <= limit:
                by_leaf.setdefault(self.leaves[self.population.leaf_of(job.device_id)], []).append(job)
        for leaf, leaf_jobs in by_leaf.items():
            self.calls.submit(
                leaf,
                "train_jobs",
                tag=time.time(),
                version=version,
                weights=self.weights,
                job_ids=np.array([j.job_id for j in leaf_jobs], dtype=np.int64),
                device_ids=np.array([j.device_id for j in leaf_jobs], dtype=np.int64),
                train_seeds=np.array([j.train_seed for j in leaf_jobs], dtype=np.int64),
                with_histograms=self.wants_histograms(),
            )

    def _wait_for(self, job_id: int, window: WindowTiming) -> dict:
        """The result of ``job_id``, taking finished calls (in host order) until it is among them."""
        while job_id not in self._waiting:
            waited = time.time()
            try:
                outcome = self.calls.next()
            except LeafCallError as error:
                raise AsyncRunError(f"waiting for job {job_id}: {error} (--round-timeout)") from error
            window.add_wait(time.time() - waited)
            if outcome.error is not None:
                raise AsyncRunError(f"leaf {outcome.leaf} failed: {outcome.error}")
            payload = outcome.result
            window.add_call(outcome.tag, time.time(), payload["timing"], name=outcome.leaf)
            for row, jid in enumerate(payload["job_id"].tolist()):
                self._waiting[jid] = {
                    "delta": {k: v[row] for k, v in payload["deltas"].items()},
                    "num_samples": int(payload["num_samples"][row]),
                    "loss": float(payload["loss"][row]),
                    "label_hist": payload["label_hist"][row] if "label_hist" in payload else None,
                }
        return self._waiting.pop(job_id)

    def _drain(self) -> None:
        """Wait for calls still running at the end so no leaf is left mid-call; their results are dropped."""
        while self.calls.pending:
            try:
                self.calls.next()
            except LeafCallError:
                break
        self._waiting.clear()
        self.snapshots.prune(set())

    def _print_progress(self, progress: ProgressLine | None, record: dict, run_started: float) -> None:
        summary = (
            f"sim-time {record['simulated_time']:.1f}s  accuracy {record['accuracy']:.4f}  loss {record['loss']:.4f}  "
            f"staleness {record['staleness_mean']:.1f}"
        )
        elapsed = time.time() - run_started
        line = progress.line(record["version"], elapsed, summary) if progress else None
        if progress is None:
            line = f"version {record['version']}  elapsed {format_duration(elapsed)}  {summary}"
        if line:
            print(line, flush=True)

    def _finish(
        self, recorder: RunRecorder, output_dir: str, evaluation: EvalResult, run_started: float, accepted: int
    ) -> None:
        final_path = os.path.join(output_dir, "final_model.pt")
        torch.save(weights_to_tensors(self.weights), final_path)
        recorder.finish(
            {
                "final_accuracy": evaluation.accuracy,
                "final_loss": evaluation.loss,
                "versions": self.scheduler.version,
                "simulated_time": self.scheduler.now,
                "accepted_updates": accepted,
                "wall_seconds": time.time() - run_started,
                "final_model": final_path,
                **self.method_record(),
            }
        )
        print(
            f"[server] done at version {self.scheduler.version}, simulated time {self.scheduler.now:.1f}s; "
            f"final model {final_path}",
            flush=True,
        )


class FedBuffServer(AsyncServer):
    """Asynchronous buffered aggregation (FedBuff)."""
