"""Per-device L2 clipping of model updates, and adaptive clipping's clip-norm update (Andrew et al. 2021).

An update is a list of tensors (one per model entry); its norm is the L2 norm over all of them together. Batched
groups hold ``(D, *shape)`` tensors, one row per device.
"""

from __future__ import annotations

import math

import torch


def clip_(update: list[torch.Tensor], clip: float) -> float:
    """Scale ``update`` in place to L2 norm at most ``clip``; returns its norm before clipping (a Python float)."""
    norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(update))))
    if norm > clip:
        torch._foreach_mul_(update, clip / norm)
    return norm


def clip_rows_(rows: list[torch.Tensor], clip: float) -> torch.Tensor:
    """Scale each device row of ``rows`` ((D, *shape) per entry) in place to L2 norm at most ``clip``.

    Returns the rows' norms before clipping, float32 (D,), on the rows' device.
    """
    squares = torch.stack([t.reshape(t.shape[0], -1).float().pow(2).sum(dim=1) for t in rows]).sum(dim=0)
    norms = squares.sqrt()
    scale = torch.clamp(clip / torch.clamp(norms, min=torch.finfo(norms.dtype).tiny), max=1.0)
    for t in rows:
        t.mul_(scale.reshape(-1, *([1] * (t.dim() - 1))).to(t.dtype))
    return norms


def next_clip(clip: float, noised_fraction_below: float, target_quantile: float, lr: float) -> float:
    """Adaptive clipping's geometric update: ``S * exp(-lr * (noised_fraction_below - target_quantile))``.

    ``noised_fraction_below`` is the noised count of devices whose update norm was at most ``S`` over the expected
    number of devices (a fixed denominator, so the count's sensitivity is known).
    """
    return float(clip * math.exp(-lr * (noised_fraction_below - target_quantile)))
