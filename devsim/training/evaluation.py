"""Central evaluation of a model on a task's held-out split: its loss and its metrics."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from devsim.data.device_shards import broadcast_prepare


def _accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    return {"accuracy": float((outputs.argmax(dim=1) == targets).sum()) / max(int(targets.shape[0]), 1)}


@dataclass(frozen=True)
class EvalResult:
    """The loss (the task's, over the whole split) and the task's metrics (e.g. ``{"accuracy": 0.95}``)."""

    loss: float
    num_samples: int
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        """``metrics["accuracy"]``, or NaN for a task that reports no accuracy."""
        return float(self.metrics.get("accuracy", math.nan))

    @property
    def score(self) -> float:
        """Higher is better: the accuracy when the task reports one, else minus the loss (accuracy gates)."""
        return self.accuracy if "accuracy" in self.metrics else -self.loss

    def record(self) -> dict[str, Any]:
        """Results-record fields: ``loss``, ``metrics`` (the task's, by name) and, when the task reports one,
        ``accuracy`` at the top level too (what plots, cluster gates and summaries read)."""
        fields: dict[str, Any] = {"loss": self.loss, "metrics": dict(self.metrics)}
        if "accuracy" in self.metrics:
            fields["accuracy"] = float(self.metrics["accuracy"])
        return fields


class Evaluator:
    """Holds a held-out split on the compute device (as stored) and scores models on it in batches.

    Args:
        inputs: (N, *sample_shape) stored inputs (NumPy or torch).
        targets: (N, ...) targets.
        device: the compute device.
        batch_size: samples per forward pass.
        prepare: stored rows -> model inputs (e.g. image normalisation), or None.
        loss: ``loss(outputs, targets) -> scalar`` over the whole split (default cross-entropy).
        metrics: ``metrics(outputs, targets) -> dict`` over the whole split (default accuracy).
    """

    def __init__(
        self,
        inputs: np.ndarray | torch.Tensor,
        targets: np.ndarray | torch.Tensor,
        device: torch.device,
        batch_size: int = 500,
        prepare: Callable[[torch.Tensor], torch.Tensor] | None = None,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        metrics: Callable[[torch.Tensor, torch.Tensor], dict[str, float]] | None = None,
    ):
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.inputs = torch.as_tensor(inputs).to(self.device)
        self.targets = torch.as_tensor(targets).to(self.device)
        self.prepare = broadcast_prepare(prepare, self.inputs.dim() - 1)
        self.loss = loss or F.cross_entropy
        self.metrics = metrics or _accuracy

    @classmethod
    def for_task(cls, task: Any, device: torch.device, batch_size: int = 500) -> Evaluator:
        """An evaluator of ``task``'s test split with its ``prepare``, ``loss`` and ``metrics`` (a
        :class:`~devsim.tasks.Task`, or anything with those attributes and ``x_test`` / ``y_test``)."""
        return cls(task.x_test, task.y_test, device, batch_size, task.prepare, task.loss, task.metrics)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> EvalResult:
        """The loss and metrics of ``model`` (in eval mode) over the whole split."""
        model.eval()
        total = int(self.targets.shape[0])
        outputs = []
        for start in range(0, total, self.batch_size):
            rows = self.inputs[start : start + self.batch_size]
            outputs.append(model(self.prepare(rows) if self.prepare is not None else rows))
        everything = torch.cat(outputs)
        loss = float(self.loss(everything, self.targets))
        values = {str(k): float(v) for k, v in self.metrics(everything, self.targets).items()}
        return EvalResult(loss=loss, num_samples=total, metrics=values)
