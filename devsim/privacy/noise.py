"""Gaussian noise for the privacy mechanisms, seeded so that runs, reruns and resumed runs draw the same noise.

Every draw is a pure function of ``(seed, purpose, round, ids)`` (:func:`devsim.seeding.derive_rng`): the server's
noise of round r, leaf i's share of it, device d's local noise. Arrays are float32, one per model entry.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from devsim.seeding import derive_rng, derive_seed

Weights = dict[str, np.ndarray]

NOISE_NORM_MARGIN = 10.0
"""Standard deviations of slack above ``sqrt(size)`` in :func:`noised_norm_bound`: the norm of N(0, std^2) noise in
``size`` dimensions is ``std * sqrt(size)`` give or take about ``std / sqrt(2)``, so 10 is about 14 of its own standard
deviations."""


def noised_norm_bound(clip: float, std: float, size: int) -> float:
    """A bound on the L2 norm of an update clipped to ``clip`` plus N(0, ``std``^2) noise in each of its ``size``
    entries, that an honest noised update does not exceed in practice: ``clip + std * (sqrt(size) + 10)``."""
    return clip + std * (math.sqrt(size) + NOISE_NORM_MARGIN)


def gaussian_like(shapes: dict[str, tuple[int, ...]], std: float, seed: int, purpose: str, *ids: int) -> Weights:
    """Noise N(0, std^2) per entry, float32 of each entry's shape, in the order of ``shapes``."""
    rng = derive_rng(seed, purpose, *ids)
    return {name: rng.standard_normal(shape, dtype=np.float32) * np.float32(std) for name, shape in shapes.items()}


def with_gaussian(values: Weights, std: float, seed: int, purpose: str, *ids: int) -> Weights:
    """``values`` with N(0, std^2) noise added (in float32, new arrays); ``std`` 0 returns them unchanged."""
    if std == 0:
        return values
    noise = gaussian_like({k: np.shape(v) for k, v in values.items()}, std, seed, purpose, *ids)
    return {k: (np.asarray(v, dtype=np.float32) + noise[k]).astype(np.float32) for k, v in values.items()}


def add_local_noise_(update: list[torch.Tensor], std: float, seed: int, round_num: int, device_id: int) -> None:
    """Local DP: add N(0, std^2) to one device's update in place (drawn on the CPU from the device's own stream)."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "dp-local", round_num, device_id))
    for t in update:
        t.add_(torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device), alpha=std)
