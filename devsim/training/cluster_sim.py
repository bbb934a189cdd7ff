"""Core-level (no NVFlare) synchronous simulation of leaves under a cluster strategy, for benchmarks and tests.

It reproduces what ``jobs/pt_job_cluster.py`` does, in one process and without messaging: the same
device population and selection (:class:`DevicePopulation`, seed ``config.seed``), the same hidden
groups (leaf ``i`` in group ``i % hidden_groups``, the task seen through :func:`grouped_task`), the
same task, partition and per-device batch-order seeds, the same model initialisation, the same local
trainer, and the same strategy object (:class:`ClusterAggregation`). Leaves train one after
another, devices one after another, on the CPU (or ``device``). It skips what the job adds around
that: update screening, dropouts, checkpoints, timings.

FedAvg is the same loop with a strategy that links every pair (``ClusterAggregation(tau=-1)``):
all leaves that updated form one cluster and share its model, which is exactly FedAvg.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from devsim.aggregation.base import LeafUpdate, Weights
from devsim.aggregation.cluster import ClusterAggregation, ClusterResult
from devsim.codec import float_state_keys
from devsim.config import ClusterConfig, device_batch_value
from devsim.data.device_shards import DeviceDataSource
from devsim.data.groups import leaf_group
from devsim.models import last_layer_names
from devsim.population.devices import DevicePopulation
from devsim.resources.device_batch import plan_device_batch
from devsim.seeding import derive_seed
from devsim.tasks import Task, task_from_settings
from devsim.tasks.shards import grouped_task, task_partitioner
from devsim.training.batched import BatchedTrainer, batched_device_bytes, batching_obstacle
from devsim.training.evaluation import Evaluator
from devsim.training.local import LocalTrainer, LocalTrainingSpec, Objective

RoundHook = Callable[[int, dict[str, Weights], list[LeafUpdate], ClusterResult], None]
"""``hook(round_num, models_trained_from, updates, result)`` called after every round's aggregation."""


@dataclass
class ClusterSimResult:
    """Outcome of :func:`simulate_clusters`.

    Attributes:
        leaf_order: Leaf names ``site-1 .. site-N``.
        true_groups: Hidden group of each leaf, in ``leaf_order``.
        labels: Final cluster label of each leaf, in ``leaf_order``.
        leaf_accuracy: Final accuracy in [0, 1] of each leaf's model on its group's view of the test set.
        rounds: One dict per round: ``round`` (1-based), ``num_clusters``, ``labels`` (list, ``leaf_order``),
            ``pending`` (rounds an unconfirmed proposal has been made, see ``ClusterResult.pending``),
            ``resplit`` (the clusters checked on their updates, ``ClusterResult.resplit``), ``lone`` (the lone
            leaves compared with the clusters in force, ``ClusterResult.lone``) and the
            strategy's ``similarity_summary`` when it has one.
    """

    leaf_order: list[str]
    true_groups: list[int]
    labels: list[int]
    leaf_accuracy: list[float]
    rounds: list[dict] = field(default_factory=list)


def simulate_clusters(
    config: ClusterConfig,
    strategy: ClusterAggregation,
    *,
    device: str = "cpu",
    on_round: RoundHook | None = None,
) -> ClusterSimResult:
    """Run ``config.num_rounds`` synchronous rounds of ``strategy`` over ``config.num_leaf_nodes`` leaves.

    Args:
        config: A validated run configuration (dataset, groups, population, local training, seed).
        strategy: A fresh strategy; its ``last_layer_keys`` must name the model's classifier entries.
        device: Torch device for training and evaluation.
        on_round: Optional hook called after every round (see :data:`RoundHook`).

    Returns:
        The :class:`ClusterSimResult`.
    """
    config.validate()
    torch_device = torch.device(device)
    leaves = [f"site-{i + 1}" for i in range(config.num_leaf_nodes)]
    groups = [leaf_group(i, config.hidden_groups) for i in range(config.num_leaf_nodes)]
    task = task_from_settings(config.to_dict())
    sources, evaluators = _group_data(task, config, torch_device)

    torch.manual_seed(derive_seed(config.seed, "model-init"))
    net = task.build_model().to(torch_device)
    keys = float_state_keys(net)
    initial = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in net.state_dict().items() if k in keys}
    spec = LocalTrainingSpec.from_settings(config)
    objective = Objective(task.loss, task.classification, task.augment)
    trainer = LocalTrainer(net, spec, torch_device, objective)
    device_batch = plan_device_batch(
        device_batch_value(config.device_batch),
        obstacle=batching_obstacle(net, spec),
        device_bytes=batched_device_bytes(net, spec, config.samples_per_device, _example(sources[0])),
        device=str(torch_device),
        num_workers=1,
        num_params=sum(t.numel() for t in net.state_dict().values() if t.is_floating_point()),
    ).size
    batched = BatchedTrainer(net, spec, torch_device, objective, _example(sources[0])) if device_batch > 1 else None
    population = DevicePopulation(config.num_leaf_nodes, config.devices_per_leaf, seed=config.seed)
    current: dict[str, Weights] = {leaf: initial for leaf in leaves}
    records: list[dict] = []
    for round_num in range(config.num_rounds):
        selected = population.select(round_num, config.device_selection_size)
        updates = []
        for index, devices in sorted(population.group_by_leaf(selected).items()):
            leaf = leaves[index]
            updates.append(
                _train_leaf(
                    trainer,
                    batched,
                    device_batch,
                    keys,
                    current[leaf],
                    sources[groups[index]],
                    devices,
                    config,
                    leaf,
                    round_num,
                )
            )
        trained_from = dict(current)
        result = strategy.aggregate_clusters(trained_from, updates)
        current = dict(result.leaf_models)
        record = {
            "round": round_num + 1,
            "num_clusters": int(result.num_clusters),
            "labels": [int(result.labels[leaf]) for leaf in leaves],
            "pending": int(result.pending),
            "resplit": result.resplit,
            "lone": result.lone,
        }
        record.update(result.similarity_summary)
        records.append(record)
        if on_round is not None:
            on_round(round_num + 1, trained_from, updates, result)

    accuracy = [
        _score(net, keys, current[leaf], evaluators[g], torch_device) for leaf, g in zip(leaves, groups, strict=True)
    ]
    return ClusterSimResult(
        leaf_order=leaves,
        true_groups=groups,
        labels=records[-1]["labels"] if records else [0] * len(leaves),
        leaf_accuracy=accuracy,
        rounds=records,
    )


def initial_weights(config: ClusterConfig) -> tuple[Weights, list[str]]:
    """The run's initial model (as the job builds it from ``config.seed``) and its last-layer entry names."""
    torch.manual_seed(derive_seed(config.seed, "model-init"))
    net = task_from_settings(config.to_dict()).build_model()
    keys = float_state_keys(net)
    weights = {k: v.detach().numpy().astype(np.float32) for k, v in net.state_dict().items() if k in keys}
    return weights, last_layer_names(net)


def _group_data(
    task: Task, config: ClusterConfig, device: torch.device
) -> tuple[dict[int, DeviceDataSource], dict[int, Evaluator]]:
    """Per hidden group: the device data source (train split through the group transform) and the test evaluator."""
    sources, evaluators = {}, {}
    for g in range(config.hidden_groups):
        seen = grouped_task(task, g, config.group_kind, config.data_seed)
        partitioner = task_partitioner(seen, config.partition, config.samples_per_device, config.seed, config.alpha)
        sources[g] = DeviceDataSource(seen.x_train, seen.y_train, partitioner, device, seen.prepare)
        evaluators[g] = Evaluator.for_task(seen, device, config.eval_batch_size)
    return sources, evaluators


def _train_leaf(
    trainer: LocalTrainer,
    batched: BatchedTrainer | None,
    device_batch: int,
    keys: list[str],
    model: Weights,
    source: DeviceDataSource,
    devices: list[int],
    config: ClusterConfig,
    leaf: str,
    round_num: int,
) -> LeafUpdate:
    """Train ``devices`` from ``model`` (one after another, or ``device_batch`` at a time with the batched
    trainer, as ``--device-batch`` resolves); the leaf's sample-weighted delta sum."""
    global_tensors = [torch.from_numpy(np.ascontiguousarray(model[k])).to(trainer.device) for k in keys]
    accumulator = [torch.zeros_like(t) for t in global_tensors]
    total = 0.0
    if batched is not None:
        for start in range(0, len(devices), device_batch):
            chunk = devices[start : start + device_batch]
            seeds = [derive_seed(config.seed, "train", round_num, d) for d in chunk]
            deltas, metrics = batched.train_pool(
                chunk, global_tensors, source.shard_pool(chunk), [torch.Generator().manual_seed(s) for s in seeds]
            )
            weights = torch.tensor([float(m.num_samples) for m in metrics], dtype=torch.float32)
            by_key = dict(zip(batched.keys, deltas, strict=True))
            for index, key in enumerate(keys):
                shape = (-1,) + (1,) * (by_key[key].dim() - 1)
                accumulator[index] += (by_key[key] * weights.to(by_key[key].device).view(shape)).sum(dim=0)
            total += float(weights.sum())
        devices = []
    for device_id in devices:
        inputs, targets = source.shard(device_id)
        generator = torch.Generator().manual_seed(derive_seed(config.seed, "train", round_num, device_id))
        metrics = trainer.train(device_id, global_tensors, inputs, targets, generator)
        trainer.accumulate_delta(accumulator, global_tensors, float(metrics.num_samples))
        total += metrics.num_samples
    delta_sum = {k: t.detach().cpu().numpy().astype(np.float32) for k, t in zip(keys, accumulator, strict=True)}
    return LeafUpdate(leaf, delta_sum, total, len(devices))


def _example(source: DeviceDataSource) -> torch.Tensor:
    """One model input row ``(1, ...)`` of ``source`` (prepared), for memory estimates."""
    rows = source.inputs[:1]
    return source.prepare(rows) if source.prepare is not None else rows


@torch.no_grad()
def _score(
    net: torch.nn.Module, keys: list[str], weights: Weights, evaluator: Evaluator, device: torch.device
) -> float:
    """Accuracy of ``weights`` loaded into ``net`` on ``evaluator``'s set."""
    state = net.state_dict()
    for k in keys:
        state[k].copy_(torch.from_numpy(np.ascontiguousarray(weights[k])).to(device))
    return evaluator.evaluate(net).accuracy
