"""Differentiable image augmentation in plain torch: reflect-padded random crop, horizontal flip, normalisation."""

from __future__ import annotations

import torch
from torch.nn import functional as F

__all__ = ["augment_images"]


def augment_images(
    images: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    padding: int = 4,
    generator: torch.Generator | None = None,
    crop_flip: bool = True,
) -> torch.Tensor:
    """Augment and normalise a batch ``(B, C, H, W)`` of images on the [0, 1] scale; gradients flow through.

    With ``crop_flip``: reflect-pad by ``padding`` pixels per side, crop back to ``H x W`` at a uniformly
    random offset per sample, and mirror each sample horizontally with probability 0.5. Always: subtract
    ``mean`` and divide by ``std`` (per channel, shape ``(C,)``, same device as ``images``). Random draws come
    from ``generator`` (a CPU ``torch.Generator``; the global CPU generator if None).
    """
    batch, channels, height, width = images.shape
    x = images
    if crop_flip:
        if padding > 0:
            padded = F.pad(x, (padding, padding, padding, padding), mode="reflect")
            offsets = torch.randint(0, 2 * padding + 1, (2, batch), generator=generator).to(x.device)
            rows = offsets[0, :, None] + torch.arange(height, device=x.device)
            cols = offsets[1, :, None] + torch.arange(width, device=x.device)
            # One gather over the flattened padded plane (row * padded width + column) crops every sample.
            index = (rows[:, :, None] * (width + 2 * padding) + cols[:, None, :]).view(batch, 1, height * width)
            x = padded.flatten(2).gather(2, index.expand(batch, channels, height * width))
            x = x.view(batch, channels, height, width)
        flip = (torch.rand(batch, generator=generator) < 0.5).to(x.device)
        x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return (x - mean.view(1, channels, 1, 1)) / std.view(1, channels, 1, 1)
