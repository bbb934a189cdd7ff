"""What a device does to its update before it leaves the device under DP: clip it, and in local DP noise it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from devsim.privacy.clipping import clip_, clip_rows_
from devsim.privacy.noise import add_local_noise_


@dataclass(frozen=True)
class DevicePrivacy:
    """One round's device-side mechanism: clip to ``clip`` (L2), then add N(0, ``local_noise_std``^2) (local DP; in
    asynchronous runs also leaf placement's share of the buffer's noise, added to each update the leaf forwards)."""

    clip: float
    local_noise_std: float = 0.0
    seed: int = 0

    def apply_(self, update: list[torch.Tensor], round_num: int, device_id: int) -> bool:
        """Clip (and noise) one device's update in place; True when its norm was at most the clip norm."""
        norm = clip_(update, self.clip)
        if self.local_noise_std:
            add_local_noise_(update, self.local_noise_std, self.seed, round_num, device_id)
        return norm <= self.clip

    def apply_rows_(self, rows: list[torch.Tensor], round_num: int | list[int], device_ids: list[int]) -> list[bool]:
        """:meth:`apply_` for a batched group: ``rows`` are (D, *shape), row i device ``device_ids[i]``.
        ``round_num`` keys the noise of every row, or one key per row (asynchronous jobs: each job's seed)."""
        norms = clip_rows_(rows, self.clip)
        if self.local_noise_std:
            keys = round_num if isinstance(round_num, list) else [round_num] * len(device_ids)
            for i, device_id in enumerate(device_ids):
                add_local_noise_([t[i] for t in rows], self.local_noise_std, self.seed, keys[i], device_id)
        return (norms <= self.clip).tolist()
