"""Server optimizers (FedAvgM, FedOpt): how a round's or a full buffer's mean update moves the global model.

The pseudo-gradient ``delta`` is a synchronous round's ``sum_leaves(delta_sum) / sum_leaves(total_weight)`` (the
sample-weighted mean of the devices' ``local - global``) or a FedBuff buffer's ``sum_i s(tau_i) delta_i / B``
(float64, each model entry's shape). With ``eta = --global-lr``:

- ``sgd`` (FedAvg): ``w += eta * delta``;
- ``momentum`` (FedAvgM, Hsu et al. 2019): ``m = beta1 * m + delta``, ``w += eta * m``;
- ``adagrad`` / ``adam`` / ``yogi`` (FedAdagrad / FedAdam / FedYogi, Reddi et al. 2021, "Adaptive Federated
  Optimization", Algorithm 2): ``m = beta1 * m + (1 - beta1) * delta`` and

  - adagrad: ``v = v + delta^2``
  - adam: ``v = beta2 * v + (1 - beta2) * delta^2``
  - yogi: ``v = v - (1 - beta2) * delta^2 * sign(v - delta^2)``

  then ``w += eta * m / (sqrt(v) + tau)``, as the paper writes it (no bias correction; ``m`` and ``v`` start at 0).
  Each coordinate then moves by up to about ``eta`` a round, so these want a much smaller ``--global-lr`` than
  FedAvg's 1 (the paper's best server rates for FedAdam and FedYogi lie around 1e-2 to 1e-1 with ``tau`` 1e-3).

The state (``m``, ``v``) lives in float64 and travels in the run's checkpoint, so ``--resume`` continues exactly.
"""

from __future__ import annotations

import math

import numpy as np

SERVER_OPTIMIZERS = ("sgd", "momentum", "adagrad", "adam", "yogi")
BETA1, BETA2, TAU = 0.9, 0.99, 1e-3
"""The defaults of ``--server-momentum``, ``--server-beta2`` and ``--server-tau`` (Reddi et al.'s)."""

Weights = dict[str, np.ndarray]


class ServerOptimizer:
    """One of :data:`SERVER_OPTIMIZERS` with its state; :meth:`apply` takes a round's mean update.

    Args:
        name: the method (see the module docstring).
        lr: ``eta``, the server learning rate (``--global-lr``).
        beta1: momentum of ``m`` (``--server-momentum``), in [0, 1).
        beta2: decay of ``v`` for adam and yogi (``--server-beta2``), in [0, 1).
        tau: adaptivity ``tau`` of the adaptive methods (``--server-tau``), > 0.
    """

    def __init__(self, name: str, lr: float, beta1: float = BETA1, beta2: float = BETA2, tau: float = TAU) -> None:
        if name not in SERVER_OPTIMIZERS:
            raise ValueError(f"server optimizer must be one of {', '.join(SERVER_OPTIMIZERS)}, got {name!r}")
        for label, value in (("beta1", beta1), ("beta2", beta2)):
            if not (math.isfinite(value) and 0.0 <= value < 1.0):
                raise ValueError(f"{label} must be in [0, 1), got {value}")
        for label, value in (("lr", lr), ("tau", tau)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{label} must be a finite number > 0, got {value}")
        self.name, self.lr, self.beta1, self.beta2, self.tau = name, float(lr), float(beta1), float(beta2), float(tau)
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}

    def describe(self) -> str:
        """One line with the method and the constants it uses."""
        names = {"sgd": (), "momentum": ("beta1",), "adagrad": ("beta1", "tau")}.get(
            self.name, ("beta1", "beta2", "tau")
        )
        return ", ".join(
            [f"server optimizer {self.name}", f"eta {self.lr:g}", *(f"{n} {getattr(self, n):g}" for n in names)]
        )

    def apply(self, weights: Weights, mean_delta: dict[str, np.ndarray]) -> Weights:
        """New float32 weights from ``weights`` and the round's mean update (float64 per entry); updates the state."""
        out: Weights = {}
        for name, value in weights.items():
            delta = np.asarray(mean_delta[name], dtype=np.float64)
            out[name] = (value + self._step(name, delta)).astype(np.float32)
        return out

    def _step(self, name: str, delta: np.ndarray) -> np.ndarray:
        if self.name == "sgd":
            return self.lr * delta
        m = self.m.get(name)
        if m is None:
            m = self.m[name] = np.zeros_like(delta)
        if self.name == "momentum":
            m *= self.beta1
            m += delta
            return self.lr * m
        m *= self.beta1
        m += (1.0 - self.beta1) * delta
        v = self.v.get(name)
        if v is None:
            v = self.v[name] = np.zeros_like(delta)
        square = delta * delta
        if self.name == "adagrad":
            v += square
        elif self.name == "adam":
            v *= self.beta2
            v += (1.0 - self.beta2) * square
        else:  # yogi
            v -= (1.0 - self.beta2) * square * np.sign(v - square)
        return self.lr * m / (np.sqrt(v) + self.tau)

    def state_dict(self) -> dict:
        """The method's name and ``m`` / ``v`` (float64 copies), for a checkpoint."""
        return {
            "name": self.name,
            "m": {k: v.copy() for k, v in self.m.items()},
            "v": {k: v.copy() for k, v in self.v.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s ``m`` and ``v``; refuses a checkpoint written by another method."""
        if state.get("name") != self.name:
            raise ValueError(f"the checkpoint's server optimizer is {state.get('name')!r}; this run's is {self.name!r}")
        self.m = {k: np.array(v, dtype=np.float64) for k, v in state.get("m", {}).items()}
        self.v = {k: np.array(v, dtype=np.float64) for k, v in state.get("v", {}).items()}


def active(optimizer: ServerOptimizer | None) -> ServerOptimizer | None:
    """``optimizer``, or None when there is none or it is sgd (the strategies take their own plain step then)."""
    return None if optimizer is None or optimizer.name == "sgd" else optimizer


def server_optimizer_for(settings) -> ServerOptimizer | None:
    """The optimizer a run's settings name (``server_optimizer``, ``global_lr``, ``server_momentum``,
    ``server_beta2``, ``server_tau``); None for sgd."""
    return active(
        ServerOptimizer(
            settings.server_optimizer,
            settings.global_lr,
            settings.server_momentum,
            settings.server_beta2,
            settings.server_tau,
        )
    )


def state_of(optimizer: ServerOptimizer | None) -> dict:
    """A strategy's checkpoint entry for its optimizer: ``{"server_optimizer": state}``, or ``{}`` without one."""
    return {} if optimizer is None else {"server_optimizer": optimizer.state_dict()}


def restore(optimizer: ServerOptimizer | None, state) -> None:
    """Load what :func:`state_of` saved into ``optimizer``; raises ValueError when the checkpoint and the run disagree
    on the method (no entry counts as sgd)."""
    saved = state.get("server_optimizer")
    if (saved is None) != (optimizer is None):
        mine = "sgd" if optimizer is None else optimizer.name
        theirs = "sgd" if saved is None else dict(saved).get("name")
        raise ValueError(f"the checkpoint's server optimizer is {theirs!r}; this run's is {mine!r}")
    if optimizer is not None:
        optimizer.load_state_dict(dict(saved))
