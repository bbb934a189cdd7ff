"""Observation settings: evaluation, progress lines, checkpoints and the run folder (the ``observation`` section).

Fields are command-line flags (field ``eval_frequency`` is ``--eval-frequency``); :class:`ObservationSettings` is
inherited by every run configuration, :class:`AsyncObservationSettings` by the asynchronous ones. Frequencies count
rounds (asynchronous runs: evaluations, every ``eval_frequency`` global versions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from devsim.sections import check_min, meta


def _observation(text: str) -> dict[str, Any]:
    return meta("observation", text)


@dataclass
class ObservationSettings:
    """When the global model is evaluated, what is printed, when checkpoints are saved and where results go."""

    eval_frequency: int = field(
        default=1, metadata=_observation("evaluate the global model every N rounds (async: every N model versions)")
    )
    log_every: int = field(
        default=1, metadata=_observation("print a progress line every N rounds or evaluations (and the last)")
    )
    eval_batch_size: int = field(default=500, metadata=_observation("batch size of central evaluation"))
    checkpoint_frequency: int = field(
        default=5,
        metadata=_observation("save a checkpoint every N rounds or evaluations (and at the end); 0: only at the end"),
    )
    stop_after_round: int | None = field(
        default=None,
        metadata={
            "section": "observation",
            "help": "save a checkpoint and stop after this round (continue later with --resume RUN_DIR)",
            "sync_only": True,
        },
    )
    resume_from: str | None = field(
        default=None,
        metadata={
            "section": "observation",
            "help": "run folder whose checkpoint the server continues from (set by --resume)",
            "internal": True,
        },
    )
    output_dir: str | None = field(
        default=None,
        metadata=_observation("where results.json and final_model.pt go; unset: a folder in the server's run dir"),
    )

    def check_observation(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad observation flag."""
        for name in ("eval_frequency", "log_every", "eval_batch_size"):
            check_min(name, getattr(self, name), 1)
        check_min("checkpoint_frequency", self.checkpoint_frequency, 0)
        if self.stop_after_round is not None:
            check_min("stop_after_round", self.stop_after_round, 1)


@dataclass
class AsyncObservationSettings:
    """Stopping an asynchronous run at a version, to continue it with ``--resume``."""

    stop_after_version: int | None = field(
        default=None,
        metadata=_observation(
            "save a checkpoint and stop at the first evaluation at or after this version (see --resume)"
        ),
    )

    def check_async_observation(self, population: bool = True) -> None:
        """Raise ConfigError for a bad ``--stop-after-version``."""
        if self.stop_after_version is not None:
            check_min("stop_after_version", self.stop_after_version, 1)
