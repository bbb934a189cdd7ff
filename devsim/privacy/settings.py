"""User-level differential privacy settings: the ``--dp-*`` flags and their checks.

:class:`PrivacySettings` is a dataclass section (:mod:`devsim.sections`) that a run configuration inherits; every
field is one command-line flag (field ``dp_clip`` is ``--dp-clip``) shown in the ``privacy`` group of ``--help``. Its
checks run as part of the configuration's validation and raise the configuration's ``ConfigError`` naming the flag.
Units: the clip norm is an L2 norm of a device's model update (``trained - global`` weights); noise multipliers are
ratios of a Gaussian's standard deviation to that norm; epsilon and delta are those of (epsilon, delta)-DP for adding
or removing one device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from devsim.config_errors import ConfigError
from devsim.sections import check_choice, check_positive_finite, meta

DP_MODES = ("off", "central", "local")
NOISE_PLACEMENTS = ("server", "leaves")
SAMPLINGS = ("poisson", "fixed")
ACCOUNTANTS = ("rdp", "pld")
MAX_NOISE_MULTIPLIER = 1000.0
"""``--dp-epsilon`` searches the noise multiplier up to this; a target that needs more is refused."""


def _privacy(text: str, sync_only: bool = False) -> dict[str, Any]:
    return meta("privacy", text, **({"sync_only": True} if sync_only else {}))


@dataclass
class PrivacySettings:
    """User-level DP: clip each device's update to ``dp_clip``, add Gaussian noise to the round's sum, account."""

    dp: str = field(
        default="off",
        metadata=_privacy(
            f"differential privacy, one of {', '.join(DP_MODES)} (central: noise on the round's sum, DP-FedAvg; "
            "local: noise on each device's update before it leaves the device); docs/privacy.md"
        ),
    )
    dp_clip: float = field(
        default=1.0,
        metadata=_privacy("L2 norm S each device's update is clipped to (the initial S with --dp-target-quantile)"),
    )
    dp_noise_multiplier: float | None = field(
        default=None,
        metadata=_privacy(
            "z: Gaussian noise of standard deviation z * S on the round's sum (asynchronous: on each applied buffer's "
            "sum; local: on each device's update); unset: solved from --dp-epsilon"
        ),
    )
    dp_epsilon: float | None = field(
        default=None,
        metadata=_privacy(
            "target epsilon after the run's rounds (asynchronous: --max-versions versions) at --dp-delta: the noise "
            "multiplier is solved for it"
        ),
    )
    dp_delta: float | None = field(
        default=None, metadata=_privacy("delta, in (0, 1 / population]; unset: 1 / population^1.1")
    )
    dp_noise_at: str = field(
        default="server",
        metadata=_privacy(
            f"where central noise is added, one of {', '.join(NOISE_PLACEMENTS)} (leaves: each of the L leaves adds "
            "standard deviation z * S / sqrt(L) to its own devices' sum, so the server sees only noised sums; "
            "asynchronous: z * S / sqrt(B) on each update it forwards)"
        ),
    )
    dp_sampling: str = field(
        default="poisson",
        metadata=_privacy(
            f"how devices are selected and accounted, one of {', '.join(SAMPLINGS)} (poisson: each device with "
            "probability --device-selection-size / population; fixed: exactly that many, replace-one accounting)",
            sync_only=True,
        ),
    )
    dp_accountant: str = field(
        default="rdp",
        metadata=_privacy(f"dp-accounting's accountant, one of {', '.join(ACCOUNTANTS)} (pld: tighter, slower)"),
    )
    dp_budget: float | None = field(
        default=None,
        metadata=_privacy(
            "stop before the round (version) whose epsilon would exceed this (the run ends there, saying so)"
        ),
    )
    dp_target_quantile: float | None = field(
        default=None,
        metadata=_privacy(
            "adaptive clipping (Andrew et al. 2021): S follows this quantile in (0, 1) of the update norms, from a "
            "noised count; unset: fixed --dp-clip"
        ),
    )
    dp_clip_lr: float = field(
        default=0.2, metadata=_privacy("adaptive clipping: S <- S * exp(-lr * (noised fraction below S - quantile))")
    )
    dp_count_noise: float | None = field(
        default=None,
        metadata=_privacy("adaptive clipping: standard deviation of the count's noise; unset: expected devices / 20"),
    )

    def check_privacy(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad ``--dp-*`` flag, or the flag DP cannot be combined with.
        ``population=False`` skips the checks against the population size."""
        for name, allowed in (
            ("dp", DP_MODES),
            ("dp_noise_at", NOISE_PLACEMENTS),
            ("dp_sampling", SAMPLINGS),
            ("dp_accountant", ACCOUNTANTS),
        ):
            check_choice(name, getattr(self, name), allowed)
        for name in ("dp_clip", "dp_epsilon", "dp_budget", "dp_clip_lr", "dp_count_noise"):
            if getattr(self, name) is not None:
                check_positive_finite(name, getattr(self, name))
        z = self.dp_noise_multiplier
        if z is not None and not (math.isfinite(z) and z >= 0):
            raise ConfigError("dp_noise_multiplier", f"{z} is not allowed; it must be a finite number >= 0")
        if self.dp_delta is not None and not (0.0 < self.dp_delta < 1.0):
            raise ConfigError("dp_delta", f"{self.dp_delta} is outside the allowed range (0, 1)")
        quantile = self.dp_target_quantile
        if quantile is not None and not (math.isfinite(quantile) and 0.0 < quantile < 1.0):
            raise ConfigError("dp_target_quantile", f"{quantile} is outside the allowed range (0, 1)")
        if self.dp == "off":
            return
        if z is None and self.dp_epsilon is None:
            raise ConfigError("dp", f"{self.dp} needs --dp-noise-multiplier Z or --dp-epsilon E")
        if self.dp == "local" and self.dp_noise_at != "server":
            raise ConfigError("dp_noise_at", "applies to --dp central; local DP adds noise on each device")
        if self.dp == "local" and quantile is not None:
            raise ConfigError("dp_target_quantile", "adaptive clipping needs --dp central (its count is noised there)")
        if quantile is not None and self.dp_noise_at == "leaves":
            raise ConfigError(
                "dp_target_quantile", "adaptive clipping's count is noised at the server: --dp-noise-at server"
            )
        if self.dp_accountant == "pld" and self.dp_sampling == "fixed" and self.dp == "central":
            raise ConfigError("dp_accountant", "pld accounts Poisson sampling only; with --dp-sampling fixed: rdp")
        _check_combinations(self, population)
        if population:
            size = int(getattr(self, "num_devices", 0))
            if self.dp_delta is not None and self.dp_delta > 1.0 / size:
                raise ConfigError(
                    "dp_delta",
                    f"{self.dp_delta:g} is above 1 / population (1 / {size}); allowed: (0, {1.0 / size:.3g}]",
                )


def _check_combinations(settings: Any, population: bool = True) -> None:
    """Options that DP cannot be combined with, each refused in one line naming the option."""

    if hasattr(settings, "kd_iterations") or hasattr(settings, "similarity_on"):
        reason = (
            "FedRevive distils from devices' raw models on the server, outside any clipping and noise"
            if hasattr(settings, "kd_iterations")
            else "cluster aggregation compares and averages leaves' un-noised models per cluster"
        )
        raise ConfigError("dp", f"{settings.dp} is not available here: {reason}; allowed: off")
    if hasattr(settings, "buffer_size"):
        _check_asynchronous(settings, population)
    if getattr(settings, "update_codec", "none") != "none":
        raise ConfigError(
            "update_codec",
            f"{settings.update_codec} is not allowed with --dp: a lossy codec changes the clipped update's norm "
            "(and error feedback carries it into later rounds); allowed: none",
        )
    if getattr(settings, "availability", "always") != "always":
        raise ConfigError(
            "availability",
            f"{settings.availability} is not allowed with --dp: selection among online devices is not the sampling "
            "the accountant assumes; allowed: always",
        )
    if getattr(settings, "inject_faults", ""):
        raise ConfigError("inject_faults", "testing faults are not allowed with --dp; allowed: '' (none)")


def _check_asynchronous(settings: Any, population: bool) -> None:
    """DP-FedBuff's limits: fixed clipping, RDP, and at least B idle devices (population - K) to sample a buffer
    from."""
    if settings.dp_target_quantile is not None:
        raise ConfigError(
            "dp_target_quantile",
            "adaptive clipping is not available in asynchronous runs (a buffer mixes updates clipped to the norms of "
            "the versions they started from); allowed: unset",
        )
    if settings.dp_accountant != "rdp":
        raise ConfigError(
            "dp_accountant",
            f"{settings.dp_accountant}: asynchronous buffers are accounted as fixed-size samples; allowed: rdp",
        )
    size = int(getattr(settings, "num_devices", 0))
    if population and size - settings.concurrency < settings.buffer_size:
        raise ConfigError(
            "concurrency",
            f"{settings.concurrency} leaves {size - settings.concurrency} idle devices, fewer than --buffer-size "
            f"{settings.buffer_size}: DP accounts each buffer as a sample of B from population - K; "
            f"allowed: 1..{size - settings.buffer_size}",
        )
