"""What a run left in its folder, as Python data: the records of ``results.json`` and the final model."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from devsim_flare.api.errors import RecipeError


@dataclasses.dataclass
class RunResult:
    """What a finished (or stopped) run left in its folder.

    ``rounds``: the per-round (sync) or per-evaluation (async) records of ``results.json`` as Python data
    (docs/outputs.md); ``summary``: the end-of-run summary (empty when the run stopped early or failed);
    ``failure``: why a failed run ended (its server's reason, as the command's last line gives it), else None."""

    folder: str
    method: str
    config: dict[str, Any]
    rounds: list[dict[str, Any]]
    summary: dict[str, Any]
    failure: str | None = None

    @classmethod
    def load(cls, folder: str) -> RunResult:
        """The result in ``folder``: a job's ``results.json``, or the edge job's ``edge_results.json`` (its records
        are per evaluated version; its summary is the last record's figures). RecipeError when there is neither."""
        from devsim.observe.results import failure_reason, load_results
        from devsim_flare.edge.job import RESULTS_FILE as EDGE_RESULTS_FILE

        folder = os.path.abspath(folder)
        if os.path.isfile(os.path.join(folder, "results.json")):
            results = load_results(folder)
            return cls(
                folder=folder,
                method=results.get("method", ""),
                config=results.get("config", {}),
                rounds=results.get("rounds", []),
                summary=results.get("summary", {}),
                failure=failure_reason(results),
            )
        edge_path = os.path.join(folder, EDGE_RESULTS_FILE)
        if os.path.isfile(edge_path):
            with open(edge_path, encoding="utf-8") as stream:
                edge = json.load(stream)
            records = edge.get("records", [])
            last = records[-1] if records else {}
            summary = {"versions": last["version"], "final_loss": last["loss"], "final_metrics": last["metrics"]}
            return cls(folder, "edge", edge.get("settings", {}), records, summary if records else {})
        raise RecipeError(f"no results.json or {EDGE_RESULTS_FILE} in {folder}")

    @property
    def finished(self) -> bool:
        return bool(self.summary)

    @property
    def final_accuracy(self) -> float | None:
        """The last evaluation's test accuracy (a fraction, unrounded), or None for a task without an accuracy
        metric."""
        evaluated = self.metric("accuracy")
        return evaluated[-1][1] if evaluated else None

    @property
    def final_loss(self) -> float | None:
        return self.summary.get("final_loss")

    def metric(self, name: str) -> list[tuple[int, float]]:
        """``(round or version, value)`` for every record that has metric ``name`` (e.g. ``"accuracy"``)."""
        points = []
        for record in self.rounds:
            value = record.get(name, (record.get("metrics") or {}).get(name))
            if value is not None:
                points.append((record.get("round", record.get("version")), value))
        return points

    def final_state_dict(self) -> dict:
        """The final global model's state dict (``final_model.pt``), tensors on the CPU."""
        import torch

        saved = torch.load(os.path.join(self.folder, "final_model.pt"), map_location="cpu", weights_only=True)
        return saved["state_dict"] if "state_dict" in saved else saved  # the edge job saves {version, state_dict}

    def final_model(self):
        """The run's model (built by its task) with the final global weights loaded."""
        from devsim.tasks.resolve import load_task

        model = load_task(self.config).build_model()
        model.load_state_dict(self.final_state_dict())
        return model


class Run:
    """A run started by :meth:`JobRecipe.execute`: it has ended when ``execute`` returns (the environment's
    command line waits the same way)."""

    def __init__(self, exit_code: int, folder: str | None):
        self.exit_code = exit_code
        self.folder = folder

    def get_status(self) -> str:
        """``FINISHED:COMPLETED``; ``STOPPED (SIGINT)`` / ``STOPPED (SIGTERM)`` for a run stopped by a signal (its
        checkpoint continues with ``resume_from``); else ``FAILED (exit code N)``, followed by ``: reason`` when the
        run's server said why (:attr:`RunResult.failure`)."""
        if self.exit_code == 0:
            return "FINISHED:COMPLETED"
        if self.exit_code in (130, 143):
            return f"STOPPED ({'SIGINT' if self.exit_code == 130 else 'SIGTERM'})"
        failure = None
        if self.folder:
            try:
                failure = RunResult.load(self.folder).failure
            except (RecipeError, OSError, ValueError):
                failure = None
        return f"FAILED (exit code {self.exit_code})" + (f": {failure}" if failure else "")

    def get_result(self) -> RunResult:
        """The run's :class:`RunResult`; raises RecipeError when the run left no results file."""
        if not self.folder:
            raise RecipeError(f"the run left no results folder (status {self.get_status()})")
        return RunResult.load(self.folder)
