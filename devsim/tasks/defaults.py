"""What a task gets when it does not define ``loss`` or ``metrics``: cross-entropy and accuracy.

Both take ``outputs`` of shape ``(batch, num_classes)`` (unnormalised logits) and ``targets`` of shape
``(batch,)`` (int64 class ids).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits ``(batch, C)`` against class ids ``(batch,)`` (a scalar tensor, nats)."""
    return F.cross_entropy(outputs, targets)


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """``{"accuracy": fraction in [0, 1]}`` of rows whose largest logit is the target class."""
    correct = (outputs.argmax(dim=1) == targets).sum()
    return {"accuracy": float(correct) / max(int(targets.shape[0]), 1)}


def no_metrics(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """No metrics beyond the loss (the default for tasks that are not classification)."""
    return {}
