"""A leaf's training data: loaded once per process, kept on the compute device, sliced per device.

The whole train split lives once in memory as stored (uint8 images, float32 features, int64 token ids; on the
GPU when there is one); a device's shard is gathered, and prepared into model inputs (e.g. normalised to
float32), only while that device trains, so idle devices cost nothing.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from devsim.data.partition import Partitioner

Prepare = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ShardPool:
    """The samples of the devices being trained, as rows of one tensor, gathered step by step.

    Attributes:
        inputs: (M, *sample_shape) stored rows of any dtype (a leaf passes its whole train split), on the
            trainer's device.
        targets: (M, *target_shape) targets (int64 class ids, or float targets).
        indices: per device, an int64 tensor of its rows in ``inputs`` (its shard, in shard order); shards may
            differ in size.
        prepare: maps gathered rows (*lead, *sample_shape) to model inputs with the same leading dimensions
            (see :func:`broadcast_prepare`); None when ``inputs`` already holds the inputs.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    indices: list[torch.Tensor]
    prepare: Prepare | None = None


def broadcast_prepare(prepare: Prepare | None, sample_dims: int) -> Prepare | None:
    """``prepare`` made to accept any number of leading dimensions.

    A task's ``prepare`` takes a batch ``(n, *sample_shape)``; the batched trainer gathers ``(batch, D,
    *sample_shape)``. Preparers that already broadcast (``prepare.broadcasts``, e.g. :class:`Normaliser`) are
    returned as they are; others get the leading dimensions flattened into one and restored after.
    """
    if prepare is None or getattr(prepare, "broadcasts", False):
        return prepare

    def prepare_any(rows: torch.Tensor) -> torch.Tensor:
        lead = rows.shape[: rows.dim() - sample_dims]
        if len(lead) == 1:
            return prepare(rows)
        flat = prepare(rows.reshape(-1, *rows.shape[len(lead) :]))
        return flat.reshape(*lead, *flat.shape[1:])

    return prepare_any


ROWS_CACHE_SIZE = 4096
"""Devices whose row indices a leaf keeps on its compute device (100-sample shards: 3.2 MB): drawing a device's
Dirichlet shard costs about 50 us, and each call to a leaf asks for every device it trains."""


class DeviceDataSource:
    """A shared train split plus a partitioner that maps a device id to its sample indices.

    Args:
        inputs: (N, *sample_shape) stored inputs (NumPy or torch); moved to ``device`` once.
        targets: (N, *target_shape) targets.
        partitioner: device id -> row indices.
        device: the compute device.
        prepare: the task's ``prepare`` (stored rows -> model inputs), or None.
    """

    def __init__(
        self,
        inputs: np.ndarray | torch.Tensor,
        targets: np.ndarray | torch.Tensor,
        partitioner: Partitioner,
        device: torch.device,
        prepare: Prepare | None = None,
    ):
        self.device = torch.device(device)
        self.partitioner = partitioner
        self.inputs = torch.as_tensor(inputs).to(self.device)
        self.targets = torch.as_tensor(targets).to(self.device)
        self.prepare = broadcast_prepare(prepare, self.inputs.dim() - 1)
        self._rows = functools.lru_cache(maxsize=ROWS_CACHE_SIZE)(self._device_rows)

    def shard(self, device_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Model inputs (n, ...) and targets (n, ...) of ``device_id``'s shard, on the compute device."""
        index = self._rows(device_id)
        rows = self.inputs[index]
        return (self.prepare(rows) if self.prepare is not None else rows), self.targets[index]

    def shard_pool(self, device_ids: list[int]) -> ShardPool:
        """The shards of ``device_ids`` as rows of the shared train split, prepared per gathered batch."""
        return ShardPool(self.inputs, self.targets, [self._rows(d) for d in device_ids], self.prepare)

    def shard_size(self, device_id: int) -> int:
        """Samples in ``device_id``'s shard."""
        return int(self.partitioner.device_indices(device_id).size)

    def _device_rows(self, device_id: int) -> torch.Tensor:
        """``device_id``'s row indices into the train split, int64, on the compute device (``_rows`` caches them:
        read-only, several calls share one tensor)."""
        return torch.from_numpy(self.partitioner.device_indices(device_id)).to(self.device)


class Normaliser:
    """Maps uint8 images (..., C, H, W) to float32 ``(x / 255 - mean) / std`` with per-channel constants.

    Works on any device (constants are made once per device) and any number of leading dimensions; the output
    keeps the input's memory layout (an elementwise op on a permuted tensor stays permuted).
    """

    broadcasts = True

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]):
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self._constants: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._lock = threading.Lock()

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        constants = self._constants.get(key)
        if constants is None:
            with self._lock:
                offset = torch.tensor(self.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1) * 255.0
                scale = 1.0 / (torch.tensor(self.std, dtype=torch.float32, device=device).view(1, -1, 1, 1) * 255.0)
                constants = self._constants.setdefault(key, (offset, scale))
        return constants

    def __call__(self, images_uint8: torch.Tensor) -> torch.Tensor:
        offset, scale = self._on(images_uint8.device)
        if _folded_storage(images_uint8):
            batch, devices, channels, height, width = images_uint8.shape
            flat = images_uint8.permute(0, 3, 4, 1, 2).reshape(batch, height, width, devices * channels)
            out = torch.sub(flat, offset.view(-1).repeat(devices)).mul_(scale.view(-1).repeat(devices))
            return out.view(batch, height, width, devices, channels).permute(0, 3, 4, 1, 2)
        return torch.sub(images_uint8, offset).mul_(scale)

    def __getstate__(self) -> dict:
        return {"mean": self.mean, "std": self.std}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["mean"], state["std"])


def _folded_storage(images: torch.Tensor) -> bool:
    """Whether ``images`` (batch, D, C, H, W) is stored as a contiguous (batch, H, W, D, C) tensor.

    The batched trainer gathers steps in that order (see ``devsim.training.batched.fold_channels_last``); the
    normaliser then broadcasts its constants along the innermost D * C values, which is 1.8x faster on the CPU
    than along C = 3 (2.3 against 4.1 ms for 500 images of 3x32x32), with the same result.
    """
    if images.dim() != 5:
        return False
    return images.permute(0, 3, 4, 1, 2).is_contiguous()
