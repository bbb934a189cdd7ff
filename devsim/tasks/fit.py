"""A run's configuration made concrete for its task, checked before any process starts.

The flags are validated on their own by :class:`~devsim.config.SimulationConfig`; what depends on the task is
settled here, in the launching process, once the task has loaded: ``--partition auto`` becomes ``natural`` or
``dirichlet``; a natural partition sets ``--devices-per-leaf`` (owners / leaves) and ``--samples-per-device``
(the mean owner's shard, for the simulated clock's work); ``--tensor-transfer auto`` follows the model's size;
flags that need class ids, image inputs or a task hook are refused with the flag named. The result travels to
every process, which therefore agrees on the population without loading anything first.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from devsim.config import INLINE_TENSOR_MAX_BYTES, ClusterConfig, ConfigError, FedReviveConfig, SimulationConfig
from devsim.data.groups import input_transform_groups
from devsim.tasks.shards import resolved_partition, task_partitioner
from devsim.tasks.task import Task


def fit_config(config: SimulationConfig, task: Task) -> tuple[SimulationConfig, list[str]]:
    """``config`` with the task-dependent settings filled in, and notes for the user (one line each).

    Raises:
        ConfigError: a flag that the task cannot honour, naming the flag, the task and what is allowed.
    """
    partition = resolved_partition(task, config.partition)
    changes: dict = {"partition": partition}
    notes: list[str] = []
    where = f"task {task.origin}"
    if partition == "natural":
        if task.owner_train is None:
            raise ConfigError(
                "partition",
                f"natural needs owner_train in the task's data(), and {where} returns none; use iid or dirichlet",
            )
        owners = int(task.num_owners or 0)
        per_leaf = owners // config.num_leaf_nodes
        if per_leaf < 1:
            raise ConfigError(
                "num_leaf_nodes",
                f"{config.num_leaf_nodes} leaves but {where} names {owners} owners; allowed: 1..{owners}",
            )
        used = per_leaf * config.num_leaf_nodes
        sizes = task_partitioner(task, "natural", 1, config.seed, config.alpha).shard_sizes()[:used]
        changes.update(devices_per_leaf=per_leaf, samples_per_device=max(1, round(float(np.mean(sizes)))))
        left = owners - used
        notes.append(
            f"natural partition: {owners} owners -> {config.num_leaf_nodes} leaves x {per_leaf} devices "
            f"({int(sizes.min())}-{int(sizes.max())} samples each, mean {float(np.mean(sizes)):.1f})"
            + (f"; the {left} owners with the largest ids are left out so every leaf holds as many" if left else "")
        )
    else:
        if partition == "dirichlet" and not task.classification:
            raise ConfigError(
                "partition",
                f"dirichlet draws label-skewed shards and needs class ids (N,); {where} is not classification: "
                "use iid (or natural, with owner_train)",
            )
        if config.samples_per_device > len(task.x_train):
            raise ConfigError(
                "samples_per_device",
                f"{config.samples_per_device} is more than the {len(task.x_train)} training samples of {where}; "
                f"allowed: 1..{len(task.x_train)}",
            )
    _check_groups(config, task, where)
    if config.augment and task.augment is None:
        raise ConfigError("augment", f"{where} defines no augment(inputs, generator); drop --augment or define it")
    if isinstance(config, ClusterConfig) and config.similarity_on.startswith("last_layer"):
        from devsim.models import last_layer_names

        try:
            last_layer_names(task.build_model())
        except ValueError as error:
            raise ConfigError("similarity_on", f"{config.similarity_on} with {where}: {error}") from error
    if isinstance(config, FedReviveConfig):
        _check_fedrevive(config, task, where)
    if config.tensor_transfer == "auto":
        changes["tensor_transfer"] = tensor_transfer_for(task.probe.model_bytes, config.shared_memory == "on")
        if changes["tensor_transfer"] == "download":
            notes.append(
                f"tensor transfer: download (the model's float32 state is {task.probe.model_bytes / 2**20:.1f} MiB, "
                f"over the {INLINE_TENSOR_MAX_BYTES / 2**20:g} MiB that travel inline; --tensor-transfer inline "
                "overrides)"
            )
    fitted = dataclasses.replace(config, **changes)
    fitted.validate()
    return fitted, notes


def tensor_transfer_for(model_bytes: int, shared_memory: bool = False) -> str:
    """``--tensor-transfer auto`` for a model of ``model_bytes`` bytes of float32 state: inline up to
    :data:`devsim.config.INLINE_TENSOR_MAX_BYTES`, download above; inline whatever the size with ``shared_memory``
    (``--shared-memory on``), where the model arrays go through files and NVFlare's messages carry only small arrays
    (device ids, metrics), for which download's second exchange is all cost: a ResNet-18 round (CPU, 2 leaves)
    spent 12 and 15 ms in the server -> leaf and leaf -> server hops inline, 21 and 23 ms with download."""
    return "inline" if shared_memory or model_bytes <= INLINE_TENSOR_MAX_BYTES else "download"


def _check_groups(config: SimulationConfig, task: Task, where: str) -> None:
    if config.hidden_groups <= 1:
        return
    if config.group_kind == "label_permutation" and not task.classification:
        raise ConfigError(
            "group_kind", f"label_permutation permutes class ids; {where} is not classification: use input_transform"
        )
    if config.group_kind == "input_transform":
        allowed = input_transform_groups(task.sample_shape, task.x_train.dtype)
        if allowed == 0:
            raise ConfigError(
                "group_kind",
                f"input_transform rotates and inverts square images (C, H, H) of uint8 or float values; {where} has "
                f"inputs {task.sample_shape} {task.x_train.dtype}: use label_permutation",
            )
        if config.hidden_groups > allowed:
            raise ConfigError(
                "hidden_groups",
                f"{config.hidden_groups} input_transform groups need more distinct transforms than the {allowed} "
                f"that inputs {task.sample_shape} allow; allowed: 1..{allowed}",
            )


def _check_fedrevive(config: FedReviveConfig, task: Task, where: str) -> None:
    from devsim.aggregation.fedrevive.inputs import generator_obstacle, input_space

    if not task.classification:
        raise ConfigError(
            "task", f"FedRevive distils class probabilities and needs a classification task; {where} is not one"
        )
    obstacle = generator_obstacle(task)
    if obstacle is not None:
        raise ConfigError("task", f"FedRevive with {where}: {obstacle}")
    if config.class_proportions == "estimated" and not input_space(task).float_inputs:
        raise ConfigError(
            "class_proportions",
            f"estimated probes client models with Gaussian float inputs; {where} feeds its model non-float inputs: "
            "use true (the clients' label histograms)",
        )
