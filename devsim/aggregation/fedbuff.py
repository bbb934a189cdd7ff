"""FedBuff: buffered asynchronous aggregation with optional staleness down-weighting.

Updates are accumulated one at a time as they are accepted; after ``buffer_size`` of them the
caller applies the buffer to the global model:

    w <- w + global_lr * sum_i(s(tau_i) * delta_i) / n

where ``n`` is the number of buffered updates (``buffer_size`` when full), ``tau_i`` the staleness
of update ``i`` and ``s`` the staleness weight: 1 for ``"none"``, ``(1 + tau) ** -exponent`` for
``"polynomial"`` (FedAsync / FedBuff). Normalisation divides by the update count, not by the sum of
the weights, as the FedBuff paper does: stale updates therefore shrink the step instead of being
re-normalised back to full size. ``--server-optimizer`` replaces the plain step with a server optimizer on that
mean (:mod:`devsim.aggregation.server_optimizers`).
"""

from __future__ import annotations

import math

import numpy as np

from devsim.aggregation.base import Weights
from devsim.aggregation.server_optimizers import ServerOptimizer, active, restore, state_of
from devsim.aggregation.settings import STALENESS_WEIGHTINGS


class FedBuff:
    """Running float64 sum of weighted deltas; no list of deltas is kept (memory: one model)."""

    name = "fedbuff"

    def __init__(
        self,
        buffer_size: int,
        global_lr: float,
        staleness_weighting: str = "none",
        staleness_exponent: float = 0.5,
        server_optimizer: ServerOptimizer | None = None,
    ):
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, (int, np.integer)) or buffer_size < 1:
            raise ValueError(f"buffer_size must be an integer >= 1, got {buffer_size!r}")
        if not (math.isfinite(global_lr) and global_lr > 0):
            raise ValueError(f"global_lr must be a finite number > 0, got {global_lr!r}")
        if staleness_weighting not in STALENESS_WEIGHTINGS:
            raise ValueError(f"staleness_weighting must be one of {STALENESS_WEIGHTINGS}, got {staleness_weighting!r}")
        if not (math.isfinite(staleness_exponent) and staleness_exponent >= 0):
            raise ValueError(f"staleness_exponent must be a finite number >= 0, got {staleness_exponent!r}")
        self.buffer_size = int(buffer_size)
        self.global_lr = float(global_lr)
        self.staleness_weighting = staleness_weighting
        self.staleness_exponent = float(staleness_exponent)
        self.server_optimizer = active(server_optimizer)
        self._sum: dict[str, np.ndarray] = {}
        self._count = 0
        self._weight_sum = 0.0

    @property
    def count(self) -> int:
        """Updates currently buffered."""
        return self._count

    @property
    def weight_sum(self) -> float:
        """Sum of the staleness weights of the buffered updates (for metrics)."""
        return self._weight_sum

    def staleness_weight(self, staleness: int) -> float:
        """``s(tau)``: 1.0 for ``"none"``, ``(1 + tau) ** -exponent`` for ``"polynomial"``."""
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        if self.staleness_weighting == "none":
            return 1.0
        return float((1.0 + staleness) ** (-self.staleness_exponent))

    def add(self, delta: Weights, staleness: int) -> float:
        """Accumulate ``s(staleness) * delta`` (arrays of the model's shapes); returns the weight used.

        Raises RuntimeError when the buffer is already full (call :meth:`apply` first) and
        ValueError when ``delta``'s names or shapes differ from earlier updates.
        """
        if self._count >= self.buffer_size:
            raise RuntimeError(f"FedBuff buffer is full ({self.buffer_size} updates); call apply() first")
        weight = self.staleness_weight(staleness)
        if not self._sum:
            self._sum = {name: np.zeros(np.shape(value), dtype=np.float64) for name, value in delta.items()}
        elif delta.keys() != self._sum.keys():
            raise ValueError(f"delta entries {sorted(delta)} differ from the buffered {sorted(self._sum)}")
        for name, value in delta.items():
            target = self._sum[name]
            if np.shape(value) != target.shape:
                raise ValueError(f"delta[{name!r}] has shape {np.shape(value)}, expected {target.shape}")
        for name, value in delta.items():
            if weight == 1.0:
                self._sum[name] += value
            else:
                self._sum[name] += weight * np.asarray(value, dtype=np.float64)
        self._count += 1
        self._weight_sum += weight
        return weight

    def ready(self) -> bool:
        """True when ``buffer_size`` updates are buffered."""
        return self._count == self.buffer_size

    def apply(self, global_weights: Weights, noise: Weights | None = None) -> Weights:
        """New global weights ``w + global_lr * (sum(s_i * delta_i) + noise) / count`` (dtypes of ``w``); resets
        the buffer.

        Normally called when :meth:`ready`; a partial buffer is divided by its own count. ``noise`` (DP-FedBuff:
        Gaussian noise on the sum, arrays of the model's shapes) is added to the sum before the division.
        ``global_weights`` is not modified. With a ``server_optimizer`` other than sgd the mean
        ``(sum(s_i * delta_i) + noise) / count`` goes through it instead (its own learning rate).
        """
        if self._count == 0:
            raise RuntimeError("FedBuff.apply() called with an empty buffer")
        if global_weights.keys() != self._sum.keys():
            raise ValueError(f"global weights {sorted(global_weights)} differ from the buffered {sorted(self._sum)}")
        if self.server_optimizer is not None:
            summed = self._sum if noise is None else {k: v + noise[k] for k, v in self._sum.items()}
            new_weights = self.server_optimizer.apply(global_weights, {k: v / self._count for k, v in summed.items()})
            self.reset()
            return new_weights
        scale = self.global_lr / self._count
        new_weights: Weights = {}
        for name, value in global_weights.items():
            step = scale * (self._sum[name] if noise is None else self._sum[name] + noise[name])
            new_weights[name] = (np.asarray(value, dtype=np.float64) + step).astype(np.asarray(value).dtype)
        self.reset()
        return new_weights

    def reset(self) -> None:
        """Empty the buffer (keeps the float64 arrays allocated, zeroed)."""
        for array in self._sum.values():
            array.fill(0.0)
        self._count = 0
        self._weight_sum = 0.0

    def state_dict(self) -> dict[str, object]:
        """Buffer state (``count``, ``weight_sum``, copies of the float64 ``sum`` arrays) and hyperparameters."""
        return {
            "name": self.name,
            "buffer_size": self.buffer_size,
            "global_lr": self.global_lr,
            "staleness_weighting": self.staleness_weighting,
            "staleness_exponent": self.staleness_exponent,
            "count": self._count,
            "weight_sum": self._weight_sum,
            "sum": {name: array.copy() for name, array in self._sum.items()},
            **state_of(self.server_optimizer),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore the buffer from :meth:`state_dict`; hyperparameters stay those of the constructor."""
        count = int(state["count"])
        if not 0 <= count <= self.buffer_size:
            raise ValueError(f"checkpoint buffer count {count} does not fit buffer_size {self.buffer_size}")
        self._sum = {name: np.array(array, dtype=np.float64) for name, array in dict(state["sum"]).items()}
        self._count = count
        self._weight_sum = float(state["weight_sum"])
        restore(self.server_optimizer, state)
