"""What FedRevive's generator makes for a task, and how a generated batch becomes the model's inputs.

:func:`generator_obstacle` says why FedRevive cannot synthesise a task's inputs (None when it can);
:func:`input_space` describes them as an :class:`InputSpace`: the model-input shape, whether it is an image
``(C, H, W)`` (then the conv generator and crop / flip augmentation apply) and the affine map from the
generator's (0, 1) outputs to model inputs, written as the normalisation ``(u - mean) / std``.
:func:`augment_inputs` applies that map (after the optional crop and flip) to a batch.

The task is taken duck-typed (``hooks.generator``, ``builtin``, ``pixel_stats``, ``prepare``, ``x_train``,
``x_test``, ``origin``), so this module imports nothing from :mod:`devsim.tasks`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

__all__ = ["InputSpace", "augment_inputs", "generator_obstacle", "input_space", "is_image_shape"]

RANGE_CHUNK = 4096
"""Test rows prepared at a time while measuring the model-input range."""

MIN_IMAGE_SIDE = 8
"""Smallest image height and width the conv generator and the reflect-padded crop handle."""


def is_image_shape(shape: tuple[int, ...]) -> bool:
    """Whether one sample of ``shape`` is an image ``(C, H, W)`` with H and W multiples of 4 (and at least 8),
    the shapes the conv generator (two x2 upsamplings) and crop / flip augmentation apply to."""
    return len(shape) == 3 and all(side % 4 == 0 and side >= MIN_IMAGE_SIDE for side in shape[1:])


def generator_obstacle(task: Any) -> str | None:
    """None when FedRevive can synthesise ``task``'s inputs, else a one-line reason for the user.

    It can when the task defines ``generator(latent_dim, num_classes)``, is a built-in image task, or stores
    float32 inputs (a generator's outputs are mapped onto their range). Integer inputs (token ids) cannot be
    produced by gradient descent, and a user task's uint8 rows have no known continuous scale.
    """
    if getattr(task.hooks, "generator", None) is not None or task.builtin:
        return None
    dtype = task.x_train.dtype
    if dtype == np.float32:
        return None
    hook = (
        "define generator(latent_dim, num_classes) in the task (an nn.Module mapping (z, labels) to model inputs) "
        "or run FedBuff"
    )
    if dtype == np.uint8:
        return f"its inputs are uint8: return them as float32 from data() (e.g. x / 255), {hook}"
    return f"its inputs are {dtype} (token ids): a generator cannot produce them by gradient descent; {hook}"


@dataclass(frozen=True)
class InputSpace:
    """The model inputs FedRevive synthesises for a task.

    Attributes:
        shape: one model input (after the task's ``prepare``), e.g. ``(3, 32, 32)`` or ``(20,)``.
        mean, std: generator output ``u`` in (0, 1) becomes the model input ``(u - mean) / std``, per channel
            (length ``C``) for images, per element (length ``prod(shape)``) otherwise; empty with ``generator``.
        generator: the task's ``generator(latent_dim, num_classes)`` hook, whose module's outputs are model
            inputs as they are (no clamp, no affine map, no crop / flip); None for the built-in generators.
        float_inputs: the model inputs are floating point (Gaussian probes of the class proportions apply).
    """

    shape: tuple[int, ...]
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    generator: Callable | None = None
    float_inputs: bool = True

    @property
    def image(self) -> bool:
        """The built-in conv generator and crop / flip augmentation apply."""
        return self.generator is None and is_image_shape(self.shape)

    def dfkd_settings(self) -> dict[str, Any]:
        """The :class:`~devsim.aggregation.fedrevive.config.DFKDConfig` fields these inputs set."""
        settings: dict[str, Any] = {"input_shape": self.shape, "task_generator": self.generator}
        if self.generator is None:
            settings.update(normalize_mean=self.mean, normalize_std=self.std)
        return settings


def input_space(task: Any) -> InputSpace:
    """The :class:`InputSpace` of ``task``: its generator hook, its pixel statistics (built-in image tasks:
    exactly the normalisation ``prepare`` applies to [0, 1] pixels), or the range of its prepared ``x_test``
    (user float tasks: ``input = lo + u * (hi - lo)``, per channel for images, per element otherwise).

    Raises:
        ValueError: FedRevive cannot synthesise the task's inputs (:func:`generator_obstacle`).
    """
    obstacle = generator_obstacle(task)
    if obstacle is not None:
        raise ValueError(f"FedRevive with task {task.origin}: {obstacle}")
    generator = getattr(task.hooks, "generator", None)
    if generator is not None:
        probe = _prepared(task, _reference_rows(task)[:2])
        return InputSpace(tuple(probe.shape[1:]), generator=generator, float_inputs=probe.is_floating_point())
    if task.builtin and task.pixel_stats is not None:
        mean, std = task.pixel_stats
        return InputSpace(tuple(task.sample_shape), tuple(map(float, mean)), tuple(map(float, std)))
    lo, hi, shape = _input_range(task)
    span = np.maximum(hi - lo, 1e-6 * np.maximum(1.0, np.maximum(np.abs(lo), np.abs(hi))))
    mean, std = -lo / span, 1.0 / span
    return InputSpace(shape, tuple(mean.tolist()), tuple(std.tolist()))


def _reference_rows(task: Any) -> np.ndarray:
    """The stored rows whose range the generator covers: the test split (the training split if it is empty)."""
    return task.x_test if len(task.x_test) else task.x_train


def _prepared(task: Any, rows: np.ndarray) -> torch.Tensor:
    """Model inputs ``(n, *shape)`` on the CPU for stored ``rows`` ``(n, *sample_shape)``."""
    with torch.no_grad():
        inputs = torch.from_numpy(np.ascontiguousarray(rows))
        return task.prepare(inputs) if task.prepare is not None else inputs


def _input_range(task: Any) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Per-channel (image inputs) or per-element minimum and maximum of the prepared reference rows, as
    float64 vectors, and the model-input shape."""
    rows = _reference_rows(task)
    lo = hi = None
    shape: tuple[int, ...] = ()
    for start in range(0, len(rows), RANGE_CHUNK):
        inputs = _prepared(task, rows[start : start + RANGE_CHUNK]).to(torch.float64)
        shape = tuple(inputs.shape[1:])
        flat = inputs.transpose(0, 1).flatten(1) if is_image_shape(shape) else inputs.flatten(1).T
        chunk_lo, chunk_hi = flat.amin(dim=1).numpy(), flat.amax(dim=1).numpy()
        lo = chunk_lo if lo is None else np.minimum(lo, chunk_lo)
        hi = chunk_hi if hi is None else np.maximum(hi, chunk_hi)
    if lo is None or hi is None:
        raise ValueError(f"FedRevive with task {task.origin}: no input rows to measure the input range on")
    return lo, hi, shape


def _per_sample(values: torch.Tensor, sample_shape: torch.Size) -> torch.Tensor:
    """``values`` (one per element of ``sample_shape``, else one per channel ``sample_shape[0]``) viewed to
    broadcast over a batch ``(B, *sample_shape)``."""
    if values.numel() == math.prod(sample_shape):
        return values.view(1, *sample_shape)
    if values.numel() == sample_shape[0]:
        return values.view(1, -1, *([1] * (len(sample_shape) - 1)))
    raise ValueError(
        f"{values.numel()} normalisation values fit neither the channels nor the elements of {tuple(sample_shape)}"
    )


def augment_inputs(
    outputs: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    padding: int = 4,
    generator: torch.Generator | None = None,
    crop_flip: bool = True,
) -> torch.Tensor:
    """Model inputs for a batch ``(B, *shape)`` of generator outputs on the (0, 1) scale; gradients flow through.

    With ``crop_flip`` (images ``(B, C, H, W)`` only): reflect-pad by ``padding`` pixels per side, crop back to
    ``H x W`` at a uniformly random offset per sample, and mirror each sample horizontally with probability 0.5.
    Always: subtract ``mean`` and divide by ``std`` (same device as ``outputs``), per channel (``(C,)``) or per
    element (``prod(shape)`` values). Random draws come from ``generator`` (a CPU ``torch.Generator``; the
    global CPU generator if None): the crop offsets, then the flips.
    """
    x = outputs
    if crop_flip:
        batch, channels, height, width = x.shape
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
    return (x - _per_sample(mean, x.shape[1:])) / _per_sample(std, x.shape[1:])
