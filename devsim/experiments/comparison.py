"""Compare arms (a job and its flags) over seeds: the arms as given on a command line, and the table of their final
metric (mean, sample standard deviation, per seed) with each arm's paired difference from the first arm.

An arm reads ``NAME=[JOB:] FLAGS``: ``FedAdam=--server-optimizer adam --global-lr 0.01`` runs ``pt_job_fedavg.py``
with those flags, ``FedBuff=fedbuff: --buffer-size 10`` runs ``pt_job_fedbuff.py``. The metric is ``accuracy`` (a
fraction; differences in points, hundredths), ``loss`` or any metric of the task's ``metrics()`` in the task's units;
:func:`lower_is_better` says which way is better.
"""

from __future__ import annotations

import math
import re
import shlex
import statistics
from dataclasses import dataclass, field

from devsim.observe.results import record_metric, record_step

JOBS = ("fedavg", "fedbuff", "fedrevive", "cluster", "edge")
"""The jobs an arm can run (``jobs/pt_job_<job>.py``)."""
LOWER_IS_BETTER_SUFFIXES = ("loss", "error", "mae", "mse", "rmse", "perplexity")
"""A metric whose name ends in one of these (``loss``, ``mae``, ``val_mse``, ...) is better when lower."""
SET_BY_COMPARISON = ("--seed", "--output-dir", "--workspace", "--resume", "--export", "--export-dir")
"""Flags the comparison sets itself (or that make a run something other than a run), refused in an arm's flags."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def lower_is_better(metric: str) -> bool:
    """Whether a lower ``metric`` is better, read from its name (:data:`LOWER_IS_BETTER_SUFFIXES`)."""
    return metric.lower().split("_")[-1] in LOWER_IS_BETTER_SUFFIXES


class ComparisonError(ValueError):
    """A bad arm, seed list or flag; the message names it."""


@dataclass(frozen=True)
class Arm:
    """One arm: its ``name`` (a folder name too), the ``job`` it runs and that job's ``flags``."""

    name: str
    job: str
    flags: tuple[str, ...]


def parse_arm(text: str) -> Arm:
    """``NAME=[JOB:] FLAGS`` -> :class:`Arm`; ComparisonError names what is wrong."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not _NAME.fullmatch(name):
        raise ComparisonError(
            f"--arm {text!r}: expected NAME=[JOB:] FLAGS, NAME of letters, digits and _.+- (a folder name)"
        )
    rest = rest.strip()
    job = "fedavg"
    head, colon, tail = rest.partition(":")
    if colon and " " not in head.strip() and not head.strip().startswith("-"):
        job, rest = head.strip(), tail
        if job not in JOBS:
            raise ComparisonError(f"--arm {name}: job {job!r} is not one of {', '.join(JOBS)}")
    try:
        flags = tuple(shlex.split(rest))
    except ValueError as error:
        raise ComparisonError(f"--arm {name}: cannot split its flags: {error}") from error
    check_flags(flags, f"--arm {name}")
    return Arm(name, job, flags)


def check_flags(flags: tuple[str, ...] | list[str], where: str) -> None:
    """Refuse the flags of :data:`SET_BY_COMPARISON` (as ``--flag value`` or ``--flag=value``) in ``flags``."""
    for flag in flags:
        if flag.split("=", 1)[0] in SET_BY_COMPARISON:
            raise ComparisonError(
                f"{where}: {flag.split('=', 1)[0]} is set by the comparison itself "
                f"(not allowed in an arm or the common flags: {', '.join(SET_BY_COMPARISON)})"
            )


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` or ``0-4`` (inclusive) -> the seeds, each once, in order; ComparisonError otherwise."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            low, dash, high = part.strip().partition("-")
            values = range(int(low), int(high) + 1) if dash else [int(low)]
            seeds.extend(seed for seed in values if seed not in seeds)
    except ValueError as error:
        raise ComparisonError(f"--seeds {text!r}: expected seeds like 0,1,2 or 0-4 ({error})") from error
    if not seeds or any(seed < 0 for seed in seeds):
        raise ComparisonError(f"--seeds {text!r}: expected one or more seeds >= 0")
    return seeds


@dataclass
class ArmSummary:
    """One arm's finished runs: the ``final`` metric per seed, ``loss`` and ``wall`` seconds per seed, the seeds that
    failed, and the paired difference from the first arm on the seeds both finished (the metric's units)."""

    arm: Arm
    final: dict[int, float] = field(default_factory=dict)
    loss: dict[int, float] = field(default_factory=dict)
    wall: dict[int, float] = field(default_factory=dict)
    failed: list[int] = field(default_factory=list)
    paired: dict[int, float] = field(default_factory=dict)
    reached: dict[int, tuple[float, float | None] | None] = field(default_factory=dict)
    """Per seed, with a target: (round or version, simulated seconds or None) of the first evaluation that reached
    it, or None when the run never did."""

    @property
    def mean(self) -> float:
        return statistics.fmean(self.final.values()) if self.final else math.nan

    @property
    def std(self) -> float:
        return statistics.stdev(self.final.values()) if len(self.final) > 1 else math.nan

    def to_dict(self) -> dict:
        """The summary as JSON-ready values (seeds as string keys)."""
        return {
            "name": self.arm.name,
            "job": self.arm.job,
            "flags": list(self.arm.flags),
            "final": {str(s): v for s, v in self.final.items()},
            "final_loss": {str(s): v for s, v in self.loss.items()},
            "wall_seconds": {str(s): v for s, v in self.wall.items()},
            "failed_seeds": self.failed,
            "mean": None if math.isnan(self.mean) else self.mean,
            "std": None if math.isnan(self.std) else self.std,
            "paired_vs_first": {str(s): v for s, v in self.paired.items()},
            "reached_target": {str(s): None if v is None else list(v) for s, v in self.reached.items()},
        }


def first_reaching(
    records: list[dict], target: float, metric: str = "accuracy", lower: bool | None = None
) -> tuple[float, float | None] | None:
    """(round or version, simulated seconds or None) of the first record of a run's ``results.json`` whose
    ``metric`` reached ``target`` (at least; at most when ``lower``, by default :func:`lower_is_better`); None when
    none did."""
    lower = lower_is_better(metric) if lower is None else lower
    for index, record in enumerate(records):
        value = record_metric(record, metric)
        if value is not None and (value <= target if lower else value >= target):
            time = record.get("simulated_time")
            return record_step(record, index), None if time is None else float(time)
    return None


def pair_with_first(summaries: list[ArmSummary]) -> None:
    """Set each arm's paired differences from the first arm (the metric's units, same seed, seeds both finished)."""
    first = summaries[0].final if summaries else {}
    for summary in summaries[1:]:
        summary.paired = {s: v - first[s] for s, v in summary.final.items() if s in first}


def markdown_table(
    summaries: list[ArmSummary], target: float | None = None, metric: str = "accuracy", lower: bool | None = None
) -> str:
    """The comparison as a Markdown table, one row per arm; with ``target``, a column saying on how many seeds the arm
    reached that value of ``metric`` and, over those, the mean round (or version) and simulated seconds it took.
    ``lower``: whether a lower ``metric`` is better (default: :func:`lower_is_better`)."""
    lower = lower_is_better(metric) if lower is None else lower
    reach = f" reached {target:g}: seeds, mean round/version, mean simulated s |" if target is not None else ""
    direction = " (lower is better)" if lower else ""
    lines = [
        f"| arm | job | final {metric}{direction}, mean ± std (n) | per seed | vs first arm (paired) | final loss "
        f"| wall s |{reach}",
        "| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if target is not None else ""),
    ]
    for index, summary in enumerate(summaries):
        n = len(summary.final)
        spread = f" ± {summary.std:.4f}" if n > 1 else ""
        value = f"{summary.mean:.4f}{spread} ({n})" if n else "—"
        seeds = " / ".join(f"{summary.final[s]:.4f}" for s in sorted(summary.final)) or "—"
        if summary.failed:
            seeds += f" (failed: seeds {', '.join(map(str, summary.failed))})"
        if index == 0:
            versus = "(first)"
        elif summary.paired:
            deltas = list(summary.paired.values())
            better = sum(delta < 0 if lower else delta > 0 for delta in deltas)
            mean = statistics.fmean(deltas)
            shown = f"{100 * mean:+.1f} points" if metric == "accuracy" else f"{mean:+.4g}"
            versus = f"{shown}, better in {better}/{len(deltas)}"
        else:
            versus = "—"
        loss = f"{statistics.fmean(summary.loss.values()):.4f}" if summary.loss else "—"
        wall = f"{statistics.fmean(summary.wall.values()):.1f}" if summary.wall else "—"
        row = f"| {summary.arm.name} | {summary.arm.job} | {value} | {seeds} | {versus} | {loss} | {wall} |"
        if target is not None:
            row += f" {_reached(summary)} |"
        lines.append(row)
    return "\n".join(lines)


def _reached(summary: ArmSummary) -> str:
    hits = [hit for hit in summary.reached.values() if hit is not None]
    if not summary.reached:
        return "—"
    text = f"{len(hits)}/{len(summary.reached)}"
    if hits:
        text += f", {statistics.fmean(step for step, _ in hits):.1f}"
        times = [time for _, time in hits if time is not None]
        text += f", {statistics.fmean(times):.1f} s" if len(times) == len(hits) else ""
    return text
