"""A run's results file: the configuration, one record per round, and the final summary.

``results.json`` is rewritten atomically after every round so that a crashed or interrupted
run still leaves a readable file. Records are a few hundred bytes each.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


class RunRecorder:
    """Collects per-round records and writes ``<output_dir>/results.json`` (with ``task``: what the run trained,
    see :meth:`devsim.tasks.Task.record`)."""

    def __init__(self, output_dir: str, config: dict[str, Any], method: str, task: dict[str, Any] | None = None):
        self.output_dir = output_dir
        os.makedirs(output_dir, exist_ok=True)
        self.path = os.path.join(output_dir, "results.json")
        self.data: dict[str, Any] = {"method": method, "config": config, "rounds": [], "summary": {}}
        if task is not None:
            self.data["task"] = task

    def add_round(self, record: dict[str, Any]) -> None:
        self.data["rounds"].append(record)
        self.flush()

    def finish(self, summary: dict[str, Any]) -> None:
        self.data["summary"] = summary
        self.flush()

    def flush(self) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.output_dir, prefix=".results.", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            json.dump(self.data, stream, indent=1)
        os.replace(tmp, self.path)


def load_results(run_dir: str) -> dict[str, Any]:
    """Read ``results.json`` from a run folder."""
    with open(os.path.join(run_dir, "results.json"), encoding="utf-8") as stream:
        return json.load(stream)
