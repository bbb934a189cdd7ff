"""Local training of one simulated device, reusing one model and optimizer per worker.

A :class:`LocalTrainer` belongs to one worker thread. For every device it is handed, it copies
the global weights into its model (no model is rebuilt), resets the optimizer state (a device
starts from fresh momentum, as in FedAvg), runs local SGD on the device's shard, and can then add
its sample-weighted delta ``weight * (local - global)`` into an accumulator. All tensors stay on
the trainer's compute device; nothing is synchronised with the host inside the step loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from devsim.codec import float_state_keys


@dataclass(frozen=True)
class LocalTrainingSpec:
    """Hyper-parameters of a device's local training.

    ``iterations`` (when set) fixes the number of steps, cycling through the shard in reshuffled
    epochs; otherwise ``epochs`` full passes are made, the last batch possibly short. ``optimizer``
    is "sgd" (with ``momentum``) or "adam"; either starts from fresh state for every device.
    ``augment`` applies the task's augmentation (:class:`Objective`; for images: a random crop of the
    4-pixel reflect-padded image and a random horizontal flip) to every training batch. ``prox_mu`` > 0 is FedProx:
    every step adds ``prox_mu * (w - w_start)`` to each parameter's gradient (the gradient of
    ``prox_mu / 2 * ||w - w_start||^2``, ``w_start`` the weights the device started from) before the optimizer.
    """

    epochs: int = 1
    iterations: int | None = None
    batch_size: int = 10
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    augment: bool = False
    prox_mu: float = 0.0

    @classmethod
    def from_settings(cls, settings: Any) -> LocalTrainingSpec:
        """The spec named by a run's settings: any object with ``local_epochs``, ``local_iterations``,
        ``batch_size``, ``lr``, ``momentum``, ``optimizer`` and ``augment`` (a config, a task processor)."""
        return cls(
            epochs=settings.local_epochs,
            iterations=settings.local_iterations,
            batch_size=settings.batch_size,
            lr=settings.lr,
            momentum=settings.momentum,
            optimizer=settings.optimizer,
            augment=settings.augment,
            prox_mu=float(getattr(settings, "prox_mu", 0.0)),
        )

    def steps_for(self, num_samples: int) -> int:
        """SGD steps a device with ``num_samples`` samples takes."""
        if self.iterations is not None:
            return self.iterations
        return self.epochs * math.ceil(num_samples / self.batch_size)


@dataclass(frozen=True)
class Objective:
    """What a device's local training minimises and counts, from its task.

    ``loss(outputs, targets)`` returns a scalar tensor (the batch mean); with ``classification`` (outputs
    ``(batch, C)``, class ids ``(batch,)``) the trainers also count correct predictions, otherwise a device's
    accuracy is NaN. ``augment(inputs, generator)`` transforms a training batch when the spec's ``augment`` is on
    (default: :func:`crop_and_flip`, for images).
    """

    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy
    classification: bool = True
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None

    def augmentation(self, spec: LocalTrainingSpec) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None:
        """The augmentation a device trained with ``spec`` applies, or None; refuses ``augment`` without one."""
        if not spec.augment:
            return None
        if self.augment is None:
            raise ValueError("augment is on but the task defines no augment(inputs, generator)")
        return self.augment


@dataclass(frozen=True)
class DeviceMetrics:
    """What one device's local training reports. Loss is the mean over its steps; accuracy the fraction of its
    training samples predicted right while it trained (NaN for tasks that are not classification)."""

    device_id: int
    num_samples: int
    steps: int
    loss: float
    accuracy: float
    compute_seconds: float


class LocalTrainer:
    """A worker's model and SGD optimizer, reused for every device the worker trains.

    ``objective`` is the task's loss, classification flag and augmentation (default: cross-entropy with
    accuracy, random crop and flip).
    """

    def __init__(
        self, model: nn.Module, spec: LocalTrainingSpec, device: torch.device, objective: Objective | None = None
    ):
        self.spec = spec
        self.objective = objective if objective is not None else Objective(augment=crop_and_flip)
        self.augment = self.objective.augmentation(spec)
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.keys = float_state_keys(self.model)
        state = self.model.state_dict()
        self.state_tensors: list[torch.Tensor] = [state[k] for k in self.keys]
        parameters = dict(self.model.named_parameters())
        self.prox_terms = [(parameters[k], i) for i, k in enumerate(self.keys) if k in parameters]
        """(parameter, its position in ``keys``) pairs that FedProx's term pulls back (``spec.prox_mu`` > 0)."""
        if spec.optimizer == "adam":
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
        elif spec.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(
                self.model.parameters(), lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
            )
        else:
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {spec.optimizer!r}")

    def load(self, global_tensors: list[torch.Tensor]) -> None:
        """Overwrite the model's floating-point state with the global weights (same order as ``keys``)."""
        with torch.no_grad():
            torch._foreach_copy_(self.state_tensors, global_tensors)

    def train(
        self,
        device_id: int,
        global_tensors: list[torch.Tensor],
        inputs: torch.Tensor,
        targets: torch.Tensor,
        generator: torch.Generator,
    ) -> DeviceMetrics:
        """Train on one shard starting from ``global_tensors``.

        Args:
            device_id: logical device id (for the metrics only).
            global_tensors: global weights on ``self.device``, ordered like ``self.keys``; not modified.
            inputs: (n, ...) model inputs (prepared, e.g. normalised images) on ``self.device``.
            targets: (n, ...) targets (int64 class ids for classification) on ``self.device``.
            generator: CPU generator that fixes the batch order (and the augmentation).
        """
        started = time.perf_counter()
        self.load(global_tensors)
        self.optimizer.state.clear()
        self.model.train()
        num_samples = int(targets.shape[0])
        steps = self.spec.steps_for(num_samples)
        loss_fn, classification = self.objective.loss, self.objective.classification
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device, dtype=torch.int64)
        seen = 0
        for batch_index in batch_orders(num_samples, steps, self.spec.batch_size, generator):
            batch_index = host_to_device(batch_index, self.device)
            batch_inputs, batch_targets = inputs[batch_index], targets[batch_index]
            if self.augment is not None:
                batch_inputs = self.augment(batch_inputs, generator)
            outputs = self.model(batch_inputs)
            loss = loss_fn(outputs, batch_targets)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.spec.prox_mu:
                self._add_prox_gradient(global_tensors)
            self.optimizer.step()
            loss_sum += loss.detach()
            if classification:
                correct += (outputs.detach().argmax(dim=1) == batch_targets).sum()
            seen += int(batch_targets.shape[0])
        return DeviceMetrics(
            device_id=int(device_id),
            num_samples=num_samples,
            steps=steps,
            loss=float(loss_sum) / max(steps, 1),
            accuracy=float(correct) / max(seen, 1) if classification else math.nan,
            compute_seconds=time.perf_counter() - started,
        )

    @torch.no_grad()
    def _add_prox_gradient(self, global_tensors: list[torch.Tensor]) -> None:
        """FedProx: ``grad += prox_mu * (w - w_start)`` for every parameter that has a gradient."""
        for parameter, position in self.prox_terms:
            if parameter.grad is not None:
                parameter.grad.add_(parameter - global_tensors[position], alpha=self.spec.prox_mu)

    def accumulate_delta(self, accumulator: list[torch.Tensor], global_tensors: list[torch.Tensor], weight: float):
        """``accumulator += weight * (local - global)``, entry by entry, in place."""
        with torch.no_grad():
            delta = torch._foreach_sub(self.state_tensors, global_tensors)
            torch._foreach_add_(accumulator, delta, alpha=float(weight))


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` (on the CPU) on ``device`` without stalling the host: on a GPU through pinned memory (a copy from
    pageable memory waits until the GPU has run everything queued before it, so the host could not queue the next
    step meanwhile; PyTorch's pinned-memory cache keeps the staging buffer until the copy is done); as is on the
    CPU."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def batch_orders(num_samples: int, steps: int, batch_size: int, generator: torch.Generator):
    """Yield ``steps`` index tensors into a shard of ``num_samples``, reshuffling at each pass over it.

    The last batch of a pass may be short; the order depends only on ``generator``.
    """
    produced = 0
    while produced < steps:
        order = torch.randperm(num_samples, generator=generator)
        for start in range(0, num_samples, batch_size):
            if produced == steps:
                return
            yield order[start : start + batch_size]
            produced += 1


def crop_and_flip(images: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Random crop of the reflect-padded batch back to its size, then a random horizontal flip.

    Args:
        images: float (b, C, H, W) on any device; a new tensor of the same shape is returned.
        generator: CPU generator for the per-sample offsets and flips (so results are seeded).
        padding: pixels of reflect padding on each side before cropping.
    """
    b, _, height, width = images.shape
    padded = F.pad(images, (padding, padding, padding, padding), mode="reflect")
    offsets = torch.randint(0, 2 * padding + 1, (2, b), generator=generator).to(images.device)
    flips = (torch.rand(b, generator=generator) < 0.5).to(images.device)
    rows = offsets[0][:, None] + torch.arange(height, device=images.device)[None, :]
    cols = offsets[1][:, None] + torch.arange(width, device=images.device)[None, :]
    cols = torch.where(flips[:, None], cols.flip(1), cols)
    batch_index = torch.arange(b, device=images.device)[:, None, None, None]
    channel_index = torch.arange(images.shape[1], device=images.device)[None, :, None, None]
    return padded[batch_index, channel_index, rows[:, None, :, None], cols[:, None, None, :]]


class DeviceWorker(Protocol):
    """What the leaf needs from a device task processor to run it in a worker thread."""

    keys: list[str]
    torch_device: torch.device

    def train_device(self, device_id: int, round_num: int, global_tensors: list[torch.Tensor]) -> DeviceMetrics:
        """Train ``device_id`` from the global weights; the trained state stays in the worker."""

    def accumulate_delta(
        self, accumulator: list[torch.Tensor], global_tensors: list[torch.Tensor], weight: float
    ) -> None:
        """``accumulator += weight * (trained - global)``."""

    def train_with_seed(self, device_id: int, train_seed: int, global_tensors: list[torch.Tensor]) -> DeviceMetrics:
        """Train ``device_id`` with batch order fixed by ``train_seed`` (asynchronous jobs)."""

    def delta(self, global_tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """``trained - global`` of the device trained last."""

    def delta_into(self, out: list[torch.Tensor], global_tensors: list[torch.Tensor]) -> None:
        """Write ``trained - global`` of the device trained last into ``out`` (no allocation)."""

    def label_histogram(self, device_id: int) -> np.ndarray:
        """Samples per class in the device's shard."""

    def round_seed(self, device_id: int, round_num: int) -> int:
        """Batch-order seed of ``device_id`` in synchronous round ``round_num`` (as ``train_device`` uses)."""

    def train_devices_batched(
        self,
        device_ids: list[int],
        train_seeds: list[int],
        global_tensors: list[torch.Tensor],
        per_device_base: bool = False,
    ) -> tuple[list[torch.Tensor], list[DeviceMetrics]]:
        """Train several devices at once; (D, *shape) deltas per key and metrics (``device_batch`` > 1). With
        ``per_device_base`` the global tensors are stacked (D, *shape), one start per device."""
