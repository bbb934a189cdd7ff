"""Cosine similarities of leaf vectors, the partitions they give, and how partitions change.

Vectors are one row per leaf, shape ``(L, D)``; similarities are ``float64`` ``(L, L)``. A pair is linked
when its similarity is strictly greater than the threshold ``tau``, and the clusters are the connected
components: with ``tau = 1`` no two leaves are ever linked; with ``tau = 0`` (absolute cosines) every pair
that is not exactly orthogonal is linked (a zero vector stays alone, its similarity to others is 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from devsim.aggregation.cluster.threshold import AGREE_LEVEL, canonical_labels, components_above


def cosine_similarity_abs(vectors: np.ndarray) -> np.ndarray:
    """Absolute cosine similarity of every pair of rows.

    Args:
        vectors: Real array of shape ``(L, D)`` with finite entries.

    Returns:
        ``float64`` array of shape ``(L, L)``, exactly symmetric, values in ``[0, 1]``. The diagonal
        is 1; a zero row has similarity 0 to every other row (and 1 to itself).
    """
    x = _checked_rows(vectors)
    # A row counts as zero when its L2 norm is 0 in float64.
    return _signed_cosine(x, np.linalg.norm(x, axis=1)[:, None] > 0, absolute=True)


def cosine_similarity_centred(vectors: np.ndarray) -> np.ndarray:
    """Signed cosine similarity of every pair of rows after subtracting the mean row.

    Args:
        vectors: Real array of shape ``(L, D)`` with finite entries.

    Returns:
        ``float64`` array of shape ``(L, L)``, exactly symmetric, values in ``[-1, 1]``, diagonal 1. A row
        equal to the mean up to rounding (largest centred entry at most ``1e-9`` of the largest entry of
        ``vectors``; so every row when ``L == 1`` or all rows are equal) has similarity 0 to every other
        row. With two equal-sized groups of identical rows, pairs of one group score 1, across groups -1.
    """
    x = _checked_rows(vectors)
    centred = x - x.mean(axis=0, keepdims=True) if x.shape[0] else x
    # What is left of a row equal to the mean is rounding error, not a direction.
    floor = 1e-9 * float(np.max(np.abs(x))) if x.size else 0.0
    return _signed_cosine(centred, _row_peaks(centred) > floor, absolute=False)


def pair_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Signed cosine of two ``(D,)`` vectors, in ``[-1, 1]``; 0 when either is zero."""
    pair = np.stack([a, b])
    return float(_signed_cosine(pair, np.linalg.norm(pair, axis=1)[:, None] > 0, absolute=False)[0, 1])


def _checked_rows(vectors: np.ndarray) -> np.ndarray:
    """``vectors`` as a ``float64`` ``(L, D)`` array; ValueError for another shape or a non-finite entry."""
    x = np.asarray(vectors, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"vectors must have shape (L, D), got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("vectors must be finite")
    return x


def _row_peaks(x: np.ndarray) -> np.ndarray:
    """Largest magnitude of each row, shape ``(L, 1)`` (zeros when ``D == 0``)."""
    return np.max(np.abs(x), axis=1, keepdims=True) if x.shape[1] else np.zeros((x.shape[0], 1))


def _signed_cosine(x: np.ndarray, directed: np.ndarray, absolute: bool) -> np.ndarray:
    """Cosine of every pair of rows of ``x`` ``(L, D)``; rows where ``directed`` ``(L, 1)`` is False count as
    zero (similarity 0 to others). Rows are scaled by their largest magnitude first, so squares of tiny
    entries do not underflow. Exactly symmetric, diagonal 1, in ``[0, 1]`` when ``absolute`` else ``[-1, 1]``."""
    peak = _row_peaks(x)
    scaled = np.divide(x, peak, out=np.zeros_like(x), where=directed & (peak > 0))
    norms = np.linalg.norm(scaled, axis=1)[:, None]
    unit = np.divide(scaled, norms, out=np.zeros_like(scaled), where=directed & (norms > 0))
    gram = unit @ unit.T
    gram = (gram + gram.T) / 2.0
    similarity = np.clip(np.abs(gram), 0.0, 1.0) if absolute else np.clip(gram, -1.0, 1.0)
    np.fill_diagonal(similarity, 1.0)
    return similarity


def cluster_by_similarity(vectors: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Cluster rows by absolute cosine similarity: connected components of ``similarity > tau``.

    Args:
        vectors: Array of shape ``(L, D)``, finite.
        tau: Finite threshold; a pair is linked when its similarity is strictly greater than ``tau``.

    Returns:
        ``(labels, similarity)``: ``int64`` labels of shape ``(L,)``, canonical (clusters numbered by
        their smallest member index), and the ``float64`` ``(L, L)`` similarity matrix of
        :func:`cosine_similarity_abs`.
    """
    similarity = cosine_similarity_abs(vectors)
    return components_above(similarity, tau), similarity


def assignment_churn(previous_labels: Sequence[Any] | np.ndarray, labels: Sequence[Any] | np.ndarray) -> int:
    """Number of items whose set of co-members differs between two partitions.

    Invariant to renumbering clusters: relabelling the same partition gives 0.

    Args:
        previous_labels: Length-``L`` cluster ids of the earlier partition.
        labels: Length-``L`` cluster ids of the later partition (same item order).

    Returns:
        How many of the ``L`` items have a different co-member set (itself included) in the two partitions.
    """
    prev = canonical_labels(previous_labels)
    cur = canonical_labels(labels)
    if prev.shape != cur.shape:
        raise ValueError(f"label arrays differ in length: {prev.shape[0]} vs {cur.shape[0]}")
    same_prev = prev[:, None] == prev[None, :]
    same_cur = cur[:, None] == cur[None, :]
    return int(np.count_nonzero(np.any(same_prev != same_cur, axis=1)))


def all_pairs_agree(similarity: np.ndarray) -> bool:
    """Whether every pair of the ``(L, L)`` absolute ``similarity`` is above :data:`AGREE_LEVEL` (at least one pair)."""
    pairs = similarity[np.triu_indices(similarity.shape[0], k=1)]
    return bool(pairs.size) and float(pairs.min()) > AGREE_LEVEL
