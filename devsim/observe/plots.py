"""Compare runs: accuracy against rounds (or versions), simulated time and wall time, in one PNG.

Reads ``results.json`` from each run folder (see ``devsim.observe.results``). Records of asynchronous runs
carry ``version``; records with ``simulated_time`` (virtual-clock seconds) get a simulated-time
panel. Wall time is the cumulative ``round_seconds`` of the records. Rendering uses Matplotlib's
Agg canvas directly, so it never opens a window nor changes the global backend.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from devsim.observe.results import record_metric, record_step

DPI = 150
PANEL_SIZE_IN = (5.0, 4.0)
LABEL_KEYS_MAX = 3
_IGNORED_CONFIG_SUFFIXES = ("_dir", "_root", "_path")


class PlotError(ValueError):
    """A run folder cannot be plotted; the message names the folder."""


@dataclass
class RunCurves:
    """One run's accuracy curves: x positions (rounds or versions, s) and accuracy (fraction)."""

    run_dir: str
    method: str
    config: dict[str, Any]
    is_async: bool
    step: list[float] = field(default_factory=list)
    step_accuracy: list[float] = field(default_factory=list)
    simulated_time: list[float] = field(default_factory=list)
    simulated_accuracy: list[float] = field(default_factory=list)
    wall_time: list[float] = field(default_factory=list)
    wall_accuracy: list[float] = field(default_factory=list)
    label: str = ""


def _read_results(run_dir: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``<run_dir>/results.json`` and its records; raises ``PlotError`` naming the folder."""
    path = os.path.join(run_dir, "results.json")
    if not os.path.isfile(path):
        raise PlotError(f"{run_dir}: no results.json in this folder")
    try:
        with open(path, encoding="utf-8") as stream:
            results = json.load(stream)
    except (OSError, json.JSONDecodeError) as error:
        raise PlotError(f"{run_dir}: cannot read results.json: {error}") from error
    rounds = results.get("rounds") if isinstance(results, dict) else None
    if not isinstance(rounds, list):
        raise PlotError(f"{run_dir}: results.json has no 'rounds' list")
    return results, rounds


def load_run(run_dir: str) -> RunCurves:
    """Read ``<run_dir>/results.json`` into accuracy curves; raises ``PlotError`` naming the folder."""
    results, rounds = _read_results(run_dir)
    curves = RunCurves(
        run_dir=run_dir,
        method=str(results.get("method") or "run"),
        config=dict(results.get("config") or {}),
        is_async=any("version" in r for r in rounds),
    )
    wall = 0.0
    for index, record in enumerate(rounds):
        wall += float(record.get("round_seconds", 0.0))
        if record.get("accuracy") is None:
            continue
        accuracy = float(record["accuracy"])
        curves.step.append(record_step(record, index))
        curves.step_accuracy.append(accuracy)
        if record.get("simulated_time") is not None:
            curves.simulated_time.append(float(record["simulated_time"]))
            curves.simulated_accuracy.append(accuracy)
        if "round_seconds" in record:
            curves.wall_time.append(wall)
            curves.wall_accuracy.append(accuracy)
    return curves


def legend_labels(runs: Sequence[RunCurves]) -> list[str]:
    """``method`` plus the config values that tell apart runs of the same method (up to three, seed
    first); the folder name is added where that still leaves two runs with the same label."""
    labels = []
    for run in runs:
        keys = _differing_config_keys([other for other in runs if other.method == run.method])
        details = ", ".join(f"{key}={run.config.get(key)}" for key in keys)
        labels.append(f"{run.method} ({details})" if details else run.method)
    if len(set(labels)) < len(labels):
        labels = [
            f"{label} [{os.path.basename(os.path.normpath(run.run_dir))}]"
            for label, run in zip(labels, runs, strict=True)
        ]
    return labels


def _differing_config_keys(runs: Sequence[RunCurves]) -> list[str]:
    names = sorted({key for run in runs for key in run.config if not key.endswith(_IGNORED_CONFIG_SUFFIXES)})
    differing = [
        key for key in names if len({json.dumps(run.config.get(key), sort_keys=True, default=str) for run in runs}) > 1
    ]
    differing.sort(key=lambda key: (key != "seed", key))
    return differing[:LABEL_KEYS_MAX]


def _time_scale(max_seconds: float) -> tuple[float, str]:
    if max_seconds >= 3 * 3600:
        return 3600.0, "h"
    if max_seconds >= 3 * 60:
        return 60.0, "min"
    return 1.0, "s"


def plot_runs(run_dirs: Sequence[str], out: str, title: str | None = None) -> str:
    """Write one PNG comparing ``run_dirs`` to ``out`` and return its path.

    Panels, left to right: accuracy vs round (or version), accuracy vs simulated time (only when some
    run has ``simulated_time``), accuracy vs wall time.
    """
    if not run_dirs:
        raise PlotError("no run folders given")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise PlotError(f"plotting needs matplotlib (pip install matplotlib): {error}") from error
    runs = [load_run(run_dir) for run_dir in run_dirs]
    for run, label in zip(runs, legend_labels(runs), strict=True):
        run.label = label
    panels = ["step"]
    if any(run.simulated_time for run in runs):
        panels.append("simulated")
    panels.append("wall")
    figure = Figure(figsize=(PANEL_SIZE_IN[0] * len(panels), PANEL_SIZE_IN[1]))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels, strict=True):
        _draw_panel(ax, panel, runs)
    axes[0].legend(loc="best", fontsize="small")
    default_title = f"Accuracy of {len(runs)} run{'s' if len(runs) != 1 else ''}"
    return _save(figure, out, title or default_title)


def _save(figure, out: str, title: str) -> str:
    """Title ``figure``, lay it out and write it to ``out`` as PNG (its folder made as needed); returns ``out``."""
    figure.suptitle(title, fontsize="medium")
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    figure.savefig(out, dpi=DPI, format="png")
    return out


def _draw_panel(ax, panel: str, runs: Sequence[RunCurves]) -> None:
    if panel == "step":
        kinds = {run.is_async for run in runs}
        xlabel = {frozenset({False}): "round", frozenset({True}): "global model version"}.get(
            frozenset(kinds), "round (sync) / global model version (async)"
        )
        ax.set_title(f"accuracy vs {xlabel}", fontsize="medium")
        for run in runs:
            ax.plot(run.step, run.step_accuracy, marker=".", label=run.label)
        ax.set_xlabel(xlabel)
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds and versions are whole numbers
    else:
        attr = "simulated" if panel == "simulated" else "wall"
        times = [getattr(run, f"{attr}_time") for run in runs]
        scale, unit = _time_scale(max((max(t) for t in times if t), default=0.0))
        name = "simulated time" if panel == "simulated" else "wall-clock time"
        ax.set_title(f"accuracy vs {name}", fontsize="medium")
        for run, time_values in zip(runs, times, strict=True):
            accuracy = getattr(run, f"{attr}_accuracy")
            ax.plot([t / scale for t in time_values], accuracy, marker=".", label=run.label)
        ax.set_xlabel(f"{name} ({unit})")
    ax.set_ylabel("test accuracy (fraction)")
    ax.grid(True, alpha=0.3)


def plot_participation(run_dirs: Sequence[str], out: str, title: str | None = None) -> str:
    """Write one PNG of who took part in ``run_dirs`` to ``out``; returns its path.

    Panels: devices by participation count (fraction of devices, log scale; Jain's index in the legend),
    the staleness distribution of accepted updates (when some run is asynchronous), and selected devices
    lost by cause. Needs the ``participation`` summary of finished runs (results.json ``summary``).
    """
    if not run_dirs:
        raise PlotError("no run folders given")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = [load_run(run_dir) for run_dir in run_dirs]
    summaries = []
    for run, label in zip(runs, legend_labels(runs), strict=True):
        run.label = label
        with open(os.path.join(run.run_dir, "results.json"), encoding="utf-8") as stream:
            summary = json.load(stream).get("summary") or {}
        if "participation" not in summary:
            raise PlotError(f"{run.run_dir}: results.json has no participation summary (unfinished or older run)")
        summaries.append(summary)
    panels = ["participation"]
    if any(s.get("staleness", {}).get("histogram") for s in summaries):
        panels.append("staleness")
    panels.append("dropouts")
    figure = Figure(figsize=(PANEL_SIZE_IN[0] * len(panels), PANEL_SIZE_IN[1]))
    FigureCanvasAgg(figure)
    axes = dict(zip(panels, figure.subplots(1, len(panels), squeeze=False)[0], strict=True))
    ax = axes["participation"]
    for run, summary in zip(runs, summaries, strict=True):
        part = summary["participation"]
        counts = sorted((int(k), v) for k, v in part["histogram"].items())
        ax.plot(
            [c for c, _ in counts],
            [v / part["devices"] for _, v in counts],
            marker="o",
            label=f"{run.label}; Jain {part['jain_index']:.3f}",
        )
    ax.set_yscale("log")
    ax.set_xlabel("updates that entered an aggregate, per device")
    ax.set_ylabel("fraction of devices")
    ax.set_title("participation per device", fontsize="medium")
    ax.legend(loc="best", fontsize="x-small")
    if "staleness" in axes:
        ax = axes["staleness"]
        for run, summary in zip(runs, summaries, strict=True):
            hist = summary.get("staleness", {}).get("histogram") or {}
            total = sum(hist.values()) or 1
            values = sorted((int(k), v) for k, v in hist.items())
            ax.plot([s for s, _ in values], [v / total for _, v in values], marker=".", label=run.label)
        ax.set_xlabel("staleness (global versions)")
        ax.set_ylabel("fraction of accepted updates")
        ax.set_title("staleness of accepted updates", fontsize="medium")
    ax = axes["dropouts"]
    causes = sorted({cause for s in summaries for cause in s.get("dropouts_by_cause", {})})
    width = 0.8 / len(runs)
    for index, (run, summary) in enumerate(zip(runs, summaries, strict=True)):
        lost = summary.get("dropouts_by_cause", {})
        ax.bar(
            [c + index * width for c in range(len(causes))], [lost.get(c, 0) for c in causes], width, label=run.label
        )
    ax.set_xticks([c + 0.4 - width / 2 for c in range(len(causes))], causes, fontsize="small")
    ax.set_ylabel("selected devices lost")
    ax.set_title("dropouts by cause", fontsize="medium")
    for ax in axes.values():
        ax.grid(True, alpha=0.3)
    return _save(figure, out, title or f"Participation in {len(runs)} run{'s' if len(runs) != 1 else ''}")


def plot_comparison(
    arm_runs: dict[str, Sequence[str]], out: str, title: str | None = None, metric: str = "accuracy"
) -> str:
    """Write one PNG comparing arms over seeds to ``out``; returns its path. ``arm_runs`` maps each arm's name to
    its finished runs' folders (one per seed); ``metric`` is ``accuracy``, ``loss`` or a task metric.

    Panels: each arm's mean ``metric`` against round (or version) over the steps every one of its runs evaluated,
    with the band from its lowest to its highest run; and each arm's final value per seed (dots) with the mean and
    the sample standard deviation.
    """
    arms = {name: [_metric_curve(run_dir, metric) for run_dir in dirs] for name, dirs in arm_runs.items() if dirs}
    if not arms:
        raise PlotError("no finished runs to compare")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(PANEL_SIZE_IN[0] * 2, PANEL_SIZE_IN[1]))
    FigureCanvasAgg(figure)
    curves, finals = figure.subplots(1, 2, squeeze=True)
    for index, (name, runs) in enumerate(arms.items()):
        steps = sorted(set.intersection(*(set(curve) for _, curve in runs)))
        columns = [[curve[step] for _, curve in runs] for step in steps]
        line = curves.plot(steps, [statistics.fmean(c) for c in columns], marker=".", label=f"{name} (n={len(runs)})")
        colour = line[0].get_color()
        curves.fill_between(steps, [min(c) for c in columns], [max(c) for c in columns], alpha=0.2, lw=0, color=colour)
        values = [curve[max(curve)] for _, curve in runs if curve]
        if not values:
            continue
        finals.scatter([index] * len(values), values, color=colour, alpha=0.7)
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        finals.errorbar([index + 0.15], [statistics.fmean(values)], yerr=[spread], fmt="D", color=colour, capsize=4)
    kinds = {is_async for runs in arms.values() for is_async, _ in runs}
    curves.set_xlabel("global model version" if kinds == {True} else "round" if kinds == {False} else "round / version")
    curves.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds and versions are whole numbers
    unit = " (fraction)" if metric == "accuracy" else ""
    curves.set_ylabel(f"test {metric}{unit}")
    curves.set_title(f"mean {metric} (band: lowest to highest seed)", fontsize="medium")
    curves.legend(loc="best", fontsize="small")
    finals.set_xticks(range(len(arms)), list(arms), fontsize="small")
    finals.set_xlim(-0.5, len(arms) - 0.5)
    finals.set_ylabel(f"final test {metric}{unit}")
    finals.set_title(f"final {metric} per seed; mean ± std", fontsize="medium")
    for ax in (curves, finals):
        ax.grid(True, alpha=0.3)
    return _save(figure, out, title or f"{len(arms)} arms over seeds")


def _metric_curve(run_dir: str, metric: str) -> tuple[bool, dict[float, float]]:
    """(asynchronous?, round or version -> ``metric``) over the evaluated records of a run's ``results.json``."""
    _, records = _read_results(run_dir)
    values = [(record_step(record, i), record_metric(record, metric)) for i, record in enumerate(records)]
    return any("version" in r for r in records), {step: value for step, value in values if value is not None}
