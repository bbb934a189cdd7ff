"""Training settings: the seed and each device's local training (the ``training`` section).

Fields are command-line flags (field ``local_epochs`` is ``--local-epochs``) inherited by every run configuration.
Units: learning rates are plain multipliers, the batch size counts samples, local iterations count optimizer steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from devsim.config_errors import ConfigError
from devsim.sections import check_choice, check_min, check_positive_finite, meta

OPTIMIZERS = ("sgd", "adam")


def _training(text: str) -> dict[str, Any]:
    return meta("training", text)


@dataclass
class TrainingSettings:
    """How each selected device trains on its shard, from the global model it receives."""

    seed: int = field(default=0, metadata=_training("seed of model init, device sampling, partitions and training"))
    local_epochs: int = field(
        default=1, metadata=_training("local epochs per device (ignored with --local-iterations)")
    )
    local_iterations: int | None = field(
        default=None, metadata=_training("fixed local SGD steps per device; overrides --local-epochs")
    )
    batch_size: int = field(default=10, metadata=_training("local batch size"))
    optimizer: str = field(default="sgd", metadata=_training(f"local optimizer, one of {', '.join(OPTIMIZERS)}"))
    lr: float = field(default=0.05, metadata=_training("local learning rate"))
    momentum: float = field(default=0.9, metadata=_training("local SGD momentum in [0, 1) (--optimizer sgd)"))
    augment: bool = field(default=False, metadata=_training("random crop (4 px reflect padding) and flip locally"))
    prox_mu: float = field(
        default=0.0,
        metadata=_training(
            "FedProx: each device adds mu/2 ||w - w_start||^2 to its local loss, w_start the model it received "
            "(0: off, plain local training)"
        ),
    )

    def check_training(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad training flag."""
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_min("local_epochs", self.local_epochs, 1)
        check_min("batch_size", self.batch_size, 1)
        check_min("seed", self.seed, 0)
        if self.local_iterations is not None:
            check_min("local_iterations", self.local_iterations, 1)
        check_positive_finite("lr", self.lr)
        if not (math.isfinite(self.prox_mu) and self.prox_mu >= 0):
            raise ConfigError("prox_mu", f"{self.prox_mu} is not allowed; it must be a finite number >= 0")
        if not (0.0 <= self.momentum < 1.0):
            raise ConfigError("momentum", f"{self.momentum} is outside the allowed range [0, 1)")
