"""Per-device data shards, derived lazily and deterministically from ``(seed, device_id)``.

A simulated population can hold millions of devices; a partitioner therefore stores only
O(N) state for the N training samples (computed once in ``__init__``) and computes a device's
shard on demand in O(samples_per_device) time, identically in every process. Nothing is cached
per device.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np

PARTITION_KINDS: tuple[str, ...] = ("iid", "dirichlet", "natural")
"""Kinds accepted by :func:`make_partitioner`."""


def _check_int(field: str, value: object, minimum: int) -> int:
    """Return ``value`` as an int if it is an integer (not bool) >= ``minimum``; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{field} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _check_alpha(alpha: object) -> float:
    """Return ``alpha`` as a float if it is a finite real number > 0; else ValueError naming alpha."""
    real = isinstance(alpha, int | float | np.integer | np.floating) and not isinstance(alpha, bool)
    if not real or not math.isfinite(float(alpha)) or float(alpha) <= 0:
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
    return float(alpha)


class Partitioner(ABC):
    """Maps a device id to the indices of its training samples.

    Attributes:
        labels: int64 class labels of the whole training set, shape ``(N,)``; None for tasks without class
            labels (then only the IID and natural partitions apply and label histograms do not exist).
        num_classes: Number of classes C (label histograms have length C); None without labels.
        samples_per_device: Number of indices in every device's shard (1 <= it <= N); None when shard sizes
            differ (the natural partition).
        seed: Non-negative seed; together with the device id it fixes the shard.
    """

    def __init__(
        self,
        labels: np.ndarray | None,
        num_classes: int | None,
        samples_per_device: int | None,
        seed: int,
        num_samples: int | None = None,
    ) -> None:
        if labels is None:
            self.labels = None
            self.num_classes = None
            self._num_samples = _check_int("num_samples", num_samples, 1)
        else:
            labels = np.asarray(labels)
            if labels.ndim != 1 or labels.size == 0 or not np.issubdtype(labels.dtype, np.integer):
                raise ValueError(f"labels must be a non-empty 1-D integer array, got {labels.dtype} {labels.shape}")
            self.num_classes = _check_int("num_classes", num_classes, 1)
            if labels.min() < 0 or labels.max() >= self.num_classes:
                raise ValueError(f"labels must lie in [0, {self.num_classes})")
            self.labels = labels.astype(np.int64, copy=False)
            self._num_samples = int(labels.size)
        if samples_per_device is None:
            self.samples_per_device = None
        else:
            self.samples_per_device = _check_int("samples_per_device", samples_per_device, 1)
            if self.samples_per_device > self._num_samples:
                raise ValueError(
                    f"samples_per_device ({samples_per_device}) exceeds the training set size ({self._num_samples})"
                )
        self.seed = _check_int("seed", seed, 0)

    @property
    def num_samples(self) -> int:
        """Size N of the training set being partitioned."""
        return self._num_samples

    @property
    def num_devices(self) -> int | None:
        """Devices that hold data (the natural partition's owners), or None: any device id has a shard."""
        return None

    @abstractmethod
    def device_indices(self, device_id: int) -> np.ndarray:
        """Indices of device ``device_id``'s samples.

        Args:
            device_id: Integer >= 0.

        Returns:
            A new int64 array of shape ``(samples_per_device,)`` (or the owner's sample count, for the natural
            partition) with values in ``[0, N)``.
        """

    def device_label_histogram(self, device_id: int) -> np.ndarray:
        """Number of the device's samples in each class: int64 array of shape ``(num_classes,)``.

        It sums to the device's shard size. Raises ValueError without class labels.
        """
        if self.labels is None:
            raise ValueError("label histograms need class labels (a classification task)")
        labels = self.labels[self.device_indices(device_id)]
        return np.bincount(labels, minlength=self.num_classes).astype(np.int64)


class IIDPartitioner(Partitioner):
    """Uniform shards: consecutive windows of one global random permutation of the train set.

    Device ``d`` takes the ``samples_per_device`` permutation entries starting at
    ``(d * samples_per_device) % N`` (wrapping around), so shards are disjoint as long as the
    population holds at most N samples in total, and recur cyclically beyond that.

    Args:
        labels: Training labels, integer array of shape ``(N,)``; None for a task without class labels (then
            give ``num_samples``).
        samples_per_device: Shard size (1..N).
        seed: Non-negative seed of the global permutation (``np.random.default_rng(seed)``).
        num_classes: Histogram length; defaults to ``max(labels) + 1``.
        num_samples: N, when ``labels`` is None.
    """

    def __init__(
        self,
        labels: np.ndarray | None,
        samples_per_device: int,
        seed: int,
        *,
        num_classes: int | None = None,
        num_samples: int | None = None,
    ) -> None:
        if labels is not None:
            labels = np.asarray(labels)
            if num_classes is None:
                num_classes = int(labels.max()) + 1 if labels.size and labels.ndim == 1 else 1
        super().__init__(labels, num_classes, samples_per_device, seed, num_samples=num_samples)
        self._permutation = np.random.default_rng(self.seed).permutation(self.num_samples)
        self._window = np.arange(self.samples_per_device, dtype=np.int64)

    def device_indices(self, device_id: int) -> np.ndarray:
        device = _check_int("device_id", device_id, 0)
        start = (device * self.samples_per_device) % self.num_samples
        positions = self._window + start
        positions[positions >= self.num_samples] -= self.num_samples
        return self._permutation[positions]


class DirichletPartitioner(Partitioner):
    """Label-skewed shards: class proportions per device drawn from a symmetric Dirichlet.

    For device ``d``, a generator seeded by ``np.random.SeedSequence(seed, spawn_key=(d,))`` (the
    d-th child of ``SeedSequence(seed)``) draws proportions ``q ~ Dirichlet(alpha * ones(C))``,
    class counts ``~ Multinomial(samples_per_device, q)``, then that many indices uniformly from
    each class's pool: without replacement when the pool holds at least that many samples, with
    replacement otherwise. Classes absent from the training set get proportion 0. Small ``alpha``
    gives few classes per device; large ``alpha`` approaches the global class balance.

    Args:
        labels: Training labels, integer array of shape ``(N,)`` with values in ``[0, num_classes)``.
        num_classes: Number of classes C.
        samples_per_device: Shard size (1..N).
        alpha: Dirichlet concentration (> 0, finite).
        seed: Non-negative seed.
    """

    def __init__(self, labels: np.ndarray, num_classes: int, samples_per_device: int, alpha: float, seed: int) -> None:
        self.alpha = _check_alpha(alpha)
        super().__init__(labels, num_classes, samples_per_device, seed)
        self._concentration = np.full(self.num_classes, self.alpha)
        self._class_order = np.argsort(self.labels, kind="stable").astype(np.int64)
        self._pool_sizes = np.bincount(self.labels, minlength=self.num_classes).astype(np.int64)
        self._pool_starts = np.concatenate(([0], np.cumsum(self._pool_sizes)[:-1])).astype(np.int64)
        self._present = self._pool_sizes > 0
        self._all_present = bool(self._present.all())
        self._sparse_limit = int(self._pool_sizes[self._present].min()) // 2
        self._classes = np.arange(self.num_classes, dtype=np.int64)

    def _rng(self, device_id: int) -> np.random.Generator:
        device = _check_int("device_id", device_id, 0)
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(device,))))

    def _class_counts(self, rng: np.random.Generator) -> np.ndarray:
        """Draw the device's per-class sample counts, int64 of shape ``(C,)`` summing to the shard size."""
        proportions = rng.dirichlet(self._concentration)
        if not self._all_present:
            proportions[~self._present] = 0.0
            total = proportions.sum()
            if total > 0.0:
                proportions /= total
            else:
                proportions = self._present / self._present.sum()
        return rng.multinomial(self.samples_per_device, proportions).astype(np.int64)

    def device_label_histogram(self, device_id: int) -> np.ndarray:
        return self._class_counts(self._rng(device_id))

    def device_indices(self, device_id: int) -> np.ndarray:
        rng = self._rng(device_id)
        counts = self._class_counts(rng)
        classes = np.repeat(self._classes, counts)
        sizes = self._pool_sizes[classes]
        offsets = _draw_offsets(rng, sizes)
        if counts.max() <= self._sparse_limit:
            _deduplicate(rng, classes, sizes, offsets, None)
        else:
            self._resolve_large_counts(rng, counts, classes, sizes, offsets)
        indices = self._class_order[self._pool_starts[classes] + offsets]
        return rng.permutation(indices)

    def _resolve_large_counts(
        self,
        rng: np.random.Generator,
        counts: np.ndarray,
        classes: np.ndarray,
        sizes: np.ndarray,
        offsets: np.ndarray,
    ) -> None:
        """Make ``offsets`` distinct within each class, in place, when some class needs over half its pool.

        Classes needing more than their pool keep independent draws (with replacement); classes
        needing over half get a prefix of a random permutation of their pool; the rest are
        deduplicated by redrawing.
        """
        replace = counts > self._pool_sizes
        dense = (2 * counts > self._pool_sizes) & ~replace
        _deduplicate(rng, classes, sizes, offsets, ~(replace | dense)[classes])
        for cls in np.flatnonzero(dense):
            offsets[classes == cls] = rng.permutation(self._pool_sizes[cls])[: counts[cls]]


class NaturalPartitioner(Partitioner):
    """The task's own partition: device ``d`` holds every training sample of the ``d``-th smallest owner id.

    ``owners`` (one int per training sample, from the task's ``owner_train``) names the device holding each
    sample, so shard sizes differ as they do between real users. Device ids ``0 .. num_devices - 1`` map to
    the distinct owner ids in ascending order; the rows of a device keep the training set's order (its local
    training reshuffles them). Memory: two int64 arrays of N entries and one of ``num_devices + 1``.

    Args:
        owners: Integer array of shape ``(N,)``.
        seed: Non-negative seed (kept for the interface; the partition itself is not random).
        labels: Training class labels ``(N,)`` for label histograms, or None.
        num_classes: Histogram length, with ``labels``.
    """

    def __init__(
        self, owners: np.ndarray, seed: int = 0, labels: np.ndarray | None = None, num_classes: int | None = None
    ) -> None:
        owners = np.asarray(owners)
        if owners.ndim != 1 or owners.size == 0 or not np.issubdtype(owners.dtype, np.integer):
            raise ValueError(f"owners must be a non-empty 1-D integer array, got {owners.dtype} {owners.shape}")
        super().__init__(labels, num_classes, None, seed, num_samples=int(owners.size))
        if labels is not None and self.num_samples != owners.size:
            raise ValueError(f"owners has {owners.size} entries but labels has {self.num_samples}")
        self.owner_ids, counts = np.unique(owners, return_counts=True)
        self._order = np.argsort(owners, kind="stable").astype(np.int64)
        self._offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)

    @property
    def num_devices(self) -> int:
        """Distinct owners: the devices that hold data."""
        return int(self.owner_ids.size)

    def shard_sizes(self) -> np.ndarray:
        """Samples held by each device, int64 ``(num_devices,)``."""
        return np.diff(self._offsets)

    def device_indices(self, device_id: int) -> np.ndarray:
        device = _check_int("device_id", device_id, 0)
        if device >= self.num_devices:
            raise ValueError(f"device_id {device} is outside the {self.num_devices} devices of the natural partition")
        return self._order[self._offsets[device] : self._offsets[device + 1]].copy()


def make_partitioner(
    kind: str,
    labels: np.ndarray | None,
    num_classes: int | None,
    samples_per_device: int,
    seed: int,
    alpha: float | None = None,
    *,
    owners: np.ndarray | None = None,
    num_samples: int | None = None,
) -> Partitioner:
    """Build a partitioner by kind.

    Args:
        kind: ``"iid"``, ``"dirichlet"`` or ``"natural"`` (see :data:`PARTITION_KINDS`).
        labels: Training labels, integer array of shape ``(N,)``; None for a task without class labels (iid and
            natural only; give ``num_samples``).
        num_classes: Number of classes C (None without labels).
        samples_per_device: Shard size (1..N); ignored by ``"natural"``.
        seed: Non-negative seed.
        alpha: Dirichlet concentration, required (> 0) for ``"dirichlet"``, ignored otherwise.
        owners: The owner of each training sample, required for ``"natural"``.
        num_samples: N, when ``labels`` is None.

    Raises:
        ValueError: Unknown kind, missing or invalid alpha or owners, or other invalid arguments.
    """
    if kind == "iid":
        return IIDPartitioner(labels, samples_per_device, seed, num_classes=num_classes, num_samples=num_samples)
    if kind == "dirichlet":
        if alpha is None:
            raise ValueError("alpha is required for the dirichlet partition (e.g. 0.5)")
        if labels is None:
            raise ValueError("the dirichlet partition needs class labels (a classification task)")
        return DirichletPartitioner(labels, num_classes, samples_per_device, alpha, seed)
    if kind == "natural":
        if owners is None:
            raise ValueError("the natural partition needs the owner of every training sample (owner_train)")
        return NaturalPartitioner(owners, seed, labels=labels, num_classes=num_classes)
    raise ValueError(f"unknown partition {kind!r}; allowed values: {', '.join(PARTITION_KINDS)}")


def _draw_offsets(rng: np.random.Generator, sizes: np.ndarray) -> np.ndarray:
    """Uniform integer offsets ``0 <= offset < size`` for each entry of ``sizes`` (int64, > 0)."""
    offsets = (rng.random(sizes.size) * sizes).astype(np.int64)
    return np.minimum(offsets, sizes - 1, out=offsets)


def _deduplicate(
    rng: np.random.Generator,
    classes: np.ndarray,
    sizes: np.ndarray,
    offsets: np.ndarray,
    unique: np.ndarray | None,
) -> None:
    """Redraw, in place, offsets that repeat an earlier (class, offset) pair.

    Only entries where ``unique`` is set (all entries when it is None) are made distinct. Callers
    use it only for classes needing at most half their pool, so each round leaves at most about
    half the repeats and a few rounds suffice (the cap is a safeguard).
    """
    stride = int(sizes.max()) + 1
    for _ in range(64):
        keys = classes * stride + offsets
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        repeated = np.zeros(keys.size, dtype=bool)
        repeated[order[1:]] = sorted_keys[1:] == sorted_keys[:-1]
        if unique is not None:
            repeated &= unique
        if not repeated.any():
            return
        offsets[repeated] = _draw_offsets(rng, sizes[repeated])
