"""The device -> leaf uplink: encode a device's update (with error feedback for ``topk``), decode it at the
leaf, count bytes and seconds.

For ``none`` the update passes through untouched (the same tensors; nothing is copied, timed work is
nil), so a run with ``none`` is bit-identical to one without this module. For ``topk`` each device adds
its residual to its update before encoding and keeps what was not sent (error feedback, Stich et al.
2018; Karimireddy et al. 2019): over any sequence of rounds, the sum of what it transmitted plus its
current residual equals the sum of its true updates (up to float32 rounding of the additions).
``fp16`` and ``int8`` send without feedback.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from devsim.compression.codecs import CodecSpec, add_flattened, decode_flat, encode_flat, flatten, unflatten
from devsim.compression.residuals import ResidualStore


@dataclass
class UplinkStats:
    """Uplink totals over some device updates: bytes sent and their float32 size, codec seconds (summed)."""

    updates: int = 0
    bytes_sent: int = 0
    raw_bytes: int = 0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0

    def add(self, other: UplinkStats) -> None:
        self.updates += other.updates
        self.bytes_sent += other.bytes_sent
        self.raw_bytes += other.raw_bytes
        self.encode_seconds += other.encode_seconds
        self.decode_seconds += other.decode_seconds

    def to_counts(self) -> dict[str, float]:
        """Wire/record form: ``uplink_updates``, ``uplink_bytes``, ``uplink_raw_bytes``, ``codec_seconds``."""
        return {
            "uplink_updates": self.updates,
            "uplink_bytes": self.bytes_sent,
            "uplink_raw_bytes": self.raw_bytes,
            "codec_seconds": self.encode_seconds + self.decode_seconds,
        }


class UplinkCompressor:
    """Applies one codec to every device update a leaf receives; thread-safe (one per leaf)."""

    def __init__(
        self,
        spec: CodecSpec,
        residual_capacity: int = 10_000,
        residual_max_age: int = 50,
        residual_max_bytes: int | None = None,
    ):
        self.spec = spec
        self.error_feedback = spec.name == "topk"
        self.residuals = (
            ResidualStore(residual_capacity, residual_max_age, residual_max_bytes) if self.error_feedback else None
        )

    def transmit(
        self, device_id: int, stamp: int, update: list[torch.Tensor], stats: UplinkStats
    ) -> list[torch.Tensor]:
        """What the leaf receives for ``update`` (a device's float32 delta entries); adds bytes, seconds to ``stats``.

        ``stamp`` is the round (sync) or the base model version (async) the update belongs to.
        """
        raw = sum(4 * t.numel() for t in update)
        if self.spec.lossless:
            stats.add(UplinkStats(1, raw, raw))
            return update
        started = time.perf_counter()
        shapes = tuple(tuple(t.shape) for t in update)
        residual = self.residuals.take(device_id, stamp) if self.residuals is not None else None
        flat = flatten(update) if residual is None else add_flattened(residual.to(update[0].device), update)
        spec = self.spec.at_round(stamp)
        encoded = encode_flat(flat, shapes, spec)
        encoded_at = time.perf_counter()
        received = decode_flat(encoded, spec)
        decoded_at = time.perf_counter()
        if self.residuals is not None:
            index = encoded.parts[0].to(torch.int64)
            if spec.topk_values == "float32":
                flat[index] = 0.0  # topk: what was not sent stays behind
            else:
                flat[index] -= received[index]  # and the rounding of the values sent
            if _finite(flat):
                self.residuals.put(device_id, stamp, flat)
        stats.add(UplinkStats(1, encoded.nbytes, raw, encoded_at - started, decoded_at - encoded_at))
        return unflatten(received, shapes)

    def sweep(self, stamp: int) -> None:
        """Apply the residual store's age and capacity bounds (see :class:`ResidualStore`)."""
        if self.residuals is not None:
            self.residuals.sweep(stamp)

    def residual_counts(self) -> dict[str, int]:
        """``residuals_held`` now and ``residual_evictions`` since the start (0 without error feedback)."""
        if self.residuals is None:
            return {"residuals_held": 0, "residual_evictions": 0}
        return {"residuals_held": len(self.residuals), "residual_evictions": self.residuals.evicted}


def _finite(vector: torch.Tensor) -> bool:
    """Whether every element is finite: one reduction, and the element-wise check only when the sum is not."""
    return math.isfinite(float(vector.sum())) or bool(torch.isfinite(vector).all())
