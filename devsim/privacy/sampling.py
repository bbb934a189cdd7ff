"""Poisson selection of devices: each device of the population joins a round independently with probability q."""

from __future__ import annotations

import numpy as np

from devsim.seeding import derive_rng


def poisson_select(seed: int, round_num: int, population: int, rate: float) -> np.ndarray:
    """Sorted device ids (int64, shape (k,), k ~ Binomial(population, rate), possibly 0) selected in ``round_num``.

    The draw is a pure function of ``(seed, round_num)``: reruns and resumed runs select the same devices.
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"rate must be in (0, 1], got {rate}")
    rng = derive_rng(seed, "dp-select", round_num)
    return np.flatnonzero(rng.random(population) < rate).astype(np.int64)
