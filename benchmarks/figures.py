"""The figures a benchmark publishes: each run's JSON under ``benchmarks/results/`` carries a ``figures`` list (one
entry per figure: name, value, target, command, date, machine), from which ``scripts/benchmark_table.py`` builds
the table in ``benchmarks/README.md``."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")


def load() -> str:
    """The 1, 5 and 15 minute load averages now ("n/a" where /proc/loadavg cannot be read)."""
    try:
        with open("/proc/loadavg", encoding="utf-8") as stream:
            return " ".join(stream.read().split()[:3])
    except OSError:
        return "n/a"


def machine(start: str | None = None) -> str:
    """This machine in a few words: cores and the load average at the moment (after ``start``, the load
    average read when the run began, when given)."""
    now = load()
    return f"{os.cpu_count()} cores, load {now if start is None else f'{start} -> {now}'}"


def invocation(env: tuple[str, ...] = ("OMP_NUM_THREADS",)) -> str:
    """The command line that runs this script, as a figure's command: those of ``env`` that are set, then
    ``.venv/bin/python``, the script's path from the repository root and its arguments (shell-quoted)."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), REPO)
    prefix = [f"{name}={shlex.quote(os.environ[name])}" for name in env if name in os.environ]
    return " ".join([*prefix, ".venv/bin/python", shlex.join([script, *sys.argv[1:]])])


def figure(name: str, value: str, target: str, command: str, date: str, where: str) -> dict[str, str]:
    """One published figure (every field a short string)."""
    return {"figure": name, "value": value, "target": target, "command": command, "date": date, "machine": where}


def short_commit(tree: str = REPO) -> str:
    """The short commit checked out in ``tree`` (default this checkout); "" when git cannot say."""
    try:
        proc = subprocess.run(
            ["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip()


def write_results(benchmark: str, payload: dict[str, Any], figures: list[dict[str, str]]) -> str:
    """Write ``payload`` with its ``figures``, the date, machine and commit to
    ``benchmarks/results/<benchmark>-<date>.json``; returns the path."""
    date = time.strftime("%Y-%m-%d")
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{benchmark}-{date}.json")
    document = {"date": date, "machine": machine(), "commit": short_commit(), **payload, "figures": figures}
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=1)
    return path
