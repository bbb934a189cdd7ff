"""The task of a run, from its settings, loaded once per process.

A run's settings (``SimulationConfig.to_dict()``, in every process of the job) name either a user task
(``task``: a file or module) or a built-in one (``dataset`` and ``model``). :func:`task_from_settings`
imports, loads and checks it the first time a process asks and returns the same :class:`Task` afterwards;
the cache holds one task (the job's), so nothing grows.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from devsim.tasks.contract import is_file_spec, load_hooks
from devsim.tasks.task import Task, make_task

TASK_SETTINGS = ("task", "dataset", "model", "data_root", "data_seed", "synthetic_train_size", "synthetic_test_size")
"""The settings that decide which task a run trains (the cache key)."""

_LOCK = threading.Lock()
_CACHED: tuple[tuple, Task] | None = None


def task_key(settings: dict[str, Any]) -> tuple:
    """The part of ``settings`` that names the task (a user task ignores the built-in dataset settings)."""
    if settings.get("task"):
        return ("task", str(settings["task"]))
    return tuple((name, settings.get(name)) for name in TASK_SETTINGS[1:])


def load_task(settings: dict[str, Any]) -> Task:
    """Load the task ``settings`` name, without the cache."""
    spec = settings.get("task")
    if spec:
        hooks = load_hooks(str(spec))
        name = os.path.splitext(os.path.basename(str(spec)))[0] if is_file_spec(str(spec)) else str(spec)
        return make_task(hooks, name)
    from devsim.tasks.builtin import builtin_task

    return builtin_task(settings)


def task_from_settings(settings: dict[str, Any]) -> Task:
    """The run's task, loaded on the first call in this process (see the module docstring).

    Raises:
        TaskError: the task cannot be loaded or fails its checks.
    """
    global _CACHED
    key = task_key(settings)
    with _LOCK:
        if _CACHED is not None and _CACHED[0] == key:
            return _CACHED[1]
        _CACHED = None
        task = load_task(settings)
        _CACHED = (key, task)
        return task
