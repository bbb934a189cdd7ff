"""The dataset dispatcher: load a split of any dataset by its name.

It sits above the readers (`cifar`, `digits`, `synthetic`), which know nothing of each other or of it, and reads
the synthetic and CIFAR splits through this user's on-disk cache (`split_cache`): decoded or generated once, then
memory-mapped by every process that loads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devsim.data.datasets import ImageDataset
from devsim.data.digits import load_digits_split
from devsim.data.split_cache import cifar_split, synthetic_split

if TYPE_CHECKING:
    from devsim.config import SimulationConfig

DATASET_NAMES: tuple[str, ...] = ("synthetic", "digits", "cifar10", "cifar100")
"""Names accepted by :func:`load_dataset`."""


def load_dataset(
    name: str,
    root: str | None,
    train: bool,
    *,
    download: bool = False,
    seed: int = 0,
    synthetic_train_size: int = 20000,
    synthetic_test_size: int = 2000,
) -> ImageDataset:
    """Load the train or test split of a dataset by name.

    Args:
        name: One of :data:`DATASET_NAMES`.
        root: Data directory for the CIFAR datasets (the ``--data-root`` option); ignored for
            ``"synthetic"``; must be None for ``"digits"`` (scikit-learn ships them).
        train: True for the training split, False for the test split.
        download: For CIFAR, download the official archive into ``root`` when it is missing.
        seed: Seed of the synthetic dataset (ignored for CIFAR and digits, whose split is fixed). The synthetic
            set and CIFAR's decoded splits are read from this user's cache when an earlier process made them
            (:mod:`devsim.data.split_cache`).
        synthetic_train_size: Number of synthetic training images.
        synthetic_test_size: Number of synthetic test images.

    Returns:
        The requested split.

    Raises:
        ValueError: Unknown ``name``, ``root`` missing for a CIFAR dataset, or given for digits.
        DatasetUnavailableError: CIFAR data missing (and not downloaded) or corrupt; scikit-learn
            missing for digits.
    """
    if name not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {name!r}; allowed values: {', '.join(DATASET_NAMES)}")
    if name == "synthetic":
        return synthetic_split(seed, synthetic_train_size, synthetic_test_size, train)
    if name == "digits":
        if root is not None or download:
            raise ValueError("--dataset digits reads no files: drop --data-root and --download (they are for cifar*)")
        return load_digits_split(train)
    if root is None:
        raise ValueError(
            f"dataset {name!r} needs a data directory: pass --data-root DIR "
            "(or use --dataset synthetic, which needs no files)"
        )
    return cifar_split(root, name, train, download=download)


def load_config_split(config: SimulationConfig, train: bool) -> ImageDataset:
    """The train or test split of a run's dataset, as its config names it (dataset, data root, data seed,
    synthetic sizes): the one place the servers, the core simulations and the benchmarks read it from."""
    return load_dataset(
        config.dataset,
        config.data_root,
        train=train,
        seed=config.data_seed,
        synthetic_train_size=config.synthetic_train_size,
        synthetic_test_size=config.synthetic_test_size,
    )
