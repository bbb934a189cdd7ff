"""Device runtime profiles: how long a logical device takes to download, train and upload.

A :class:`DelaySchedule` describes a population (speed tiers, download and upload delays, all in
simulated seconds). Each device gets a persistent :class:`DeviceProfile` drawn from the schedule,
derived on demand from ``(seed, device_id)`` so nothing is stored per device. Each job of a device
then samples its actual durations from that profile:

- download: constant ``download``;
- training: exponential with mean ``train_mean`` (the device's tier);
- upload: uniform on ``[upload_mean - upload_half_width, upload_mean + upload_half_width]``,
  clipped at 0, where ``upload_mean`` is one of the schedule's ``upload_means`` picked uniformly.

Presets live in ``app_configs/device_profiles/<name>.json`` (see :func:`load_schedule`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devsim.seeding import derive_rng

PRESETS_DIR = Path(__file__).resolve().parents[2] / "app_configs" / "device_profiles"

_PROBABILITY_TOLERANCE = 1e-6
_REQUIRED_KEYS = ("train_tiers", "download", "upload_means", "upload_half_width")
_ALLOWED_KEYS = frozenset(("name", "description", *_REQUIRED_KEYS))
_TIER_KEYS = frozenset(("probability", "train_mean"))


def _check_non_negative(field: str, value: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{field} must be a number, got {value!r}") from None
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{field} must be a finite number >= 0, got {value!r}")
    return number


@dataclass(frozen=True)
class DelaySchedule:
    """Distribution of device runtime profiles (all durations in simulated seconds).

    ``train_tiers`` holds ``(probability, mean training seconds)`` pairs; a device belongs to one
    tier for the whole run. ``upload_means`` are the possible per-device upload means, each equally
    likely. Lists given for the tuple fields are converted to tuples.
    """

    name: str
    train_tiers: tuple[tuple[float, float], ...]
    download: float
    upload_means: tuple[float, ...]
    upload_half_width: float
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.description, str):
            raise ValueError(f"description must be a string, got {self.description!r}")
        tiers = tuple(self.train_tiers)
        if not tiers:
            raise ValueError("train_tiers must not be empty")
        normalised = []
        for index, tier in enumerate(tiers):
            if len(tier) != 2:
                raise ValueError(f"train_tiers[{index}] must be a (probability, train_mean) pair, got {tier!r}")
            probability = _check_non_negative(f"train_tiers[{index}].probability", tier[0])
            train_mean = _check_non_negative(f"train_tiers[{index}].train_mean", tier[1])
            normalised.append((probability, train_mean))
        total = sum(p for p, _ in normalised)
        if abs(total - 1.0) > _PROBABILITY_TOLERANCE:
            raise ValueError(f"train_tiers probabilities must sum to 1 (within 1e-6), got {total!r}")
        uploads = tuple(self.upload_means)
        if not uploads:
            raise ValueError("upload_means must not be empty")
        uploads = tuple(_check_non_negative(f"upload_means[{i}]", u) for i, u in enumerate(uploads))
        object.__setattr__(self, "train_tiers", tuple(normalised))
        object.__setattr__(self, "upload_means", uploads)
        object.__setattr__(self, "download", _check_non_negative("download", self.download))
        object.__setattr__(self, "upload_half_width", _check_non_negative("upload_half_width", self.upload_half_width))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], default_name: str | None = None) -> DelaySchedule:
        """Build from a JSON-style mapping; unknown or missing keys raise ``ValueError`` naming them.

        ``train_tiers`` entries may be ``{"probability": p, "train_mean": s}`` objects or ``[p, s]``
        pairs. ``name`` falls back to ``default_name`` (e.g. the file stem) when absent.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a delay schedule must be a JSON object, got {type(data).__name__}")
        for key in data:
            if key not in _ALLOWED_KEYS:
                raise ValueError(f"unknown delay schedule key {key!r}; allowed keys: {sorted(_ALLOWED_KEYS)}")
        for key in _REQUIRED_KEYS:
            if key not in data:
                raise ValueError(f"delay schedule is missing the key {key!r}")
        name = data.get("name", default_name)
        if name is None:
            raise ValueError("delay schedule is missing the key 'name'")
        raw_tiers = data["train_tiers"]
        if not isinstance(raw_tiers, (list, tuple)):
            raise ValueError(f"train_tiers must be a list, got {type(raw_tiers).__name__}")
        tiers = []
        for index, tier in enumerate(raw_tiers):
            if isinstance(tier, Mapping):
                for key in tier:
                    if key not in _TIER_KEYS:
                        raise ValueError(f"unknown key {key!r} in train_tiers[{index}]; allowed: {sorted(_TIER_KEYS)}")
                if set(tier) != _TIER_KEYS:
                    raise ValueError(f"train_tiers[{index}] needs both 'probability' and 'train_mean'")
                tiers.append((tier["probability"], tier["train_mean"]))
            elif isinstance(tier, (list, tuple)):
                tiers.append(tuple(tier))
            else:
                raise ValueError(f"train_tiers[{index}] must be an object or a [probability, train_mean] pair")
        upload_means = data["upload_means"]
        if not isinstance(upload_means, (list, tuple)):
            raise ValueError(f"upload_means must be a list, got {type(upload_means).__name__}")
        return cls(
            name=name,
            train_tiers=tuple(tiers),
            download=data["download"],
            upload_means=tuple(upload_means),
            upload_half_width=data["upload_half_width"],
            description=data.get("description", ""),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form accepted by :meth:`from_dict`."""
        return {
            "name": self.name,
            "description": self.description,
            "train_tiers": [{"probability": p, "train_mean": m} for p, m in self.train_tiers],
            "download": self.download,
            "upload_means": list(self.upload_means),
            "upload_half_width": self.upload_half_width,
        }


def available_schedules() -> list[str]:
    """Names of the preset schedules in ``app_configs/device_profiles`` (sorted)."""
    if not PRESETS_DIR.is_dir():
        return []
    return sorted(path.stem for path in PRESETS_DIR.glob("*.json"))


def load_schedule(name_or_path: str) -> DelaySchedule:
    """A preset by name (``app_configs/device_profiles/<name>.json``) or a JSON file by path.

    A value containing a path separator or ending in ``.json`` is a path; anything else is a
    preset name. Unknown names raise ``ValueError`` listing the available presets.
    """
    text = str(name_or_path)
    is_path = text.endswith(".json") or "/" in text or "\\" in text
    path = Path(text) if is_path else PRESETS_DIR / f"{text}.json"
    if not path.is_file():
        if is_path:
            raise ValueError(f"delay schedule file {text!r} does not exist")
        raise ValueError(f"unknown delay schedule {text!r}; available presets: {available_schedules()}")
    with open(path, encoding="utf-8") as stream:
        try:
            data = json.load(stream)
        except json.JSONDecodeError as error:
            raise ValueError(f"delay schedule file {str(path)!r} is not valid JSON: {error}") from None
    return DelaySchedule.from_dict(data, default_name=path.stem)


@dataclass(frozen=True)
class DeviceProfile:
    """One device's persistent runtime profile (simulated seconds)."""

    train_mean: float
    download: float
    upload_mean: float
    upload_half_width: float

    def sample_delays(self, rng: np.random.Generator) -> tuple[float, float, float]:
        """One job's ``(download, train, upload)`` durations in simulated seconds, drawn from ``rng``."""
        train = float(rng.exponential(self.train_mean))
        low = self.upload_mean - self.upload_half_width
        upload = max(0.0, float(rng.uniform(low, self.upload_mean + self.upload_half_width)))
        return self.download, train, upload


PROFILE_CACHE_SIZE = 2**14
"""Device profiles :func:`profile_for` keeps (about 3 MB): every dispatch asks for its device's profile, and a run of
fewer devices than this draws each once."""


@functools.lru_cache(maxsize=PROFILE_CACHE_SIZE)
def profile_for(schedule: DelaySchedule, seed: int, device_id: int) -> DeviceProfile:
    """The persistent profile of ``device_id``: a pure function of ``(schedule, seed, device_id)``.

    Two uniforms from ``derive_rng(seed, "profile", device_id)`` pick the tier (by its probability)
    and the upload mean (uniformly among ``schedule.upload_means``). The last :data:`PROFILE_CACHE_SIZE` are
    cached.
    """
    rng = derive_rng(seed, "profile", device_id)
    tier_draw, upload_draw = rng.random(2).tolist()
    probabilities = [p for p, _ in schedule.train_tiers]
    last_possible = max(i for i, p in enumerate(probabilities) if p > 0)
    tier = min(bisect.bisect_right(list(itertools.accumulate(probabilities)), tier_draw), last_possible)
    n_uploads = len(schedule.upload_means)
    upload_mean = schedule.upload_means[min(int(upload_draw * n_uploads), n_uploads - 1)]
    return DeviceProfile(
        train_mean=schedule.train_tiers[tier][1],
        download=schedule.download,
        upload_mean=upload_mean,
        upload_half_width=schedule.upload_half_width,
    )
