"""The server: samples devices, sends each leaf the model once with its device list, aggregates.

Runs as the Collab ``main`` of the NVFlare server. One line is printed per round; the results
file and the final model are written to the run's output folder.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from nvflare.collab import collab

from devsim.codec import load_numpy_into_model, model_to_numpy
from devsim.config import SimulationConfig
from devsim.data import load_dataset
from devsim.evaluation import Evaluator
from devsim.population import DevicePopulation, natural_sort
from devsim.results import RunRecorder
from devsim.seeding import derive_seed
from devsim.strategies import FedAvg, LeafUpdate
from processors.cifar10_fedavg_task_processor import default_torch_device
from processors.models import build_model


class LeafRoundError(RuntimeError):
    """A leaf did not deliver its round result."""


class FedAvgServer:
    """Server-side Collab object for synchronous hierarchical FedAvg."""

    def __init__(self, settings: dict):
        self.settings = settings

    @collab.main
    def run(self) -> None:
        config = SimulationConfig.from_dict(self.settings)
        leaves = natural_sort([client.name for client in collab.clients])
        if len(leaves) != config.num_leaf_nodes:
            raise RuntimeError(
                f"{len(leaves)} leaf sites are connected ({', '.join(leaves)}) but --num-leaf-nodes is "
                f"{config.num_leaf_nodes}"
            )
        output_dir = self._output_dir(config)
        device = default_torch_device()
        torch.manual_seed(derive_seed(config.seed, "model-init"))
        model = build_model(config.model, num_classes=config.num_classes).to(device)
        weights = model_to_numpy(model)
        evaluator = Evaluator(
            load_dataset(
                config.dataset,
                config.data_root,
                train=False,
                seed=config.data_seed,
                synthetic_train_size=config.synthetic_train_size,
                synthetic_test_size=config.synthetic_test_size,
            ),
            device,
            batch_size=config.eval_batch_size,
        )
        population = DevicePopulation(config.num_leaf_nodes, config.devices_per_leaf, seed=config.seed)
        strategy = FedAvg(global_lr=config.global_lr)
        recorder = RunRecorder(output_dir, config.to_dict(), method=strategy.name)
        print(
            f"[server] FedAvg: {config.num_leaf_nodes} leaves x {config.devices_per_leaf} devices, "
            f"{config.device_selection_size} selected per round, {config.num_rounds} rounds, "
            f"model {config.model}, dataset {config.dataset}; results in {output_dir}",
            flush=True,
        )
        run_started = time.perf_counter()
        evaluation = None
        for round_num in range(config.num_rounds):
            round_started = time.perf_counter()
            selected = population.select(round_num, config.device_selection_size)
            assignments = {
                leaves[leaf]: np.asarray(devices, dtype=np.int64)
                for leaf, devices in population.group_by_leaf(selected).items()
            }
            payloads = self._call_leaves(config, round_num, weights, assignments)
            updates = [
                LeafUpdate(leaf, p["delta_sum"], p["total_weight"], len(assignments[leaf]))
                for leaf, p in sorted(payloads.items(), key=lambda item: leaves.index(item[0]))
            ]
            aggregate_started = time.perf_counter()
            weights = strategy.aggregate(weights, updates)
            train_seconds = time.perf_counter() - round_started
            record = {
                "round": round_num + 1,
                "devices": int(len(selected)),
                "train_seconds": train_seconds,
                "server_aggregate_seconds": time.perf_counter() - aggregate_started,
                "device_train_loss": _mean_metric(payloads, "loss"),
                "device_train_accuracy": _mean_metric(payloads, "accuracy"),
            }
            if (round_num + 1) % config.eval_frequency == 0 or round_num + 1 == config.num_rounds:
                eval_started = time.perf_counter()
                load_numpy_into_model(model, weights)
                evaluation = evaluator.evaluate(model)
                record.update(
                    accuracy=evaluation.accuracy,
                    loss=evaluation.loss,
                    eval_seconds=time.perf_counter() - eval_started,
                )
            record["round_seconds"] = time.perf_counter() - round_started
            recorder.add_round(record)
            print(_round_line(record, config.num_rounds), flush=True)

        load_numpy_into_model(model, weights)
        final_path = os.path.join(output_dir, "final_model.pt")
        torch.save({k: torch.from_numpy(v) for k, v in weights.items()}, final_path)
        recorder.finish(
            {
                "final_accuracy": evaluation.accuracy if evaluation else None,
                "final_loss": evaluation.loss if evaluation else None,
                "rounds": config.num_rounds,
                "wall_seconds": time.perf_counter() - run_started,
                "final_model": final_path,
            }
        )
        print(f"[server] done; final model {final_path}", flush=True)

    def _output_dir(self, config: SimulationConfig) -> str:
        run_dir = collab.workspace.get_run_dir(collab.fl_ctx.get_job_id())
        if config.output_dir:
            return config.output_dir if os.path.isabs(config.output_dir) else os.path.join(run_dir, config.output_dir)
        return os.path.join(run_dir, "devsim")

    @staticmethod
    def _call_leaves(config: SimulationConfig, round_num: int, weights, assignments) -> dict[str, dict]:
        names = list(assignments)
        group = collab.get_clients(names)(timeout=config.round_timeout)
        results = group.train_round(round_num=round_num, weights=weights, assignments=assignments)
        payloads = {name: payload for name, payload in results}
        failures = getattr(results, "failures", {}) or {}
        missing = [n for n in names if n not in payloads]
        if failures or missing:
            reasons = "; ".join(f"{n}: {failures.get(n, 'no result')}" for n in sorted(set(missing) | set(failures)))
            raise LeafRoundError(
                f"round {round_num + 1}: {len(missing)} of {len(names)} leaves gave no result "
                f"(timeout {config.round_timeout:g}s, --round-timeout): {reasons}"
            )
        return payloads


def _mean_metric(payloads: dict[str, dict], name: str) -> float:
    values = [p["device_metrics"][name] for p in payloads.values()]
    weights = [p["device_metrics"]["num_samples"] for p in payloads.values()]
    return float(np.average(np.concatenate(values), weights=np.concatenate(weights)))


def _round_line(record: dict, num_rounds: int) -> str:
    line = f"round {record['round']:>4}/{num_rounds}"
    if "accuracy" in record:
        line += f"  accuracy {record['accuracy']:.4f}  loss {record['loss']:.4f}"
    else:
        line += f"  train-loss {record['device_train_loss']:.4f}"
    line += f"  {record['round_seconds']:.2f}s (train {record['train_seconds']:.2f}s)"
    return line
