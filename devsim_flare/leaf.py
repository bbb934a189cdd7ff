"""The leaf node: an NVFlare client (Collab object) that trains the devices it is assigned.

A leaf loads its training data once, builds a fixed pool of device workers sized from CPU cores
and free VRAM (printed at start, overridable), and for every round receives the global model
once plus its device list, trains those devices in its pool, and replies with the sum of
sample-weighted deltas, the total weight and per-device metrics.
"""

from __future__ import annotations

import functools
import importlib
import os
import time
from collections.abc import Sequence

import numpy as np
import torch
from nvflare.collab import collab

from devsim.codec import weights_norm
from devsim.compression import CodecSpec, UplinkCompressor
from devsim.config import device_batch_value
from devsim.data.groups import leaf_group
from devsim.observe.cpu import leaf_counters_now
from devsim.observe.startup import SetupParts, process_started
from devsim.population.devices import natural_sort
from devsim.population.dropout import DropoutModel
from devsim.population.faults import FaultInjector
from devsim.privacy.device import DevicePrivacy
from devsim.privacy.noise import noised_norm_bound, with_gaussian
from devsim.resources.collection import PeriodicCollector
from devsim.resources.cuda_warmup import warmup_parts
from devsim.resources.leaf_plan import LeafPlan, devices_at_once, expected_group_sizes, plan_leaf
from devsim.resources.precision import apply_cudnn_benchmark, apply_tf32
from devsim.shared_arrays import ExchangeClosed, received_weights, reply_in_file
from devsim.training.leaf_runner import LeafRoundRunner
from devsim_flare.leaf_liveness import in_job_process, mark_lost_if_killed, unmark_lost
from devsim_flare.wire import per_job_field

RUN_ENDED = {"run_ended": True}
"""A leaf's answer to a call of a run that has ended (Ctrl-C, SIGTERM): no one reads it."""
PER_JOB_FIELDS = ("job_id", "num_samples", "loss", "accuracy", "compute_seconds", "uplink_bytes", "uplink_raw_bytes")
"""Per-job fields of an asynchronous reply (one value per job), sent in :func:`~devsim_flare.wire.per_job_field`'s
form."""

DEFAULT_PROCESSOR = "processors.task_processor.TaskDeviceProcessor"


def _import_class(path: str):
    module_name, _, class_name = path.rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)


class LeafNode:
    """Client-side Collab object; constructor arguments are plain values (they go into job JSON)."""

    def __init__(
        self,
        settings: dict,
        num_workers: int | None = None,
        leaves_on_host: int = 1,
        processor: str = DEFAULT_PROCESSOR,
        leaves_on_gpu: int = 1,
    ):
        self.settings = settings
        self.num_workers = num_workers
        self.leaves_on_host = leaves_on_host
        self.leaves_on_gpu = leaves_on_gpu
        self.processor = processor
        self._runner: LeafRoundRunner | None = None
        self._startup: dict[str, float] | None = None
        self._lost_mark: str | None = None

    @collab.init
    def start(self) -> None:
        """Load data, size and build the worker pool (runs once when the job starts on this site)."""
        started = time.time()
        if in_job_process():  # POC, prod: a killed job process reads as a lost leaf, not as a failed job
            self._lost_mark = mark_lost_if_killed(collab.context.workspace.get_run_dir(collab.fl_ctx.get_job_id()))
        parts = SetupParts()
        with parts.measure("import"):  # the project's modules, from the job's custom/ folder
            processor_cls = _import_class(self.processor)
        settings = dict(self.settings)
        settings["hidden_group"] = self._hidden_group()
        self.settings = settings
        apply_tf32(bool(settings.get("tf32", False)))
        apply_cudnn_benchmark(bool(settings.get("cudnn_benchmark", False)))
        first = processor_cls.from_settings(settings)
        if first.torch_device.type == "cuda":
            with parts.measure("cuda_init"):
                torch.zeros(1, device=first.torch_device)
                torch.cuda.synchronize(first.torch_device)
        with parts.measure("task_and_data"):
            first.setup()
        with parts.measure("plan_and_probe"):
            plan = self._plan(first)
        torch.set_num_threads(plan.threads_per_worker)
        workers = [first]
        with parts.measure("workers"):
            for _ in range(plan.num_workers - 1):
                worker = processor_cls.from_settings(self.settings, compute_device=str(first.torch_device))
                worker.setup()
                workers.append(worker)
        self._runner = LeafRoundRunner(
            workers,
            device_batch=plan.device_batch,
            uplink=_uplink_from_settings(settings),
            fill_groups=plan.fill_groups,
        )
        compiled = self._warm_compiled(workers, plan, parts)
        self._dropout = DropoutModel(
            float(settings.get("device_dropout", 0.0)),
            float(settings.get("device_never_answer", 0.0)),
            seed=int(settings.get("seed", 0)),
        )
        kinds = tuple(k.strip() for k in str(settings.get("inject_faults", "")).split(",") if k.strip())
        self._faults = FaultInjector(kinds, float(settings.get("fault_probability", 0.0)), int(settings.get("seed", 0)))
        self._leaf_index = natural_sort([client.name for client in collab.clients]).index(collab.site_name)
        group = f"; hidden group {settings['hidden_group']}" if int(settings.get("hidden_groups", 1)) > 1 else ""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = f"; CUDA_VISIBLE_DEVICES={visible}" if visible is not None else ""
        if hasattr(first, "_ready_task"):
            print(f"[{collab.site_name}] {first._ready_task().describe()}", flush=True)
        print(f"[{collab.site_name}] {plan.reason}{group}{gpus}", flush=True)
        if plan.device_batch > 1 and getattr(first, "batching_note", ""):
            print(f"[{collab.site_name}] {first.batching_note}", flush=True)
        if getattr(first, "probe_cached_in", None):
            print(f"[{collab.site_name}] batching verdict from {first.probe_cached_in} (delete it to probe again)")
        if compiled:
            print(f"[{collab.site_name}] {compiled}", flush=True)
        print(
            f"[{collab.site_name}] set up in {time.time() - started:.1f}s ("
            + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in parts.seconds.items())
            + "), "
            f"{time.time() - process_started():.1f}s after its process started",
            flush=True,
        )
        self._collector = PeriodicCollector().start()
        process_at = process_started()
        self._startup = {
            **parts.record(),
            "process_to_setup": started - process_at,
            "process_started_at": process_at,
            "setup_done_at": time.time(),
            **warmup_parts(),
        }

    def _plan(self, worker) -> LeafPlan:
        """This leaf's workers and devices per batched computation (:func:`devsim.resources.leaf_plan.plan_leaf`;
        auto batches when the probe finds the batched updates exact, sized from free memory); the probe runs only
        when batching is still in question."""
        setting = device_batch_value(self.settings.get("device_batch", "auto"))
        if hasattr(worker, "batching_obstacle") and hasattr(worker, "train_devices_batched"):
            obstacle = functools.partial(worker.batching_obstacle, timed=setting == "auto")
            device_bytes = worker.batched_device_bytes()
        else:
            obstacle, device_bytes = f"processor {type(worker).__name__} trains one device at a time", 1
        return plan_leaf(
            device=str(worker.torch_device),
            num_params=int(worker.num_params),
            batch_size=int(self.settings.get("batch_size", 32)),
            device_batch_setting=setting,
            obstacle=obstacle,
            device_bytes=device_bytes,
            devices_at_once=devices_at_once(self.settings),
            leaves_on_host=self.leaves_on_host,
            leaves_on_gpu=self.leaves_on_gpu,
            override=self.num_workers,
        )

    def _warm_compiled(self, workers: list, plan: LeafPlan, parts: SetupParts) -> str:
        """Resolve ``--compile`` and compile the bucketed group sizes this leaf's rounds (every size up to its share
        of the jobs in flight, in an asynchronous run) will bring, on every worker, now (start-up) rather than in the
        first rounds; the log phrase ('' when the leaf does not batch)."""
        first = workers[0]
        if plan.device_batch < 2 or not hasattr(first, "compile_choice"):
            return ""
        with parts.measure("compile"):
            choice = first.compile_choice()
            sizes = expected_group_sizes(plan, devices_at_once(self.settings))
            if sizes and self.settings.get("concurrency") is not None:  # async calls bring any count up to it
                sizes = list(range(2, max(sizes) + 1))
            warmed = [worker.warm_compiled(sizes) for worker in workers][0] if choice.enabled else []
        return f"{choice.reason}" + (f"; warmed buckets {warmed} for groups of {sizes}" if warmed else "")

    def _attach_startup(self, payload: dict) -> None:
        """Send this leaf's set-up parts (seconds) once, with its first reply (``startup``)."""
        if self._startup is not None:
            payload["startup"] = self._startup
            self._startup = None

    def _receive(self, weights: dict, exchange_folder: str | None, shared_weights: dict | None) -> dict | None:
        """A call's weights (:func:`~devsim.shared_arrays.received_weights`), the periodic collection run; None when
        the run that sent the call has ended (its exchange folder is gone, so no one reads the answer)."""
        try:
            weights = received_weights(weights, exchange_folder, shared_weights)
        except ExchangeClosed:
            return None
        self._collector.maybe_collect()
        return weights

    def _norm_limit(self, weights: dict) -> float | None:
        """Device-update L2 limit: --max-update-norm and --max-update-ratio times the global model's norm."""
        limits = [float(v) for v in (self.settings.get("max_update_norm"),) if v is not None]
        ratio = self.settings.get("max_update_ratio")
        if ratio is not None:
            limits.append(float(ratio) * weights_norm(weights))
        return min(limits) if limits else None

    def _hidden_group(self) -> int:
        """This leaf's hidden data group: its position among all leaf sites (natural order) mod the group count."""
        groups = int(self.settings.get("hidden_groups", 1))
        if groups <= 1:
            return 0
        leaves = natural_sort([client.name for client in collab.clients])
        return leaf_group(leaves.index(collab.site_name), groups)

    @collab.publish
    def train_round(
        self,
        round_num: int,
        weights: dict,
        assignments: dict,
        exchange_folder: str | None = None,
        shared_weights: dict | None = None,
        dp: dict | None = None,
    ) -> dict:
        """Train this leaf's devices in ``assignments`` (site name -> int64 device ids) from ``weights``; with
        ``exchange_folder`` the weights and the float32 ``delta_sum`` travel as files of it (see
        :meth:`train_jobs`). ``dp`` (differential privacy; the server's ``_leaf_privacy``) holds this round's clip
        norm, each device's local noise std and this leaf's share of the central noise (std, 0: none)."""
        received_at = time.time()
        weights = self._receive(weights, exchange_folder, shared_weights)
        if weights is None:
            return dict(RUN_ENDED)
        device_ids = np.asarray(assignments[collab.site_name], dtype=np.int64).tolist()
        max_norm = self._norm_limit(weights)
        privacy = None
        if dp is not None:
            privacy = DevicePrivacy(float(dp["clip"]), float(dp["local_noise_std"]), int(self.settings.get("seed", 0)))
            if max_norm is not None and privacy.local_noise_std:  # local DP: the leaf sees noised updates
                size = sum(int(np.size(v)) for v in weights.values())
                max_norm = max(max_norm, noised_norm_bound(privacy.clip, privacy.local_noise_std, size))
        result = self._runner.run_round(round_num, weights, device_ids, self._dropout, self._faults, max_norm, privacy)
        payload = result.to_payload()
        if dp is not None and float(dp["leaf_noise_std"]):
            seed = int(self.settings.get("seed", 0))
            payload["delta_sum"] = with_gaussian(
                payload["delta_sum"], float(dp["leaf_noise_std"]), seed, "dp-leaf-noise", round_num, self._leaf_index
            )
        wire_fault = self._faults.wire_fault(round_num, self._leaf_index)
        if wire_fault is not None:
            payload["delta_sum"] = FaultInjector.corrupt(payload["delta_sum"], wire_fault)
        reply_in_file(payload, "delta_sum", exchange_folder)
        self._attach_startup(payload)
        payload["timing"]["leaf_received_at"] = received_at
        payload["timing"]["leaf_replied_at"] = time.time()
        payload["timing"].update(leaf_counters_now())
        return payload

    @collab.publish
    def train_jobs(
        self,
        version: int,
        weights: dict,
        job_ids: Sequence[int],
        device_ids: Sequence[int],
        train_seeds: Sequence[int],
        with_histograms: bool = False,
        job_bases: Sequence[int] | None = None,
        base_versions: Sequence[int] | None = None,
        exchange_folder: str | None = None,
        shared_weights: dict | None = None,
        dp: dict | None = None,
    ) -> dict:
        """Train asynchronous device jobs that all start from global ``version`` (``weights``), or, with
        ``job_bases``, from several versions: ``weights`` then stacks the ``base_versions`` models per entry,
        (V, *shape), and job ``i`` starts from row ``job_bases[i]``.

        With ``exchange_folder`` (``--shared-memory on``: server and leaf on one host) ``shared_weights``, when
        given, describes the file of that folder holding the weights (``weights`` is then empty), and the float32
        deltas go back the same way unless the file cannot be written (:mod:`devsim.shared_arrays`).

        ``dp`` (DP-FedBuff; the server's ``_job_privacy``) holds the clip norm and the noise std each update gets
        before it leaves the leaf (local DP, or leaf placement's share of a buffer's noise; 0: none).

        Returns each job's own delta (stacked per model entry) with its metrics; see
        :meth:`devsim.training.leaf_runner.LeafRoundRunner.run_jobs`. The ids come, and the per-job metrics
        (:data:`PER_JOB_FIELDS`) go back, as lists when a call carries few jobs (:mod:`devsim_flare.wire`).
        """
        received_at = time.time()
        weights = self._receive(weights, exchange_folder, shared_weights)
        if weights is None:
            return dict(RUN_ENDED)
        payload = self._runner.run_jobs(
            weights,
            np.asarray(job_ids).tolist(),
            np.asarray(device_ids).tolist(),
            np.asarray(train_seeds).tolist(),
            with_histograms=with_histograms,
            version=int(version),
            job_bases=None if job_bases is None else np.asarray(job_bases).tolist(),
            base_versions=None if base_versions is None else np.asarray(base_versions).tolist(),
            privacy=None
            if dp is None
            else DevicePrivacy(float(dp["clip"]), float(dp["noise_std"]), int(self.settings.get("seed", 0))),
        )
        payload["version"] = int(version)
        for key in PER_JOB_FIELDS:
            if key in payload:
                payload[key] = per_job_field(payload[key])
        reply_in_file(payload, "deltas", exchange_folder)
        self._attach_startup(payload)
        payload["timing"]["leaf_received_at"] = received_at
        payload["timing"]["leaf_replied_at"] = time.time()
        payload["timing"].update(leaf_counters_now())
        return payload

    @collab.publish
    def uplink_state(self) -> dict:
        """This leaf's uplink state (error-feedback residuals, top-k momentum) for the server's checkpoint."""
        return self._runner.uplink.state()

    @collab.publish
    def load_uplink_state(self, state: dict) -> bool:
        """Restore :meth:`uplink_state` from a checkpoint (``--resume``); True when done."""
        self._runner.uplink.load_state(state)
        return True

    @collab.final
    def stop(self) -> None:
        if self._lost_mark is not None:
            unmark_lost(self._lost_mark)
        if self._runner is not None:
            self._runner.close()
            self._runner = None


def _uplink_from_settings(settings: dict) -> UplinkCompressor:
    """The device -> leaf uplink of this run (``--update-codec`` and its options; ``none`` when absent)."""
    return UplinkCompressor(
        CodecSpec.from_settings(settings),
        residual_capacity=int(settings.get("residual_capacity", 10000)),
        residual_max_age=int(settings.get("residual_max_age", 50)),
        residual_max_bytes=int(float(settings.get("residual_memory_mb", 1024)) * 2**20),
    )
