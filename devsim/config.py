"""Run configuration for hierarchical device simulation, validated before anything starts.

A configuration is assembled from settings sections, each defined and checked beside the code that uses it
(:data:`devsim.sections.SECTIONS`: task and data, population and selection, clock, training, aggregation,
compression, observation, environment, privacy, and the cluster and FedRevive methods' own). The assembled
dataclass is flat, plain values (str, int, float, bool, None), so that it travels unchanged through NVFlare's job
configuration (JSON) to every process and code reads ``config.lr`` whatever its section. Every field maps to one
command-line flag: field ``device_selection_size`` is flag ``--device-selection-size``. Validation errors name that
flag and the allowed values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from devsim.aggregation.settings import (  # noqa: F401  (re-exported)
    CLASS_PROPORTION_SOURCES,
    SIMILARITY_SOURCES,
    STALENESS_WEIGHTINGS,
    AggregationSettings,
    BufferedAggregationSettings,
    ClusterSettings,
    FedReviveSettings,
)
from devsim.clock.settings import ClockSettings
from devsim.compression.settings import TOPK_VALUE_TYPES, UPDATE_CODECS, CompressionSettings  # noqa: F401
from devsim.config_errors import ConfigError, flag_name  # noqa: F401  (flag_name: imported from here by many)
from devsim.data.settings import (  # noqa: F401  (re-exported)
    DATASET_CLASSES,
    DATASETS,
    GROUP_KINDS,
    MODELS,
    PARTITIONS,
    DataSettings,
)
from devsim.observe.settings import AsyncObservationSettings, ObservationSettings
from devsim.population.settings import (  # noqa: F401  (re-exported)
    AVAILABILITY_MODES,
    FAULT_KINDS,
    SPEED_DISTRIBUTIONS,
    AsyncPopulationSettings,
    PopulationSettings,
)
from devsim.privacy.settings import PrivacySettings
from devsim.resources.settings import (  # noqa: F401  (re-exported)
    COMPILE_SETTINGS,
    DEVICE_BATCH_WORDS,
    INLINE_TENSOR_MAX_BYTES,
    SHARED_MEMORY_MODES,
    TENSOR_TRANSFERS,
    AsyncEnvironmentSettings,
    EnvironmentSettings,
    device_batch_value,
)
from devsim.sections import SECTIONS, by_section, flatten_sections
from devsim.training.settings import OPTIMIZERS, TrainingSettings  # noqa: F401


@dataclass
class SimulationConfig(
    EnvironmentSettings,
    ObservationSettings,
    CompressionSettings,
    AggregationSettings,
    TrainingSettings,
    ClockSettings,
    PopulationSettings,
    DataSettings,
    PrivacySettings,
):
    """Everything that defines a synchronous hierarchical FedAvg run: the sections every job shares.

    Units: learning rates are plain multipliers; sizes are counts; timeouts are seconds.
    """

    def to_dict(self) -> dict[str, Any]:
        """The flat ``{field: value}`` mapping (what travels to every process and results.json records)."""
        return dataclasses.asdict(self)

    def to_sections(self) -> dict[str, dict[str, Any]]:
        """``{section: {field: value}}``, sections in ``--help`` order (the form presets are written in)."""
        return by_section(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], population: bool = True) -> SimulationConfig:
        """Build and validate from a flat mapping or one written by section (``{"training": {"lr": 0.05}}``, see
        :func:`devsim.sections.flatten_sections`); unknown keys and wrongly typed values raise ConfigError.
        ``population=False`` leaves out the checks against the population size, for a configuration whose task has
        yet to set it (a natural partition; see :func:`devsim.tasks.fit.fit_config`)."""
        if not isinstance(values, dict):
            raise ConfigError("config", f"expected a mapping of field names to values, got {type(values).__name__}")
        values = flatten_sections(values, cls)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                str(unknown[0]),
                f"unknown setting {unknown}; allowed settings: {', '.join(sorted(known))} "
                f"(or by section: {', '.join(SECTIONS)})",
            )
        config = cls(**values)
        config.validate(population=population)
        return config

    def validate(self, population: bool = True) -> SimulationConfig:
        """Check every field, section by section; raise ConfigError naming the first bad flag. Returns self.
        ``population=False`` skips the checks against ``num_devices`` (see :meth:`from_dict`)."""
        _check_types(self)
        self.check_population(population)
        self.check_data(population)
        self.check_clock(population)
        self.check_training(population)
        self.check_aggregation(population)
        self.check_compression(population)
        self.check_observation(population)
        self.check_environment(population)
        self.check_privacy(population)
        return self


def _check_types(config: SimulationConfig) -> None:
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        allowed = f.type if isinstance(f.type, str) else str(f.type)
        optional = "None" in allowed
        if value is None:
            if not optional:
                raise ConfigError(f.name, f"a value is required (type {allowed})")
            continue
        base = allowed.replace("| None", "").strip()
        if base == "bool":
            ok = isinstance(value, bool)
        elif base == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif base == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif base == "str":
            ok = isinstance(value, str)
        else:
            ok = True
        if not ok:
            raise ConfigError(f.name, f"{value!r} has type {type(value).__name__}; expected {allowed}")


@dataclass
class AsyncConfig(
    AsyncEnvironmentSettings,
    AsyncObservationSettings,
    BufferedAggregationSettings,
    AsyncPopulationSettings,
    SimulationConfig,
):
    """An asynchronous run (FedBuff, FedRevive) on the seeded virtual clock: the K/B/O scheduler.

    ``concurrency`` (K) device jobs are in flight, a new global version follows every
    ``buffer_size`` (B) accepted updates, and new jobs are dispatched once ``min_open_slots`` (O)
    slots are free. Times are simulated seconds.
    """

    def validate(self, population: bool = True) -> AsyncConfig:
        super().validate(population)
        self.check_async_population(population)
        self.check_buffered_aggregation(population)
        self.check_async_observation(population)
        self.check_async_environment(population)
        return self


@dataclass
class ClusterConfig(ClusterSettings, SimulationConfig):
    """A synchronous run with cluster aggregation over leaf models at the server."""

    def validate(self, population: bool = True) -> ClusterConfig:
        super().validate(population)
        self.refuse_server_optimizer("cluster aggregation (one model per cluster)")
        self.check_cluster(population)
        return self


@dataclass
class FedReviveConfig(FedReviveSettings, AsyncConfig):
    """FedRevive: FedBuff-style aggregation plus server-side data-free knowledge distillation (DFKD)."""

    def validate(self, population: bool = True) -> FedReviveConfig:
        super().validate(population)
        self.check_fedrevive(population)
        return self
