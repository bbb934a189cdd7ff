"""Clock settings: device delays and the network on the virtual clock (the ``clock`` section).

Fields are command-line flags (field ``uplink_mbps`` is ``--uplink-mbps``) inherited by every run configuration.
Units: bandwidths in Mbit/s, latency in milliseconds, spreads are log-normal sigmas; the delay schedule is a preset
name in ``app_configs/device_profiles`` or a JSON file (:func:`devsim.clock.profiles.load_schedule`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from devsim.config_errors import ConfigError
from devsim.sections import check_non_negative, check_positive_finite, meta


def _clock(text: str) -> dict[str, Any]:
    return meta("clock", text)


@dataclass
class ClockSettings:
    """How long device jobs take on the virtual clock: delay tiers, link bandwidths and latency."""

    delay_schedule: str = field(
        default="paper_default",
        metadata=_clock("device delay preset in app_configs/device_profiles (or a JSON file path)"),
    )
    uplink_mbps: float | None = field(
        default=None,
        metadata=_clock("median device uplink in Mbit/s on the virtual clock; unset: uploads take no time"),
    )
    downlink_mbps: float | None = field(
        default=None,
        metadata=_clock("median device downlink in Mbit/s on the virtual clock; unset: downloads take no time"),
    )
    latency_ms: float = field(default=0.0, metadata=_clock("median latency added to each transfer, milliseconds"))
    bandwidth_spread: float = field(
        default=0.0, metadata=_clock("log-normal sigma of per-device bandwidth and latency around the medians")
    )

    def check_clock(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad clock flag; the delay schedule is loaded to check it."""
        for name in ("uplink_mbps", "downlink_mbps"):
            if getattr(self, name) is not None:
                check_positive_finite(name, getattr(self, name))
        for name in ("latency_ms", "bandwidth_spread"):
            check_non_negative(name, getattr(self, name))
        from devsim.clock.profiles import load_schedule

        try:
            load_schedule(self.delay_schedule)
        except (ValueError, OSError) as error:
            raise ConfigError("delay_schedule", str(error)) from error
