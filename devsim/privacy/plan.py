"""A run's resolved privacy mechanism: sampling rate, fixed denominator, noise multipliers and the accounted event.

:class:`PrivacyPlan` is built once from a run's settings (``--dp-*``, the population, the selection size) and is
what the server, the leaves and the accountant agree on:

- central DP: each selected device's update is clipped to ``S``, the round's sum gets Gaussian noise of standard
  deviation ``sum_noise_multiplier * S`` (at the server, or ``/ sqrt(L)`` at each of L leaves) and is divided by
  ``denominator`` (the expected number of devices, fixed in advance). With adaptive clipping the noised count of
  updates below ``S`` takes part of the privacy cost: ``1/z^2 = 1/z_sum^2 + 1/(2 sigma_count)^2`` (Andrew et al.
  2021, Theorem 1), so ``z`` stays what is accounted.
- local DP: each device adds standard deviation ``z * S`` to its own clipped update; the epsilon reported is that
  of one device's uploads in every round (replace-one, no sampling amplification: the receiver sees who uploaded).
- asynchronous runs (DP-FedBuff, ``sampling == "buffer"``): a "round" is an applied version, whose buffer holds
  exactly B updates of distinct devices, each dispatched to a device drawn uniformly from the idle ones (at least
  population - K); each version is accounted as a sample of B without replacement from ``population`` = N - K
  (replace-one), the denominator is B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting

from devsim.privacy.accountant import RunAccountant, solve_noise_multiplier
from devsim.privacy.settings import MAX_NOISE_MULTIPLIER

DEFAULT_DELTA_EXPONENT = 1.1
"""Unset ``--dp-delta`` is ``1 / population ** 1.1``."""
COUNT_NOISE_DIVISOR = 20.0
"""Unset ``--dp-count-noise`` is ``expected devices / 20`` (the default Flower documents for Andrew et al.)."""


@dataclass(frozen=True)
class PrivacyPlan:
    """The mechanism of one DP run. ``population`` devices, ``expected`` selected per round on average."""

    mode: str
    population: int
    expected: int
    sampling: str
    noise_multiplier: float
    delta: float
    clip: float
    noise_at: str = "server"
    accountant: str = "rdp"
    target_quantile: float | None = None
    clip_lr: float = 0.2
    count_noise: float | None = None

    @classmethod
    def from_settings(cls, settings) -> PrivacyPlan | None:
        """The plan of a validated configuration with its noise multiplier resolved; None when DP is off."""
        if settings.dp == "off":
            return None
        if settings.dp_noise_multiplier is None:
            raise ValueError("the noise multiplier is unresolved: call resolve_noise_multiplier first")
        population = int(settings.num_devices)
        sampling, pool, expected = sampling_model(settings)
        count_noise = settings.dp_count_noise
        if settings.dp_target_quantile is not None and count_noise is None:
            count_noise = expected / COUNT_NOISE_DIVISOR
        return cls(
            mode=settings.dp,
            population=pool,
            expected=expected,
            sampling=sampling,
            noise_multiplier=float(settings.dp_noise_multiplier),
            delta=float(settings.dp_delta) if settings.dp_delta is not None else default_delta(population),
            clip=float(settings.dp_clip),
            noise_at=settings.dp_noise_at,
            accountant=settings.dp_accountant,
            target_quantile=settings.dp_target_quantile,
            clip_lr=float(settings.dp_clip_lr),
            count_noise=count_noise,
        )

    @property
    def rate(self) -> float:
        """q: the probability that a given device is selected in a round (in a version's buffer)."""
        return self.expected / self.population

    @property
    def denominator(self) -> float:
        """The fixed divisor of the round's noised sum: the expected number of selected devices."""
        return float(self.expected)

    @property
    def replace_one(self) -> bool:
        """Whether the accounting is for replacing one device (fixed-size sampling, buffers, local DP) or
        adding/removing one."""
        return self.sampling != "poisson" or self.mode == "local"

    @property
    def sum_noise_multiplier(self) -> float:
        """Noise multiplier of the update sum: ``z``, or with adaptive clipping the share left after the count's."""
        return sum_noise_multiplier(self.noise_multiplier, self.count_noise if self.target_quantile else None)

    def event(self, noise_multiplier: float | None = None) -> dp_accounting.DpEvent:
        """The DP event of one round (``noise_multiplier`` overrides z, for the solver)."""
        z = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        return make_event(self.mode, self.sampling, z, self.rate, self.population, self.expected)

    def new_accountant(self) -> RunAccountant:
        """A fresh accountant of this plan's event."""
        return RunAccountant(self.event(), self.delta, self.accountant, self.replace_one)


def make_event(
    mode: str, sampling: str, noise_multiplier: float, rate: float, population: int, expected: int
) -> dp_accounting.DpEvent:
    """One round's event. The library's noise multiplier is noise std over the L2 sensitivity: ``z`` with
    add/remove one device, ``z / 2`` with replace-one (two clipped updates differ by up to ``2 S``)."""
    if mode == "local":
        return dp_accounting.GaussianDpEvent(noise_multiplier / 2.0)
    if sampling in ("fixed", "buffer"):
        gaussian = dp_accounting.GaussianDpEvent(noise_multiplier / 2.0)
        return dp_accounting.SampledWithoutReplacementDpEvent(population, expected, gaussian)
    return dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(noise_multiplier))


def sum_noise_multiplier(noise_multiplier: float, count_noise: float | None) -> float:
    """``z_sum = (z^-2 - (2 sigma_count)^-2)^-1/2`` (adaptive clipping), or ``z`` without a noised count.
    Raises ValueError when the count's noise is too small to leave any for the sum."""
    if count_noise is None or noise_multiplier == 0:
        return noise_multiplier
    rest = noise_multiplier**-2 - (2.0 * count_noise) ** -2
    if rest <= 0:
        raise ValueError(
            f"the count noise {count_noise:g} needs a noise multiplier below {2 * count_noise:g} (got "
            f"{noise_multiplier:g}); raise --dp-count-noise"
        )
    return 1.0 / math.sqrt(rest)


def sampling_model(settings) -> tuple[str, int, int]:
    """(sampling, population sampled from, expected devices per aggregate) of a run: synchronous rounds select
    ``--device-selection-size`` of the N devices (``--dp-sampling``); an asynchronous run's buffer is B devices
    from the N - K idle ones (``"buffer"``)."""
    if hasattr(settings, "buffer_size"):
        return "buffer", int(settings.num_devices) - int(settings.concurrency), int(settings.buffer_size)
    return settings.dp_sampling, int(settings.num_devices), int(settings.device_selection_size)


def default_delta(population: int) -> float:
    """``1 / population ** 1.1``."""
    return 1.0 / population**DEFAULT_DELTA_EXPONENT


def resolve_noise_multiplier(settings, rounds: int) -> float:
    """``--dp-noise-multiplier``, or the smallest one that keeps ``rounds`` rounds within ``--dp-epsilon``.
    Raises ValueError (naming what cannot be reached) when the target needs more than
    :data:`~devsim.privacy.settings.MAX_NOISE_MULTIPLIER`, or more than adaptive clipping's count noise allows."""
    if settings.dp_noise_multiplier is not None:
        return float(settings.dp_noise_multiplier)
    population = int(settings.num_devices)
    delta = settings.dp_delta if settings.dp_delta is not None else default_delta(population)
    upper = MAX_NOISE_MULTIPLIER
    sampling, pool, expected = sampling_model(settings)
    if settings.dp_target_quantile is not None:
        count_noise = settings.dp_count_noise or expected / COUNT_NOISE_DIVISOR
        upper = min(upper, 2.0 * count_noise * 0.999)
    replace_one = sampling != "poisson" or settings.dp == "local"

    def event(z: float) -> dp_accounting.DpEvent:
        return make_event(settings.dp, sampling, z, expected / pool, pool, expected)

    z = solve_noise_multiplier(event, settings.dp_epsilon, rounds, delta, settings.dp_accountant, replace_one, upper)
    if z is None:
        raise ValueError(
            f"{settings.dp_epsilon:g} cannot be reached in {rounds} rounds at delta {delta:.3g}: it needs a noise "
            f"multiplier above {upper:g}; allow a larger epsilon, fewer rounds (versions) or fewer devices per round "
            "(a smaller buffer)"
        )
    return z
