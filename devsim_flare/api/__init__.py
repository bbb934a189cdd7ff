"""Python API: build a device-simulation job, run it in an environment, read its result, without a command line.

In NVFlare's recipe style (a recipe builds a job; an environment runs it)::

    from devsim_flare.api import FedAvgRecipe, SimEnv

    recipe = FedAvgRecipe(task="examples/penguins_task.py", num_rounds=5, devices_per_leaf=20)
    result = recipe.execute(SimEnv(workspace="ws")).get_result()
    print(result.final_accuracy, result.folder)

A recipe takes a task (a file path, a module name, an imported module, or the task's functions as a
:class:`TaskFunctions`) and any setting of its job's configuration by keyword (the command line's flags with
``_`` for ``-``: ``num_rounds=5`` is ``--num-rounds 5``), optionally on top of a ``preset``. The job scripts in
``jobs/`` are command lines over the same recipes (:meth:`JobRecipe.command_line`), so a setting means the same
thing in both, and bad input raises :class:`RecipeError` with the message the command line prints.
"""

from devsim_flare.api.environments import Environment, PocEnv, ProdEnv, SimEnv
from devsim_flare.api.errors import RecipeError
from devsim_flare.api.recipes import (
    RECIPES,
    ClusterRecipe,
    FedAvgRecipe,
    FedBuffRecipe,
    FedReviveRecipe,
    JobRecipe,
    recipe_settings,
)
from devsim_flare.api.results import Run, RunResult
from devsim_flare.api.task_objects import TaskFunctions, task_spec

__all__ = [
    "RECIPES",
    "ClusterRecipe",
    "EdgeRecipe",
    "Environment",
    "FedAvgRecipe",
    "FedBuffRecipe",
    "FedReviveRecipe",
    "JobRecipe",
    "PocEnv",
    "ProdEnv",
    "RecipeError",
    "Run",
    "RunResult",
    "SimEnv",
    "TaskFunctions",
    "recipe_settings",
    "task_spec",
]


def __getattr__(name: str):
    """``EdgeRecipe`` on first use: it imports NVFlare's edge stack, which the other jobs do not need."""
    if name == "EdgeRecipe":
        from devsim_flare.api.edge_recipe import EdgeRecipe

        return EdgeRecipe
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
