"""A checked task: the model factory, the data arrays, the loss, the metrics and the optional hooks.

:class:`Task` is the unit every job runs, built-in (``--dataset`` / ``--model``) or written by a user
(``--task``). It is the one place that knows the data's shape: partitions, device shards, the trainers, the
batched path, evaluation, FedRevive's generator and cluster aggregation ask it instead of assuming images.
:func:`make_task` builds one from :class:`~devsim.tasks.contract.TaskHooks`: it calls ``data()`` once,
checks and converts the arrays and probes the model (:mod:`devsim.tasks.checks`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from devsim.resources.threads import one_torch_thread
from devsim.tasks.checks import ProbeResult, TaskArrays, build_model, call_hook, checked_arrays, probe_model
from devsim.tasks.contract import TaskError, TaskHooks
from devsim.tasks.defaults import accuracy, cross_entropy, no_metrics


@dataclass(frozen=True, eq=False)
class Task:
    """What a device trains, checked and loaded.

    Attributes:
        name: short name for logs and records (``digits/cnn``, or the task file's stem).
        hooks: the task's functions (:class:`TaskHooks`).
        arrays: ``x_train (N, *sample_shape)``, ``y_train (N, *target_shape)``, ``x_test``, ``y_test`` and the
            optional ``owner_train (N,)`` as NumPy arrays: inputs float32, int64 or uint8; class ids int64.
        probe: what the probe forward pass found (classification, number of classes, output shape).
        builtin: a built-in image task (its model takes ``track_features`` for FedRevive).
        pixel_stats: built-in image tasks only: per-channel ``(mean, std)`` on the [0, 1] pixel scale, the
            normalisation ``prepare`` applies (FedRevive's image generator works on that scale).
        load_seconds: wall seconds ``data()`` and the checks took in this process.
    """

    name: str
    hooks: TaskHooks
    arrays: TaskArrays
    probe: ProbeResult
    builtin: bool = False
    pixel_stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    load_seconds: float = 0.0

    @property
    def origin(self) -> str:
        """How the task was named (a file, a module, or ``builtin:<dataset>/<model>``)."""
        return self.hooks.origin

    @property
    def x_train(self) -> np.ndarray:
        return self.arrays.x_train

    @property
    def y_train(self) -> np.ndarray:
        return self.arrays.y_train

    @property
    def x_test(self) -> np.ndarray:
        return self.arrays.x_test

    @property
    def y_test(self) -> np.ndarray:
        return self.arrays.y_test

    @property
    def owner_train(self) -> np.ndarray | None:
        return self.arrays.owner_train

    @property
    def classification(self) -> bool:
        """Class ids ``(N,)`` with model outputs ``(batch, num_classes)``: label partitions, accuracy and
        FedRevive's class proportions apply."""
        return self.probe.classification

    @property
    def num_classes(self) -> int | None:
        """Classes the model outputs (classification tasks), else None."""
        return self.probe.num_classes

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one stored input row (before ``prepare``)."""
        return tuple(self.arrays.x_train.shape[1:])

    @property
    def input_kind(self) -> str:
        """``"float"`` (continuous inputs), ``"int"`` (e.g. token ids) or ``"uint8"`` (stored images)."""
        dtype = self.arrays.x_train.dtype
        return "float" if dtype == np.float32 else "uint8" if dtype == np.uint8 else "int"

    @property
    def num_owners(self) -> int | None:
        """Distinct devices named by ``owner_train`` (None without it)."""
        owner = self.arrays.owner_train
        return None if owner is None else int(np.unique(owner).size)

    @property
    def loss(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``loss(outputs, targets) -> scalar tensor``: the task's, or cross-entropy."""
        return self.hooks.loss or cross_entropy

    @property
    def metrics(self) -> Callable[[torch.Tensor, torch.Tensor], dict[str, float]]:
        """``metrics(outputs, targets) -> dict`` over a whole split: the task's, accuracy, or none."""
        if self.hooks.metrics is not None:
            return self.hooks.metrics
        return accuracy if self.classification else no_metrics

    @property
    def prepare(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """Stored rows ``(n, *sample_shape)`` -> model inputs, or None (the rows are the inputs)."""
        return self.hooks.prepare

    @property
    def augment(self) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None:
        """The task's training augmentation, or None."""
        return self.hooks.augment

    def build_model(self, *, track_features: bool = False) -> nn.Module:
        """A fresh model. ``track_features`` (FedRevive's feature statistics) applies to built-in models only;
        a user's model is built as its task writes it (FedRevive then matches no feature statistics)."""
        if self.builtin:
            return build_model(self.hooks, track_features=track_features)
        return build_model(self.hooks)

    def with_arrays(self, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> Task:
        """The same task over other arrays of the same shapes and dtypes (a hidden group's view)."""
        arrays = dataclasses.replace(self.arrays, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
        return dataclasses.replace(self, arrays=arrays)

    def record(self) -> dict[str, Any]:
        """What a run trained, for its results: name, how it was named, the file loaded (and its SHA-256, so a
        run can be matched to the exact task file), sizes, shapes, classes and owners."""
        file = self.hooks.file
        digest = None
        if file and os.path.isfile(file):
            with open(file, "rb") as stream:
                digest = hashlib.sha256(stream.read()).hexdigest()
        return {
            "name": self.name,
            "origin": self.origin,
            "file": file,
            "sha256": digest,
            "train_samples": len(self.x_train),
            "test_samples": len(self.x_test),
            "sample_shape": list(self.sample_shape),
            "input_dtype": str(self.x_train.dtype),
            "classification": self.classification,
            "num_classes": self.num_classes,
            "owners": self.num_owners,
            "lower_is_better": list(self.hooks.lower_is_better),
        }

    def describe(self) -> str:
        """One line: name, sizes, input and target shapes, classes and owners."""
        target = "class ids" if self.classification else f"targets {self.y_train.shape[1:]} {self.y_train.dtype}"
        classes = f", {self.num_classes} classes" if self.classification else ""
        owners = f", {self.num_owners} owners" if self.owner_train is not None else ""
        return (
            f"task {self.name}: {len(self.x_train)} train / {len(self.x_test)} test samples of "
            f"{self.sample_shape} {self.x_train.dtype}, {target}{classes}{owners}"
        )


def make_task(hooks: TaskHooks, name: str, *, builtin: bool = False, pixel_stats=None) -> Task:
    """Call ``hooks.data()`` once, check the arrays and probe the model; returns the :class:`Task`.

    Raises:
        TaskError: anything the checks refuse, naming the task and the problem.
    """
    started = time.perf_counter()
    with one_torch_thread():
        values: Any = call_hook(hooks, "data", hooks.data)
        arrays = checked_arrays(hooks, values)
        probe = probe_model(hooks, arrays, hooks.loss, hooks.metrics)
    return Task(
        name=name,
        hooks=hooks,
        arrays=arrays,
        probe=probe,
        builtin=builtin,
        pixel_stats=pixel_stats,
        load_seconds=time.perf_counter() - started,
    )


def require_classification(task: Task, what: str) -> None:
    """Refuse ``what`` (a feature that needs class ids, e.g. ``--partition dirichlet``) for other tasks."""
    if not task.classification:
        raise TaskError(
            task.origin,
            f"{what} needs a classification task (int class ids y of shape (N,), model outputs (batch, classes))",
        )
