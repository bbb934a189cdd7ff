"""Seeded device failures: which selected devices drop out mid-task or never answer.

A device's fate in a round (or asynchronous job) is a pure function of the run seed, the round or
job number and the device id, drawn from its own :func:`~devsim.seeding.derive_rng` stream, so every
process (server, leaves, workers) agrees on it without communicating. Outcomes:

* ``"ok"``: the device trains and reports.
* ``"dropped"``: the device starts but fails mid-task; its leaf discards the work.
* ``"silent"``: the device never answers; its leaf reports it as timed out without waiting.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from devsim.config import ConfigError
from devsim.seeding import derive_rng

OK = "ok"
DROPPED = "dropped"
SILENT = "silent"
OUTCOMES = (OK, DROPPED, SILENT)


class RoundFailedError(RuntimeError):
    """Too few selected devices answered for the round's update to be trusted."""


@dataclass(frozen=True)
class DropoutModel:
    """Per-device failure probabilities of one run.

    ``drop_probability`` (flag ``--device-dropout``) and ``never_answer_probability`` (flag
    ``--device-never-answer``) are the fractions of selected devices, in expectation, that end
    ``"dropped"`` and ``"silent"``; the two outcomes are exclusive, so the probabilities must sum to
    less than 1. ``seed`` is the run seed.
    """

    drop_probability: float = 0.0
    never_answer_probability: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        _check_probability("device_dropout", self.drop_probability)
        _check_probability("device_never_answer", self.never_answer_probability)
        if self.drop_probability + self.never_answer_probability >= 1.0:
            raise ConfigError(
                "device_dropout",
                f"device_dropout {self.drop_probability} + device_never_answer {self.never_answer_probability} "
                "must be < 1 (no device would ever answer)",
            )
        if not (isinstance(self.seed, numbers.Integral) and not isinstance(self.seed, bool) and self.seed >= 0):
            raise ConfigError("seed", f"{self.seed!r} is not allowed; it must be an integer >= 0")

    @property
    def enabled(self) -> bool:
        """Whether any device can fail (both probabilities zero: every outcome is ``"ok"``)."""
        return self.drop_probability > 0 or self.never_answer_probability > 0

    def outcome(self, round_or_job: int, device_id: int) -> str:
        """``"ok"``, ``"dropped"`` or ``"silent"`` for ``device_id`` in round (or async job) ``round_or_job``.

        Deterministic: the same for the same (seed, round_or_job, device_id) in every process.
        """
        if round_or_job < 0 or device_id < 0:
            raise ValueError(f"round_or_job ({round_or_job}) and device_id ({device_id}) must be >= 0")
        if not self.enabled:
            return OK
        u = float(derive_rng(self.seed, "dropout", round_or_job, device_id).random())
        if u < self.never_answer_probability:
            return SILENT
        if u < self.never_answer_probability + self.drop_probability:
            return DROPPED
        return OK

    def outcomes(self, round_or_job: int, device_ids: list[int]) -> dict[int, str]:
        """:meth:`outcome` of each device id, keyed by id."""
        return {int(d): self.outcome(round_or_job, int(d)) for d in device_ids}


def min_devices_needed(selected: int, min_fraction: float) -> int:
    """Answers needed from ``selected`` devices for ``min_fraction`` (at least one when any were selected)."""
    _check_fraction(min_fraction)
    if selected <= 0:
        return 0
    return max(1, math.ceil(min_fraction * selected - 1e-9))


def min_devices_check(
    answered: int, selected: int, min_fraction: float, round_num: int | None = None, why: str = ""
) -> None:
    """Raise :class:`RoundFailedError` when fewer than ``min_fraction`` of the selected devices answered.

    ``round_num`` (optional) prefixes the message, e.g. "round 3: only 2 of 20 selected devices
    answered; --min-devices-fraction 0.5 needs 10"; ``why`` (optional) follows "answered" in parentheses, e.g.
    which updates were rejected (their devices do not count as answered). A round with no answers always fails,
    since there is nothing to aggregate.
    """
    if not 0 <= answered <= selected:
        raise ValueError(f"answered ({answered}) must be between 0 and selected ({selected})")
    needed = min_devices_needed(selected, min_fraction)
    if answered < needed:
        prefix = "" if round_num is None else f"round {round_num}: "
        raise RoundFailedError(
            f"{prefix}only {answered} of {selected} selected devices answered{f' ({why})' if why else ''}; "
            f"--min-devices-fraction {min_fraction:g} needs {needed}"
        )


def _check_probability(name: str, value: float) -> None:
    if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and 0.0 <= value < 1.0):
        raise ConfigError(name, f"{name} = {value!r} is outside the allowed range [0, 1)")


def _check_fraction(value: float) -> None:
    if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and 0.0 <= value <= 1.0):
        raise ConfigError(
            "min_devices_fraction", f"min_devices_fraction = {value!r} is outside the allowed range [0, 1]"
        )
