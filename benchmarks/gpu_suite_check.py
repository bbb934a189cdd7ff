"""Every target of the GPU issue beside its figure in a GPU suite's JSON (``gpu_suite.py check FILE``).

    .venv/bin/python benchmarks/gpu_suite.py check benchmarks/results/gpu_suite.json

Prints one row per target: what is measured, the figure, the target, and ``met`` / ``NOT MET`` / ``missing`` (the
section did not run, was skipped for time, or failed: the reason is printed). Exits 0 whatever the figures say; 2
when the file cannot be read. Also prints the start-up breakdown of the default job, TF32's gain and difference and
the profiled leaf rounds (``profile``), which have no target.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MET, NOT_MET, MISSING = "met", "NOT MET", "missing"


@dataclass(frozen=True)
class Target:
    """One row: ``figure`` is the section's path to the number (or a function of the report; KeyError/TypeError:
    missing); ``goal`` (``>= X`` or ``<= X`` and words) gives the verdict."""

    what: str
    section: str
    figure: tuple[str, ...] | Callable[[dict], float]
    goal: str
    unit: str = ""

    def value(self, report: dict) -> float | None:
        return self.figure(report) if callable(self.figure) else _s(report, self.section, *self.figure)

    def ok(self, value: float) -> bool:
        op, bound = self.goal.split()[:2]
        return value >= float(bound) if op == ">=" else value <= float(bound)


def _s(report: dict, *path: str) -> Any:
    value: Any = report["sections"]
    for key in path:
        value = value[key]
    if value is None:
        raise KeyError(path[-1])
    return value


def _groups_vs_held(report: dict) -> float:
    """Smallest, over the async settings, of devices per training group against the jobs a leaf call holds."""
    rows = _s(report, "async_throughput", "settings").values()
    return min(row["updates_per_training_group"] / row["updates_per_leaf_call"] for row in rows)


def _fedrevive_wall(report: dict) -> float | None:
    """FedRevive's wall seconds, when its server ran on the GPU."""
    return _s(report, "fedrevive", "wall_seconds") if _s(report, "fedrevive", "server_device") == "cuda" else None


ASYNC = "async_throughput"
TARGETS = tuple(
    Target(*row)
    for row in (
        ("default FedAvg job (CNN, 2 leaves): device-samples/s against centralized batch 256", "fedavg_e2e",
         ("cnn_default", "vs_limit"), ">= 0.40"),
        ("one leaf, 64 devices, CNN, the leaf's own plan, against the same limit", "throughput",
         ("cnn", "auto_vs_limit"), ">= 0.60"),
        ("one leaf, 64 devices, ResNet-18, the leaf's own plan, against its limit", "throughput",
         ("resnet18", "auto_vs_limit"), ">= 0.40"),
        ("async benchmark (digits CNN, 2 x 50 devices): FedAvg device updates/s", ASYNC,
         ("settings", "fedavg", "updates_per_s"), ">= 1000", "/s"),
        *((f"same: {name} per update against FedAvg", ASYNC, ("settings", name, "ratio_to_fedavg"), ">= 0.9", "x")
          for name in ("fedbuff B=10", "fedbuff B=2", "fedbuff paper")),
        ("devices per training group against the jobs a leaf call holds (worst async setting)", ASYNC,
         _groups_vs_held, ">= 0.9 (the jobs a leaf holds)"),
        ("automatic leaf plan against the best of the sweep", "worker_sweep", ("auto_vs_best",), ">= 0.9"),
        ("launch to the first finished round, default CNN job", "fedavg_e2e",
         ("cnn_default", "first_round_seconds"), "<= 10 s", " s"),
        ("same, the command run again (warm parent)", "fedavg_e2e",
         ("cnn_repeat", "first_round_seconds"), "<= 10 s", " s"),
        ("FedRevive at the paper's per-arrival size (server on the GPU): wall seconds", "fedrevive",
         _fedrevive_wall, "<= 90 s", " s"),
        ("FedRevive paper's whole command against FedBuff paper's (on request: async_revive)", "async_revive",
         ("command_ratio",), "<= 1.5", "x"),
        ("the whole suite in one call", "", lambda r: r["suite_seconds"], "<= 360 s", " s"),
    )
)  # fmt: skip

CPU_TARGETS = (
    "CPU (not measured by this suite): CNN round against the tight loop >= 0.317x on 2 cores "
    "(benchmarks/round_overhead.py); demo accuracy 0.9583 (scripts/demo.sh)",
)


def _why_missing(report: dict, section: str) -> str:
    if not section:
        return "the suite did not record its wall time"
    if section in report.get("skipped", {}):
        return f"skipped: {report['skipped'][section]}"
    if section in report.get("errors", {}):
        return "failed: " + report["errors"][section].strip().splitlines()[-1][:160]
    if section not in report.get("sections", {}):
        return "section not run"
    return "figure not in the section"


def rows(report: dict) -> list[tuple[str, str, str, str]]:
    """(what, figure, goal, verdict) per target, the verdict with the reason when missing."""
    out = []
    for target in TARGETS:
        try:
            value = target.value(report)
            if value is None:
                raise KeyError(target.section)
            value = float(value)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            out.append((target.what, "-", target.goal, f"{MISSING} ({_why_missing(report, target.section)})"))
            continue
        shown = f"{value:,.0f}{target.unit}" if abs(value) >= 100 else f"{value:.3g}{target.unit}"
        out.append((target.what, shown, target.goal, MET if target.ok(value) else NOT_MET))
    return out


def extras(report: dict) -> list[str]:
    """Lines without a target: start-up breakdown of the default job, TF32's gain and difference."""
    lines = []
    try:
        startup = _s(report, "fedavg_e2e", "cnn_default", "startup")
        seconds = {k: v for k, v in startup.get("seconds", {}).items() if v is not None}
        lines.append("startup (default CNN job), s: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
        parts = startup.get("leaf_parts_max", {})
        if parts:
            lines.append("  slowest leaf's set-up, s: " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
        usual = report["sections"]["fedavg_e2e"].get("cnn_cold_usual_fork")
        if usual:
            lines.append(f"  first launch with the fork servers forked late: {usual['first_round_seconds']:.1f} s")
    except (KeyError, TypeError):
        lines.append("startup: missing")
    if host := report.get("machine", {}).get("host_seconds"):
        lines.append("host, s in a new interpreter: " + ", ".join(f"{k} {v}" for k, v in host.items()))
    if graph := report.get("machine", {}).get("graph_launch"):  # kernels -> costs, or a failed probe's error
        costs = ", ".join(
            f"{n} kernels {c['host_us']:.0f} / {c['wall_us']:.0f}" for n, c in graph.items() if n != "error"
        )
        lines.append("a CUDA graph's replay, us on the host / until the GPU has run it: " + graph.get("error", costs))
    try:
        for section in ("tf32", "cudnn_benchmark"):
            for model, row in report["sections"].get(section, {}).items():
                if isinstance(row, dict) and "leaf_gain" in row:
                    lines.append(
                        f"{section} {model}: leaf {row['leaf_gain']:.2f}x, centralized "
                        f"{row['centralized_gain']:.2f}x faster; leaf delta sum differs by "
                        f"{row['max_relative_difference']:.1e} of its largest entry"
                    )
    except (KeyError, TypeError, AttributeError):
        lines.append("tf32: missing")
    lines += profile_lines(report)
    return lines


def profile_lines(report: dict) -> list[str]:
    """One line per profiled leaf run (``profile`` section, and ``cudnn_benchmark``'s with the search on): round ms,
    GPU busy share, launches, top CUDA op and cuDNN's layout transposes among the top ops."""
    runs = dict(report.get("sections", {}).get("profile") or {})
    for model, row in report.get("sections", {}).get("cudnn_benchmark", {}).items():
        if isinstance(row, dict) and isinstance(row.get("profile_on"), dict):
            runs[f"{model} with cuDNN's search"] = row["profile_on"]
    if not runs:
        return ["profile: missing"]
    lines = []
    for name, run in runs.items():
        if not isinstance(run, dict) or "round_ms" not in run:
            continue
        line = f"profile {name} ({run.get('compile_choice', run.get('compile'))}): round {run['round_ms']:.1f} ms"
        if run.get("gpu_busy") is not None:
            line += f", GPU busy {100 * run['gpu_busy']:.0f}%, launches/round {run['launches_per_round']:.0f}"
        cuda = bool(run.get("top_self_cuda"))
        top = run.get("top_self_cuda" if cuda else "top_self_cpu") or []
        if top:
            unit, label = ("self_cuda_ms", "CUDA") if cuda else ("self_cpu_ms", "CPU")
            line += f", top {label} op {top[0]['name'][:60]} {top[0][unit]:.1f} ms ({top[0]['calls']} calls)"
        if cuda and (moves := [r for r in top if "Transpose" in r["name"]]):
            line += f", layout transposes {sum(r[unit] for r in moves):.1f} ms ({sum(r['calls'] for r in moves)} calls)"
        lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_suite.py check", description=__doc__.splitlines()[0])
    parser.add_argument("file", help="a gpu_suite.json")
    args = parser.parse_args(argv)
    try:
        with open(args.file, encoding="utf-8") as stream:
            report = json.load(stream)
    except (OSError, ValueError) as error:
        print(f"gpu_suite.py check: cannot read {args.file}: {error}", file=sys.stderr)
        return 2
    machine = report.get("machine", {})
    print(f"{args.file}: {machine.get('gpu', machine.get('device'))}, torch {machine.get('torch')}")
    table = rows(report)
    width = max(len(r[0]) for r in table)
    for what, figure, goal, verdict in table:
        print(f"{what:<{width}}  {figure:>10}  {goal:<10}  {verdict}")
    for line in (*extras(report), *CPU_TARGETS):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
