"""A recipe's task as the ``--task`` value a job ships: a file, a module, or Python functions written to a file."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import types
from collections.abc import Callable
from typing import Any

from devsim.tasks.contract import OPTIONAL_HOOKS, REQUIRED_HOOKS
from devsim_flare.api.errors import RecipeError


@dataclasses.dataclass(frozen=True)
class TaskFunctions:
    """A task given as functions instead of a file (the contract of docs/tasks.md: ``model()`` and ``data()``,
    optionally ``loss``, ``metrics``, ``prepare``, ``augment``, ``generator``).

    The functions are serialised by value with ``cloudpickle`` into a task file in the workspace, which the job
    ships like any task file; so they may be defined in a notebook, and whatever they refer to must be
    importable (or defined beside them) in every process of the job."""

    model: Callable
    data: Callable
    loss: Callable | None = None
    metrics: Callable | None = None
    prepare: Callable | None = None
    augment: Callable | None = None
    generator: Callable | None = None

    def write(self, folder: str) -> str:
        """Write the task file into ``folder`` (named by the content's hash, so the same functions give the same
        file) and return its absolute path."""
        import cloudpickle

        hooks = {name: getattr(self, name) for name in REQUIRED_HOOKS + OPTIONAL_HOOKS if getattr(self, name)}
        for function in hooks.values():
            module = sys.modules.get(getattr(function, "__module__", "") or "")
            if module is not None and _is_user_module(module):
                cloudpickle.register_pickle_by_value(module)
        payload = cloudpickle.dumps(hooks).hex()
        digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
        path = os.path.abspath(os.path.join(folder, "tasks", f"api_task_{digest}.py"))
        if not os.path.isfile(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            lines = [
                '"""A task written by devsim_flare.api from Python functions (cloudpickle, by value)."""',
                "import cloudpickle as _cloudpickle",
                f"_HOOKS = _cloudpickle.loads(bytes.fromhex({payload!r}))",
                *(f"{name} = _HOOKS[{name!r}]" for name in hooks),
                "",
            ]
            partial = f"{path}.{os.getpid()}"
            with open(partial, "w", encoding="utf-8") as stream:
                stream.write("\n".join(lines))
            os.replace(partial, path)
        return path


def _is_user_module(module: types.ModuleType) -> bool:
    """Whether ``module`` is the user's own code (a notebook, a script, a file beside it) rather than an installed
    package or the standard library, which every process of the job imports by name."""
    if module.__name__ == "__main__":
        return False  # cloudpickle already pickles __main__'s functions by value
    file = getattr(module, "__file__", None)
    if not file:
        return False
    installed = {sys.prefix, sys.base_prefix, os.path.dirname(os.__file__)}
    path = os.path.abspath(file)
    return "site-packages" not in path and not any(path.startswith(os.path.abspath(p) + os.sep) for p in installed)


def task_spec(task: Any, workspace: str) -> str | None:
    """The ``--task`` value of ``task``: a file path or module name as given, an imported module's file, or the
    file :meth:`TaskFunctions.write` writes; None for the built-in task (``dataset`` and ``model`` settings)."""
    if task is None or isinstance(task, str):
        return task
    if isinstance(task, os.PathLike):
        return os.fspath(task)
    if isinstance(task, types.ModuleType):
        file = getattr(task, "__file__", None)
        if not file:
            raise RecipeError(f"--task: module {task.__name__!r} has no source file to ship with the job")
        return os.path.abspath(file)
    if isinstance(task, TaskFunctions):
        return task.write(workspace)
    raise RecipeError(
        f"--task: a file path, a module name, an imported module or TaskFunctions, not {type(task).__name__}"
    )
