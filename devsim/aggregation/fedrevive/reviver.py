"""Per-arrival server logic of FedRevive: teacher buffer, staleness gate, synthesis, KD and delta blending.

Applying the returned delta (buffering ``B`` deltas, ``w += eta_g * mean(buffer)``, ``v += 1``: spec step 5) is the
caller's job; this module produces the per-arrival delta only.

Two schedules for the synthesis and KD work (``ReviverConfig.distill_lag``):

- inline (``distill_lag`` 0, the paper's literal order): :meth:`Reviver.on_arrival` synthesises and distils on the
  arrival that needs it, before returning its delta;
- background (``distill_lag`` N >= 1): :meth:`Reviver.on_version` (each new global version ``v``) starts that
  version's synthesis and / or KD on one background thread, reading ``w_v`` and the teachers buffered then, and
  installs the work started at ``v - N`` (waiting for it); arrivals blend the ``delta_KD`` installed last. What
  each piece of work reads and where it lands depend on versions alone, so a run repeats bit for bit.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from devsim.aggregation.fedrevive._common import WorkAbandoned
from devsim.aggregation.fedrevive.config import ReviverConfig
from devsim.aggregation.fedrevive.distill import distill
from devsim.aggregation.fedrevive.ensemble import TeacherEnsemble
from devsim.aggregation.fedrevive.staleness import beta as staleness_beta
from devsim.aggregation.fedrevive.synthesis import Synthesizer
from devsim.aggregation.fedrevive.teachers import TeacherBuffer
from devsim.codec import load_numpy_into_model

__all__ = ["FedReviveServerState", "Reviver", "ReviverConfig"]

Weights = dict[str, np.ndarray]


@dataclass
class FedReviveServerState:
    """Counters of a :class:`Reviver` (part of its checkpoint). Seconds are wall-clock totals.

    ``kd_updates``: arrivals blended with a KD delta; ``kd_runs``: distillations run (fewer with ``kd_interval``);
    ``kd_since_run``: eligible arrivals since the last distillation (0: none yet).
    """

    arrivals: int = 0
    synth_steps: int = 0
    kd_updates: int = 0
    kd_runs: int = 0
    kd_since_run: int = 0
    synth_seconds: float = 0.0
    kd_seconds: float = 0.0


class Reviver:
    """FedRevive's server state and per-arrival update rule.

    ``model_fn()`` must return a fresh model of the federation's architecture, with feature trackers where the
    architecture has them (built-in models; a user's model has none and synthesis matches no feature
    statistics), so its ``state_dict`` keys match the weight dicts; up to ``teacher_capacity + 1`` such modules
    are kept on ``device`` (teachers and a scratch student). Synthesis and KD randomness derives from ``seed``.
    """

    def __init__(
        self,
        model_fn: Callable[[], nn.Module],
        config: ReviverConfig | None = None,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ) -> None:
        self.config = config if config is not None else ReviverConfig()
        self.model_fn = model_fn
        self.device = torch.device(device)
        self.teachers = TeacherBuffer(self.config.teacher_capacity)
        self.synthesizer = Synthesizer(self.config.dfkd, self.device, seed)
        self.kd_rng = torch.Generator().manual_seed(seed + 1)
        self.state = FedReviveServerState()
        self._student = model_fn().to(self.device)
        self._param_names = {name for name, _ in self._student.named_parameters()}
        self._teacher_modules: dict[int, nn.Module] = {}
        self._spare_modules: list[nn.Module] = []
        self._ensemble: tuple[tuple[int, ...], TeacherEnsemble] | None = None
        self._delta_kd: Weights | None = None
        self._pending: dict[int, Future | tuple[Weights | None, dict[str, Any]]] = {}
        """Background work by the version its result lands at: running (a future) or done (restored)."""
        self._executor: ThreadPoolExecutor | None = None
        self._abandon = threading.Event()
        """Set while :meth:`abandon_pending` stops the running work at its next inner step."""
        self._threads = torch.get_num_threads()
        self._prepared = self._background_executor().submit(self.synthesizer.prepare) if self.background else None

    @property
    def background(self) -> bool:
        """Whether synthesis and KD run on the background thread (``distill_lag`` >= 1)."""
        return self.config.distill_lag > 0

    @property
    def kd_updates(self) -> int:
        """Number of arrivals whose delta was blended with a KD update."""
        return self.state.kd_updates

    @property
    def synth_steps(self) -> int:
        """Number of SYNTHESIZE calls (each ``config.dfkd.synth_steps`` inner generator steps)."""
        return self.state.synth_steps

    @property
    def pool(self):
        """The synthetic input pool (:class:`devsim.aggregation.fedrevive.pool.SyntheticPool`)."""
        return self.synthesizer.pool

    def _synthesize(self, teachers, weights, warm: bool, ensemble, info: dict[str, Any]) -> None:
        """One synthesis step into the pool (the student, warm, starts from ``weights``); its seconds and losses go
        into ``info`` and the run's counters."""
        synth_start = time.perf_counter()
        if warm:
            load_numpy_into_model(self._student, weights)
        student = self._student if warm else None
        losses = self.synthesizer.synthesize(teachers, student, warm, ensemble, stop=self._abandon)
        info["synth_seconds"] = time.perf_counter() - synth_start
        info.update({f"synth_{key}": value for key, value in losses.items()})
        info["synthesized"] = True
        self.state.synth_steps += 1
        self.state.synth_seconds += info["synth_seconds"]

    def _loaded_teachers(self, live: list | None = None) -> list[tuple[nn.Module, np.ndarray]]:
        """``(module, q)`` for ``live`` (default: the buffered teachers, newest first), reusing modules already
        holding a teacher."""
        live = list(self.teachers) if live is None else live
        live_uids = {teacher.uid for teacher in live}
        for uid in [uid for uid in self._teacher_modules if uid not in live_uids]:
            self._spare_modules.append(self._teacher_modules.pop(uid))
        for teacher in live:
            if teacher.uid not in self._teacher_modules:
                module = self._spare_modules.pop() if self._spare_modules else self.model_fn().to(self.device)
                load_numpy_into_model(module, teacher.weights)
                self._teacher_modules[teacher.uid] = module.eval()
        return [(self._teacher_modules[teacher.uid], teacher.q) for teacher in live]

    def _teacher_ensemble(
        self, teachers: list[tuple[nn.Module, np.ndarray]], live: list | None = None
    ) -> TeacherEnsemble | None:
        """The teachers ``live`` (default: the buffered ones) stacked for vectorised forwards (rebuilt when they
        changed), or None."""
        if self.config.dfkd.teacher_batching == "off":
            return None
        uids = tuple(teacher.uid for teacher in (self.teachers if live is None else live))
        if self._ensemble is None or self._ensemble[0] != uids:
            self._ensemble = (uids, TeacherEnsemble([module for module, _ in teachers]))
        return self._ensemble[1]

    def on_arrival(
        self,
        global_weights: Weights,
        version: int,
        base_weights: Weights,
        client_weights: Weights,
        q: np.ndarray,
        staleness: float,
    ) -> tuple[Weights, dict[str, Any]]:
        """Process one accepted client model and return the delta to buffer, plus diagnostics.

        ``global_weights``: current global model ``w`` at ``version`` ``v``; ``base_weights``: the exact model the
        client trained from (``w_{v_i}``); ``client_weights``: its result ``w_i`` (kept by reference as a
        teacher); ``q``: its class proportions ``(num_classes,)``; ``staleness``: ``tau = v - v_i`` (versions).

        Returns ``delta`` (float32, keys of ``client_weights``): ``w_i - w_{v_i}``, or for parameters
        ``(1 - beta) * (w_i - w_{v_i}) + beta * delta_KD`` when KD ran (buffers such as tracker statistics keep
        the client delta). ``info`` holds ``beta``, ``staleness``, ``synthesized``, ``distilled`` (a distillation
        ran), ``kd_reused`` (the previous ``delta_KD`` was blended, ``kd_interval`` > 1), the synthesis losses
        (``synth_*``), ``kd_loss`` (last KD step, when distilled), and ``seconds`` / ``synth_seconds`` / ``kd_seconds``
        spent in this call.
        """
        start = time.perf_counter()
        cfg = self.config
        delta = {
            name: np.asarray(value, np.float32) - np.asarray(base_weights[name], np.float32)
            for name, value in client_weights.items()
        }
        self.teachers.push(client_weights, q)
        self.state.arrivals += 1
        weight = staleness_beta(float(staleness), cfg.s_max)
        warm = version > cfg.warmup_version
        info: dict[str, Any] = {
            "beta": weight,
            "staleness": float(staleness),
            "synthesized": False,
            "distilled": False,
            "synth_seconds": 0.0,
            "kd_seconds": 0.0,
        }
        if self.background:
            if weight > 0 and warm and self._delta_kd is not None:
                kd_start = time.perf_counter()
                for name, value in self._delta_kd.items():
                    delta[name] = ((1.0 - weight) * delta[name] + weight * value).astype(np.float32)
                info["kd_seconds"] = time.perf_counter() - kd_start
                info["kd_reused"] = True
                self.state.kd_updates += 1
            info["seconds"] = time.perf_counter() - start
            return delta, info
        synthesize = version % cfg.generation_interval == 0
        if weight > 0 and version >= cfg.freeze_version and (synthesize or (warm and len(self.pool) > 0)):
            fresh = self._delta_kd is None or self.state.kd_since_run >= cfg.kd_interval
            # Teachers are loaded into modules (and stacked) only when something runs them: an arrival that
            # only reuses delta_KD (kd_interval > 1) needs neither; the ensemble serves synthesis, and KD
            # only with teacher_batching "all".
            teachers, ensemble = [], None
            if synthesize or (warm and fresh):
                teachers = self._loaded_teachers()
                if synthesize or cfg.dfkd.teacher_batching == "all":
                    ensemble = self._teacher_ensemble(teachers)
            if synthesize:
                self._synthesize(teachers, global_weights, warm, ensemble, info)
            if warm and len(self.pool) > 0:
                kd_start = time.perf_counter()
                if fresh:
                    kd_losses: list[float] = []
                    delta_kd = distill(
                        global_weights,
                        teachers,
                        self.pool,
                        cfg.dfkd,
                        student=self._student,
                        generator=self.kd_rng,
                        losses=kd_losses,
                        ensemble=ensemble,
                    )
                    self._delta_kd = {name: delta_kd[name] for name in delta if name in self._param_names}
                    self.state.kd_runs += 1
                    self.state.kd_since_run = 0
                    info["kd_loss"] = kd_losses[-1] if kd_losses else float("nan")
                self.state.kd_since_run += 1
                for name, value in self._delta_kd.items():
                    delta[name] = ((1.0 - weight) * delta[name] + weight * value).astype(np.float32)
                info["kd_seconds"] = time.perf_counter() - kd_start
                info["distilled"] = fresh
                info["kd_reused"] = not fresh
                self.state.kd_updates += 1
                self.state.kd_seconds += info["kd_seconds"]
        info["seconds"] = time.perf_counter() - start
        return delta, info

    def on_version(self, global_weights: Weights, version: int) -> dict[str, Any]:
        """Background schedule (``distill_lag`` >= 1; nothing otherwise): called once with each new global version.

        Waits for the work started at ``version - distill_lag`` and installs its ``delta_KD`` (when it distilled),
        then starts this version's work when ``version`` is a generation or KD version (see
        :class:`ReviverConfig`) and a teacher is buffered. ``global_weights`` (``w_v``) is copied, the teacher
        list taken as it is now. Returns what landed: ``landed`` (bool), ``waited_seconds`` (wall seconds spent
        waiting for the thread) and the work's own info (``synthesized``, ``distilled``, ``synth_seconds``,
        ``kd_seconds``, ``seconds`` (wall) and ``cpu_seconds`` of the work on the background thread, losses).
        """
        out: dict[str, Any] = {"landed": False, "waited_seconds": 0.0}
        if not self.background:
            return out
        cfg = self.config
        landing = self._pending.pop(version, None)
        if landing is not None:
            waited = time.perf_counter()
            delta_kd, info = landing.result() if isinstance(landing, Future) else landing
            out.update(info, landed=True, waited_seconds=time.perf_counter() - waited)
            if delta_kd is not None:
                self._delta_kd = delta_kd
        synthesize = version >= cfg.freeze_version and version % cfg.generation_interval == 0
        distil = version > cfg.warmup_version and version % cfg.kd_interval == 0
        if (synthesize or distil) and len(self.teachers) > 0:
            weights = {name: np.array(value, np.float32) for name, value in global_weights.items()}
            work = (self._revive, weights, version, list(self.teachers), synthesize, distil)
            self._pending[version + cfg.distill_lag] = self._background_executor().submit(*work)
        return out

    def _background_executor(self) -> ThreadPoolExecutor:
        """The one background thread (started on first use), with the PyTorch threads of the caller."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="fedrevive-distill",
                initializer=torch.set_num_threads,
                initargs=(self._threads,),
            )
        return self._executor

    def _revive(
        self, weights: Weights, version: int, live: list, synthesize: bool, distil: bool
    ) -> tuple[Weights | None, dict[str, Any]]:
        """One version's background work (on the background thread; one at a time, in the order started):
        synthesis and then KD from ``weights`` (``w_version``) and the teachers ``live``."""
        cfg = self.config
        started, cpu_started = time.perf_counter(), time.thread_time()
        warm = version > cfg.warmup_version
        info: dict[str, Any] = {"synthesized": False, "distilled": False, "synth_seconds": 0.0, "kd_seconds": 0.0}
        teachers = self._loaded_teachers(live)
        ensemble = None
        if synthesize or cfg.dfkd.teacher_batching == "all":
            ensemble = self._teacher_ensemble(teachers, live)
        if synthesize:
            self._synthesize(teachers, weights, warm, ensemble, info)
        delta_kd = None
        if distil and len(self.pool) > 0:
            kd_start = time.perf_counter()
            kd_losses: list[float] = []
            full = distill(
                weights,
                teachers,
                self.pool,
                cfg.dfkd,
                student=self._student,
                generator=self.kd_rng,
                losses=kd_losses,
                ensemble=ensemble,
                stop=self._abandon,
            )
            delta_kd = {name: full[name] for name in full if name in self._param_names}
            info["kd_seconds"] = time.perf_counter() - kd_start
            info["kd_loss"] = kd_losses[-1] if kd_losses else float("nan")
            info["distilled"] = True
            self.state.kd_runs += 1
            self.state.kd_seconds += info["kd_seconds"]
        info["cpu_seconds"] = time.thread_time() - cpu_started
        info["seconds"] = time.perf_counter() - started
        return delta_kd, info

    def settle(self) -> None:
        """Wait for the background work started so far, the thread's first job included (results land by version)."""
        if self._prepared is not None:
            self._prepared.result()
        for version, work in list(self._pending.items()):
            if isinstance(work, Future):
                self._pending[version] = work.result()

    def abandon_pending(self) -> int:
        """Drop the background work not landed yet (at the run's last version none of it would land: results land
        ``distill_lag`` >= 1 versions later): queued work is cancelled, and running work stops at its next inner
        step (a synthesis step or a KD iteration: waited for here, so that nothing changes the state afterwards).
        Returns how many were dropped; a checkpoint after this does not wait for them."""
        self._abandon.set()
        try:
            for work in self._pending.values():
                if isinstance(work, Future) and not work.cancel():
                    with contextlib.suppress(WorkAbandoned):
                        work.result()
        finally:
            self._abandon.clear()
        dropped, self._pending = len(self._pending), {}
        return dropped

    def close(self) -> None:
        """Stop the background thread (waits for the work it is running; unstarted work is dropped)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def state_dict(self) -> dict:
        """Checkpoint: generator, meta-optimizer, pool, teacher buffer, last ``delta_KD``, random states, counters,
        and the background work started but not landed yet (waited for first, so the state is the one after it)."""
        self.settle()
        return {
            "synthesizer": self.synthesizer.state_dict(),
            "teachers": self.teachers.state_dict(),
            "kd_rng": self.kd_rng.get_state(),
            "delta_kd": self._delta_kd,
            "counters": asdict(self.state),
            "pending": dict(self._pending),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` output (teacher modules are reloaded lazily)."""
        self.settle()  # the thread's first job builds the meta-optimizer this restores
        self.synthesizer.load_state_dict(state["synthesizer"])
        self.teachers.load_state_dict(state["teachers"])
        self.kd_rng.set_state(state["kd_rng"])
        self._delta_kd = state.get("delta_kd")
        self._pending = dict(state.get("pending", {}))
        self._ensemble = None
        self.state = FedReviveServerState(**state["counters"])
        self._spare_modules.extend(self._teacher_modules.values())
        self._teacher_modules.clear()
