"""Tasks: what a device trains (a model factory, the data, a loss, metrics), built in or brought by a user.

`contract` (the functions a task file defines, finding and importing it), `checks` (what they must return),
`task` (the checked :class:`Task` every job runs), `defaults` (cross-entropy, accuracy), `builtin` (the
project's image datasets and models as tasks) and `resolve` (a run's task from its settings, once per process).

May import `devsim.data`, `devsim.models` and `devsim.training.local`; nothing here imports the servers,
the leaves or NVFlare. The rest of the core asks a :class:`Task` for shapes and functions instead of assuming
32x32 images.
"""

from devsim.tasks.contract import SHIPPED_FOLDER, TaskError, TaskHooks, load_hooks, source_file
from devsim.tasks.resolve import load_task, task_from_settings
from devsim.tasks.task import Task, make_task, require_classification

__all__ = [
    "SHIPPED_FOLDER",
    "Task",
    "TaskError",
    "TaskHooks",
    "load_hooks",
    "load_task",
    "make_task",
    "require_classification",
    "source_file",
    "task_from_settings",
]
