"""FedRevive on the asynchronous server: every accepted arrival may be revived by server-side
data-free knowledge distillation before it enters the buffer (REFERENCES.md, FedRevive)."""

from __future__ import annotations

import time

import numpy as np
import torch

from devsim.aggregation.fedrevive import (
    DFKDConfig,
    GaussianProbeEstimator,
    InputSpace,
    Reviver,
    ReviverConfig,
    input_space,
    proportions_from_counts,
    scaled_s_max,
)
from devsim.clock import DeviceJob
from devsim.codec import load_numpy_into_model
from devsim.config import ConfigError, FedReviveConfig
from devsim_flare.servers.async_server import AsyncServer, Weights

FEDREVIVE_PROCESSOR = "processors.fedrevive_task_processor.FedReviveDeviceProcessor"


class FedReviveServer(AsyncServer):
    """Asynchronous FedRevive: FedBuff buffering of deltas blended with a KD delta by staleness."""

    method = "fedrevive"
    processor = FEDREVIVE_PROCESSOR
    config_cls = FedReviveConfig

    def wants_histograms(self) -> bool:
        return self.config.class_proportions == "true"

    def model_args(self) -> dict:
        return {"track_features": True}

    def setup_method(self, config: FedReviveConfig, device: torch.device) -> None:
        """Build the reviver for ``self.task`` (set by ``start_run``): its generator, input map and models.

        Raises:
            ValueError: FedRevive cannot synthesise the task's inputs.
            ConfigError: ``--class-proportions estimated`` for a task whose model inputs are not floating point
                (the Gaussian probes are float inputs).
        """
        space = input_space(self.task)
        self._check_proportions(config, space)
        s_max = config.s_max if config.s_max is not None else scaled_s_max(config.concurrency, config.buffer_size)
        dfkd = DFKDConfig(
            num_classes=self.task.num_classes,
            generator_width=config.generator_width,
            synth_batch_size=config.synth_batch_size,
            kd_iterations=config.kd_iterations,
            pool_capacity=config.pool_capacity,
            **space.dfkd_settings(),
        )
        self.reviver = Reviver(
            lambda: self.task.build_model(track_features=True),
            ReviverConfig(
                s_max=s_max,
                freeze_version=config.freeze_version,
                warmup_version=config.warmup_version,
                generation_interval=config.generation_interval,
                teacher_capacity=config.teacher_capacity,
                kd_interval=config.kd_interval,
                distill_lag=config.distill_lag,
                dfkd=dfkd,
            ),
            device,
            seed=config.seed,
        )
        self.estimator = None
        if config.class_proportions == "estimated":
            self.estimator = GaussianProbeEstimator(seed=config.seed, input_shape=space.shape)
        self.probe_model = self.task.build_model(track_features=True).to(device)
        self.revive_seconds = 0.0
        self.revive_cpu_seconds = 0.0
        self.revive_wait_seconds = 0.0
        self.arrivals = 0
        schedule = (
            f"synthesis and KD in the background, each landing {config.distill_lag} version(s) after the version it "
            f"reads, KD every {config.kd_interval} version(s)"
            if config.distill_lag
            else f"KD every {config.kd_interval} eligible arrival(s)"
        )
        print(
            f"[server] FedRevive: s_max {s_max:g}, freeze at version {config.freeze_version}, "
            f"warm-up until version {config.warmup_version}, class proportions {config.class_proportions}, "
            f"{schedule}, {_describe(space)}",
            flush=True,
        )

    def _check_proportions(self, config: FedReviveConfig, space: InputSpace) -> None:
        if config.class_proportions == "estimated" and not space.float_inputs:
            raise ConfigError(
                "class_proportions",
                f"estimated probes each client model with Gaussian float inputs, and task {self.task.origin} "
                "feeds its model non-float inputs; use true (the clients' label histograms)",
            )

    def revise_delta(self, job: DeviceJob, result: dict, staleness: int, base: Weights) -> Weights:
        started, cpu_started = time.perf_counter(), time.thread_time()
        client = {k: base[k] + result["delta"][k] for k in base}
        if self.estimator is None:
            q = proportions_from_counts(np.asarray(result["label_hist"], dtype=np.float64))
        else:
            load_numpy_into_model(self.probe_model, client)
            q = self.estimator.observe(job.device_id, self.probe_model)
        delta, _ = self.reviver.on_arrival(self.weights, self.scheduler.version, base, client, q, staleness)
        self.revive_seconds += time.perf_counter() - started
        self.revive_cpu_seconds += time.thread_time() - cpu_started
        self.arrivals += 1
        return delta

    def on_new_version(self) -> None:
        landed = self.reviver.on_version(self.weights, self.scheduler.version)
        if landed["landed"]:
            self.revive_cpu_seconds += float(landed.get("cpu_seconds", 0.0))
            self.revive_seconds += float(landed["seconds"])
        self.revive_wait_seconds += landed["waited_seconds"]

    def on_last_version(self) -> None:
        self.reviver.abandon_pending()

    def close_method(self) -> None:
        self.reviver.close()

    def method_record(self) -> dict:
        state = self.reviver.state
        return {
            "kd_updates": int(state.kd_updates),
            "kd_runs": int(state.kd_runs),
            "synth_steps": int(state.synth_steps),
            "revive_seconds_per_arrival": self.revive_seconds / max(self.arrivals, 1),
            "revive_cpu_seconds_per_arrival": self.revive_cpu_seconds / max(self.arrivals, 1),
            "revive_wait_seconds": self.revive_wait_seconds,
        }

    def method_state(self) -> dict:
        return {
            "reviver": self.reviver.state_dict(),
            "estimator": self.estimator.state_dict() if self.estimator is not None else None,
            "revive_seconds": self.revive_seconds,
            "revive_cpu_seconds": self.revive_cpu_seconds,
            "revive_wait_seconds": self.revive_wait_seconds,
            "arrivals": self.arrivals,
        }

    def load_method_state(self, state: dict) -> None:
        self.reviver.load_state_dict(state["reviver"])
        if self.estimator is not None and state["estimator"] is not None:
            self.estimator.load_state_dict(state["estimator"])
        self.revive_seconds = float(state["revive_seconds"])
        self.revive_cpu_seconds = float(state.get("revive_cpu_seconds", 0.0))
        self.revive_wait_seconds = float(state.get("revive_wait_seconds", 0.0))
        self.arrivals = int(state["arrivals"])


def _describe(space: InputSpace) -> str:
    """How FedRevive synthesises the task's inputs, for the server log."""
    if space.generator is not None:
        return f"inputs {space.shape} from the task's generator"
    kind = "conv generator, crop and flip" if space.image else "MLP generator"
    return f"inputs {space.shape} from the {kind}"
