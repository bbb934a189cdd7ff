"""Task and data settings: the user's task or a built-in dataset and model, and how data is split over devices (the
``data`` section, titled "task and data").

Fields are command-line flags (field ``data_root`` is ``--data-root``) inherited by every run configuration. Sizes
count images (synthetic data) or samples (a device's shard); ``alpha`` is a Dirichlet concentration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from devsim.config_errors import ConfigError
from devsim.sections import check_choice, check_min, check_positive_finite, meta

DATASETS = ("synthetic", "digits", "cifar10", "cifar100")
MODELS = ("cnn", "resnet18", "resnet18_nonorm")
PARTITIONS = ("auto", "natural", "iid", "dirichlet")
GROUP_KINDS = ("label_permutation", "input_transform")
DATASET_CLASSES = {"synthetic": 10, "digits": 10, "cifar10": 10, "cifar100": 100}


def _data(text: str) -> dict[str, Any]:
    return meta("data", text)


@dataclass
class DataSettings:
    """What is learned (a task file or module, else a built-in dataset and model) and each device's shard of it."""

    task: str | None = field(
        default=None,
        metadata=_data(
            "your task: a Python file (path/to/my_task.py) or module (package.module) defining model() and data(), "
            "optionally loss(), metrics(), prepare(), augment() (docs/tasks.md); unset: the built-in task of "
            "--dataset and --model"
        ),
    )
    dataset: str = field(
        default="synthetic", metadata=_data(f"built-in dataset (without --task), one of {', '.join(DATASETS)}")
    )
    model: str = field(default="cnn", metadata=_data(f"built-in model (without --task), one of {', '.join(MODELS)}"))
    data_root: str | None = field(
        default=None, metadata=_data("folder holding the CIFAR python-format data (required for cifar*)")
    )
    download: bool = field(default=False, metadata=_data("download CIFAR into --data-root when missing"))
    data_seed: int = field(default=0, metadata=_data("seed of the synthetic dataset's images"))
    synthetic_train_size: int = field(default=20000, metadata=_data("synthetic training images"))
    synthetic_test_size: int = field(default=2000, metadata=_data("synthetic test images"))
    hidden_groups: int = field(
        default=1,
        metadata=_data("leaves form this many hidden groups whose data differ (leaf i is in group i mod N); 1: none"),
    )
    group_kind: str = field(
        default="label_permutation",
        metadata=_data(f"how hidden groups differ, one of {', '.join(GROUP_KINDS)}"),
    )
    samples_per_device: int = field(
        default=100,
        metadata=_data("training samples in each device's shard (iid, dirichlet; natural: set to the mean owner's)"),
    )
    partition: str = field(
        default="auto",
        metadata=_data(
            f"data partition, one of {', '.join(PARTITIONS)} (natural: one device per owner in the task's "
            "owner_train, the population size follows from it; auto: natural when the task names owners, "
            "else dirichlet)"
        ),
    )
    alpha: float = field(default=0.5, metadata=_data("Dirichlet concentration (> 0) for --partition dirichlet"))

    def check_data(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad task or data flag (the data files are looked for, not read)."""
        check_choice("dataset", self.dataset, DATASETS)
        check_choice("model", self.model, MODELS)
        check_choice("partition", self.partition, PARTITIONS)
        check_choice("group_kind", self.group_kind, GROUP_KINDS)
        leaves = self.num_leaf_nodes
        if not 1 <= self.hidden_groups <= leaves:
            raise ConfigError(
                "hidden_groups", f"{self.hidden_groups} is not allowed; allowed: 1..{leaves} (--num-leaf-nodes)"
            )
        for name in ("samples_per_device", "synthetic_train_size", "synthetic_test_size"):
            check_min(name, getattr(self, name), 1)
        check_min("data_seed", self.data_seed, 0)
        check_positive_finite("alpha", self.alpha)
        if self.task is not None:
            if not self.task.strip():
                raise ConfigError("task", "give a file path (my_task.py) or a module name (package.module)")
        elif self.dataset == "digits":
            _check_digits(self)
        elif self.dataset != "synthetic":
            if not self.data_root:
                raise ConfigError(
                    "data_root",
                    f"--dataset {self.dataset} needs --data-root (a folder for the CIFAR python-format "
                    "data); for an offline run use --dataset synthetic",
                )
            if not self.download and not os.path.isdir(self.data_root):
                raise ConfigError(
                    "data_root",
                    f"folder {self.data_root!r} does not exist; create it and pass --download, "
                    "or use --dataset synthetic for an offline run",
                )


def _check_digits(settings: Any) -> None:
    """Flags that cannot apply to scikit-learn's digits (real, built in, 1,437 grey training images)."""
    from devsim.data.digits import DIGITS_TRAIN_SIZE, INSTALL_HINT, digits_available

    if settings.data_root or settings.download:
        name = "data_root" if settings.data_root else "download"
        raise ConfigError(name, "--dataset digits reads no files: drop --data-root and --download (for cifar*)")
    if settings.samples_per_device > DIGITS_TRAIN_SIZE:
        raise ConfigError(
            "samples_per_device",
            f"{settings.samples_per_device} is more than the {DIGITS_TRAIN_SIZE} digits training images; "
            f"allowed: 1..{DIGITS_TRAIN_SIZE}",
        )
    if settings.group_kind == "input_transform" and settings.hidden_groups > 8:
        raise ConfigError(
            "hidden_groups",
            f"{settings.hidden_groups} is not allowed with --dataset digits --group-kind input_transform: digits "
            "are grey, so only the 8 rotation/inversion transforms differ; allowed: 1..8",
        )
    if not digits_available():
        raise ConfigError("dataset", INSTALL_HINT)
