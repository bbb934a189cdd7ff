"""The interface every synchronous aggregation strategy implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from devsim.aggregation.server_optimizers import ServerOptimizer

Weights = dict[str, np.ndarray]


@dataclass(frozen=True)
class LeafUpdate:
    """One leaf's contribution to a synchronous round (hierarchical aggregation already done).

    ``delta_sum`` holds, per model entry, the sum over the leaf's devices of
    ``num_samples * (local - global)`` (float32, the model entry's shape); ``total_weight`` is the
    sum of those sample counts.
    """

    leaf: str
    delta_sum: Weights
    total_weight: float
    num_devices: int


class SyncStrategy(ABC):
    """Turns the global weights and the leaves' updates of one round into new global weights."""

    name: str = "base"
    server_optimizer: ServerOptimizer | None = None
    """What moves the global model from a round's mean update when it is not the plain ``w += global_lr * mean``
    (FedAvgM, FedAdam, ...): a DP round's noised mean goes through it too."""

    @abstractmethod
    def aggregate(self, global_weights: Weights, updates: list[LeafUpdate]) -> Weights:
        """New global weights; ``updates`` come in a fixed (leaf-name) order for reproducibility."""
