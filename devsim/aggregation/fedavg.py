"""Synchronous FedAvg over hierarchical (leaf-summed) updates."""

from __future__ import annotations

import time

import numpy as np
import torch

from devsim.aggregation.base import LeafUpdate, SyncStrategy, Weights
from devsim.aggregation.server_optimizers import ServerOptimizer, active, restore, state_of

DEVICE_MIN_PARAMS = 1_000_000
"""Models with at least this many float entries are aggregated on the server's torch device when it is a GPU;
smaller ones stay in NumPy, where a round's arithmetic takes well under a millisecond and copies would dominate."""


class FedAvg(SyncStrategy):
    """``w <- w + global_lr * sum_leaves(delta_sum) / sum_leaves(total_weight)``.

    Sums run in float64 in the order the updates are given, so the result does not depend on
    which leaf answered first. With a CUDA ``device`` and a model of at least :data:`DEVICE_MIN_PARAMS` entries
    the same float64 arithmetic runs there (same order, same result to the bit), unless :meth:`calibrate` measured
    NumPy faster; ``device="cpu"`` forces the torch path on the CPU (tests).

    With a ``server_optimizer`` other than ``sgd`` (:mod:`devsim.aggregation.server_optimizers`: FedAvgM, FedAdagrad,
    FedAdam, FedYogi) the same float64 mean update goes through that optimizer instead (in NumPy, on any device),
    which uses its own learning rate.
    """

    name = "fedavg"

    def __init__(
        self,
        global_lr: float = 1.0,
        device: str | torch.device | None = None,
        server_optimizer: ServerOptimizer | None = None,
    ):
        if not (np.isfinite(global_lr) and global_lr > 0):
            raise ValueError(f"global_lr must be a finite number > 0, got {global_lr}")
        self.global_lr = float(global_lr)
        self.device = None if device is None else torch.device(device)
        self.server_optimizer = active(server_optimizer)
        self.use_device: bool | None = None
        """Set by :meth:`calibrate`: whether the torch path was the faster; None: by :data:`DEVICE_MIN_PARAMS`."""

    def _on_device(self, global_weights: Weights) -> bool:
        if self.device is None:
            return False
        if self.use_device is not None:
            return self.use_device
        if self.device.type == "cpu":
            return True
        return sum(int(v.size) for v in global_weights.values()) >= DEVICE_MIN_PARAMS

    def calibrate(self, global_weights: Weights, num_leaves: int, repeats: int = 2) -> str:
        """Time one round's arithmetic (``num_leaves`` leaf sums of zeros) on ``self.device`` and in NumPy, the best
        of ``repeats`` each, keep the faster (both give the same bits) and return a line saying so. Does nothing
        without a device, under a server optimizer, or for a model below :data:`DEVICE_MIN_PARAMS` ("")."""
        size = sum(int(v.size) for v in global_weights.values())
        if self.device is None or self.server_optimizer is not None or size < DEVICE_MIN_PARAMS:
            return ""
        zeros = {name: np.zeros_like(value) for name, value in global_weights.items()}
        updates = [LeafUpdate(f"leaf-{i}", zeros, 1.0, 1) for i in range(max(1, num_leaves))]
        seconds = {}
        for use_device in (True, False):
            self.use_device, best = use_device, float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                self.aggregate(global_weights, updates)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                best = min(best, time.perf_counter() - started)
            seconds[use_device] = best
        self.use_device = seconds[True] < seconds[False]
        where = str(self.device) if self.use_device else "NumPy"
        return (
            f"FedAvg's arithmetic in {where}: {1000 * seconds[True]:.1f} ms a round on {self.device} against "
            f"{1000 * seconds[False]:.1f} ms in NumPy for {size:,} parameters and {len(updates)} leaves, measured "
            "at start (the same bits either way)"
        )

    def aggregate(self, global_weights: Weights, updates: list[LeafUpdate]) -> Weights:
        total_weight = sum(u.total_weight for u in updates)
        if not updates or total_weight <= 0:
            raise ValueError("FedAvg needs at least one update with a positive total weight")
        if self.server_optimizer is not None:
            mean = {name: _summed(updates, name, value.shape) / total_weight for name, value in global_weights.items()}
            return self.server_optimizer.apply(global_weights, mean)
        scale = self.global_lr / total_weight
        if self._on_device(global_weights):
            return self._aggregate_torch(global_weights, updates, scale)
        new_weights: Weights = {}
        for name, value in global_weights.items():
            summed = _summed(updates, name, value.shape)
            summed *= scale  # value + scale * summed in float64, rounded once to float32, without temporaries
            new_weights[name] = np.add(summed, value, out=np.empty(value.shape, np.float32), casting="unsafe")
        return new_weights

    def state_dict(self) -> dict:
        """The server optimizer's state (empty for plain FedAvg), for a checkpoint."""
        return state_of(self.server_optimizer)

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; a checkpoint and a run must agree on the server optimizer."""
        restore(self.server_optimizer, state)

    def _aggregate_torch(self, global_weights: Weights, updates: list[LeafUpdate], scale: float) -> Weights:
        """The NumPy arithmetic in float64 on ``self.device``: one copy in per array, one copy out per entry."""
        device = self.device
        new_weights: Weights = {}
        for name, value in global_weights.items():
            summed = torch.zeros(value.shape, dtype=torch.float64, device=device)
            for update in updates:
                summed += torch.from_numpy(np.ascontiguousarray(update.delta_sum[name])).to(device, non_blocking=True)
            base = torch.from_numpy(np.ascontiguousarray(value)).to(device, dtype=torch.float64)
            new_weights[name] = (base + summed * scale).to(torch.float32).cpu().numpy()
        return new_weights


def _summed(updates: list[LeafUpdate], name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The leaves' ``delta_sum[name]`` added in float64, in the order given (the first converted, not added to zeros:
    the same values, one pass fewer)."""
    if not updates:
        return np.zeros(shape, dtype=np.float64)
    summed = np.array(updates[0].delta_sum[name], dtype=np.float64)
    for update in updates[1:]:
        summed += update.delta_sum[name]
    return summed
