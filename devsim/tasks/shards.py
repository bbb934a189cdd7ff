"""A task's training split cut into device shards, and the hidden groups' views of a task.

:func:`task_partitioner` picks the partition a run asked for (``natural``: the task's ``owner_train``;
``iid``; ``dirichlet``: label-skewed, classification only); :func:`grouped_task` is the task as the leaves of
one hidden group see it (cluster scenarios: permuted labels, or rotated / inverted / channel-swapped images).
"""

from __future__ import annotations

from devsim.data.groups import apply_group
from devsim.data.partition import Partitioner, make_partitioner
from devsim.tasks.task import Task

PARTITION_CHOICES: tuple[str, ...] = ("auto", "natural", "iid", "dirichlet")
"""``--partition`` values; ``auto`` is ``natural`` for a task with ``owner_train``, else ``dirichlet``."""


def resolved_partition(task: Task, partition: str) -> str:
    """``partition`` with ``auto`` resolved for ``task`` (natural when it names owners, else dirichlet)."""
    if partition != "auto":
        return partition
    return "natural" if task.owner_train is not None else "dirichlet"


def task_partitioner(task: Task, partition: str, samples_per_device: int, seed: int, alpha: float) -> Partitioner:
    """The partitioner of ``task``'s training split for ``--partition`` (``auto`` resolved here).

    Raises:
        ValueError: ``natural`` without ``owner_train``, ``dirichlet`` for a task without class ids, or
            ``samples_per_device`` above the training set size.
    """
    kind = resolved_partition(task, partition)
    labels = task.y_train if task.classification else None
    return make_partitioner(
        kind,
        labels,
        task.num_classes,
        samples_per_device,
        seed,
        alpha=alpha,
        owners=task.owner_train,
        num_samples=len(task.x_train),
    )


def grouped_task(task: Task, group: int, kind: str, seed: int) -> Task:
    """``task`` as hidden group ``group`` sees it (group 0: the task itself); both splits are transformed."""
    if group == 0:
        return task
    x_train, y_train = apply_group(task.x_train, task.y_train, group, kind, seed, num_classes=task.num_classes)
    x_test, y_test = apply_group(task.x_test, task.y_test, group, kind, seed, num_classes=task.num_classes)
    return task.with_arrays(x_train, y_train, x_test, y_test)
