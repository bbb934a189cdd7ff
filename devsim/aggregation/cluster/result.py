"""What one round of cluster aggregation is given and returns: the settings, the models the leaves train from,
the checked updates, the model each cluster gets and the round's record (:class:`ClusterResult`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from devsim.aggregation.base import LeafUpdate, Weights

if TYPE_CHECKING:
    from devsim.config import ClusterConfig


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
        similarity_summary: :func:`~devsim.aggregation.cluster.threshold.split_summary` of this round's
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
            (its pull towards each, same order), ``target`` (the members of the cluster it prefers over every
            other by more than ``lone_pull`` with a pull above :data:`~devsim.aggregation.cluster.resplit.JOIN_PULL`,
            or None), ``preference`` (the lowest preference for ``target`` over another cluster; None without a
            target), ``rounds`` (consecutive rounds with this target, this one included; 0 without) and
            ``joined`` (True when it joined this round).
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
    """The :class:`~devsim.aggregation.cluster.strategy.ClusterAggregation` arguments a
    :class:`~devsim.config.ClusterConfig` sets (its similarity, gate, confirmation and re-split fields), for the
    job, the recovery benchmark and the tests alike."""
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


def checked_updates(
    leaf_models: Mapping[str, Weights], updates: Sequence[LeafUpdate], last_layer_keys: Sequence[str]
) -> dict[str, LeafUpdate]:
    """``updates`` by leaf; ValueError for a second update of one leaf, a leaf without an entry in
    ``leaf_models``, a ``total_weight`` that is not finite and > 0, or ``last_layer_keys`` missing from a leaf's
    model or update."""
    by_leaf: dict[str, LeafUpdate] = {}
    for update in updates:
        if update.leaf in by_leaf:
            raise ValueError(f"more than one update for leaf {update.leaf!r}")
        if update.leaf not in leaf_models:
            raise ValueError(f"update for leaf {update.leaf!r}, which has no entry in leaf_models")
        if not (math.isfinite(update.total_weight) and update.total_weight > 0):
            raise ValueError(f"leaf {update.leaf!r} has total_weight {update.total_weight}; it must be > 0")
        missing = [k for k in last_layer_keys if k not in leaf_models[update.leaf] or k not in update.delta_sum]
        if missing:
            raise ValueError(f"last_layer_keys {missing} missing from the model or update of leaf {update.leaf!r}")
        by_leaf[update.leaf] = update
    return by_leaf


def weighted_cluster_model(models: list[Weights], updates: list[LeafUpdate], global_lr: float) -> Weights:
    """``mean_w(models) + global_lr * sum(delta_sum) / sum(total_weight)``, float64 sums, float32 result.

    ``models[i]`` is the model member ``i`` trained from, ``updates[i]`` its update; ``mean_w`` weighs by
    ``total_weight``. The weighted mean is taken as ``models[0] + sum_i w_i (models[i] - models[0]) / W``, so
    members that trained from the same model reproduce FedAvg's arithmetic exactly.
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
        result[name] = ((base + shift / total) + (global_lr / total) * summed).astype(np.float32)
    return result
