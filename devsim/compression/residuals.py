"""Bounded store of per-device error-feedback residuals (what a lossy codec has not sent yet).

Each device keeps ``residual = (its update + its previous residual) - what it transmitted``. A residual
is stamped with the round (synchronous runs) or the global model version (asynchronous runs) in which
it was made. Two bounds keep memory flat however many devices a population has:

- age: a residual older than ``max_age`` stamps when its device is next seen is discarded, not used
  (the device "forgot" it), and :meth:`sweep` removes every such residual;
- capacity: after a sweep at most ``capacity`` residuals remain, and at most ``max_bytes`` of them
  (``max_bytes // residual size`` residuals: a model of 11M parameters fits 24 residuals in 1 GiB,
  a 62k-parameter CNN 4,300); the oldest (then the largest device id) go first.

Each discarded residual counts as an eviction. Memory between sweeps is at most ``capacity`` plus the
devices seen since the last sweep, each one model's worth of float32 on the CPU. A synchronous leaf
sweeps at the end of each round from one thread, so which residuals survive is a pure function of
the seed. An asynchronous leaf sweeps after each call; calls overlap, so when evictions happen
(population above ``capacity`` or devices idle for more than ``max_age`` versions) which residuals
survive can depend on the order in which overlapping calls finish.
"""

from __future__ import annotations

import threading

import numpy as np
import torch


class ResidualStore:
    """Per-device residuals (flat float32 CPU vectors), bounded by age and count; thread-safe."""

    def __init__(self, capacity: int, max_age: int, max_bytes: int | None = None):
        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if max_bytes is not None and int(max_bytes) < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        if int(max_age) < 0:
            raise ValueError(f"max_age must be >= 0, got {max_age}")
        self.capacity = int(capacity)
        self.max_age = int(max_age)
        self._entries: dict[int, tuple[int, torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.evicted = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def take(self, device_id: int, stamp: int) -> torch.Tensor | None:
        """Remove and return the device's residual, or None when it has none or it is older than ``max_age``."""
        with self._lock:
            entry = self._entries.pop(int(device_id), None)
            if entry is None:
                return None
            if stamp - entry[0] > self.max_age:
                self.evicted += 1
                return None
            return entry[1]

    def put(self, device_id: int, stamp: int, residual: torch.Tensor) -> None:
        """Keep ``residual`` (on the CPU; a CPU tensor is kept as is, not copied) for the device, stamped ``stamp``."""
        kept = residual.detach().to("cpu", torch.float32)
        with self._lock:
            self._entries[int(device_id)] = (int(stamp), kept)

    def _capacity_now(self) -> int:
        """``capacity``, lowered to what fits in ``max_bytes`` at the stored residuals' size (at least 1)."""
        if self.max_bytes is None or not self._entries:
            return self.capacity
        entry_bytes = 4 * next(iter(self._entries.values()))[1].numel()
        return max(1, min(self.capacity, self.max_bytes // max(entry_bytes, 1)))

    def sweep(self, stamp: int) -> int:
        """Evict residuals older than ``max_age`` at ``stamp``, then the oldest past ``capacity``; returns the count."""

        with self._lock:
            stale = [d for d, (t, _) in self._entries.items() if stamp - t > self.max_age]
            for device_id in stale:
                del self._entries[device_id]
            overflow = len(self._entries) - self._capacity_now()
            if overflow > 0:
                order = sorted(self._entries, key=lambda d: (self._entries[d][0], -d))
                for device_id in order[:overflow]:
                    del self._entries[device_id]
            removed = len(stale) + max(overflow, 0)
            self.evicted += removed
            return removed

    def state(self) -> dict:
        """The residuals as plain arrays, for a checkpoint: ``devices`` and ``stamps`` (int64, (n,)), ``values``
        (float32, (n, size); (0, 0) when empty) and ``evicted``; :meth:`load_state` restores them."""
        with self._lock:
            items = sorted(self._entries.items())
            values = [v.numpy() for _, (_, v) in items]
            return {
                "devices": np.array([d for d, _ in items], dtype=np.int64),
                "stamps": np.array([t for _, (t, _) in items], dtype=np.int64),
                "values": np.stack(values) if values else np.zeros((0, 0), dtype=np.float32),
                "evicted": int(self.evicted),
            }

    def load_state(self, state: dict) -> None:
        """Replace the store's residuals by those of :meth:`state` (bounds are this store's own)."""
        values = np.asarray(state["values"], dtype=np.float32)
        devices, stamps = np.asarray(state["devices"]), np.asarray(state["stamps"])
        if not len(devices) == len(stamps) == (len(values) if values.size else 0):
            raise ValueError(f"residual state: {len(devices)} devices, {len(stamps)} stamps, {len(values)} rows")
        with self._lock:
            self._entries = {
                int(d): (int(t), torch.from_numpy(values[i].copy()))
                for i, (d, t) in enumerate(zip(devices, stamps, strict=True))
            }
            self.evicted = int(state["evicted"])
