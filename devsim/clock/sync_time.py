"""Simulated duration of synchronous rounds (the sync path's virtual clock; wall behaviour is unchanged).

A synchronous round lasts as long as its slowest answering device: for each device the round samples
``(download, train, upload)`` from the device's profile with ``derive_rng(seed, "sync-delay", round,
device_id)`` and adds the transfer of the model down and of the encoded update up over the device's
link (:mod:`devsim.clock.network`). Simulated seconds; a pure function of the seed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from devsim.clock.network import NetworkModel
from devsim.clock.profiles import DelaySchedule, profile_for
from devsim.seeding import derive_rng


class SyncRoundClock:
    """Accumulates simulated time over synchronous rounds; stores only the running total."""

    def __init__(
        self,
        schedule: DelaySchedule,
        network: NetworkModel | None,
        seed: int,
        download_bytes: int,
        upload_bytes: int | Callable[[int], int],
    ):
        """``upload_bytes``: a device's encoded update, in bytes, or a function of the round number giving it
        (a codec whose payload changes by round, e.g. a top-k warm-up)."""
        self.schedule = schedule
        self.network = network if network is not None and network.enabled else None
        self.seed = int(seed)
        self.download_bytes = int(download_bytes)
        self.upload_bytes = upload_bytes if callable(upload_bytes) else int(upload_bytes)
        self.now = 0.0

    def upload_bytes_at(self, round_num: int) -> int:
        """Bytes a device uploads in ``round_num``."""
        return int(self.upload_bytes(round_num)) if callable(self.upload_bytes) else self.upload_bytes

    def device_seconds(self, round_num: int, device_id: int) -> tuple[float, float]:
        """``(compute + fixed delays, transfer)`` simulated seconds of one device in ``round_num``."""
        profile = profile_for(self.schedule, self.seed, device_id)
        download, train, upload = profile.sample_delays(derive_rng(self.seed, "sync-delay", round_num, device_id))
        transfer = 0.0
        if self.network is not None:
            link = self.network.link_for(self.seed, device_id)
            transfer = link.download_seconds(self.download_bytes) + link.upload_seconds(self.upload_bytes_at(round_num))
        return download + train + upload, transfer

    def round_seconds(self, round_num: int, device_ids: Iterable[int]) -> dict[str, float]:
        """Advance the clock by the round's duration (max over ``device_ids``); the record fields of the round."""
        slowest, transfer_of_slowest = 0.0, 0.0
        for device_id in sorted(int(d) for d in device_ids):
            compute, transfer = self.device_seconds(round_num, device_id)
            if compute + transfer > slowest:
                slowest, transfer_of_slowest = compute + transfer, transfer
        self.now += slowest
        return {
            "simulated_round_seconds": slowest,
            "simulated_transfer_seconds": transfer_of_slowest,
            "simulated_time": self.now,
        }
