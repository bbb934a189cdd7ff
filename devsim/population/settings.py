"""Population and selection settings: the leaves and their devices, how devices are selected, when they are online,
how fast they compute and how they fail (the ``population`` section, titled "population and selection").

Fields are command-line flags (field ``devices_per_leaf`` is ``--devices-per-leaf``); :class:`PopulationSettings`
is inherited by every run configuration, :class:`AsyncPopulationSettings` (the K and O of the K/B/O scheduler, and
leaf losses) by the asynchronous ones. Probabilities are per selected device; speeds are relative to a speed-1.0
device training ``samples_per_second`` samples per simulated second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from devsim.config_errors import ConfigError
from devsim.sections import check_choice, check_fraction, check_min, check_positive_finite, meta

AVAILABILITY_MODES = ("always", "diurnal", "trace")
SPEED_DISTRIBUTIONS = ("profile", "lognormal", "trace")
FAULT_KINDS = ("nan", "inf", "norm", "shape", "keys", "dtype")


def _population(text: str) -> dict[str, Any]:
    return meta("population", text)


@dataclass
class PopulationSettings:
    """The simulated population: leaves, devices per leaf, per-round selection, availability, speeds and faults."""

    rounds_select_devices: ClassVar[bool] = True
    """Whether the run selects ``device_selection_size`` devices a round (synchronous jobs); asynchronous jobs have
    no such flag, so its default is not checked against their population."""

    num_leaf_nodes: int = field(default=2, metadata=_population("leaf nodes (NVFlare clients) under the server"))
    devices_per_leaf: int = field(
        default=50,
        metadata=_population(
            "simulated devices owned by each leaf (natural partition: owners / leaves, set from the task)"
        ),
    )
    device_selection_size: int = field(
        default=20,
        metadata={"section": "population", "help": "devices sampled per round, over all leaves", "sync_only": True},
    )
    availability: str = field(
        default="always",
        metadata=_population(
            f"when devices are online, one of {', '.join(AVAILABILITY_MODES)} (diurnal: seeded sessions; "
            "trace: --trace-file); see docs/device_traces.md"
        ),
    )
    trace_file: str | None = field(
        default=None,
        metadata=_population("device trace (.csv or .npz) for --availability trace (docs/device_traces.md)"),
    )
    speed_distribution: str = field(
        default="profile",
        metadata=_population(
            f"device compute speeds, one of {', '.join(SPEED_DISTRIBUTIONS)} (profile: --delay-schedule tiers; "
            "lognormal: median 1, --speed-sigma; trace: the trace's speed column)"
        ),
    )
    speed_sigma: float = field(default=0.5, metadata=_population("log-sd of --speed-distribution lognormal"))
    samples_per_second: float = field(
        default=10.0, metadata=_population("simulated training samples per second of a speed-1.0 device")
    )
    device_dropout: float = field(
        default=0.0, metadata=_population("probability that a selected device fails mid-task (its work is discarded)")
    )
    device_never_answer: float = field(
        default=0.0, metadata=_population("probability that a selected device never answers")
    )
    inject_faults: str = field(
        default="",
        metadata=_population(f"testing: corrupt updates with these faults (comma list of {', '.join(FAULT_KINDS)})"),
    )
    fault_probability: float = field(default=0.0, metadata=_population("testing: probability of each injected fault"))

    @property
    def num_devices(self) -> int:
        """Devices in the whole population."""
        return self.num_leaf_nodes * self.devices_per_leaf

    @property
    def fault_kinds(self) -> list[str]:
        """The kinds listed in ``inject_faults``."""
        return [k.strip() for k in self.inject_faults.split(",") if k.strip()]

    def check_population(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad population flag; ``population=False`` skips the checks against the
        population size (a natural partition sets it from the task later)."""
        for name in ("num_leaf_nodes", "devices_per_leaf", "device_selection_size"):
            check_min(name, getattr(self, name), 1)
        if population and self.rounds_select_devices and self.device_selection_size > self.num_devices:
            raise ConfigError(
                "device_selection_size",
                f"{self.device_selection_size} is larger than the population of {self.num_devices} devices "
                f"(--num-leaf-nodes {self.num_leaf_nodes} x --devices-per-leaf {self.devices_per_leaf}); "
                f"allowed: 1..{self.num_devices}",
            )
        for name in ("device_dropout", "device_never_answer", "fault_probability"):
            check_fraction(name, getattr(self, name))
        if self.device_dropout + self.device_never_answer >= 1.0:
            raise ConfigError("device_dropout", "--device-dropout + --device-never-answer must be < 1")
        for kind in self.fault_kinds:
            check_choice("inject_faults", kind, FAULT_KINDS)
        _check_heterogeneity(self)


def _check_heterogeneity(settings: PopulationSettings) -> None:
    """``--availability``, ``--trace-file``, ``--speed-distribution`` and their numbers fit together; a
    trace file is read and checked here so that a bad one stops the run before anything starts."""
    check_choice("availability", settings.availability, AVAILABILITY_MODES)
    check_choice("speed_distribution", settings.speed_distribution, SPEED_DISTRIBUTIONS)
    check_positive_finite("samples_per_second", settings.samples_per_second)
    if not (math.isfinite(settings.speed_sigma) and settings.speed_sigma >= 0):
        raise ConfigError("speed_sigma", f"{settings.speed_sigma} is not allowed; it must be a finite number >= 0")
    if settings.availability == "trace" and not settings.trace_file:
        raise ConfigError("trace_file", "--availability trace needs --trace-file (a .csv or .npz trace)")
    if settings.availability != "trace" and settings.trace_file:
        raise ConfigError("trace_file", f"is only used with --availability trace, not {settings.availability}")
    if settings.speed_distribution == "trace" and settings.availability != "trace":
        raise ConfigError("speed_distribution", "trace needs --availability trace and a trace with a 'speed' column")
    if settings.trace_file:
        from devsim.population.traces import load_trace

        try:
            trace = load_trace(settings.trace_file)
        except ValueError as error:
            raise ConfigError("trace_file", str(error)) from error
        if settings.speed_distribution == "trace" and trace.speed is None:
            raise ConfigError("speed_distribution", f"trace needs a 'speed' column in {settings.trace_file}")


@dataclass
class AsyncPopulationSettings:
    """Asynchronous selection: K device jobs in flight, dispatched once O slots are open; leaves lost at a version."""

    rounds_select_devices: ClassVar[bool] = False

    concurrency: int = field(default=20, metadata=_population("K: device jobs in flight"))
    min_open_slots: int = field(default=1, metadata=_population("O: dispatch new jobs once this many slots are open"))
    lose_leaf: str = field(
        default="",
        metadata=_population(
            "faults: drop leaves from the run at a global version, as if their host died then, e.g. "
            "site-3@20,site-1@40 (its jobs arriving after that version are lost); a loss at a version, unlike a "
            "killed process, is the same in every run of the seed"
        ),
    )

    def leaf_losses(self) -> dict[str, int]:
        """``--lose-leaf`` as {leaf site name: global version at which it is lost}."""
        losses = {}
        for entry in (e.strip() for e in self.lose_leaf.split(",")):
            if not entry:
                continue
            site, _, version = entry.rpartition("@")
            if not site.startswith("site-") or not site[5:].isdigit() or not version.isdigit() or int(version) < 1:
                raise ConfigError(
                    "lose_leaf", f"{entry!r} is not SITE@VERSION (a leaf site-N and a version >= 1, e.g. site-3@20)"
                )
            if int(site[5:]) not in range(1, self.num_leaf_nodes + 1):
                raise ConfigError(
                    "lose_leaf", f"{entry!r}: no leaf {site}; the leaves are site-1..site-{self.num_leaf_nodes}"
                )
            losses[site] = int(version)
        return losses

    def check_async_population(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad K/O or ``--lose-leaf`` flag; ``population=False`` skips the check
        of K against the population size."""
        check_min("concurrency", self.concurrency, 1)
        if population and self.concurrency > self.num_devices:
            raise ConfigError(
                "concurrency",
                f"{self.concurrency} is larger than the population of {self.num_devices} devices (--num-leaf-nodes "
                f"{self.num_leaf_nodes} x --devices-per-leaf {self.devices_per_leaf}); allowed: 1..{self.num_devices}",
            )
        if not 1 <= self.min_open_slots <= self.concurrency:
            raise ConfigError(
                "min_open_slots", f"{self.min_open_slots} is not allowed; allowed: 1..{self.concurrency} (K)"
            )
        if len(self.leaf_losses()) >= self.num_leaf_nodes:
            raise ConfigError("lose_leaf", f"{self.lose_leaf!r} loses every leaf; at least one must remain")
