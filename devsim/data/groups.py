"""Hidden leaf groups for clustered benchmark scenarios.

Leaves are split into groups (leaf ``i`` belongs to group ``i % num_groups``); each group sees the
data through its own fixed transform, so leaves of different groups need different models and a
cluster-aware strategy can find the groups. Two kinds:

* ``"label_permutation"``: group ``g`` relabels class ``c`` as ``perm_g[c]``; ``perm_g`` is a random
  permutation drawn from ``(seed, g)`` (never the identity for ``g > 0`` when there are at least two
  classes); group 0 keeps the identity.
* ``"input_transform"``: group ``g`` transforms the images, labels unchanged. ``g`` is read in mixed
  radix: ``g % 4`` quarter turns (counter-clockwise in the image plane), then ``(g // 4) % 2``
  inversion (``255 - x`` for uint8 images, ``-x`` for float ones), then ``g // 8`` one of the six channel
  orders (0 = RGB; three-channel images only). Groups 0..47 are distinct transforms for three channels,
  0..7 for other channel counts (group 0 is the identity); larger groups are rejected. Independent of ``seed``.

Pure numpy; images are ``(N, C, H, W)`` with ``H == W``, uint8 or float32 (any task with square image
inputs); labels ``int64`` ``(N,)``. Label permutations work for any classification task.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from devsim.data.datasets import ImageDataset
from devsim.seeding import derive_rng

GROUP_KINDS: tuple[str, ...] = ("label_permutation", "input_transform")
"""Kinds accepted by :class:`GroupTransform` and :func:`apply_group`."""

CHANNEL_ORDERS: tuple[tuple[int, int, int], ...] = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))
"""The six channel orders, identity first."""

NUM_INPUT_TRANSFORMS: int = 4 * 2 * len(CHANNEL_ORDERS)
"""Number of distinct ``input_transform`` groups (48)."""


def _check_int(field: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{field} must be an int >= {minimum}, got {value!r}")
    return int(value)


def leaf_group(leaf_index: int, num_groups: int) -> int:
    """The hidden group of leaf ``leaf_index`` (0-based): ``leaf_index % num_groups``."""
    return _check_int("leaf_index", leaf_index, 0) % _check_int("num_groups", num_groups, 1)


@dataclass(frozen=True)
class GroupTransform:
    """The fixed data transform of one hidden group.

    Attributes:
        kind: One of :data:`GROUP_KINDS`.
        group: Group index ``g >= 0`` (``< 48`` for ``"input_transform"``); group 0 is the identity.
        seed: Run seed; the label permutation is a pure function of ``(seed, group)``.
        num_classes: Number of classes C; required for ``"label_permutation"``.
    """

    kind: str
    group: int
    seed: int = 0
    num_classes: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in GROUP_KINDS:
            raise ValueError(f"kind must be one of {', '.join(GROUP_KINDS)}, got {self.kind!r}")
        _check_int("group", self.group, 0)
        _check_int("seed", self.seed, 0)
        if self.kind == "label_permutation":
            if self.num_classes is None:
                raise ValueError("num_classes is required for kind 'label_permutation'")
            _check_int("num_classes", self.num_classes, 1)
        elif self.group >= NUM_INPUT_TRANSFORMS:
            raise ValueError(f"input_transform supports groups 0..{NUM_INPUT_TRANSFORMS - 1}, got {self.group}")

    def label_map(self) -> np.ndarray:
        """``int64`` permutation of shape ``(C,)``: class ``c`` becomes ``label_map()[c]``.

        Identity for ``"input_transform"`` and for group 0.
        """
        if self.kind != "label_permutation":
            raise ValueError("label_map is defined for kind 'label_permutation' only")
        num_classes = int(self.num_classes or 0)
        identity = np.arange(num_classes, dtype=np.int64)
        if self.group == 0 or num_classes < 2:
            return identity
        rng = derive_rng(self.seed, "group_label_permutation", self.group)
        perm = rng.permutation(num_classes).astype(np.int64)
        while np.array_equal(perm, identity):
            perm = rng.permutation(num_classes).astype(np.int64)
        return perm

    def input_parts(self) -> tuple[int, bool, tuple[int, int, int]]:
        """``(quarter_turns, invert, channel_order)`` of an ``"input_transform"`` group."""
        g = self.group
        return g % 4, bool((g // 4) % 2), CHANNEL_ORDERS[g // 8]

    def __call__(self, images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Transformed copies ``(images, labels)``, same shapes and dtypes, C-contiguous.

        Args:
            images: uint8 or float32 ``(N, C, H, W)`` with ``H == W`` (``"input_transform"``); any inputs with one
                row per label for ``"label_permutation"``.
            labels: Integer ``(N,)`` in ``[0, num_classes)`` (for ``"label_permutation"``).
        """
        if self.kind == "input_transform":
            _check_arrays(images, labels)
        elif not isinstance(labels, np.ndarray) or labels.ndim != 1 or labels.shape[0] != len(images):
            raise ValueError("labels must be a 1-D array with one class id per input row")
        if self.kind == "label_permutation":
            if labels.size and (labels.min() < 0 or labels.max() >= int(self.num_classes or 0)):
                raise ValueError(f"labels must lie in [0, {self.num_classes}) for label_permutation")
            return images.copy(order="C"), self.label_map()[labels].astype(labels.dtype, copy=False)
        turns, invert, channels = self.input_parts()
        if channels != (0, 1, 2) and images.shape[1] != 3:
            raise ValueError(f"input_transform group {self.group} reorders channels: it needs 3 channels")
        out = images[:, list(channels)] if channels != (0, 1, 2) else images
        if turns:
            out = np.rot90(out, k=turns, axes=(2, 3))
        out = np.array(out, order="C")
        if invert and out.dtype == np.uint8:
            np.subtract(np.uint8(255), out, out=out)
        elif invert:
            np.negative(out, out=out)
        return out, labels.copy()


def input_transform_groups(sample_shape: tuple[int, ...], dtype: np.dtype) -> int:
    """How many distinct ``input_transform`` groups inputs of ``sample_shape`` and ``dtype`` allow (0: none,
    they are not square images of uint8 or float values)."""
    if len(sample_shape) != 3 or sample_shape[1] != sample_shape[2]:
        return 0
    if np.dtype(dtype) not in (np.dtype(np.uint8), np.dtype(np.float32)):
        return 0
    return NUM_INPUT_TRANSFORMS if sample_shape[0] == 3 else 8


def _check_arrays(images: np.ndarray, labels: np.ndarray) -> None:
    if not isinstance(images, np.ndarray) or images.dtype not in (np.uint8, np.float32):
        raise TypeError("images must be a uint8 or float32 numpy array")
    if images.ndim != 4 or images.shape[2] != images.shape[3]:
        raise ValueError(f"images must have shape (N, C, H, H), got {images.shape}")
    if not isinstance(labels, np.ndarray) or labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise TypeError("labels must be a 1-D integer numpy array")
    if labels.shape[0] != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {labels.shape[0]} labels")


def apply_group(
    images: np.ndarray,
    labels: np.ndarray,
    group: int,
    kind: str,
    seed: int = 0,
    *,
    num_classes: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Apply group ``group``'s transform of ``kind`` to a subset of a dataset.

    Args:
        images: uint8 or float32 ``(N, C, H, W)`` with ``H == W``.
        labels: Integer ``(N,)``.
        group: Group index (see :func:`leaf_group`).
        kind: One of :data:`GROUP_KINDS`.
        seed: Run seed (used by ``"label_permutation"``).
        num_classes: Number of classes of the whole dataset; required for ``"label_permutation"``
            (a subset's labels cannot tell it).

    Returns:
        New ``(images, labels)`` arrays with the input shapes and dtypes.
    """
    return GroupTransform(kind=kind, group=group, seed=seed, num_classes=num_classes)(images, labels)


def grouped_dataset(dataset: ImageDataset, group: int, kind: str, seed: int = 0) -> ImageDataset:
    """``dataset`` as seen by leaves of hidden group ``group`` (group 0 is the dataset itself)."""
    if group == 0:
        return dataset
    images, labels = apply_group(dataset.images, dataset.labels, group, kind, seed, num_classes=dataset.num_classes)
    return dataclasses.replace(dataset, images=images, labels=labels)
