"""Checkpoints of asynchronous runs: what an :class:`~devsim_flare.servers.async_server.AsyncServer` saves
(weights, scheduler, snapshots of versions in flight, buffer, method and privacy state, records) and how a resumed
run restores it and relaunches the jobs that were in flight. A mixin; the state lives on the server."""

from __future__ import annotations

import numpy as np

from devsim.clock import DeviceJob
from devsim.observe.checkpoint import load_checkpoint
from devsim.observe.results import RunRecorder


class AsyncCheckpoints:
    """Save and restore an asynchronous run (methods only; ``method_state`` is extended by FedRevive)."""

    def method_state(self) -> dict:
        """Method-specific state for checkpoints (FedRevive: the reviver)."""
        return {}

    def load_method_state(self, state: dict) -> None:
        """Restore :meth:`method_state`."""

    def _checkpoint(self, output_dir: str, recorder: RunRecorder, accepted: int, wait: bool = True) -> None:
        """Save the run's state: in the background, or complete on return (``wait``; see
        :class:`~devsim.observe.checkpoint.CheckpointWriter`)."""
        in_flight = self.scheduler.base_versions_in_flight()
        self.checkpoints.save(
            output_dir,
            {
                "kind": "async",
                "weights": self.weights,
                "scheduler": self.scheduler.state_dict(),
                "snapshots": {v: self.snapshots.get(v) for v in sorted(in_flight)},
                "buffer": self.buffer.state_dict(),
                "method": self.method_state(),
                "records": recorder.log_records(),
                "accepted": accepted,
                "failures": dict(self.failures),
                "participation": self.participation.state(),
                "staleness_histogram": self.staleness_histogram.state(),
                "lost_at": dict(self.lost_at),
                "privacy": self.privacy.state() if self.privacy is not None else None,
                "config": self.config.to_dict(),
            },
            wait=wait,
        )

    def _resume(self, recorder: RunRecorder) -> int:
        """Restore a checkpoint and relaunch the jobs that were in flight; returns accepted updates so far."""
        state = load_checkpoint(self.config.resume_from)
        if state.get("kind") != "async":
            raise RuntimeError(f"{self.config.resume_from} holds a checkpoint of a synchronous run")
        self.weights = {k: np.asarray(v, dtype=np.float32) for k, v in state["weights"].items()}
        self.scheduler.load_state_dict(state["scheduler"])
        self.buffer.load_state_dict(state["buffer"])
        self.load_method_state(state["method"])
        self.failures.update(state["failures"])
        self.lost_at = dict(state.get("lost_at", {}))
        self.dead_leaves.update(self.lost_at)
        if self.privacy is not None:
            self.privacy.load_state(state["privacy"])
        if "participation" in state:
            self.participation.load(state["participation"])
            self.staleness_histogram.load(state["staleness_histogram"])
        recorder.data["rounds"] = list(state["records"])
        self.traffic.load_totals(recorder.data["rounds"][-1].get("bytes_total", {}) if recorder.data["rounds"] else {})
        jobs = self.scheduler.in_flight_jobs()
        by_version: dict[int, list[DeviceJob]] = {}
        for job in jobs:
            by_version.setdefault(job.base_version, []).append(job)
        for version, version_jobs in sorted(by_version.items()):
            weights = {k: np.asarray(v, dtype=np.float32) for k, v in state["snapshots"][version].items()}
            self.snapshots.retain(version, weights, len(version_jobs))
        self.gather.add([job for job in jobs if self._sendable(job)])
        self.gather.flush()
        self._send_ready()
        print(
            f"[server] resumed from {self.config.resume_from} at version {self.scheduler.version}, simulated time "
            f"{self.scheduler.now:.2f}s, {len(jobs)} jobs relaunched",
            flush=True,
        )
        return int(state["accepted"])
