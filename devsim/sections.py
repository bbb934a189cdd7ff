"""Settings sections: how a run's settings are grouped by concern, and the helpers every section uses.

A section is a dataclass of plain values defined beside the code that uses it (e.g.
:mod:`devsim.training.settings`); the run configurations in :mod:`devsim.config` inherit them, so a configuration
stays one flat set of fields (``config.lr``) that travels as JSON, while each field records its section in its
metadata (:func:`meta`). ``--help`` groups the flags by section and presets are written by section
(``{"training": {"lr": 0.05}}``); :func:`flatten_sections` turns such a mapping into the flat one and refuses a
setting placed in the wrong section in one line naming where it belongs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from devsim.config_errors import ConfigError

SECTIONS = {
    "data": "task and data",
    "population": "population and selection",
    "clock": "clock",
    "training": "training",
    "aggregation": "aggregation",
    "compression": "compression",
    "observation": "observation",
    "environment": "environment",
    "privacy": "privacy",
    "cluster": "cluster aggregation",
    "fedrevive": "FedRevive distillation",
}
"""Section key (a preset's key, a Python API keyword) -> title (the ``--help`` group), in ``--help`` order."""


def meta(section: str, text: str, **extra: Any) -> dict[str, Any]:
    """A field's metadata: its section and command-line help; ``extra`` adds flags (``sync_only``: synchronous jobs
    only; ``internal``: no flag)."""
    if section not in SECTIONS:
        raise ValueError(f"unknown settings section {section!r}; known: {', '.join(SECTIONS)}")
    return {"help": text, "section": section, **extra}


def section_of(config_cls: type, name: str) -> str | None:
    """The section of field ``name`` of ``config_cls`` (None for an unknown name)."""
    for f in dataclasses.fields(config_cls):
        if f.name == name:
            return f.metadata.get("section")
    return None


def section_fields(config_cls: type) -> dict[str, list[str]]:
    """Section key -> names of ``config_cls``'s fields in it, sections in :data:`SECTIONS` order (empty ones left
    out), fields in definition order."""
    grouped: dict[str, list[str]] = {key: [] for key in SECTIONS}
    for f in dataclasses.fields(config_cls):
        grouped[f.metadata["section"]].append(f.name)
    return {key: names for key, names in grouped.items() if names}


def flatten_sections(values: dict[str, Any], config_cls: type) -> dict[str, Any]:
    """Flat ``{field: value}`` from ``values`` written by section (``{"training": {"lr": 0.05}}``); a flat key at the
    top level (the older form) is kept as it is. Raises ConfigError, in one line naming the setting and its section,
    for a setting under the wrong section, one given twice, or a section that is not a mapping."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if key not in SECTIONS:
            _put(flat, key, value)
            continue
        if not isinstance(value, dict):
            raise ConfigError(key, f"section {key!r} must map setting names to values, got {type(value).__name__}")
        for name, item in value.items():
            home = section_of(config_cls, name)
            if home is not None and home != key:
                raise ConfigError(name, f"belongs in section {home!r} ({home}.{name}), not {key!r}")
            _put(flat, name, item)
    return flat


def _put(flat: dict[str, Any], name: str, value: Any) -> None:
    if name in flat:
        raise ConfigError(name, "is given twice (flat and in its section); give it once")
    flat[name] = value


def by_section(config: Any) -> dict[str, dict[str, Any]]:
    """``config``'s values grouped by section: ``{"training": {"lr": 0.05, ...}, ...}`` (the form presets use)."""
    return {key: {name: getattr(config, name) for name in names} for key, names in section_fields(type(config)).items()}


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """Raise ConfigError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(name, f"{value!r} is not one of the allowed values: {', '.join(allowed)}")


def check_min(name: str, value: int, minimum: int) -> None:
    """Raise ConfigError when ``value`` is below ``minimum``."""
    if value < minimum:
        raise ConfigError(name, f"{value} is below the minimum of {minimum}")


def check_positive_finite(name: str, value: float) -> None:
    """Raise ConfigError unless ``value`` is a finite number > 0."""
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(name, f"{value} is not allowed; it must be a finite number > 0")


def check_non_negative(name: str, value: float) -> None:
    """Raise ConfigError unless ``value`` is a finite number >= 0."""
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(name, f"{value} is not allowed; it must be a finite number >= 0")


def check_fraction(name: str, value: float, closed: bool = False) -> None:
    """Raise ConfigError unless ``value`` is in [0, 1) (``closed``: [0, 1])."""
    if not (math.isfinite(value) and 0.0 <= value and (value <= 1.0 if closed else value < 1.0)):
        raise ConfigError(name, f"{value} is outside the allowed range [0, 1{']' if closed else ')'}")
