"""What a run left in its folder, as Python data: the records of ``results.json`` and the final model."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from devsim_flare.api.errors import RecipeError


@dataclasses.dataclass
class RunResult:
    """What a finished (or stopped) run left in its folder.

    ``rounds``: the per-round (sync) or per-evaluation (async) records of ``results.json`` as Python data
    (docs/outputs.md); ``summary``: the end-of-run summary (empty when the run stopped early)."""

    folder: str
    method: str
    config: dict[str, Any]
    rounds: list[dict[str, Any]]
    summary: dict[str, Any]

    @classmethod
    def load(cls, folder: str) -> RunResult:
        from devsim.observe.results import load_results

        results = load_results(folder)
        return cls(
            folder=os.path.abspath(folder),
            method=results.get("method", ""),
            config=results.get("config", {}),
            rounds=results.get("rounds", []),
            summary=results.get("summary", {}),
        )

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

        return torch.load(os.path.join(self.folder, "final_model.pt"), map_location="cpu", weights_only=True)

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
        return "FINISHED:COMPLETED" if self.exit_code == 0 else f"FAILED (exit code {self.exit_code})"

    def get_result(self) -> RunResult:
        """The run's :class:`RunResult`; raises RecipeError when the run left no results file."""
        if not self.folder or not os.path.isfile(os.path.join(self.folder, "results.json")):
            raise RecipeError(f"the run left no results.json (status {self.get_status()}; folder {self.folder})")
        return RunResult.load(self.folder)
