"""Cluster aggregation at the top tier: leaves grouped by the similarity of their models, one model per cluster.

Each round, every leaf that reported an update gets a leaf-level model
``m_leaf = leaf_model + delta_sum / total_weight`` (the sample-weighted average of its devices'
local models). One vector per leaf (``similarity_on``, see :mod:`~devsim.aggregation.cluster_similarity`:
drift from the initial model, weights or updates, of the last layer or of every layer) is compared
by absolute cosine similarity; pairs with similarity strictly greater than a threshold are linked
and the connected components of that graph are the clusters. The threshold is ``tau``, or when
``tau`` is None it is chosen every round from the similarities themselves
(:mod:`~devsim.aggregation.cluster_threshold`). Every member of a cluster receives the cluster's
sample-weighted model next round. With the split source ``layer_updates`` leaves are compared only
with leaves that trained from the same model, so clusters only ever split.

Two steps added for issue #20, chosen by replaying per-round similarities of leaves that trained alone
(benchmarks/cluster_replay.py, docs/concepts.md#cluster-aggregation); the job turns both on:

* ``centre`` (drift sources, automatic threshold): the split is decided on the *centred* cosine
  (:func:`cosine_similarity_centred`: the mean vector of this round's leaves is subtracted first, and the
  sign is kept). Every leaf's drift shares what all leaves learn alike; that common part raises every
  absolute cosine and, with 2 groups of 2, could rank a pair of different groups above a pair of the
  same group for all 15 rounds. What is left after centring is what sets a leaf apart, and leaves of
  different groups point opposite ways. Whether every pair agrees (absolute cosines all above 0.5: no
  hidden groups) is judged on the absolute cosines, and while every leaf is still alone it comes
  first: centring leaves only noise when the leaves do not differ, and noise can clear the bar.
* ``confirm_rounds`` (every source but ``layer_updates``): a partition other than the one in force takes
  effect only once the same partition (of the same leaves) has been proposed in that many consecutive
  rounds; until then the leaves keep their clusters. Drift accumulates, so a true split, once visible,
  is proposed round after round, while a chance split of one round (4 leaves reach a silhouette of 0.4
  by chance) is not. This is what lets the bar ``min_silhouette`` sit lower (0.25 with 3 rounds in the
  job) than the 0.4 a single round needs. Exception: with a drift source and the automatic threshold,
  all leaves joining because every pair agrees (no hidden groups) takes effect at once.

A third step, for issue #20's remaining failure (a wrong merge held for good: once a leaf shares a cluster's
model, its drift follows the cluster's, so drift can never show that it does not belong):

* ``resplit_silhouette`` (every source but ``layer_updates``; None: off): each cluster in force with at
  least 3 members that trained from its model is checked on its members' *updates* (the same entries as
  ``similarity_on``, :func:`~devsim.aggregation.cluster_similarity.update_vector`), which, unlike drift, are
  comparable between leaves that trained from one model. The split is decided as above (silhouette
  threshold, bar ``resplit_silhouette``) on cosines centred on the members' mean update, and takes effect
  once the same split of the same members has been proposed ``confirm_rounds`` rounds in a row. One round's
  updates are fresh noise each round, while a member of another group pulls the other way every round.
  A part whose update pulls the cluster's model towards another cluster's model (:data:`JOIN_PULL`)
  joins that cluster at once, with its model. The pairs a split separates are then kept apart: in every
  later round their compared similarity counts as the lowest possible (-1 centred, else 0), because their
  drifts still hold the shared history and would merge them again. A cluster of 2 cannot be checked (2
  centred vectors always point opposite ways).

Three steps for issue #33 (exact within 10 rounds), chosen by replaying per-round drifts of leaves that trained alone
(60 synthetic runs: 2 kinds x 2-4 groups x 2-3 leaves per group x 5 seeds; docs/benchmark_history.md); the job turns
all three on, the constructor keeps them off:

* ``agree_on="updates"``: "every pair agrees" (all leaves join at once, no hidden groups) is judged on the absolute
  cosines of this round's *updates*, not of the drifts. Every leaf's drift holds the shrink of the initial weights
  that all leaves undergo alike (weight decay), so absolute drift cosines were 0.99-1.0 for every pair in all 60
  runs, at every round: all leaves joined at round 1 whatever the groups, and only the re-split (slower: members
  of one cluster train from a shared compromise model) could find the groups.
* ``scale_entries`` (centred cosines, partition and re-split): before the cosine, each model entry's columns are
  divided by the entry's spread across the leaves
  (:func:`~devsim.aggregation.cluster_similarity.scale_entries`), so every value counts alike. Unscaled, entries
  with few values but large differences (biases, the small conv layers) outweighed the large layers where the
  groups show (``fc1``: 48,000 of 62,006 values): the true split was the best one from round 5-8 scaled, against
  8-10 or never unscaled.
* ``confirm_pairs``: besides a partition proposed ``confirm_rounds`` rounds in a row, the pairs proposed
  together in each of the last ``confirm_rounds`` rounds (of the same leaves) join, with the clusters in force.
  One leaf that changes sides from round to round no longer holds back every other group; it waits alone.

Two more for issue #33's last failures (one leaf still alone at round 10 in 5 of 60 synthetic runs, never a wrong
merge), chosen by running the failing runs again and then the whole grid (benchmarks/cluster_recovery.py, 120 runs:
none wrong in any round); the job turns both on, the constructor keeps them off:

* ``pair_window``: a pair joins once proposed together in ``confirm_rounds`` of the last ``pair_window`` proposals
  (of the same leaves), not only in each of the last ``confirm_rounds``; its votes count across joins of other
  leaves (a re-split restarts them). A leaf proposed with its group in rounds 2, 4 and 5 (with another leaf in 3)
  joins at round 5 instead of waiting for 3 in a row (synthetic label 3x3, seed 2). Two of three, tried too,
  linked two leaves of different groups proposed together at rounds 2 and 3 (early proposals are noisy).
* ``pair_companion``: when a cluster grows by those votes, a leaf alone (in force and after the votes) that was
  proposed together with every member of it in each of the last ``pair_companion`` proposals joins it too (when
  exactly one growing cluster qualifies). Once its group shares one model, the leaf left out is compared with
  members whose drifts agree closely: the automatic threshold rises above its similarity to them and the
  silhouette split keeps it alone round after round (synthetic label 4x3, seed 2: with its group at rounds 5
  and 6, alone from 7 to 10). Only growing clusters draw companions: letting any pair of the last 2 proposals
  join with them linked two pairs of lone leaves of different groups at round 3 (input 3x2, seed 0).

One more for issue #33's last failure (synthetic input 2x3 seed 1: site-6 alone at round 10; its model was nearer
the other group's cluster than its own at rounds 5-8, in drift and, at rounds 6-8, in its outputs on a probe batch of
smooth noise, so no similarity of models can place it); the job turns it on, the constructor keeps it off:

* ``lone_pull``: drift says where a model has been, an update where its leaf's data pull it. A leaf alone (its own
  model, alone in force and in this round's partition) is compared with the clusters in force (2 or more members
  that trained from one shared model, at least 2 such clusters) on its update: its *pull* towards a cluster is the
  cosine of its update with the step from its model to the cluster's model, and its *preference* for a cluster K
  over another J the cosine of its update with the step from J's model to K's (which cancels what both clusters
  learnt alike). When its pull towards K exceeds :data:`JOIN_PULL` and its preference for K over every other
  cluster exceeds ``lone_pull``, in ``confirm_rounds`` consecutive rounds (K's members unchanged), it joins K at
  once: it takes K's label and the model K's members produced this round, without contributing to it (as a part
  that a re-split sends to another cluster). Measured (docs/benchmark_history.md): site-6's preference for its
  group's cluster was 0.15, 0.14, 0.34, 0.46, 0.45, 0.35 at rounds 5-10 (pull 0.20-0.38, towards the other
  cluster -0.17 to -0.24 from round 7), so it joins at round 9; in the other 119 runs of the grid no lone leaf had a
  target in any round. Replayed on their trajectories without the rule (and without the condition on this round's
  partition), single rounds reached the bars (preference up to 0.30, pull 0.22: input 4x3 seed 4), never 2 in a row.

Threshold convention: a pair is linked when ``similarity > tau`` (strict), matching "pairs above
tau". With ``tau = 1`` no two leaves are ever linked; with ``tau = 0`` every pair that is not
exactly orthogonal is linked (zero vectors stay alone, their similarity to others is 0).

This module is longer than 400 lines because the strategy class keeps its round logic, its gate,
its resumable state and the argument checks together; the pieces that stand alone (vectors,
thresholds, partition scores) live in the two sibling modules.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from devsim.config import ClusterConfig

from devsim.aggregation.base import LeafUpdate, Weights
from devsim.aggregation.cluster_similarity import (
    DRIFT_SOURCES,
    SIMILARITY_SOURCES,
    SPLIT_SOURCES,
    entry_sizes,
    leaf_vector,
    scale_entries,
    update_vector,
)
from devsim.aggregation.cluster_threshold import (
    AGREE_LEVEL,
    DEFAULT_MIN_SILHOUETTE,
    THRESHOLD_METHODS,
    all_in_one_threshold,
    canonical_labels,
    choose_threshold,
    components_above,
    silhouette,
    silhouette_threshold,
    split_summary,
)

AGREE_SOURCES: tuple[str, ...] = ("drift", "updates")
"""Values of ``ClusterAggregation(agree_on=...)``: what "every pair agrees" is judged on (drift sources)."""

JOIN_PULL: float = 0.15
"""A part split off a cluster joins another cluster when its pull towards that cluster's model exceeds this
(:meth:`ClusterAggregation._pull`). Measured on synthetic data (docs/benchmark_history.md, cluster recovery): the leaf
of another group inside the one wrong cluster pulled 0.23-0.28 towards its group's cluster (rounds 10-12); single
members of correct clusters -0.10 to 0.12 (3 runs of 6-9 leaves, every round from the first merge on)."""

__all__ = [
    "SIMILARITY_SOURCES",
    "THRESHOLD_METHODS",
    "ClusterAggregation",
    "ClusterResult",
    "assignment_churn",
    "canonical_labels",
    "cluster_by_similarity",
    "components_above",
    "cosine_similarity_abs",
    "cosine_similarity_centred",
    "leaf_models_for_round",
]


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


def _all_pairs_agree(similarity: np.ndarray) -> bool:
    """Whether every pair's absolute similarity is above :data:`AGREE_LEVEL` (at least one pair)."""
    pairs = similarity[np.triu_indices(similarity.shape[0], k=1)]
    return bool(pairs.size) and float(pairs.min()) > AGREE_LEVEL


def _same_model_groups(order: list[str], models: Mapping[str, Weights]) -> list[list[int]]:
    """Indices of ``order`` grouped by the model they trained from (same object, or equal entries)."""
    groups: list[tuple[Weights, list[int]]] = []
    for index, leaf in enumerate(order):
        model = models[leaf]
        for shared, members in groups:
            if shared is model or (
                shared.keys() == model.keys() and all(np.array_equal(shared[k], model[k]) for k in model)
            ):
                members.append(index)
                break
        else:
            groups.append((model, [index]))
    return [members for _, members in groups]


def leaf_models_for_round(
    initial: Weights, leaves: Iterable[str], current: Mapping[str, Weights] | None = None
) -> dict[str, Weights]:
    """The model each leaf trains from: its entry in ``current`` (last round's result) else ``initial``."""
    current = current or {}
    return {leaf: current.get(leaf, initial) for leaf in leaves}


@dataclass
class ClusterResult:
    """Outcome of one round of cluster aggregation.

    Attributes:
        leaf_models: Model each leaf receives next round, for every leaf of ``leaf_models`` passed in.
            Members of a cluster share one dict (and its arrays); treat them as read-only.
        labels: Canonical cluster label of every leaf (numbered by first appearance in sorted leaf-name order).
        similarity: ``(L, L)`` absolute cosine similarity of this round's updated leaves, rows in ``leaf_order``.
        leaf_order: The leaves clustered this round (those with an update), sorted by name.
        num_clusters: Number of distinct labels in ``labels``.
        churn: Leaves of ``leaf_order`` labelled in the previous round whose co-members among
            ``leaf_order`` changed (0 in the first round).
        gated: Leaves that kept their previous model because the accuracy gate rejected the cluster model.
        thresholds: The link thresholds used this round (``tau``, or the automatic choice when ``tau`` is
            None): one for the whole similarity matrix, or with a split source one per group of leaves
            that trained from the same model, in order of their first leaf.
        similarity_summary: :func:`~devsim.aggregation.cluster_threshold.split_summary` of this round's
            partition of ``leaf_order`` on the similarities it was decided from (split sources: the
            smoothed ones, pairs that trained from different models left out; with ``centre`` the
            centred ones): ``within_min``, ``between_max``, ``margin``, ``thresholds``, ``silhouette``.
        pending: With ``confirm_rounds > 1``: how many consecutive rounds (this one included) the latest
            proposal that differs from the partition in force has been made; 0 when this round's
            proposal is the partition in force (or took effect this round).
        resplit: With ``resplit_silhouette`` set, one entry per cluster in force whose members' updates were
            checked this round (3+ members that trained from its model), in order of their first leaf:
            ``members`` (names), ``silhouette`` (of the best split on centred update cosines; None when
            no split has one), ``parts`` (the split proposed, lists of names; None below the bar),
            ``rounds`` (consecutive rounds this split has been proposed, this one included; 0 without
            one) and ``split`` (True when it took effect this round); a split that took effect adds, per
            part, ``pull`` (the highest pull towards another cluster of this round, None without one) and
            ``joined`` (the members of the cluster the part joined, or None).
        lone: With ``lone_pull`` set, one entry per leaf alone that was compared with 2 or more clusters in force
            this round, in leaf order: ``leaf``, ``clusters`` (the clusters' members, lists of names), ``pull``
            (its pull towards each, same order), ``target`` (the members of the cluster it prefers over every other
            by more than ``lone_pull`` with a pull above :data:`JOIN_PULL`, or None), ``preference`` (the lowest
            preference for ``target`` over another cluster; None without a target), ``rounds`` (consecutive rounds
            with this target, this one included; 0 without) and ``joined`` (True when it joined this round).
    """

    leaf_models: dict[str, Weights]
    labels: dict[str, int]
    similarity: np.ndarray
    leaf_order: list[str]
    num_clusters: int
    churn: int
    gated: list[str] = field(default_factory=list)
    thresholds: list[float] = field(default_factory=list)
    similarity_summary: dict[str, float | None] = field(default_factory=dict)
    pending: int = 0
    resplit: list[dict[str, Any]] = field(default_factory=list)
    lone: list[dict[str, Any]] = field(default_factory=list)


def config_settings(config: ClusterConfig) -> dict[str, Any]:
    """The :class:`ClusterAggregation` arguments a :class:`~devsim.config.ClusterConfig` sets (its similarity,
    gate, confirmation and re-split fields), for the job, the recovery benchmark and the tests alike."""
    return {
        "tau": config.tau,
        "similarity_on": config.similarity_on,
        "min_silhouette": config.min_silhouette,
        "centre": config.centre_similarity,
        "confirm_rounds": config.confirm_rounds,
        "resplit_silhouette": config.resplit_silhouette,
        "scale_entries": config.scale_entries,
        "agree_on": config.agree_on,
        "confirm_pairs": config.confirm_pairs,
        # Both refine pair confirmation; without it they are left out.
        "pair_window": config.pair_window if config.confirm_pairs else None,
        "pair_companion": config.pair_companion if config.confirm_pairs else None,
        "lone_pull": config.lone_pull,
    }


class ClusterAggregation:
    """Server-side clustered aggregation over leaves (one model per cluster of similar leaves).

    ``global_lr`` semantics: the cluster model is
    ``mean_w(leaf_model_i) + global_lr * sum_i(delta_sum_i) / sum_i(total_weight_i)`` with ``mean_w``
    the sample-weighted (``total_weight``) mean over the cluster's members of the model each trained
    from. With ``global_lr = 1`` this is the sample-weighted average of the leaf-level models
    ``m_leaf``; when all members trained from the same model it is exactly FedAvg restricted to
    the cluster.

    Leaves without an update this round keep their model and their previous cluster (they share a
    label only with other non-updated leaves that shared it before; leaves never clustered are
    singletons). Labels are re-canonicalised each round, so label numbers are not stable across
    rounds; use :func:`assignment_churn` (the ``churn`` field) to track membership changes.

    Accuracy gate (``gate_margin`` not None): for each updated leaf, if
    ``score(leaf, cluster_model) < score(leaf, previous_model) - gate_margin`` the leaf keeps its
    previous model (the one it trained from this round) and is listed in ``gated``; it keeps its
    cluster label. A negative margin demands an improvement of at least ``-gate_margin``.

    ``min_silhouette`` is the bar of the automatic threshold; ``centre`` (drift sources, automatic
    threshold), ``confirm_rounds`` and ``resplit_silhouette`` (every source but ``layer_updates``),
    ``scale_entries``, ``agree_on`` (one of :data:`AGREE_SOURCES`), ``confirm_pairs``, ``pair_window`` (None, or
    an int >= ``confirm_rounds``), ``pair_companion`` (None, or an int >= 1; both need ``confirm_pairs``) and
    ``lone_pull`` (None, or a number in [-1, 1); every source but ``layer_updates``) are described in the module
    docstring. The constructor keeps the earlier behaviour by default (0.4, no centring,
    at once, no re-split, unscaled, agreement on drift, whole partitions confirmed, pairs together in every one
    of the last ``confirm_rounds`` proposals, no companions, lone leaves never joined by their pull); the cluster
    job passes ``ClusterConfig``'s values.
    """

    name = "cluster"

    def __init__(
        self,
        *,
        tau: float | None = 0.7,
        similarity_on: str = "last_layer_weights",
        last_layer_keys: Sequence[str],
        threshold_method: str = "silhouette",
        global_lr: float = 1.0,
        gate_margin: float | None = None,
        reference: Weights | None = None,
        memory: float = 0.5,
        min_silhouette: float = DEFAULT_MIN_SILHOUETTE,
        centre: bool = False,
        confirm_rounds: int = 1,
        resplit_silhouette: float | None = None,
        scale_entries: bool = False,
        agree_on: str = "drift",
        confirm_pairs: bool = False,
        pair_window: int | None = None,
        pair_companion: int | None = None,
        lone_pull: float | None = None,
    ):
        if tau is not None and not math.isfinite(float(tau)):
            raise ValueError(f"tau must be finite or None, got {tau!r}")
        if threshold_method not in THRESHOLD_METHODS:
            raise ValueError(
                f"threshold_method must be one of {', '.join(THRESHOLD_METHODS)}, got {threshold_method!r}"
            )
        if similarity_on not in SIMILARITY_SOURCES:
            raise ValueError(f"similarity_on must be one of {', '.join(SIMILARITY_SOURCES)}, got {similarity_on!r}")
        if isinstance(last_layer_keys, str) or not last_layer_keys:
            raise ValueError("last_layer_keys must be a non-empty list of model entry names")
        if not (math.isfinite(float(global_lr)) and global_lr > 0):
            raise ValueError(f"global_lr must be a finite number > 0, got {global_lr}")
        if gate_margin is not None and not math.isfinite(float(gate_margin)):
            raise ValueError(f"gate_margin must be finite or None, got {gate_margin!r}")
        self.tau = None if tau is None else float(tau)
        self.threshold_method = threshold_method
        self.similarity_on = similarity_on
        self.last_layer_keys = list(last_layer_keys)
        self.global_lr = float(global_lr)
        self.gate_margin = None if gate_margin is None else float(gate_margin)
        if similarity_on in DRIFT_SOURCES and reference is None:
            raise ValueError(f"similarity_on={similarity_on!r} needs the reference (initial) model")
        self.reference = reference
        if not 0.0 <= float(memory) < 1.0:
            raise ValueError(f"memory must lie in [0, 1), got {memory!r}")
        self.memory = float(memory)
        if not (math.isfinite(float(min_silhouette)) and -1.0 <= float(min_silhouette) < 1.0):
            raise ValueError(f"min_silhouette must lie in [-1, 1), got {min_silhouette!r}")
        self.min_silhouette = float(min_silhouette)
        self.centre = bool(centre)
        if isinstance(confirm_rounds, bool) or int(confirm_rounds) != confirm_rounds or confirm_rounds < 1:
            raise ValueError(f"confirm_rounds must be an int >= 1, got {confirm_rounds!r}")
        self.confirm_rounds = int(confirm_rounds)
        if resplit_silhouette is not None and not (
            math.isfinite(float(resplit_silhouette)) and -1.0 <= float(resplit_silhouette) < 1.0
        ):
            raise ValueError(f"resplit_silhouette must lie in [-1, 1) or be None, got {resplit_silhouette!r}")
        self.resplit_silhouette = None if resplit_silhouette is None else float(resplit_silhouette)
        if not isinstance(scale_entries, bool | np.bool_):
            raise ValueError(f"scale_entries must be True or False, got {scale_entries!r}")
        self.scale_entries = bool(scale_entries)
        if agree_on not in AGREE_SOURCES:
            raise ValueError(f"agree_on must be one of {', '.join(AGREE_SOURCES)}, got {agree_on!r}")
        self.agree_on = agree_on
        if not isinstance(confirm_pairs, bool | np.bool_):
            raise ValueError(f"confirm_pairs must be True or False, got {confirm_pairs!r}")
        self.confirm_pairs = bool(confirm_pairs)
        if pair_window is not None and (
            isinstance(pair_window, bool) or int(pair_window) != pair_window or pair_window < self.confirm_rounds
        ):
            raise ValueError(
                f"pair_window must be None or an int >= confirm_rounds ({self.confirm_rounds}), got {pair_window!r}"
            )
        self.pair_window = None if pair_window is None else int(pair_window)
        if pair_companion is not None and (
            isinstance(pair_companion, bool) or int(pair_companion) != pair_companion or pair_companion < 1
        ):
            raise ValueError(f"pair_companion must be None or an int >= 1, got {pair_companion!r}")
        self.pair_companion = None if pair_companion is None else int(pair_companion)
        if (self.pair_window is not None or self.pair_companion is not None) and not self.confirm_pairs:
            raise ValueError("pair_window and pair_companion need confirm_pairs=True")
        if lone_pull is not None and (
            isinstance(lone_pull, bool) or not (math.isfinite(float(lone_pull)) and -1.0 <= float(lone_pull) < 1.0)
        ):
            raise ValueError(f"lone_pull must lie in [-1, 1) or be None, got {lone_pull!r}")
        self.lone_pull = None if lone_pull is None else float(lone_pull)
        self._lone_pending: dict[str, tuple[tuple[str, ...], int]] = {}
        self._history: list[tuple[tuple[str, int], ...]] = []
        self._sizes: list[int] = []
        self._split_pending: dict[tuple[str, ...], tuple[tuple[int, ...], int]] = {}
        self._apart: set[tuple[str, str]] = set()
        self._pending: tuple[tuple[tuple[str, int], ...], int] | None = None
        self._previous_labels: dict[str, int] = {}
        self._pair_similarity: dict[tuple[str, str], float] = {}

    def aggregate_clusters(
        self,
        leaf_models: Mapping[str, Weights],
        updates: Sequence[LeafUpdate],
        leaf_val_scores: Callable[[str, Weights], float] | None = None,
    ) -> ClusterResult:
        """Cluster the updated leaves and give each its cluster's model.

        Args:
            leaf_models: For every leaf, the model it trained from this round (its cluster's model).
            updates: At most one update per leaf, relative to that leaf's entry of ``leaf_models``,
                each with ``total_weight > 0``; order does not matter (leaves are sorted by name).
            leaf_val_scores: ``score(leaf, weights)``, higher is better; required when ``gate_margin``
                is set, ignored otherwise.

        Returns:
            The :class:`ClusterResult`; the strategy remembers its labels for the next round's churn.
        """
        if self.gate_margin is not None and leaf_val_scores is None:
            raise ValueError("gate_margin is set, so leaf_val_scores is required")
        by_leaf = self._check_updates(leaf_models, updates)
        order = sorted(by_leaf)
        models = {leaf: leaf_models[leaf] for leaf in order}

        if order:
            first = order[0]
            self._sizes = entry_sizes(
                self.similarity_on, models[first], by_leaf[first], last_layer_keys=self.last_layer_keys
            )
            vectors = np.stack([self._vector(models[leaf], by_leaf[leaf]) for leaf in order])
            similarity = cosine_similarity_abs(vectors)
            agreement = None
            if self.agree_on == "updates" and self.similarity_on in DRIFT_SOURCES:
                # Every leaf's drift holds the shrink of the initial weights that all leaves undergo alike
                # (weight decay), which puts every absolute drift cosine near 1 whatever the groups.
                agreement = cosine_similarity_abs(
                    np.stack([self._update(models[leaf], by_leaf[leaf]) for leaf in order])
                )
            round_labels, thresholds, compared = self._partition(order, models, similarity, vectors, agreement)
        else:
            round_labels, similarity = np.zeros(0, dtype=np.int64), np.zeros((0, 0))
            thresholds, compared = [], similarity
        pending = self._pending[1] if self._pending is not None else 0
        checks: list[dict[str, Any]] = []
        adopters: set[str] = set()
        if self.resplit_silhouette is not None and self.similarity_on not in SPLIT_SOURCES:
            round_labels, checks, adopters = self._resplit(order, models, by_leaf, round_labels)
        lone: list[dict[str, Any]] = []
        if self.lone_pull is not None and self.similarity_on not in SPLIT_SOURCES:
            round_labels, lone, joined = self._lone_joins(order, models, by_leaf, round_labels)
            adopters |= joined

        new_models: dict[str, Weights] = dict(leaf_models)
        gated: list[str] = []
        for cluster in range(int(round_labels.max()) + 1 if order else 0):
            members = [leaf for leaf, label in zip(order, round_labels.tolist(), strict=True) if label == cluster]
            # Leaves that joined this cluster after a re-split trained from another model: they take the
            # model of the members that trained from this cluster's, without contributing.
            own = [m for m in members if m not in adopters] or members
            cluster_model = self._cluster_model([models[m] for m in own], [by_leaf[m] for m in own])
            for leaf in members:
                if self.gate_margin is not None and leaf_val_scores is not None:
                    new_score = float(leaf_val_scores(leaf, cluster_model))
                    old_score = float(leaf_val_scores(leaf, models[leaf]))
                    if new_score < old_score - self.gate_margin:
                        gated.append(leaf)
                        continue
                new_models[leaf] = cluster_model

        all_leaves = sorted(leaf_models)
        round_of = dict(zip(order, round_labels.tolist(), strict=True))
        ids = [self._cluster_id(leaf, round_of) for leaf in all_leaves]
        labels = dict(zip(all_leaves, canonical_labels(ids).tolist(), strict=True))

        known = [leaf for leaf in order if leaf in self._previous_labels]
        churn = assignment_churn([self._previous_labels[leaf] for leaf in known], [labels[leaf] for leaf in known])
        self._previous_labels = dict(labels)
        return ClusterResult(
            leaf_models=new_models,
            labels=labels,
            similarity=similarity,
            leaf_order=order,
            num_clusters=len(set(labels.values())),
            churn=churn,
            gated=sorted(gated),
            thresholds=[float(t) for t in thresholds],
            similarity_summary=split_summary(compared, round_labels, thresholds) if order else {},
            pending=pending,
            resplit=checks,
            lone=lone,
        )

    def state_dict(self) -> dict[str, Any]:
        """Resumable state: the labels of the last round (``{"previous_labels": {leaf: int}}``); for split
        sources once pairs were compared, their smoothed similarity (``"pair_similarity": [[a, b, value], ...]``);
        while a proposal awaits confirmation, its labels and count (``"pending": {"labels": {leaf: int},
        "rounds": int}``); with ``confirm_pairs``, the last proposals, up to ``pair_window`` or ``confirm_rounds`` of
        them (``"history": [{leaf: int}, ...]``); with
        ``resplit_silhouette``, the pairs kept apart (``"apart": [[a, b], ...]``) and the splits awaiting
        confirmation (``"split_pending": [{"members", "labels", "rounds"}, ...]``); with ``lone_pull``, the
        lone leaves on their way to a cluster (``"lone_pending": [{"leaf", "target", "rounds"}, ...]``)."""
        state: dict[str, Any] = {"previous_labels": dict(self._previous_labels)}
        if self._pair_similarity:
            state["pair_similarity"] = [[a, b, value] for (a, b), value in sorted(self._pair_similarity.items())]
        if self._pending is not None:
            state["pending"] = {"labels": dict(self._pending[0]), "rounds": self._pending[1]}
        if self._apart:
            state["apart"] = [[a, b] for a, b in sorted(self._apart)]
        if self._history:
            state["history"] = [dict(entry) for entry in self._history]
        if self._lone_pending:
            state["lone_pending"] = [
                {"leaf": leaf, "target": list(target), "rounds": rounds}
                for leaf, (target, rounds) in sorted(self._lone_pending.items())
            ]
        if self._split_pending:
            state["split_pending"] = [
                {"members": list(members), "labels": list(labels), "rounds": rounds}
                for members, (labels, rounds) in sorted(self._split_pending.items())
            ]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        labels = state.get("previous_labels")
        if not isinstance(labels, Mapping):
            raise ValueError("state must hold 'previous_labels' as a mapping of leaf name to int label")
        self._previous_labels = {str(leaf): int(label) for leaf, label in labels.items()}
        self._pair_similarity = {(str(a), str(b)): float(v) for a, b, v in state.get("pair_similarity", [])}
        pending = state.get("pending")
        self._pending = None
        if pending is not None:
            proposal = tuple(sorted((str(leaf), int(label)) for leaf, label in pending["labels"].items()))
            self._pending = (proposal, int(pending["rounds"]))
        self._apart = {(str(a), str(b)) for a, b in state.get("apart", [])}
        self._history = [
            tuple(sorted((str(leaf), int(label)) for leaf, label in entry.items()))
            for entry in state.get("history", [])
        ]
        self._split_pending = {
            tuple(str(m) for m in entry["members"]): (tuple(int(x) for x in entry["labels"]), int(entry["rounds"]))
            for entry in state.get("split_pending", [])
        }
        self._lone_pending = {
            str(entry["leaf"]): (tuple(str(m) for m in entry["target"]), int(entry["rounds"]))
            for entry in state.get("lone_pending", [])
        }

    def _partition(
        self,
        order: list[str],
        models: Mapping[str, Weights],
        similarity: np.ndarray,
        vectors: np.ndarray,
        agreement: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[float], np.ndarray]:
        """This round's labels of ``order``, the thresholds used and the similarities they were decided on.

        Weight and drift sources: one threshold over all pairs. Split sources compare updates, which only
        mean the same thing for leaves that trained from the same model: each group of such leaves (a
        cluster of last round) is split on its own, on similarities smoothed over rounds
        (``memory * previous + (1 - memory) * current`` while the pair keeps training from a shared
        model); leaves of different groups are never linked (non-compared pairs are NaN in the result).
        """
        if self.similarity_on not in SPLIT_SOURCES:
            threshold, compared, agree, fallback = self.tau, similarity, None, "together"
            centred = threshold is None and self.similarity_on in DRIFT_SOURCES and self.centre
            if threshold is None and self.similarity_on in DRIFT_SOURCES:
                # Merging is hard to undo (members then share a model), so without a clear split every
                # leaf stays alone; the split is judged on centred drift, agreement on absolute cosines.
                fallback, agree = "alone", similarity if agreement is None else agreement
                if centred:
                    compared = self._centred_similarity(vectors)
            if self._apart:
                # Pairs a re-split separated: their drifts still hold the history they shared.
                compared = self._keep_apart(order, compared, -1.0 if centred else 0.0)
                agree = None if agree is None else self._keep_apart(order, agree, 0.0)
            if threshold is None:
                alone = len({self._previous_labels.get(leaf, ("alone", leaf)) for leaf in order}) == len(order)
                if self.centre and agree is not None and alone and _all_pairs_agree(agree):
                    # Centring leaves only noise when the leaves do not differ, and noise can clear the bar; the
                    # absolute cosines say the leaves agree, so they join (as the uncentred rule would). Only
                    # while every leaf is alone: a cluster's model averages its members' noise away, which
                    # lifts its absolute cosines, so after a split "agree" would undo true groups.
                    threshold = all_in_one_threshold(compared)
                else:
                    threshold = choose_threshold(compared, self.threshold_method, self.min_silhouette, fallback, agree)
            proposal = components_above(compared, threshold)
            # A drift source's one-cluster proposal comes only from "every pair agrees" (a silhouette split has
            # 2+ clusters): no hidden groups, FedAvg from then on, taken at once as before confirmation existed.
            at_once = agree is not None and proposal.size > 1 and int(proposal.max()) == 0
            return self._confirmed(order, proposal, at_once), [threshold], compared
        compared = np.full(similarity.shape, np.nan)
        ids: list[tuple[int, int]] = [(0, 0)] * len(order)
        thresholds: list[float] = []
        memory: dict[tuple[str, str], float] = {}
        for number, members in enumerate(_same_model_groups(order, models)):
            for i in members:
                for j in members:
                    key = (order[min(i, j)], order[max(i, j)])
                    value = float(similarity[i, j])
                    if i != j and key in self._pair_similarity:
                        value = self.memory * self._pair_similarity[key] + (1.0 - self.memory) * value
                    compared[i, j] = value
                    if i < j:
                        memory[key] = value
            sub = compared[np.ix_(members, members)]
            threshold = self.tau if self.tau is not None else choose_threshold(sub, self.threshold_method)
            thresholds.append(float(threshold))
            for i, label in zip(members, components_above(sub, threshold).tolist(), strict=True):
                ids[i] = (number, label)
        self._pair_similarity = memory
        return canonical_labels(ids), thresholds, compared

    def _keep_apart(self, order: list[str], similarity: np.ndarray, floor: float) -> np.ndarray:
        """A copy of ``similarity`` with the pairs that a re-split separated set to ``floor``."""
        out = np.array(similarity, dtype=np.float64, copy=True)
        index = {leaf: i for i, leaf in enumerate(order)}
        for a, b in self._apart:
            if a in index and b in index:
                out[index[a], index[b]] = out[index[b], index[a]] = floor
        return out

    def _resplit(
        self,
        order: list[str],
        models: Mapping[str, Weights],
        by_leaf: Mapping[str, LeafUpdate],
        labels: np.ndarray,
    ) -> tuple[np.ndarray, list[dict[str, Any]], set[str]]:
        """``labels`` of ``order`` refined by the splits of clusters in force that take effect this round.

        A cluster in force is a label of last round; its members of ``order`` that trained from the same
        model (3 or more) are checked on their centred update cosines (module docstring). A split that
        takes effect divides those members as proposed; leaves of their cluster in ``labels`` that were not
        checked stay with the part of the first member. Splits awaiting confirmation are forgotten when
        their members are not checked again with the same split proposed. A part whose pull
        (:meth:`_pull`) towards another cluster of this round exceeds :data:`JOIN_PULL` joins the cluster
        with the highest pull: it takes that cluster's label and model (returned as adopters, which do not
        contribute to the model they receive).
        """
        assert self.resplit_silhouette is not None
        clusters: dict[int, list[str]] = {}
        for leaf in order:
            if leaf in self._previous_labels:
                clusters.setdefault(self._previous_labels[leaf], []).append(leaf)
        index = {leaf: i for i, leaf in enumerate(order)}
        ids: list[tuple[int, int]] = [(int(label), 0) for label in labels.tolist()]
        pending: dict[tuple[str, ...], tuple[tuple[int, ...], int]] = {}
        checks: list[dict[str, Any]] = []
        adopters: set[str] = set()
        for members in sorted(clusters.values()):
            for group in _same_model_groups(members, models):
                if len(group) < 3:
                    continue
                names = tuple(members[i] for i in group)
                vectors = np.stack([self._update(models[leaf], by_leaf[leaf]) for leaf in names])
                compared = self._centred_similarity(vectors)
                # The best split whatever its silhouette (bar -1), so the record shows how close it came.
                candidate = components_above(compared, silhouette_threshold(compared, -1.0))
                best = silhouette(compared, candidate)
                check: dict[str, Any] = {
                    "members": list(names),
                    "silhouette": float(best) if np.isfinite(best) else None,
                    "parts": None,
                    "rounds": 0,
                    "split": False,
                }
                checks.append(check)
                if not (np.isfinite(best) and best > self.resplit_silhouette + 1e-12):
                    continue
                key = tuple(candidate.tolist())
                earlier = self._split_pending.get(names)
                count = earlier[1] + 1 if earlier is not None and earlier[0] == key else 1
                parts = [[leaf for leaf, p in zip(names, key, strict=True) if p == n] for n in range(max(key) + 1)]
                check.update(parts=parts, rounds=count)
                if count < self.confirm_rounds:
                    pending[names] = (key, count)
                    continue
                check["split"] = True
                if self.pair_window is not None:
                    # Votes cast before the split would join its parts again.
                    self._history = []
                for leaf, part in zip(names, key, strict=True):
                    ids[index[leaf]] = (ids[index[leaf]][0], part)
                for (a, part_a), (b, part_b) in itertools.combinations(zip(names, key, strict=True), 2):
                    if part_a != part_b:
                        self._apart.add((a, b))
                others = [
                    other[0] for other in sorted(clusters.values()) if other is not members and other[0] not in names
                ]
                check["pull"], check["joined"] = [], []
                for n, part in enumerate(parts):
                    mask = np.array([p == n for p in key])
                    pulls = [self._pull(vectors, mask, models[names[0]], models[leaf]) for leaf in others]
                    best_pull = max(pulls, default=None)
                    target = others[pulls.index(best_pull)] if best_pull is not None and best_pull > JOIN_PULL else None
                    check["pull"].append(best_pull)
                    check["joined"].append(None if target is None else self._previous_labels_members(target, order))
                    if target is not None:
                        for leaf in part:
                            ids[index[leaf]] = ids[index[target]]
                            adopters.add(leaf)
        self._split_pending = pending
        return canonical_labels(ids), checks, adopters

    def _lone_joins(
        self,
        order: list[str],
        models: Mapping[str, Weights],
        by_leaf: Mapping[str, LeafUpdate],
        labels: np.ndarray,
    ) -> tuple[np.ndarray, list[dict[str, Any]], set[str]]:
        """``labels`` of ``order`` with the lone leaves that join a cluster this round added to it (``lone_pull``,
        module docstring), the records (``ClusterResult.lone``) and the leaves that joined (adopters: they take
        the cluster's model without contributing to it).

        A leaf is alone when no other leaf of ``order`` trained from its model, shared its label last round or
        shares it in ``labels``; a cluster in force is a set of 2 or more leaves that trained from one model and
        share one label in ``labels`` with no other leaf (a cluster this round's partition left as it was).
        """
        assert self.lone_pull is not None
        index = {leaf: i for i, leaf in enumerate(order)}
        ids = labels.tolist()
        sizes = {label: ids.count(label) for label in set(ids)}
        clusters: list[list[str]] = []
        lone: list[str] = []
        for group in _same_model_groups(order, models):
            names = [order[i] for i in group]
            label = ids[group[0]]
            if len(group) >= 2 and all(ids[i] == label for i in group) and sizes[label] == len(group):
                clusters.append(names)
            elif len(group) == 1 and sizes[label] == 1 and self._alone_in_force(names[0], order):
                lone.append(names[0])
        records: list[dict[str, Any]] = []
        pending: dict[str, tuple[tuple[str, ...], int]] = {}
        joined: set[str] = set()
        if len(clusters) < 2:
            self._lone_pending = pending
            return labels, records, joined
        for leaf in sorted(lone):
            update = self._update(models[leaf], by_leaf[leaf])
            pulls = [self._step_cosine(update, models[leaf], models[leaf], models[k[0]]) for k in clusters]
            target, preference = None, None
            for n, cluster in enumerate(clusters):
                if pulls[n] <= JOIN_PULL or any((leaf, m) in self._apart or (m, leaf) in self._apart for m in cluster):
                    continue
                lowest = min(
                    self._step_cosine(update, models[leaf], models[other[0]], models[cluster[0]])
                    for other in clusters
                    if other is not cluster
                )
                if lowest > self.lone_pull + 1e-12:
                    target, preference = tuple(cluster), lowest
            count = 0
            if target is not None:
                earlier = self._lone_pending.get(leaf)
                count = earlier[1] + 1 if earlier is not None and earlier[0] == target else 1
                if count < self.confirm_rounds:
                    pending[leaf] = (target, count)
                else:
                    ids[index[leaf]] = ids[index[target[0]]]
                    joined.add(leaf)
            records.append(
                {
                    "leaf": leaf,
                    "clusters": [list(c) for c in clusters],
                    "pull": pulls,
                    "target": None if target is None else list(target),
                    "preference": preference,
                    "rounds": count,
                    "joined": leaf in joined,
                }
            )
        self._lone_pending = pending
        return (canonical_labels(ids) if joined else labels), records, joined

    def _alone_in_force(self, leaf: str, order: list[str]) -> bool:
        """Whether no other leaf of ``order`` shared ``leaf``'s label last round (a leaf never labelled: alone)."""
        if leaf not in self._previous_labels:
            return True
        label = self._previous_labels[leaf]
        return not any(self._previous_labels.get(other) == label for other in order if other != leaf)

    def _step_cosine(self, update: np.ndarray, model: Weights, start: Weights, end: Weights) -> float:
        """Cosine of ``update`` (a leaf's update vector, from ``model``) with the step from ``start`` to ``end`` on the
        same entries: > 0 when the leaf's data pull its model that way."""
        step = {k: np.asarray(end[k], np.float64) - np.asarray(start[k], np.float64) for k in model}
        towards = update_vector(
            self.similarity_on, model, LeafUpdate("", step, 1.0, 0), last_layer_keys=self.last_layer_keys
        )
        pair = np.stack([update, towards])
        return float(_signed_cosine(pair, np.linalg.norm(pair, axis=1)[:, None] > 0, absolute=False)[0, 1])

    def _previous_labels_members(self, leaf: str, order: list[str]) -> list[str]:
        """The leaves of ``order`` that shared ``leaf``'s label last round (its cluster in force)."""
        label = self._previous_labels[leaf]
        return [other for other in order if self._previous_labels.get(other) == label]

    def _pull(self, vectors: np.ndarray, part: np.ndarray, model: Weights, other: Weights) -> float:
        """Cosine of a part's mean update minus the other members' mean update (``vectors`` rows, ``part`` a
        boolean mask) with the step from the cluster's ``model`` to ``other`` (on the same entries): > 0 when
        the part's data pulls the shared model towards ``other``, about 0 for an unrelated direction."""
        direction = vectors[part].mean(axis=0) - vectors[~part].mean(axis=0)
        step = {k: np.asarray(other[k], np.float64) - np.asarray(model[k], np.float64) for k in model}
        towards = update_vector(
            self.similarity_on, model, LeafUpdate("", step, 1.0, 0), last_layer_keys=self.last_layer_keys
        )
        pair = np.stack([direction, towards])
        return float(_signed_cosine(pair, np.linalg.norm(pair, axis=1)[:, None] > 0, absolute=False)[0, 1])

    def _confirmed(self, order: list[str], proposal: np.ndarray, at_once: bool = False) -> np.ndarray:
        """The labels of ``order`` in force after this round's ``proposal`` (see ``confirm_rounds``).

        The partition in force is last round's labels of ``order`` (leaves never labelled: alone). A different
        proposal replaces it once the same partition of the same leaves was proposed ``confirm_rounds``
        rounds in a row (or at once with ``at_once``); any other round (the partition in force proposed
        again, or a different proposal) restarts the count. With ``confirm_pairs``, besides, the pairs of
        leaves proposed together in each of the last ``confirm_rounds`` rounds (of the same leaves) join,
        with the clusters in force: a leaf that changes sides in one round holds back only itself, not every
        other group. With ``pair_window``, a pair joins once proposed together in ``confirm_rounds`` of the last
        ``pair_window`` proposals, counted across changes of the clusters in force (a re-split restarts them);
        with ``pair_companion``, a lone leaf joins a cluster that grows by those votes when proposed with all its
        members in each of the last ``pair_companion`` proposals (:meth:`_companions`).
        """
        if self.confirm_rounds == 1 or at_once:
            self._pending, self._history = None, []
            return proposal
        current = canonical_labels([self._previous_labels.get(leaf, ("alone", leaf)) for leaf in order])
        key = tuple(zip(order, proposal.tolist(), strict=True))
        window = self.confirm_rounds if self.pair_window is None else self.pair_window
        if self.confirm_pairs:
            same_leaves = bool(self._history) and [leaf for leaf, _ in self._history[-1]] == order
            self._history = [*(self._history if same_leaves else [])[-(window - 1) :], key]
        if np.array_equal(current, proposal):
            self._pending = None
            return proposal
        count = self._pending[1] + 1 if self._pending is not None and self._pending[0] == key else 1
        if count >= self.confirm_rounds:
            self._took_effect()
            return proposal
        self._pending = (key, count)
        if self.confirm_pairs and len(self._history) >= self.confirm_rounds:
            # Linked: together in force, or together in confirm_rounds of the last `window` proposals (without
            # pair_window: in every one of the last confirm_rounds).
            pairs = [np.equal.outer(row, row) for row in ([label for _, label in entry] for entry in self._history)]
            together = (np.sum(pairs, axis=0) >= self.confirm_rounds) | np.equal.outer(current, current)
            joined = components_above(together.astype(np.float64), 0.5)
            if self.pair_companion is not None and not np.array_equal(joined, current):
                joined = self._companions(current, joined, np.all(pairs[-self.pair_companion :], axis=0))
            if not np.array_equal(joined, current):
                self._took_effect()
                return joined
        return current

    @staticmethod
    def _companions(current: np.ndarray, joined: np.ndarray, recent: np.ndarray) -> np.ndarray:
        """``joined`` (the clusters after this round's pair votes) with each leaf that is alone in ``current`` and
        in ``joined`` added to the one cluster that grew by votes this round and that it was proposed together
        with, every member, in each of the last ``pair_companion`` proposals (``recent``, (L, L) bool: the pairs
        together in all of them); a leaf that qualifies for two such clusters, or for none, stays alone. Only a
        cluster that grows draws companions: once its members share a model, a leaf left alone is held apart by
        it (module docstring)."""
        sizes = np.bincount(joined)
        before = {tuple(np.flatnonzero(current == label)) for label in set(current.tolist())}
        grown = [label for label in range(sizes.size) if tuple(np.flatnonzero(joined == label)) not in before]
        lone = [i for i in range(joined.size) if sizes[joined[i]] == 1 and np.count_nonzero(current == current[i]) == 1]
        ids = joined.tolist()
        for i in lone:
            targets = [label for label in grown if bool(np.all(recent[i, joined == label]))]
            if len(targets) == 1:
                ids[i] = targets[0]
        return canonical_labels(ids)

    def _took_effect(self) -> None:
        """A proposal (or pairs of it) took effect: the count restarts; so do the pair votes, unless they are
        counted over ``pair_window`` (a pair's votes stay evidence about the pair whatever joined meanwhile)."""
        self._pending = None
        if self.pair_window is None:
            self._history = []

    def _check_updates(
        self, leaf_models: Mapping[str, Weights], updates: Sequence[LeafUpdate]
    ) -> dict[str, LeafUpdate]:
        by_leaf: dict[str, LeafUpdate] = {}
        for update in updates:
            if update.leaf in by_leaf:
                raise ValueError(f"more than one update for leaf {update.leaf!r}")
            if update.leaf not in leaf_models:
                raise ValueError(f"update for leaf {update.leaf!r}, which has no entry in leaf_models")
            if not (math.isfinite(update.total_weight) and update.total_weight > 0):
                raise ValueError(f"leaf {update.leaf!r} has total_weight {update.total_weight}; it must be > 0")
            missing = [
                k for k in self.last_layer_keys if k not in leaf_models[update.leaf] or k not in update.delta_sum
            ]
            if missing:
                raise ValueError(f"last_layer_keys {missing} missing from the model or update of leaf {update.leaf!r}")
            by_leaf[update.leaf] = update
        return by_leaf

    def _cluster_id(self, leaf: str, round_of: Mapping[str, int]) -> tuple[str, Any]:
        """Pre-canonical cluster id: this round's cluster, else the previous label, else a singleton."""
        if leaf in round_of:
            return ("round", round_of[leaf])
        if leaf in self._previous_labels:
            return ("kept", self._previous_labels[leaf])
        return ("alone", leaf)

    def _centred_similarity(self, vectors: np.ndarray) -> np.ndarray:
        """Centred cosines of ``vectors`` ``(L, D)``, each model entry scaled by its spread first with
        ``scale_entries`` (the partition and the re-split compare alike)."""
        return cosine_similarity_centred(scale_entries(vectors, self._sizes) if self.scale_entries else vectors)

    def _update(self, model: Weights, update: LeafUpdate) -> np.ndarray:
        """The update counterpart of the compared vector for one leaf (what a re-split compares)."""
        return update_vector(self.similarity_on, model, update, last_layer_keys=self.last_layer_keys)

    def _vector(self, model: Weights, update: LeafUpdate) -> np.ndarray:
        """The vector compared for one leaf (see :mod:`devsim.aggregation.cluster_similarity`)."""
        return leaf_vector(
            self.similarity_on, model, update, last_layer_keys=self.last_layer_keys, reference=self.reference
        )

    def _cluster_model(self, models: list[Weights], updates: list[LeafUpdate]) -> Weights:
        """``mean_w(models) + global_lr * sum(delta_sum) / sum(total_weight)``, float64 sums, float32 result.

        The weighted mean is taken as ``models[0] + sum_i w_i (models[i] - models[0]) / W``, so members
        that trained from the same model reproduce FedAvg's arithmetic exactly.
        """
        total = sum(u.total_weight for u in updates)
        reference = models[0]
        result: Weights = {}
        for name, value in reference.items():
            base = np.asarray(value, dtype=np.float64)
            shift = np.zeros(base.shape, dtype=np.float64)
            summed = np.zeros(base.shape, dtype=np.float64)
            for model, update in zip(models, updates, strict=True):
                if model[name] is not value:
                    shift += update.total_weight * (np.asarray(model[name], dtype=np.float64) - base)
                summed += update.delta_sum[name]
            result[name] = ((base + shift / total) + (self.global_lr / total) * summed).astype(np.float32)
        return result
