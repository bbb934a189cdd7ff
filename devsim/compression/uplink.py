"""The device -> leaf uplink: encode a device's update (with error feedback for ``topk``), decode it at the
leaf, count bytes and seconds.

For ``none`` the update passes through untouched (the same tensors; nothing is copied, timed work is
nil), so a run with ``none`` is bit-identical to one without this module. For ``topk`` each device adds
its residual to its update before encoding and keeps what was not sent (error feedback, Stich et al.
2018; Karimireddy et al. 2019): over any sequence of rounds, the sum of what it transmitted plus its
current residual equals the sum of its true updates (up to float32 rounding of the additions).
``fp16`` and ``int8`` send without feedback.

With ``topk_momentum`` beta > 0 (synchronous runs) the leaf also keeps a heavy-ball momentum on what it
received (:meth:`UplinkCompressor.fold_aggregate`): ``v = beta * v + mean``, where ``mean`` is the
sample-weighted mean of the round's decoded sparse updates, and it reports ``v`` in place of ``mean`` (as
``v * total weight``). This is FetchSGD's aggregator-side momentum (Rothchild et al. 2020) placed at the leaf;
FetchSGD's error accumulation at the aggregator needs a linear sketch of each whole update, which top-k is not
(the leaf never sees what a device left out; the device's residual keeps it), and on a float32 leaf -> server
hop nothing is left to accumulate, so momentum is the part of it that applies. It adds no uplink bytes; with
two or more leaves that all report every round it is close to the server's momentum on the global mean (exact
when the leaves' weights keep their proportions).

Residuals and velocity live in the leaf's memory; :meth:`UplinkCompressor.state` and
:meth:`UplinkCompressor.load_state` carry them through a synchronous run's checkpoint (the server asks each leaf
for them when it saves one and hands them back on ``--resume``), so a resumed top-k run continues bit for bit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from devsim.compression.codecs import CodecSpec, Encoded, decode_flat, encode_flat, flatten_rows, unflatten
from devsim.compression.residuals import ResidualStore

CHUNK_BYTES = 1 << 20  # a group crosses in chunks of rows of about this many float32 bytes (see transmit_rows)


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


def keeps_state(spec: CodecSpec) -> bool:
    """Whether an uplink with this codec keeps state between rounds: ``topk``'s error-feedback residuals (and its
    optional momentum velocity); the other codecs keep none."""
    return spec.name == "topk"


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
        self.error_feedback = keeps_state(spec)
        self.momentum = float(spec.topk_momentum) if spec.name == "topk" else 0.0
        self._velocity: list[torch.Tensor] | None = None
        self.residuals = (
            ResidualStore(residual_capacity, residual_max_age, residual_max_bytes) if self.error_feedback else None
        )

    def transmit(
        self,
        device_id: int,
        stamp: int,
        update: list[torch.Tensor],
        stats: UplinkStats,
        encoded_out: list[Encoded] | None = None,
    ) -> list[torch.Tensor]:
        """What the leaf receives for ``update`` (a device's float32 delta entries); adds bytes, seconds to ``stats``.

        ``stamp`` is the round (sync) or the base model version (async) the update belongs to. With a lossy
        codec and ``encoded_out`` given, the update as it travelled is appended there (parts with a leading
        row of 1), for a leaf that forwards it as it came (see :mod:`devsim.compression.forwarding`).
        """
        if self.spec.lossless:
            raw = sum(4 * t.numel() for t in update)
            stats.add(UplinkStats(1, raw, raw))
            return update
        rows = self.transmit_rows([device_id], stamp, [t.unsqueeze(0) for t in update], stats, encoded_out)
        return [t[0] for t in rows]

    def transmit_rows(
        self,
        device_ids: list[int],
        stamp: int,
        stacked: list[torch.Tensor],
        stats: UplinkStats,
        encoded_out: list[Encoded] | None = None,
    ) -> list[torch.Tensor]:
        """:meth:`transmit` for D devices at once: each entry of ``stacked`` is ``(D, *shape)``, row i being
        ``device_ids[i]``'s update; returns what the leaf receives, stacked the same way.

        Bytes, residuals and received values are exactly those of D :meth:`transmit` calls (the codecs work row
        by row), but the array work runs once over the ``(D, n)`` matrix, which is what a batched group of
        devices hands over; only the top-k selection still loops over the rows. With a lossy codec and
        ``encoded_out`` given, the encoded rows are appended there, one :class:`Encoded` a chunk of rows, in order.
        """
        count = len(device_ids)
        raw = sum(4 * t[0].numel() for t in stacked) if count else 0
        if self.spec.lossless:
            stats.add(UplinkStats(count, raw * count, raw * count))
            return stacked
        shapes = tuple(tuple(t.shape[1:]) for t in stacked)
        rows = max(1, CHUNK_BYTES // max(raw, 1))
        if count <= rows:
            return unflatten(self._transmit_chunk(device_ids, stamp, stacked, shapes, raw, stats, encoded_out), shapes)
        received = torch.empty((count, raw // 4), dtype=torch.float32, device=stacked[0].device)
        for i in range(0, count, rows):
            part = [t[i : i + rows] for t in stacked]
            chunk_ids = device_ids[i : i + rows]
            self._transmit_chunk(chunk_ids, stamp, part, shapes, raw, stats, encoded_out, received[i : i + rows])
        return unflatten(received, shapes)

    def _transmit_chunk(
        self,
        device_ids: list[int],
        stamp: int,
        stacked: list[torch.Tensor],
        shapes: tuple[tuple[int, ...], ...],
        raw: int,
        stats: UplinkStats,
        encoded_out: list[Encoded] | None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`transmit_rows` for a group small enough that its (rows, n) arrays stay in the CPU's caches:
        the received rows ``(rows, n)``, written into ``out`` when given. ``raw`` is one device's update in
        float32 bytes. Encode seconds include the error feedback's bookkeeping (adding and keeping residuals)."""
        count = len(device_ids)
        started = time.perf_counter()
        flat = flatten_rows(stacked)
        buffers: list[torch.Tensor | None] = []
        if self.residuals is not None:
            for row, device_id in zip(flat, device_ids, strict=True):
                residual = self.residuals.take(device_id, stamp)
                if residual is not None:
                    row += residual.to(row.device)
                buffers.append(residual)
        spec = self.spec.at_round(stamp)
        encoded = encode_flat(flat, shapes, spec)
        encoded_at = time.perf_counter()
        received = decode_flat(encoded, spec, out)
        decoded_at = time.perf_counter()
        if self.residuals is not None:  # what did not arrive stays behind: entries not sent, rounding of those sent
            for i, (device_id, finite) in enumerate(zip(device_ids, _finite_rows(flat), strict=True)):
                if finite:
                    self.residuals.put(device_id, stamp, _difference(flat[i], received[i], buffers[i]))
        kept_at = time.perf_counter()
        encode_seconds = (encoded_at - started) + (kept_at - decoded_at)
        stats.add(UplinkStats(count, encoded.nbytes, raw * count, encode_seconds, decoded_at - encoded_at))
        if encoded_out is not None:
            encoded_out.append(encoded)
        return received

    def fold_aggregate(self, accumulator: list[torch.Tensor], total_weight: float) -> list[torch.Tensor]:
        """The leaf's round sum as it reports it: ``accumulator`` (the weighted sum of the received updates, entry
        by entry) as is without ``topk_momentum``; with momentum beta, ``v * total_weight`` where ``v = beta * v
        + accumulator / total_weight`` (``v`` starts at zero and is kept between rounds). A round with no weight
        (no device accepted) leaves ``v`` alone and returns ``accumulator``. Synchronous rounds only (one call a
        round, from one thread)."""
        if not self.momentum or total_weight <= 0:
            return accumulator
        mean = [a.to(torch.float32) / float(total_weight) for a in accumulator]
        if self._velocity is None:
            self._velocity = mean
        else:
            if self._velocity[0].device != mean[0].device:  # restored from a checkpoint on the CPU
                self._velocity = [v.to(mean[0].device) for v in self._velocity]
            torch._foreach_mul_(self._velocity, self.momentum)
            torch._foreach_add_(self._velocity, mean)
        return [v * float(total_weight) for v in self._velocity]

    @property
    def stateful(self) -> bool:
        """Whether this uplink keeps state between rounds (:func:`keeps_state`)."""
        return keeps_state(self.spec)

    def state(self) -> dict:
        """Residuals (:meth:`ResidualStore.state`) and the momentum velocity (float32 arrays, one per entry; empty
        before the first fold) as plain arrays, for a checkpoint."""
        velocity = [] if self._velocity is None else [v.detach().cpu().numpy() for v in self._velocity]
        return {"residuals": self.residuals.state() if self.residuals is not None else None, "velocity": velocity}

    def load_state(self, state: dict) -> None:
        """Restore :meth:`state` (from a leaf with the same codec settings)."""
        if (state.get("residuals") is None) != (self.residuals is None):
            raise ValueError("uplink state and codec settings disagree on error feedback")
        if self.residuals is not None:
            self.residuals.load_state(state["residuals"])
        velocity = state.get("velocity") or []
        self._velocity = [torch.from_numpy(np.array(v, dtype=np.float32)) for v in velocity] or None

    def sweep(self, stamp: int) -> None:
        """Apply the residual store's age and capacity bounds (see :class:`ResidualStore`)."""
        if self.residuals is not None:
            self.residuals.sweep(stamp)

    def residual_counts(self) -> dict[str, int]:
        """``residuals_held`` now and ``residual_evictions`` since the start (0 without error feedback)."""
        if self.residuals is None:
            return {"residuals_held": 0, "residual_evictions": 0}
        return {"residuals_held": len(self.residuals), "residual_evictions": self.residuals.evicted}


def _finite_rows(rows: torch.Tensor) -> list[bool]:
    """Whether each row of ``(D, n)`` is all finite: a row's maximum and minimum are finite exactly when
    all its entries are (NaN propagates through both); one NumPy reduction each on the CPU."""
    if rows.is_cpu:
        values = rows.numpy()
        return (np.isfinite(values.max(axis=-1)) & np.isfinite(values.min(axis=-1))).tolist()
    return torch.isfinite(rows).all(dim=-1).tolist()


def _difference(sent: torch.Tensor, received: torch.Tensor, spare: torch.Tensor | None) -> torch.Tensor:
    """``sent - received`` (1-D, float32), written into ``spare`` (a residual the device just used up) when it
    is a CPU vector like ``sent``, so that a group's residuals neither share the group's memory nor allocate.
    Exact where a value arrived as sent (``x - x = 0``) and where nothing arrived (``x - 0 = x``)."""
    if sent.is_cpu and spare is not None and spare.is_cpu and spare.shape == sent.shape:
        np.subtract(sent.numpy(), received.numpy(), out=spare.numpy())
        return spare
    return sent - received
