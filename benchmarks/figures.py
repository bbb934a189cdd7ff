"""The figures a benchmark publishes: each run's JSON under ``benchmarks/results/`` carries a ``figures`` list (one
entry per figure: name, value, target, command, date, machine), from which ``scripts/benchmark_table.py`` builds
the table in ``benchmarks/README.md``."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")


def machine() -> str:
    """This machine in a few words: cores and the load average at the moment."""
    try:
        with open("/proc/loadavg", encoding="utf-8") as stream:
            load = " ".join(stream.read().split()[:3])
    except OSError:
        load = "n/a"
    return f"{os.cpu_count()} cores, load {load}"


def figure(name: str, value: str, target: str, command: str, date: str, where: str) -> dict[str, str]:
    """One published figure (every field a short string)."""
    return {"figure": name, "value": value, "target": target, "command": command, "date": date, "machine": where}


def write_results(benchmark: str, payload: dict[str, Any], figures: list[dict[str, str]]) -> str:
    """Write ``payload`` with its ``figures``, the date, machine and commit to
    ``benchmarks/results/<benchmark>-<date>.json``; returns the path."""
    date = time.strftime("%Y-%m-%d")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{benchmark}-{date}.json")
    document = {"date": date, "machine": machine(), "commit": commit.stdout.strip(), **payload, "figures": figures}
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=1)
    return path
