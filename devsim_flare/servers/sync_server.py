"""The server of synchronous runs: samples devices, sends each leaf its model once with its device
list, aggregates the leaves' delta sums, evaluates, records, checkpoints.

Runs as the Collab ``main`` of the NVFlare server. One line is printed per round; results,
checkpoints and the final model go to the run's output folder.

This module is longer than 400 lines on purpose: it is one run loop whose hooks (selection on the
population model's virtual clock, network round clock, screening, checkpoints, resume) share the
round's state; splitting them apart would scatter that state.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from nvflare.collab import collab

from devsim.aggregation import FedAvg, LeafUpdate
from devsim.aggregation.server_optimizers import server_optimizer_for
from devsim.aggregation.update_checks import UpdateValidator
from devsim.clock import NetworkModel, SyncRoundClock, load_schedule
from devsim.codec import load_numpy_into_model, weights_norm
from devsim.compression import CodecSpec, keeps_state, round_payload_bytes
from devsim.config import SimulationConfig
from devsim.data.groups import leaf_group
from devsim.observe.checkpoint import CheckpointWriter, background_pays, load_checkpoint, weights_to_tensors
from devsim.observe.cpu import CpuLedger
from devsim.observe.metrics import MetricsWriter
from devsim.observe.participation import Participation
from devsim.observe.progress import ProgressLine, format_metrics
from devsim.observe.results import RunRecorder
from devsim.observe.round_timeout import RoundTimeout
from devsim.observe.startup import StartupClock
from devsim.observe.timing import RoundTiming, ServerStamps, summarize, with_info
from devsim.observe.traffic import TrafficCounter, array_bytes, with_bytes
from devsim.population.devices import DevicePopulation
from devsim.population.dropout import min_devices_check
from devsim.population.heterogeneity import SESSION_END, build_population_model, job_work
from devsim.privacy.sampling import poisson_select
from devsim.resources.collection import PeriodicCollector
from devsim.resources.cuda_warmup import warmup_stamps
from devsim.shared_arrays import open_exchange, reply_arrays_taken, shared_or_inline, weights_for_call
from devsim.training.evaluation import EvalResult
from devsim_flare.leaf import DEFAULT_PROCESSOR
from devsim_flare.leaf_calls import LeafCallError, LeafCalls, RunStopped
from devsim_flare.leaf_liveness import LeafLiveness
from devsim_flare.servers.base import (
    announce_privacy,
    group_evaluators,
    record_failure,
    reraise_checkpoint_failure,
    start_run,
)
from devsim_flare.servers.round_records import count_traffic, dropouts_by_cause, mean_metric, round_summary
from devsim_flare.stop_request import StopRequest

Weights = dict[str, np.ndarray]


def _why(rejected: dict[str, str], counts: dict[str, int]) -> str:
    """What a round's rejections took from its answered devices, for :func:`min_devices_check` ('' for nothing)."""
    parts = [f"the updates of {', '.join(rejected)} were rejected"] if rejected else []
    if counts["rejected_devices"]:
        parts.append(f"the leaves rejected {counts['rejected_devices']} device updates")
    return "; ".join(parts) + ": see the lines above" if parts else ""


class LeafRoundError(RuntimeError):
    """A leaf did not deliver its round result."""


class SyncServer:
    """Server-side Collab object for synchronous hierarchical rounds (FedAvg by default).

    Subclasses change what each leaf receives (:meth:`leaf_models`) and how replies become the
    next models (:meth:`aggregate`); everything else (sampling, calls, evaluation, results,
    checkpoints, resume) is shared.
    """

    method = "fedavg"
    processor = DEFAULT_PROCESSOR
    config_cls = SimulationConfig

    def __init__(self, settings: dict, leaves_on_host: int = 0):
        self.settings = settings
        self.leaves_on_host = leaves_on_host  # leaf processes sharing this server's cores (sim, poc)

    def setup_strategy(self, config: SimulationConfig) -> None:
        device = getattr(self, "device", None)
        device = device if device is not None and torch.device(device).type != "cpu" else None  # NumPy: faster there
        self.strategy = FedAvg(global_lr=config.global_lr, device=device, server_optimizer=server_optimizer_for(config))
        weights = getattr(self, "weights", None)
        line = self.strategy.calibrate(weights, len(self.leaves)) if weights is not None and device is not None else ""
        if line:
            print(f"[server] {line}", flush=True)

    def leaf_models(self, leaves: list[str]) -> dict[str, Weights]:
        """The model each leaf trains from this round."""
        return {leaf: self.weights for leaf in leaves}

    def aggregate(self, round_num: int, payloads: dict[str, dict], assignments: dict[str, np.ndarray]) -> dict:
        """Fold the leaves' replies into the model(s); returns extra fields for the round record."""
        if self.privacy is not None:
            return self._aggregate_private(round_num, payloads)
        updates = [
            LeafUpdate(leaf, payloads[leaf]["delta_sum"], payloads[leaf]["total_weight"], len(assignments[leaf]))
            for leaf in self.leaves
            if leaf in payloads
        ]
        self.weights = self.strategy.aggregate(self.weights, updates)
        return {}

    def _aggregate_private(self, round_num: int, payloads: dict[str, dict]) -> dict:
        """DP-FedAvg: the leaves' sums of clipped updates plus noise over the fixed denominator (privacy.server)."""
        from devsim.privacy.server import LeafSum

        sums = [
            LeafSum(
                payloads[leaf]["delta_sum"],
                len(payloads[leaf]["device_metrics"]["device_id"]),
                int(payloads[leaf].get("counts", {}).get("dp_below_clip", 0)),
            )
            for leaf in self.leaves
            if leaf in payloads
        ]
        self.weights, record = self.privacy.aggregate(round_num, self.weights, sums)
        return record

    def strategy_state(self) -> dict:
        """What the strategy carries from round to round (a server optimizer's moments), for the checkpoint."""
        return self.strategy.state_dict()

    def save_outputs(self, output_dir: str) -> None:
        """Extra files at the end of a run (cluster runs: each leaf's model)."""

    def load_strategy_state(self, state: dict) -> None:
        """Restore what :meth:`strategy_state` saved."""
        self.strategy.load_state_dict(state)

    def score(self, weights: Weights, group: int = 0) -> EvalResult:
        """``weights`` evaluated on the test set as hidden group ``group`` sees it."""
        load_numpy_into_model(self.model, weights)
        return self.evaluators[group].evaluate(self.model)

    def evaluate(self) -> dict:
        """Record fields of an evaluation: the global model's ``loss`` on the test set, its ``metrics`` (the
        task's; ``accuracy`` also at the top level when there is one), and with hidden groups each leaf's
        accuracy on its group's view of it (``leaf_accuracy``)."""
        fields = self.score(self.weights).record()
        if len(self.evaluators) > 1:
            by_group = {g: self.score(self.weights, g).accuracy for g in self.evaluators}
            fields.update(self._leaf_fields({leaf: by_group[g] for leaf, g in self.leaf_groups.items()}))
        return fields

    @staticmethod
    def _leaf_fields(leaf_accuracy: dict[str, float]) -> dict:
        return {"leaf_accuracy": leaf_accuracy, "mean_leaf_accuracy": float(np.mean(list(leaf_accuracy.values())))}

    @collab.main
    def run(self) -> None:
        startup = StartupClock()
        startup.mark("server_run_started")
        output_dir, device = start_run(self)
        self.device = device
        config = self.config
        self.round_timeout = RoundTimeout(config.round_timeout)
        self.evaluators = group_evaluators(self.task, config, device)
        self.leaf_groups = {leaf: leaf_group(i, config.hidden_groups) for i, leaf in enumerate(self.leaves)}
        population = DevicePopulation(config.num_leaf_nodes, config.devices_per_leaf, seed=config.seed)
        self.population_model = build_population_model(config)
        self.sim_time = 0.0
        self.participation = Participation(config.num_devices)
        self.setup_strategy(config)
        self.privacy = private_aggregator(config, len(self.leaves), self.strategy.server_optimizer)
        recorder = RunRecorder(output_dir, config.to_dict(), method=self.method, task=self.task.record())
        start_round = self._resume(config, recorder) if config.resume_from else 0
        model_bytes = array_bytes(self.weights)
        update_bytes = round_payload_bytes([v.shape for v in self.weights.values()], codec_spec(config))
        sim_clock = SyncRoundClock(
            load_schedule(config.delay_schedule),
            NetworkModel.from_config(config),
            config.seed,
            model_bytes,
            update_bytes,
        )
        traffic = TrafficCounter()
        if recorder.data["rounds"]:
            sim_clock.now = float(recorder.data["rounds"][-1].get("simulated_time", 0.0))
            traffic.load_totals(recorder.data["rounds"][-1].get("bytes_total", {}))
        stop = StopRequest(output_dir)
        # a round in flight is abandoned on a stop request unless the leaves keep uplink state (error-feedback
        # residuals) that its training already changed: then it is finished, so that --resume gives the same run
        calls = LeafCalls(
            call_timeout=self.round_timeout.seconds,
            liveness=LeafLiveness.for_job(self.leaves, collab.fl_ctx.get_job_id(), collab.fl_ctx),
            stop=None if keeps_state(codec_spec(config)) else stop,
        )
        self.exchange = open_exchange(config.shared_memory)
        self.dead_leaves: set[str] = set()
        self.new_losses: dict[str, str] = {}  # leaf -> why, lost since the last round record (leaves_lost)
        self.validator = UpdateValidator(
            self.weights,
            max_norm=config.max_update_norm,
            max_norm_factor=config.update_norm_factor if self.privacy is None else None,
        )
        announce_privacy(self.privacy, self.weights)
        if config.server_optimizer != "sgd":  # FedAvg's (cluster aggregation refuses one)
            print(f"[server] {self.strategy.server_optimizer.describe()}", flush=True)
        print(
            f"[server] {self.method}: {config.num_leaf_nodes} leaves x {config.devices_per_leaf} devices, "
            f"{config.device_selection_size} selected per round, rounds {start_round + 1}..{config.num_rounds}, "
            f"task {self.task.name}; results in {output_dir}",
            flush=True,
        )
        run_started = time.time()
        evaluation = None
        progress = ProgressLine(config.num_rounds, every=config.log_every, start=start_round)
        metrics = MetricsWriter(output_dir)
        timings: list[RoundTiming] = []
        initial = self.evaluate()
        print(
            f"[server] model before round {start_round + 1}: {format_metrics(initial['loss'], initial['metrics'])}",
            flush=True,
        )
        collector = PeriodicCollector().start()
        cpu = CpuLedger()
        startup.mark("server_ready")
        startup.add_stamps(warmup_stamps())  # when the CUDA warm-up started and ended (none without CUDA)
        previous_end: float | None = None  # the last round's end (evaluation done), for its bookkeeping's seconds
        self.checkpoints = CheckpointWriter(background=background_pays(self.leaves_on_host))
        try:
            for round_num in range(start_round, config.num_rounds):
                reason = stop()
                if reason:
                    self._stop_run(output_dir, round_num, recorder, reason)
                    return
                if self._over_budget(round_num, recorder):
                    break
                startup.mark("first_round_started")
                collector.maybe_collect()
                round_started = time.time()
                sim_time_before = self.sim_time
                selected, to_train, clock = self._select(population, round_num)
                on_dead_leaves = self._devices_on_dead_leaves(population, selected)
                assignments = {
                    self.leaves[leaf]: np.asarray(devices, dtype=np.int64)
                    for leaf, devices in population.group_by_leaf(to_train).items()
                    if self.leaves[leaf] not in self.dead_leaves
                }
                models = self.leaf_models(list(assignments))
                dispatched = time.time()
                calls.call_timeout = self.round_timeout.seconds
                try:
                    payloads = self._call_leaves(calls, round_num, models, assignments)
                except RunStopped as stopped:  # the round in flight is abandoned: state as after the last one
                    self.sim_time = sim_time_before
                    self._stop_run(output_dir, round_num, recorder, str(stopped))
                    return
                results_in = time.time()
                for leaf, payload in payloads.items():
                    startup.leaf_reply(leaf, payload)
                if payloads:
                    self.round_timeout.observe(results_in - dispatched)
                record = {"round": round_num + 1, "devices": int(len(selected)), **clock}
                record["devices_on_dead_leaves"] = on_dead_leaves
                count_traffic(traffic, payloads, model_bytes, len(assignments), record)
                screen_started = time.time()
                payloads = self._screen(round_num, payloads, len(selected) - on_dead_leaves, record)
                screened = time.time()
                answered = [d for p in payloads.values() for d in p["device_metrics"]["device_id"].tolist()]
                if not clock:
                    record.update(sim_clock.round_seconds(round_num, answered))
                for payload in payloads.values():
                    self.participation.add(payload["device_metrics"]["device_id"])
                update_started = time.time()
                if payloads:
                    record.update(self.aggregate(round_num, payloads, assignments))
                else:  # every selected device sat on a lost leaf (counted by --min-leaves): the model stays
                    record["no_updates"] = True
                aggregated = time.time()
                record.update(train_seconds=aggregated - round_started, device_train_loss=mean_metric(payloads, "loss"))
                if self.task.classification:
                    record["device_train_accuracy"] = mean_metric(payloads, "accuracy")
                if (round_num + 1) % config.eval_frequency == 0 or round_num + 1 == config.num_rounds:
                    evaluation = self.evaluate()
                    record.update(evaluation)
                round_ended = time.time()
                timing = RoundTiming.from_round(
                    ServerStamps(round_started, dispatched, results_in, aggregated, round_ended),
                    {leaf: payload["timing"] for leaf, payload in payloads.items()},
                )
                for leaf, payload in payloads.items():
                    cpu.leaf_reply(leaf, payload["timing"])
                server_info = {"server_screen": screened - screen_started, "server_update": aggregated - update_started}
                server_info["between_rounds"] = 0.0 if previous_end is None else round_started - previous_end
                timing = with_info(with_bytes(timing, record["bytes"]), {**cpu.close(), **server_info})
                timings.append(timing)
                record.update(round_seconds=timing.wall, timing=timing.to_dict())
                recorder.add_round(record)
                metrics.after_round(round_num + 1, record)
                startup.round_finished(round_ended)
                previous_end = round_ended
                line = progress.line(round_num + 1, round_ended - run_started, round_summary(record))
                if line:
                    print(line, flush=True)
                done = round_num + 1
                stopping = done == config.stop_after_round and done < config.num_rounds
                last = stopping or done == config.num_rounds  # written before the run says it ended
                if last or (config.checkpoint_frequency and done % config.checkpoint_frequency == 0):
                    self._checkpoint(output_dir, done, recorder, wait=last)
                if stopping:
                    self._mark_stopped(recorder, done, "--stop-after-round")
                    print(f"[server] stopped after round {done}; continue with --resume {output_dir}", flush=True)
                    return
        except Exception as error:
            record_failure(recorder, error)
            raise
        finally:
            failed_checkpoint = self.checkpoints.close()
            calls.close()
            if self.exchange is not None:
                self.exchange.remove()
            collector.stop()
            metrics.close()
        reraise_checkpoint_failure(recorder, failed_checkpoint)
        if timings:
            print(summarize(timings, unit="round"), flush=True)

        final_path = os.path.join(output_dir, "final_model.pt")
        torch.save(weights_to_tensors(self.weights), final_path)
        self.save_outputs(output_dir)
        recorder.data["startup"] = startup.record()
        recorder.finish(
            {
                "initial_accuracy": initial.get("accuracy"),
                "final_accuracy": evaluation.get("accuracy") if evaluation else None,
                "final_loss": evaluation["loss"] if evaluation else None,
                "final_metrics": evaluation["metrics"] if evaluation else None,
                "final_mean_leaf_accuracy": evaluation.get("mean_leaf_accuracy") if evaluation else None,
                "rounds": config.num_rounds,
                "simulated_time": sim_clock.now if self.population_model is None else self.sim_time,
                "bytes_total": dict(traffic.totals),
                "dropouts_by_cause": dropouts_by_cause(recorder.data["rounds"]),
                "participation": self.participation.summary(),
                "wall_seconds": time.time() - run_started,
                "final_model": final_path,
                **self._privacy_summary(recorder),
            }
        )
        print(f"[server] done; final model {final_path}", flush=True)

    def _checkpoint(self, output_dir: str, rounds_done: int, recorder: RunRecorder, wait: bool = True) -> None:
        """Save the run's state after ``rounds_done`` rounds: in the background, or complete on return (``wait``)."""
        self.checkpoints.save(
            output_dir,
            {
                "rounds_done": rounds_done,
                "weights": self.weights,
                "strategy": self.strategy_state(),
                "records": recorder.log_records(),
                "config": self.config.to_dict(),
                "sim_time": self.sim_time,
                "participation": self.participation.state(),
                "privacy": self.privacy.state() if self.privacy is not None else None,
                "leaf_uplink": self._leaf_uplink_states(),
            },
            wait=wait,
        )

    def _stop_run(self, output_dir: str, rounds_done: int, recorder: RunRecorder, reason: str) -> None:
        """End the run on a stop request after ``rounds_done`` complete rounds: checkpoint, results marked."""
        self._checkpoint(output_dir, rounds_done, recorder)
        self._mark_stopped(recorder, rounds_done, reason)
        print(f"[server] stopped ({reason}) after round {rounds_done}; continue with --resume {output_dir}", flush=True)

    @staticmethod
    def _mark_stopped(recorder: RunRecorder, rounds_done: int, reason: str) -> None:
        """Record in results.json that the run stopped early (the command stops the processes once it reads it)."""
        recorder.data["stopped"] = {"after_round": rounds_done, "reason": reason}
        recorder.flush()

    def _leaf_uplink_states(self) -> dict[str, dict]:
        """Each live leaf's uplink state (error-feedback residuals, top-k momentum) when the codec keeps any."""
        if not keeps_state(codec_spec(self.config)):
            return {}
        states = {}
        for leaf in self.leaves:
            if leaf not in self.dead_leaves:
                for _, state in collab.get_clients([leaf])(timeout=self.round_timeout.seconds).uplink_state():
                    states[leaf] = state
        missing = sorted(set(self.leaves) - self.dead_leaves - set(states))
        if missing:
            print(f"[server] no uplink state from {', '.join(missing)}: a resumed run starts theirs afresh", flush=True)
        return states

    def _restore_leaf_uplinks(self, states: dict[str, dict]) -> None:
        """Hand each leaf the uplink state a checkpoint kept for it (``--resume``)."""
        restored = 0
        for leaf, state in sorted(states.items()):
            if leaf in self.leaves:
                for _, done in collab.get_clients([leaf])(timeout=self.round_timeout.seconds).load_uplink_state(
                    state=state
                ):
                    restored += int(bool(done))
        if states:
            print(f"[server] leaf state of {restored} leaves restored (residuals, momentum)", flush=True)

    def _resume(self, config: SimulationConfig, recorder: RunRecorder) -> int:
        state = load_checkpoint(config.resume_from)
        self.weights = {k: np.asarray(v, dtype=np.float32) for k, v in state["weights"].items()}
        self.load_strategy_state(state["strategy"])
        self._restore_leaf_uplinks(state.get("leaf_uplink", {}))
        recorder.data["rounds"] = list(state["records"])
        if self.privacy is not None:
            self.privacy.load_state(state["privacy"])
        if "participation" in state:
            self.sim_time = float(state["sim_time"])
            self.participation.load(state["participation"])
        print(f"[server] resumed from {config.resume_from} after round {state['rounds_done']}", flush=True)
        return int(state["rounds_done"])

    def _select(self, population: DevicePopulation, round_num: int) -> tuple[np.ndarray, np.ndarray, dict]:
        """This round's selected devices, those that train, and virtual-clock fields for the record.

        Without a population model: every selected device trains and there is no clock. With one: only
        devices online at the round's start are selected, those whose session ends before their training
        and upload finish are dropouts (``session_end``), and the clock moves to the round's end.
        """
        config = self.config
        if self.population_model is None:
            if self.privacy is not None and self.privacy.plan.sampling == "poisson":
                selected = poisson_select(config.seed, round_num, population.size, self.privacy.plan.rate)
            else:
                selected = population.select(round_num, config.device_selection_size)
            return selected, selected, {}
        plan = self.population_model.plan_round(
            round_num, self.sim_time, config.device_selection_size, job_work(config)
        )
        self.sim_time = plan.end
        fields = {SESSION_END: int(plan.dropped.size), "round_start_time": plan.start, "simulated_time": plan.end}
        return plan.selected, plan.completed, fields

    def _devices_on_dead_leaves(self, population: DevicePopulation, selected: np.ndarray) -> int:
        """How many of ``selected`` sit on leaves already dropped from the run (0 at once while none is)."""
        if not self.dead_leaves:
            return 0
        groups = population.group_by_leaf(selected)
        return sum(len(devices) for leaf, devices in groups.items() if self.leaves[leaf] in self.dead_leaves)

    def _screen(self, round_num: int, payloads: dict[str, dict], selected: int, record: dict) -> dict[str, dict]:
        """Drop leaf replies that fail validation; count dropped, silent and rejected devices; enforce
        ``--min-devices-fraction`` over the ``selected`` devices of leaves alive when the round was sent (the
        devices of a leaf already lost are counted by ``--min-leaves``, not here). Every rejection is printed
        with its reason and recorded."""
        accepted, rejected, candidates, limits = {}, {}, {}, {}
        counts = {"dropped": 0, "silent": 0, "rejected_devices": 0}
        model_norms: dict[int, float] = {}  # id(model) -> its norm: FedAvg's leaves share one model
        for leaf in sorted(payloads, key=self.leaves.index):
            payload = payloads[leaf]
            leaf_counts = payload.get("counts", {}) if isinstance(payload, dict) else {}
            counts["dropped"] += int(leaf_counts.get("dropped", 0))
            counts["silent"] += int(leaf_counts.get("silent", 0))
            counts["rejected_devices"] += int(leaf_counts.get("rejected", 0))
            for reason in payload.get("rejections", []) if isinstance(payload, dict) else []:
                print(f"[server] round {round_num + 1}: {leaf} rejected {reason}", flush=True)
            if isinstance(payload, dict) and payload.get("total_weight") == 0:
                continue
            candidates[leaf] = payload
            if self.privacy is None:  # under DP each device's norm is bounded; a leaf-sum limit would depend on others
                model = self.leaf_models([leaf])[leaf]
                if id(model) not in model_norms:
                    model_norms[id(model)] = weights_norm(model)
                limits[leaf] = self.config.update_norm_limit(model_norms[id(model)])
        checked = self.validator.check_round(candidates, limits)
        for leaf, payload in candidates.items():
            if checked[leaf] is None:
                accepted[leaf] = payload
            else:
                rejected[leaf] = checked[leaf].reason
                print(f"[server] round {round_num + 1}: {checked[leaf]}", flush=True)
        answered = sum(len(p["device_metrics"]["device_id"]) for p in accepted.values())
        record.update(answered_devices=answered, rejected_leaves=rejected, **counts)
        record["dead_leaves"] = sorted(self.dead_leaves)
        if self.new_losses:  # read by the POC command, which does not see the server's console
            record["leaves_lost"], self.new_losses = self.new_losses, {}
        if selected or self.privacy is None:  # Poisson sampling may select nobody: then the round is noise only
            why = _why(rejected, counts)
            min_devices_check(answered, selected, self.config.min_devices_fraction, round_num + 1, why)
        return accepted

    def _call_leaves(
        self, calls: LeafCalls, round_num: int, models: dict[str, Weights], assignments: dict[str, np.ndarray]
    ) -> dict[str, dict]:
        folder = self.exchange.path if self.exchange is not None else None  # the leaves reply the same way
        written: dict[int, dict | None] = {}  # id(model) -> its file, written once and read by each of its leaves
        for leaf, device_ids in assignments.items():
            model = models[leaf]
            if id(model) not in written:
                written[id(model)] = shared_or_inline(folder, model, keep=True)
            arrays = weights_for_call(model, folder, written[id(model)])
            tag = (round_num, leaf)
            if self.privacy is not None:
                arrays["dp"] = self._leaf_privacy()
            calls.submit(leaf, "train_round", tag=tag, round_num=round_num, assignments={leaf: device_ids}, **arrays)
        payloads, errors = {}, {}
        try:
            while calls.pending:
                outcome = calls.next()
                if outcome.error is not None:
                    errors[outcome.leaf] = outcome.error
                    continue
                try:
                    reply_arrays_taken(outcome.result, "delta_sum", self.exchange)
                    payloads[outcome.leaf] = outcome.result
                except (ValueError, OSError) as error:
                    errors[outcome.leaf] = error
        except LeafCallError as error:
            for leaf in assignments:
                if leaf not in payloads and leaf not in errors:
                    errors[leaf] = error
            calls.forget([(round_num, leaf) for leaf in assignments])
        finally:
            for shared in written.values():
                if shared is not None:
                    self.exchange.discard(shared)
        if errors:
            self.dead_leaves.update(errors)
            self.new_losses.update({leaf: str(error).splitlines()[0] for leaf, error in errors.items()})
            alive = len(self.leaves) - len(self.dead_leaves)
            reasons = "; ".join(f"{leaf}: {errors[leaf]}" for leaf in sorted(errors))
            if alive < self.config.min_leaves:
                raise LeafRoundError(
                    f"round {round_num + 1}: {len(errors)} of {len(assignments)} leaves gave no result "
                    f"({self.round_timeout.describe()}) and only {alive} of {len(self.leaves)} leaves "
                    f"remain, fewer than --min-leaves {self.config.min_leaves}: {reasons}"
                )
            print(
                f"[server] round {round_num + 1}: leaves {sorted(errors)} stopped answering and are dropped from the "
                f"run; continuing with {alive} leaves ({reasons})",
                flush=True,
            )
        return payloads

    def _leaf_privacy(self) -> dict:
        """This round's device clip norm and noise, as the leaves apply them (``LeafNode.train_round``'s ``dp``)."""
        device = self.privacy.device_privacy()
        return {
            "clip": device.clip,
            "local_noise_std": device.local_noise_std,
            "leaf_noise_std": self.privacy.leaf_noise_std(),
        }

    def _over_budget(self, round_num: int, recorder: RunRecorder) -> bool:
        """True (and says so) when round ``round_num + 1`` would take epsilon above ``--dp-budget``."""
        if self.privacy is None:
            return False
        after = self.privacy.would_exceed(self.config.dp_budget)
        if after is None:
            return False
        recorder.data["dp_stopped"] = (
            f"stopped before round {round_num + 1}: its epsilon {after:.4g} would exceed --dp-budget "
            f"{self.config.dp_budget:g} (epsilon after {round_num} rounds: {self.privacy.accountant.epsilon:.4g})"
        )
        print(f"[server] {recorder.data['dp_stopped']}", flush=True)
        return True

    def _privacy_summary(self, recorder: RunRecorder) -> dict:
        """The summary's ``dp_*`` fields: final epsilon, delta, rounds accounted, why the run stopped early."""
        if self.privacy is None:
            return {}
        return {
            "dp_epsilon": self.privacy.accountant.epsilon,
            "dp_delta": self.privacy.plan.delta,
            "dp_noise_multiplier": self.privacy.plan.noise_multiplier,
            "dp_rounds_accounted": self.privacy.accountant.rounds,
            "dp_stopped": recorder.data.get("dp_stopped"),
        }


def private_aggregator(config: SimulationConfig, num_leaves: int, server_optimizer=None):
    """The run's :class:`~devsim.privacy.server.PrivateAggregator` (the noised mean through ``server_optimizer`` when
    given: the strategy's, which keeps its state in the checkpoint), or None without ``--dp``."""
    if config.dp == "off":
        return None
    from devsim.privacy.plan import PrivacyPlan
    from devsim.privacy.server import PrivateAggregator

    plan = PrivacyPlan.from_settings(config)
    return PrivateAggregator(plan, config.seed, num_leaves, config.global_lr, server_optimizer=server_optimizer)


class FedAvgServer(SyncServer):
    """Synchronous hierarchical FedAvg."""


def codec_spec(config: SimulationConfig) -> CodecSpec:
    """The run's device -> leaf codec (``--update-codec`` and its options)."""
    return CodecSpec.from_settings(config.to_dict())
