"""The server of asynchronous runs (FedBuff, FedRevive): the K/B/O scheduler on a virtual clock.

Logical order and physical execution are separate. The scheduler decides, on its seeded virtual
clock, which device trains from which version and when its update *arrives*; every job is sent to
its leaf as soon as it is dispatched, so leaves train as many jobs in parallel as their pools
allow, and results that come back early wait (at most K of them) until the virtual clock reaches
their arrival. Updates are therefore applied in simulated-arrival order, never in host order, and
a run is reproducible from its seed without sleeping. Each delta is taken against the exact
snapshot its device started from; staleness is the number of versions since.

This module is longer than 400 lines on purpose: it is one run loop whose state (scheduler, snapshots,
buffer, timing window, leaves lost) every step reads, and splitting the loop would scatter that state.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from nvflare.collab import collab

from devsim.aggregation.fedbuff import FedBuff
from devsim.aggregation.server_optimizers import server_optimizer_for
from devsim.aggregation.stall import StallGuard
from devsim.aggregation.update_checks import UpdateValidator
from devsim.clock import AsyncScheduler, DeviceJob, NetworkModel, SnapshotStore, load_schedule
from devsim.clock.gather import JobGatherer, JobKey, job_key
from devsim.codec import load_numpy_into_model
from devsim.compression import CodecSpec, decode_row, payload_bytes
from devsim.config import AsyncConfig
from devsim.observe.checkpoint import CheckpointWriter, background_pays, weights_to_tensors
from devsim.observe.cpu import CpuLedger
from devsim.observe.metrics import MetricsWriter
from devsim.observe.participation import Participation, StalenessHistogram
from devsim.observe.progress import BoundEta, ProgressLine, format_duration, format_metrics
from devsim.observe.results import RunRecorder
from devsim.observe.round_timeout import RoundTimeout
from devsim.observe.startup import StartupClock
from devsim.observe.timing import RoundTiming, WindowTiming, summarize, with_info
from devsim.observe.traffic import TrafficCounter, array_bytes, with_bytes
from devsim.population.devices import DevicePopulation
from devsim.population.dropout import DropoutModel
from devsim.population.faults import FaultInjector
from devsim.population.heterogeneity import SESSION_END, build_population_model, job_work
from devsim.resources.collection import PeriodicCollector
from devsim.resources.cuda_warmup import warmup_stamps
from devsim.shared_arrays import open_exchange
from devsim.training.evaluation import EvalResult
from devsim_flare.leaf import DEFAULT_PROCESSOR
from devsim_flare.leaf_calls import LeafCalls
from devsim_flare.leaf_liveness import LeafLiveness
from devsim_flare.servers.async_checkpoint import AsyncCheckpoints
from devsim_flare.servers.async_leaf_traffic import AsyncLeafTraffic
from devsim_flare.servers.base import (
    announce_privacy,
    central_evaluator,
    record_failure,
    reraise_checkpoint_failure,
    start_run,
)
from devsim_flare.stop_request import StopRequest

Weights = dict[str, np.ndarray]

MAX_CALL_MODEL_BYTES = {"download": 64 * 2**20, "inline": 4 * 2**20}
"""Gathered jobs are sent before a call to a leaf would carry more than this many bytes of base models, by
``--tensor-transfer`` (download: a ResNet-18 at 45 MB, one version per call, the 62k-parameter CNN up to 268 versions;
inline, where the whole call is one message: the CNN up to 16 versions)."""


class AsyncServer(AsyncCheckpoints, AsyncLeafTraffic):
    """Server-side Collab object for FedBuff; :class:`FedReviveServer` extends the arrival step."""

    method = "fedbuff"
    processor = DEFAULT_PROCESSOR
    config_cls = AsyncConfig

    def __init__(self, settings: dict, leaves_on_host: int = 0):
        self.settings = settings
        self.leaves_on_host = leaves_on_host  # leaf processes sharing this server's cores (sim, poc)

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

    def on_new_version(self) -> None:
        """Called once with each new global version, after ``self.weights`` changed (FedRevive: starts and lands
        background distillation)."""

    def on_last_version(self) -> None:
        """Called once when the run has reached its last version, before its end checkpoint (FedRevive: drops the
        background work that would land after it)."""

    def close_method(self) -> None:
        """Stop what :meth:`setup_method` started (FedRevive: the background thread); called however the run ends."""

    def method_record(self) -> dict:
        """Extra fields for each results record."""
        return {}

    def evaluate(self) -> EvalResult:
        load_numpy_into_model(self.model, self.weights)
        return self.evaluator.evaluate(self.model)

    @collab.main
    def run(self) -> None:
        startup = self._startup = StartupClock()
        startup.mark("server_run_started")
        output_dir, device = start_run(self, self.model_args())
        config = self.config
        self.evaluator = central_evaluator(self.task, config, device)
        self.population = DevicePopulation(config.num_leaf_nodes, config.devices_per_leaf, seed=config.seed)
        self.traffic = TrafficCounter()
        self._residual_counts: dict[str, dict] = {}
        self.model_bytes = array_bytes(self.weights)
        spec = self.codec_spec = CodecSpec.from_settings(config.to_dict())
        self.population_model = build_population_model(config)
        self.scheduler = AsyncScheduler(
            population_size=config.num_devices,
            schedule=load_schedule(config.delay_schedule),
            seed=config.seed,
            concurrency=config.concurrency,
            buffer_size=config.buffer_size,
            min_open_slots=config.min_open_slots,
            max_versions=config.max_versions,
            max_time=config.max_sim_time,
            network=NetworkModel.from_config(config),
            download_bytes=self.model_bytes,
            upload_bytes=payload_bytes([v.shape for v in self.weights.values()], spec),
            population=self.population_model,
            work=job_work(config),
        )
        self.buffer = FedBuff(
            buffer_size=config.buffer_size,
            global_lr=config.global_lr,
            staleness_weighting=config.staleness_weighting,
            staleness_exponent=config.staleness_exponent,
            server_optimizer=server_optimizer_for(config),
        )
        self.privacy = buffered_privacy(config)
        self.setup_method(config, device)
        self.snapshots = SnapshotStore()
        self.round_timeout = RoundTimeout(config.round_timeout)
        self.calls = LeafCalls(
            call_timeout=self.round_timeout.seconds,
            liveness=LeafLiveness.for_job(self.leaves, collab.fl_ctx.get_job_id(), collab.fl_ctx),
        )
        stop = StopRequest(output_dir)  # honoured at model versions: a checkpoint there resumes the same run
        self.exchange = open_exchange(config.shared_memory)
        self._waiting: dict[JobKey, dict] = {}
        # "auto" is resolved before the job starts; a server given it unresolved gets NVFlare's download limit, as
        # does one whose base models go through shared files (no message carries them, whatever --tensor-transfer)
        transfer = "download" if self.exchange is not None else config.tensor_transfer
        call_bytes = MAX_CALL_MODEL_BYTES.get(transfer, MAX_CALL_MODEL_BYTES["download"])
        self.gather = JobGatherer(config.dispatch_batch_size(), max(1, call_bytes // max(self.model_bytes, 1)))
        self._failed_jobs: set[JobKey] = set()
        self._in_flight: set[JobKey] = set()
        """Jobs sent to a leaf whose call has not come back (at most ``--concurrency`` plus wrong guesses)."""
        self.dead_leaves: set[str] = set()
        self.new_losses: dict[str, str] = {}  # leaf -> why, lost since the last record (leaves_lost)
        self.planned_losses = config.leaf_losses()
        self.lost_at: dict[str, float] = {}
        """Leaves lost by ``--lose-leaf`` -> the simulated time they were lost at."""
        self.dropout = DropoutModel(config.device_dropout, config.device_never_answer, seed=config.seed)
        self.faults = FaultInjector(tuple(config.fault_kinds), config.fault_probability, seed=config.seed)
        self.validator = UpdateValidator(  # under DP clipping bounds every update; checks left: finite, shapes
            self.weights,
            max_norm=config.max_update_norm if self.privacy is None else None,
            max_norm_factor=config.update_norm_factor if self.privacy is None else None,
        )
        self._base_norms: dict[int, float] = {}
        self.stall = StallGuard(config.concurrency, lambda: (self.failures, self.validator.counts()))
        self.failures = {"dropped": 0, "silent": 0, "rejected": 0, "leaf_lost": 0}
        if self.population_model is not None:
            self.failures[SESSION_END] = 0
        if self.privacy is not None:
            self.failures["dp_repeat"] = 0
        self.participation = Participation(config.num_devices)
        self.staleness_histogram = StalenessHistogram()
        recorder = RunRecorder(output_dir, config.to_dict(), method=self.method, task=self.task.record())
        metrics = MetricsWriter(output_dir)
        progress = (
            ProgressLine(config.max_versions, every=config.log_every, unit="version") if config.max_versions else None
        )
        print(
            f"[server] {self.method}: {config.num_leaf_nodes} leaves x {config.devices_per_leaf} devices, "
            f"K={config.concurrency} B={config.buffer_size} O={config.min_open_slots}, delays {config.delay_schedule}, "
            f"until version {config.max_versions} / simulated time {config.max_sim_time}; task {self.task.name}; "
            f"availability {config.availability}, speeds {config.speed_distribution}; "
            f"results in {output_dir}",
            flush=True,
        )
        announce_privacy(self.privacy, self.weights)
        if self.buffer.server_optimizer is not None:
            print(f"[server] {self.buffer.server_optimizer.describe()}", flush=True)
        run_started = time.time()
        timings: list[RoundTiming] = []
        window = WindowTiming(run_started)
        window_staleness: list[int] = []
        evaluation = self.evaluate()
        arrivals_path = os.path.join(output_dir, "arrivals.csv")
        evaluations = 0
        if config.resume_from:
            accepted = self._resume(recorder)
            _truncate_lines(arrivals_path, accepted + 1)
            arrivals = open(arrivals_path, "a", encoding="utf-8")  # noqa: SIM115
        else:
            recorder.add_round({"version": 0, "simulated_time": 0.0, **evaluation.record()})
            accepted = 0
            arrivals = open(arrivals_path, "w", encoding="utf-8")  # noqa: SIM115
            arrivals.write("job_id,device_id,base_version,dispatch_time,arrival_time,staleness\n")
        self._sim_time_eta = None
        if config.max_sim_time:  # from where a resumed run's simulated time stands
            self._sim_time_eta = BoundEta(config.max_sim_time, self.scheduler.now, time.time() - run_started)
        collector = PeriodicCollector().start()
        self.cpu = CpuLedger()
        self.stall.reset()
        startup.mark("server_ready")
        startup.add_stamps(warmup_stamps())  # when the CUDA warm-up started and ended (none without CUDA)
        startup.mark("first_round_started")
        self.checkpoints = CheckpointWriter(background=background_pays(self.leaves_on_host))
        try:
            if not config.resume_from:
                self._dispatch(self.scheduler.start())
            budget_checked = None
            while True:
                if self.privacy is not None and self.buffer.count == 0 and budget_checked != self.scheduler.version:
                    budget_checked = self.scheduler.version
                    if self._over_budget():
                        evaluation = self._evaluate_at_stop(recorder, evaluation)
                        break
                collector.maybe_collect()
                job = self.scheduler.next_arrival()
                if job is None:
                    break
                result = self._arrival_result(job, window)
                if result is None:
                    self.snapshots.release(job.base_version)
                    self.stall.missed(self.scheduler.version)
                    self._dispatch(self.scheduler.dispatch_open())
                    continue
                started = time.time()
                staleness = self.scheduler.staleness(job)
                base = self.snapshots.get(job.base_version)
                delta = self.revise_delta(job, result, staleness, base)
                self.buffer.add(delta, staleness)
                if self.privacy is not None:
                    self.privacy.accepted(job.device_id)
                self.snapshots.release(job.base_version)
                self.stall.accepted()
                accepted += 1
                window_staleness.append(staleness)
                self.staleness_histogram.add(staleness)
                self.participation.add([job.device_id])
                arrivals.write(
                    f"{job.job_id},{job.device_id},{job.base_version},{job.dispatch_time!r},{job.arrival_time!r},"
                    f"{staleness}\n"
                )
                new_version = self.scheduler.record_accepted(job)
                if new_version:
                    self._apply_buffer(metrics)
                    self.on_new_version()
                    self._apply_planned_losses()
                window.add("server_aggregate", time.time() - started)
                if new_version and record_due(self.scheduler.version, config, self.scheduler.done):
                    eval_started = time.time()
                    evaluation = self.evaluate()
                    window.add("evaluation", time.time() - eval_started)
                    traffic = self._traffic_fields()
                    timing = with_info(with_bytes(window.close(time.time()), traffic["bytes"]), self.cpu.close())
                    timings.append(timing)
                    record = {
                        "version": self.scheduler.version,
                        "simulated_time": self.scheduler.now,
                        **evaluation.record(),
                        "accepted_updates": accepted,
                        "staleness_mean": float(np.mean(window_staleness)),
                        "staleness_max": int(np.max(window_staleness)),
                        "round_seconds": timing.wall,
                        "timing": timing.to_dict(),
                        "snapshots_held": len(self.snapshots),
                        "dead_leaves": sorted(self.dead_leaves),
                        **traffic,
                        **{f"failed_{k}": v for k, v in self.failures.items()},
                        **self.method_record(),
                        **(self.privacy.last if self.privacy is not None else {}),
                    }
                    if self.new_losses:  # read by the POC command, which does not see the server's console
                        record["leaves_lost"], self.new_losses = self.new_losses, {}
                    recorder.add_round(record)
                    metrics.after_round(self.scheduler.version, record, prefix="version")
                    metrics.histogram(self.scheduler.version, "async/staleness", np.asarray(window_staleness))
                    window_staleness = []
                    window = WindowTiming(time.time())
                    startup.round_finished(time.time())
                    self._print_progress(progress, record, run_started)
                    evaluations += 1
                dispatch_started = time.time()
                self._dispatch(self.scheduler.dispatch_open())
                window.add("server_prepare", time.time() - dispatch_started)
                if new_version and record_due(self.scheduler.version, config, self.scheduler.done):
                    stopping = bool(config.stop_after_version) and self.scheduler.version >= config.stop_after_version
                    if stopping or (config.checkpoint_frequency and evaluations % config.checkpoint_frequency == 0):
                        arrivals.flush()
                        self._checkpoint(output_dir, recorder, accepted, wait=stopping)
                    if stopping and not self.scheduler.done:
                        self._drain()
                        version = self.scheduler.version
                        self._mark_stopped(recorder, "--stop-after-version")
                        print(f"[server] stopped at version {version}; continue with --resume {output_dir}", flush=True)
                        return
                reason = stop() if new_version and not self.scheduler.done else None
                if reason:
                    arrivals.flush()
                    self._checkpoint(output_dir, recorder, accepted)
                    self._mark_stopped(recorder, reason)
                    print(
                        f"[server] stopped ({reason}) at version {self.scheduler.version}; continue with --resume "
                        f"{output_dir}",
                        flush=True,
                    )
                    return
            arrivals.flush()
            self.on_last_version()
            self._checkpoint(output_dir, recorder, accepted)
            self._drain()
        except Exception as error:
            record_failure(recorder, error)
            raise
        finally:
            failed_checkpoint = self.checkpoints.close()
            self.close_method()
            self.calls.close()
            if self.exchange is not None:
                self.exchange.remove()
            collector.stop()
            metrics.close()
            arrivals.close()
        reraise_checkpoint_failure(recorder, failed_checkpoint)
        if timings:
            print(summarize(timings, unit="window"), flush=True)
        recorder.data["startup"] = startup.record()
        self._finish(recorder, output_dir, evaluation, run_started, accepted)

    def _apply_buffer(self, metrics: MetricsWriter) -> None:
        """Apply the full buffer to the global model; under DP with the buffer's noise, accounting the version
        (its epsilon goes to TensorBoard at every version, to the results at recorded ones). ``scheduler.version``
        is already the new version's number."""
        if self.privacy is None:
            self.weights = self.buffer.apply(self.weights)
            return
        version = self.scheduler.version
        noise = self.privacy.noise(version, {name: value.shape for name, value in self.weights.items()})
        self.weights = self.buffer.apply(self.weights, noise)
        epsilon = self.privacy.applied()["dp_epsilon"]
        if not record_due(version, self.config, self.scheduler.done):  # a recorded version writes it with its record
            metrics.scalars(version, {"dp_epsilon": epsilon}, "version")

    def _over_budget(self) -> bool:
        """True (and says so) when the next version would take epsilon above ``--dp-budget``."""
        message = self.privacy.over_budget(self.config.dp_budget, self.scheduler.version + 1)
        if message is not None:
            print(f"[server] {message}", flush=True)
        return message is not None

    def _evaluate_at_stop(self, recorder: RunRecorder, evaluation: EvalResult) -> EvalResult:
        """The model's evaluation where a budget stops the run, recorded when its version was not yet."""
        rounds = recorder.data["rounds"]
        if rounds and rounds[-1]["version"] == self.scheduler.version:
            return evaluation
        evaluation = self.evaluate()
        record = {"version": self.scheduler.version, "simulated_time": self.scheduler.now, **evaluation.record()}
        recorder.add_round({**record, **self.privacy.last})
        return evaluation

    def _mark_stopped(self, recorder: RunRecorder, reason: str) -> None:
        """Record in results.json that the run stopped early (the command stops the processes once it reads it)."""
        recorder.data["stopped"] = {"at_version": self.scheduler.version, "reason": reason}
        recorder.flush()

    def _arrival_result(self, job: DeviceJob, window: WindowTiming) -> dict | None:
        """The accepted result of an arriving job, or None when the device dropped out, never answered,
        its leaf is gone, or its update failed validation (each counted and, for rejections, printed)."""
        if job.dropped:
            self.failures[SESSION_END] += 1
            return None
        outcome = self.dropout.outcome(job.job_id, job.device_id) if self.dropout.enabled else "ok"
        if outcome != "ok":
            self.failures[outcome] += 1
            return None
        leaf = self.leaves[self.population.leaf_of(job.device_id)]
        if leaf in self.lost_at and job.arrival_time > self.lost_at[leaf]:
            # lost by --lose-leaf: whether its result already came back (wall-clock timing) must not matter
            if self._waiting.pop(job_key(job), None) is None and job_key(job) in self._in_flight:
                self.gather.stale.add(job_key(job))  # still in flight: drop the result when it comes
            self.failures["leaf_lost"] += 1
            return None
        if leaf in self.dead_leaves and job_key(job) not in self._waiting:
            self.failures["leaf_lost"] += 1
            return None
        if self.gather.holds(job):  # needed now: send what was gathered
            self.gather.flush()
            self._send_ready()
        result = self._wait_for(job_key(job), window)
        if result is None:
            self.failures["leaf_lost"] += 1
            return None
        if self.privacy is not None and self.privacy.repeats(job.device_id):  # DP: one update per device and buffer
            self.failures["dp_repeat"] += 1
            return None
        if "encoded" in result:  # a lossy uplink's row, forwarded by the leaf as it arrived
            parts, keys = result.pop("encoded"), result.pop("delta_keys")
            decode_started = time.perf_counter()
            try:
                result["delta"] = decode_row(parts, keys, self.weights, self.codec_spec)
            except ValueError as error:
                self.failures["rejected"] += 1
                self._print_rejection(f"device {job.device_id}: {error}")
                return None
            finally:
                window.add_server_decode(time.perf_counter() - decode_started)
        fault = self.faults.any_fault(job.job_id, job.device_id)
        if fault is not None:
            result["delta"] = FaultInjector.corrupt(result["delta"], fault)
        if self.privacy is None:
            self.validator.max_norm = self.config.update_norm_limit(self._base_norm(job.base_version))
        rejection = self.validator.check_job_result(result["delta"], result["num_samples"], f"device {job.device_id}")
        if rejection is not None:
            self.failures["rejected"] += 1
            self._print_rejection(str(rejection))
            return None
        return result

    def _print_rejection(self, text: str) -> None:
        """Print a rejected update's line, the first few of each version (:meth:`StallGuard.printable`)."""
        line = self.stall.printable(self.scheduler.version, f"[server] version {self.scheduler.version}: {text}")
        if line is not None:
            print(line, flush=True)

    def _base_norm(self, version: int) -> float:
        """L2 norm of the model of ``version`` (held in the snapshots), computed once per version: about B
        arrivals share a base. Norms of versions no longer held are dropped when a new one is computed."""
        norm = self._base_norms.get(version)
        if norm is None:
            base = self.snapshots.get(version)
            norm = float(np.sqrt(sum(float(np.vdot(v, v)) for v in base.values())))
            self._base_norms = {v: n for v, n in self._base_norms.items() if v in self.snapshots}
            self._base_norms[version] = norm
        return norm

    def _print_progress(self, progress: ProgressLine | None, record: dict, run_started: float) -> None:
        summary = (
            f"sim-time {record['simulated_time']:.1f}s  {format_metrics(record['loss'], record['metrics'])}  "
            f"staleness {record['staleness_mean']:.1f}"
        )
        if "dp_epsilon" in record:
            summary += f"  epsilon {record['dp_epsilon']:.3f}"
        elapsed = time.time() - run_started
        sim_eta = self._sim_time_eta.update(record["simulated_time"], elapsed) if self._sim_time_eta else None
        line = progress.line(record["version"], elapsed, summary, other_eta=sim_eta) if progress else None
        if progress is None:
            eta = f"  eta {format_duration(sim_eta)}" if sim_eta is not None else ""
            line = f"version {record['version']}  elapsed {format_duration(elapsed)}{eta}  {summary}"
        if line:
            print(line, flush=True)

    def _finish(
        self, recorder: RunRecorder, output_dir: str, evaluation: EvalResult, run_started: float, accepted: int
    ) -> None:
        final_path = os.path.join(output_dir, "final_model.pt")
        torch.save(weights_to_tensors(self.weights), final_path)
        recorder.finish(
            {
                "final_accuracy": evaluation.metrics.get("accuracy"),
                "final_loss": evaluation.loss,
                "final_metrics": dict(evaluation.metrics),
                "versions": self.scheduler.version,
                "simulated_time": self.scheduler.now,
                "accepted_updates": accepted,
                "bytes_total": dict(self.traffic.totals),
                "dropouts_by_cause": dict(self.failures),
                "participation": self.participation.summary(),
                "staleness": self.staleness_histogram.summary(),
                "wall_seconds": time.time() - run_started,
                "final_model": final_path,
                **self.method_record(),
                **(self.privacy.summary() if self.privacy is not None else {}),
            }
        )
        print(
            f"[server] done at version {self.scheduler.version}, simulated time {self.scheduler.now:.1f}s; "
            f"final model {final_path}",
            flush=True,
        )


class FedBuffServer(AsyncServer):
    """Asynchronous buffered aggregation (FedBuff)."""


def record_due(version: int, config: AsyncConfig, done: bool) -> bool:
    """Whether version ``version`` is evaluated and recorded (every ``--eval-frequency`` versions and the last)."""
    return version % config.eval_frequency == 0 or done


def _truncate_lines(path: str, keep: int) -> None:
    """Keep the first ``keep`` lines of a text file (arrivals logged after the checkpoint are replayed)."""
    if not os.path.isfile(path):
        with open(path, "w", encoding="utf-8") as stream:
            stream.write("job_id,device_id,base_version,dispatch_time,arrival_time,staleness\n")
        return
    with open(path, encoding="utf-8") as stream:
        lines = stream.readlines()[:keep]
    with open(path, "w", encoding="utf-8") as stream:
        stream.writelines(lines)


def buffered_privacy(config: AsyncConfig):
    """The run's :class:`~devsim.privacy.buffered.BufferedPrivacy` (DP-FedBuff), or None without ``--dp``."""
    if config.dp == "off":
        return None
    from devsim.privacy.buffered import BufferedPrivacy
    from devsim.privacy.plan import PrivacyPlan

    return BufferedPrivacy(PrivacyPlan.from_settings(config), config.seed, config.global_lr)
