"""Real handwritten digits offline: scikit-learn's ``load_digits`` as a devsim :class:`ImageDataset`.

The data are the 1,797 8x8 grey images of the UCI "Optical Recognition of Handwritten Digits" test
set (10 classes, about 180 images each) that scikit-learn ships inside its wheel: no download, no
data folder. This reader turns them into the project's image format:

* Split: one fixed stratified split, :data:`DIGITS_TEST_FRACTION` (20 %) held out as the test set,
  drawn with :data:`DIGITS_SPLIT_SEED`. The split is the same for every run seed, so accuracies of
  different seeds and methods are measured on the same 360 test images (1,437 train images).
* Pixels: the 0..16 grey levels are scaled to 0..255 (``round(x * 255 / 16)``) and stored as uint8.
* Size: every pixel becomes a 4x4 block (nearest-neighbour upscaling, 8x8 -> 32x32), and the grey
  plane is copied to the three colour channels, giving the ``(N, 3, 32, 32)`` input that every model
  of the project expects. Nearest-neighbour adds no invented detail and is exactly invertible; the
  models' first convolution sees a coarse image, which is what the data are.
* Normalisation: mean and standard deviation of the training split's pixels (identical in the three
  channels), on the ``[0, 1]`` scale.
* Validation (for choosing settings without looking at the test split): with the environment variable
  :data:`HOLDOUT_ENV` (``DEVSIM_DIGITS_HOLDOUT``) set to a fraction in (0, 1), e.g. ``0.2``, a
  stratified share of the 1,437 *training* images, drawn with :data:`DIGITS_HOLDOUT_SEED`, is held
  out: the train split is the rest and the "test" split is that holdout (normalisation from the
  rest). The 360 test images are then not loaded at all. Every process of a run inherits the
  variable, so ``DEVSIM_DIGITS_HOLDOUT=0.2 python jobs/pt_job_fedbuff.py --dataset digits`` reports
  validation accuracy; a note on stderr says so. Unset, empty or ``0``: the normal train/test split.

scikit-learn is a core dependency of the project (``pyproject.toml``). A Python environment without it
(the lent GPU machine) can read the same images, labels and split from a file written here by
:func:`export_digits`, named by :data:`FILE_ENV` (``DEVSIM_DIGITS_FILE``); the validation holdout still
needs scikit-learn. Without either, :class:`~devsim.data.datasets.DatasetUnavailableError` gives the
command that installs it.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np

from devsim.data.datasets import DatasetUnavailableError, ImageDataset

DIGITS_NUM_CLASSES: int = 10
DIGITS_TEST_FRACTION: float = 0.2
"""Share of the 1,797 images held out as the test split (stratified by class)."""
DIGITS_SPLIT_SEED: int = 0
"""Seed of the fixed train/test split (independent of the run's ``--seed``)."""
DIGITS_TRAIN_SIZE: int = 1437
"""Images in the training split: ``1797 - ceil(0.2 * 1797)``."""
DIGITS_TEST_SIZE: int = 360
"""Images in the test split."""
DIGITS_HOLDOUT_SEED: int = 1
"""Seed of the validation holdout carved from the training split (see :data:`HOLDOUT_ENV`)."""
HOLDOUT_ENV: str = "DEVSIM_DIGITS_HOLDOUT"
"""Environment variable: a fraction in (0, 1) of the training split held out as the evaluation set."""
UPSCALE: int = 4
"""Each 8x8 pixel becomes an ``UPSCALE x UPSCALE`` block (32 / 8)."""

FILE_ENV: str = "DEVSIM_DIGITS_FILE"
"""Environment variable: an ``.npz`` written by :func:`export_digits`, read instead of scikit-learn's copy (the same
images and split; needed where scikit-learn is not installed, and quicker to load where it is: a job command
writes one into its workspace for the processes it starts)."""

INSTALL_HINT = (
    "--dataset digits needs scikit-learn: run `pip install scikit-learn` (or `pip install -e .`), "
    f"or set {FILE_ENV} to a file written by devsim.data.digits.export_digits"
)
"""The one line shown when neither scikit-learn nor a digits file is there."""


def digits_available() -> bool:
    """Whether the digits can be loaded: scikit-learn is installed, or :data:`FILE_ENV` names a file."""
    return sklearn_available() or _digits_file() is not None


def _digits_file() -> str | None:
    """The path :data:`FILE_ENV` names, or None when it is unset or empty."""
    return os.environ.get(FILE_ENV, "").strip() or None


def sklearn_available() -> bool:
    """Whether scikit-learn can be imported (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("sklearn") is not None


def load_digits_split(train: bool) -> ImageDataset:
    """The train or test split of the digits, as ``uint8`` ``(N, 3, 32, 32)`` images and ``int64`` labels.

    Args:
        train: True for the 1,437 training images, False for the 360 test images. With
            ``DEVSIM_DIGITS_HOLDOUT`` set (:data:`HOLDOUT_ENV`): the training images less the
            holdout, and the holdout.

    Returns:
        A new :class:`ImageDataset` named ``"digits"`` (fresh arrays on every call; the split is
        computed once per process and holdout setting).

    Raises:
        DatasetUnavailableError: scikit-learn is not installed.
        ValueError: ``DEVSIM_DIGITS_HOLDOUT`` is not a fraction in [0, 1).
    """
    train_set, test_set = _splits(holdout_fraction())
    chosen = train_set if train else test_set
    return ImageDataset(
        images=chosen.images.copy(),
        labels=chosen.labels.copy(),
        num_classes=chosen.num_classes,
        name=chosen.name,
        mean=chosen.mean,
        std=chosen.std,
    )


def holdout_fraction(environ: dict[str, str] | None = None) -> float:
    """The validation holdout fraction from ``DEVSIM_DIGITS_HOLDOUT`` (0.0: none, the test split is used)."""
    text = (os.environ if environ is None else environ).get(HOLDOUT_ENV, "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{HOLDOUT_ENV}={text!r}: expected a fraction in [0, 1), e.g. 0.2 (unset or 0: no holdout)")
    return value


@functools.lru_cache(maxsize=4)
def _splits(holdout: float = 0.0) -> tuple[ImageDataset, ImageDataset]:
    """The (train, evaluation) datasets; cached, so it runs, and prints its validation note, once per
    process and holdout fraction."""
    if (path := _digits_file()) is not None:  # read first: importing scikit-learn costs ~1 s a process
        grey, labels, train_idx, test_idx = _file_arrays(path)
    elif sklearn_available():
        grey, labels, train_idx, test_idx = _sklearn_arrays()
    else:
        raise DatasetUnavailableError(INSTALL_HINT)
    if holdout > 0.0:
        if not sklearn_available():
            raise DatasetUnavailableError(f"{HOLDOUT_ENV} needs scikit-learn (its stratified split draws the holdout)")
        from sklearn.model_selection import train_test_split

        train_idx, test_idx = train_test_split(
            train_idx, test_size=holdout, stratify=labels[train_idx], random_state=DIGITS_HOLDOUT_SEED
        )
        train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
        print(
            f"digits: {HOLDOUT_ENV}={holdout:g}: validation mode, {train_idx.size} training images and "
            f"{test_idx.size} held-out training images as the evaluation set (not the test split)",
            file=sys.stderr,
        )
    scaled = grey[train_idx].astype(np.float64) / 255.0
    mean, std = float(scaled.mean()), float(scaled.std())
    return (
        _as_dataset(grey[train_idx], labels[train_idx], mean, std),
        _as_dataset(grey[test_idx], labels[test_idx], mean, std),
    )


def _sklearn_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits: uint8 grey images ``(1797, 8, 8)`` on 0..255, int64 labels, and the sorted
    indices of the fixed stratified train and test splits."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    grey = np.rint(np.asarray(bunch.images, dtype=np.float64) * (255.0 / 16.0)).astype(np.uint8)
    labels = np.asarray(bunch.target, dtype=np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(labels.size),
        test_size=DIGITS_TEST_FRACTION,
        stratify=labels,
        random_state=DIGITS_SPLIT_SEED,
    )
    return grey, labels, np.sort(train_idx), np.sort(test_idx)


def export_digits(path: str) -> None:
    """Write the digits and their fixed train/test split to ``path`` (a ~50 KB ``.npz``), for a machine
    without scikit-learn: with :data:`FILE_ENV` set to that file there, ``--dataset digits`` loads the same
    images, labels and split (``scripts/gpu_suite.sh fetch`` writes one next to the carried wheels)."""
    if not sklearn_available():
        raise DatasetUnavailableError(INSTALL_HINT)
    grey, labels, train_idx, test_idx = _sklearn_arrays()
    np.savez_compressed(path, grey=grey, labels=labels, train_idx=train_idx, test_idx=test_idx)


def _file_arrays(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_sklearn_arrays` read back from an :func:`export_digits` file, checked for shape and split."""
    try:
        with np.load(path) as stored:
            arrays = [stored[key] for key in ("grey", "labels", "train_idx", "test_idx")]
    except (OSError, KeyError, ValueError) as error:
        message = f"{FILE_ENV}={path!r} is not a digits file from export_digits ({error})"
        raise DatasetUnavailableError(message) from None
    grey, labels, train_idx, test_idx = arrays
    total = DIGITS_TRAIN_SIZE + DIGITS_TEST_SIZE
    if (
        grey.shape != (total, 8, 8)
        or grey.dtype != np.uint8
        or labels.shape != (total,)
        or train_idx.shape != (DIGITS_TRAIN_SIZE,)
        or test_idx.shape != (DIGITS_TEST_SIZE,)
        or not np.array_equal(np.sort(np.concatenate([train_idx, test_idx])), np.arange(total))
    ):
        message = f"{FILE_ENV}={path!r}: unexpected shapes or split; write it again with export_digits"
        raise DatasetUnavailableError(message)
    return grey, labels.astype(np.int64), train_idx.astype(np.int64), test_idx.astype(np.int64)


def _as_dataset(grey: np.ndarray, labels: np.ndarray, mean: float, std: float) -> ImageDataset:
    """Upscale ``(n, 8, 8)`` uint8 grey images to ``(n, 3, 32, 32)`` and wrap them."""
    big = grey.repeat(UPSCALE, axis=1).repeat(UPSCALE, axis=2)
    images = np.ascontiguousarray(np.broadcast_to(big[:, None], (big.shape[0], 3, *big.shape[1:])))
    return ImageDataset(
        images=images,
        labels=labels,
        num_classes=DIGITS_NUM_CLASSES,
        name="digits",
        mean=(mean, mean, mean),
        std=(std, std, std),
    )
