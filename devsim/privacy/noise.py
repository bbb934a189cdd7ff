"""Gaussian noise for the privacy mechanisms, seeded so that runs, reruns and resumed runs draw the same noise.

Every draw is a pure function of ``(seed, purpose, round, ids)`` (:func:`devsim.seeding.derive_rng`): the server's
noise of round r, leaf i's share of it, device d's local noise. Arrays are float32, one per model entry.
"""

from __future__ import annotations

import numpy as np
import torch

from devsim.seeding import derive_rng, derive_seed

Weights = dict[str, np.ndarray]


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
