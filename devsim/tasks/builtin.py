"""The built-in tasks: this project's image datasets and models, written against the task contract.

``--dataset NAME --model NAME`` (no ``--task``) is the task whose ``model()`` builds the named model for the
dataset's classes, whose ``data()`` returns the dataset's ``uint8`` ``(N, 3, 32, 32)`` images and labels, whose
``prepare`` normalises gathered images on the compute device (:class:`~devsim.data.device_shards.Normaliser`)
and whose ``augment`` is the random crop and flip of ``--augment``. Loss and metrics are the defaults
(cross-entropy, accuracy). It runs through exactly the code path of a user's task.
"""

from __future__ import annotations

from typing import Any

from devsim.config import DATASET_CLASSES
from devsim.data.device_shards import Normaliser
from devsim.data.loading import load_dataset
from devsim.models import build_model
from devsim.tasks.contract import TaskHooks
from devsim.tasks.task import Task, make_task
from devsim.training.local import crop_and_flip


def builtin_task(settings: dict[str, Any]) -> Task:
    """The built-in task of a run's ``dataset`` and ``model`` settings (and the dataset's own settings:
    ``data_root``, ``data_seed``, ``synthetic_train_size``, ``synthetic_test_size``)."""
    dataset = settings.get("dataset", "synthetic")
    model_name = settings.get("model", "cnn")
    num_classes = DATASET_CLASSES[dataset]
    splits: dict[bool, Any] = {}

    def split(train: bool):
        if train not in splits:
            splits[train] = load_dataset(
                dataset,
                settings.get("data_root"),
                train=train,
                seed=int(settings.get("data_seed", 0)),
                synthetic_train_size=int(settings.get("synthetic_train_size", 20000)),
                synthetic_test_size=int(settings.get("synthetic_test_size", 2000)),
            )
        return splits[train]

    def model(track_features: bool = False):
        return build_model(model_name, num_classes=num_classes, track_features=track_features)

    def data() -> dict:
        train, test = split(True), split(False)
        return {"x_train": train.images, "y_train": train.labels, "x_test": test.images, "y_test": test.labels}

    train = split(True)
    hooks = TaskHooks(
        origin=f"builtin:{dataset}/{model_name}",
        model=model,
        data=data,
        prepare=Normaliser(train.mean, train.std),
        augment=crop_and_flip,
    )
    task = make_task(hooks, f"{dataset}/{model_name}", builtin=True, pixel_stats=(train.mean, train.std))
    splits.clear()
    return task
