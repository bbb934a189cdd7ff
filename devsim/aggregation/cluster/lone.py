"""A leaf left alone joins the cluster its updates pull towards, once they do so round after round.

Drift says where a model has been, an update where its leaf's data pull it: a leaf's *pull* towards a
cluster K is the cosine of its update with the step from its model to K's model, and its *preference* for K
over another cluster J the cosine of its update with the step from J's model to K's (which cancels what both
clusters learnt alike). Labels are ``int64`` arrays over ``order`` (leaf names, sorted).
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

import numpy as np

from devsim.aggregation.base import LeafUpdate, Weights
from devsim.aggregation.cluster.compare import LeafComparison, same_model_groups
from devsim.aggregation.cluster.resplit import JOIN_PULL
from devsim.aggregation.cluster.threshold import canonical_labels


class LoneJoins:
    """The lone leaves on their way to a cluster: ``pending[leaf] = (target cluster's members, rounds)``.

    Args:
        preference: A lone leaf's preference for its target over every other cluster must exceed this
            (``lone_pull``, in [-1, 1); None: off), with a pull above
            :data:`~devsim.aggregation.cluster.resplit.JOIN_PULL`.
        rounds: Consecutive rounds with the same target (its members unchanged) before the leaf joins.
    """

    def __init__(self, preference: float | None, rounds: int):
        self.preference = preference
        self.rounds = rounds
        self.pending: dict[str, tuple[tuple[str, ...], int]] = {}

    def joins(
        self,
        order: list[str],
        models: Mapping[str, Weights],
        by_leaf: Mapping[str, LeafUpdate],
        labels: np.ndarray,
        previous_labels: Mapping[str, int],
        apart: Set[tuple[str, str]],
        comparison: LeafComparison,
    ) -> tuple[np.ndarray, list[dict[str, Any]], set[str]]:
        """``labels`` of ``order`` with the lone leaves that join a cluster this round added to it, the records
        (``ClusterResult.lone``) and the leaves that joined (adopters: they take the model the cluster's members
        produced this round without contributing to it).

        A leaf is alone when no other leaf of ``order`` trained from its model, shared its label in
        ``previous_labels`` or shares it in ``labels``; a cluster in force is a set of 2 or more leaves that
        trained from one model and share one label in ``labels`` with no other leaf (a cluster this round's
        partition left as it was). Leaves are compared only while 2 or more clusters are in force; a pair in
        ``apart`` (separated by a re-split) never joins.
        """
        assert self.preference is not None
        index = {leaf: i for i, leaf in enumerate(order)}
        ids = labels.tolist()
        sizes = {label: ids.count(label) for label in set(ids)}
        clusters: list[list[str]] = []
        lone: list[str] = []
        for group in same_model_groups(order, models):
            names = [order[i] for i in group]
            label = ids[group[0]]
            if len(group) >= 2 and all(ids[i] == label for i in group) and sizes[label] == len(group):
                clusters.append(names)
            elif len(group) == 1 and sizes[label] == 1 and _alone_in_force(names[0], order, previous_labels):
                lone.append(names[0])
        records: list[dict[str, Any]] = []
        pending: dict[str, tuple[tuple[str, ...], int]] = {}
        joined: set[str] = set()
        if len(clusters) < 2:
            self.pending = pending
            return labels, records, joined
        for leaf in sorted(lone):
            update = comparison.update(models[leaf], by_leaf[leaf])
            pulls = [comparison.step_cosine(update, models[leaf], models[leaf], models[k[0]]) for k in clusters]
            target, preference = None, None
            for n, cluster in enumerate(clusters):
                if pulls[n] <= JOIN_PULL or any((leaf, m) in apart or (m, leaf) in apart for m in cluster):
                    continue
                lowest = min(
                    comparison.step_cosine(update, models[leaf], models[other[0]], models[cluster[0]])
                    for other in clusters
                    if other is not cluster
                )
                if lowest > self.preference + 1e-12:
                    target, preference = tuple(cluster), lowest
            count = 0
            if target is not None:
                earlier = self.pending.get(leaf)
                count = earlier[1] + 1 if earlier is not None and earlier[0] == target else 1
                if count < self.rounds:
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
        self.pending = pending
        return (canonical_labels(ids) if joined else labels), records, joined


def _alone_in_force(leaf: str, order: list[str], previous_labels: Mapping[str, int]) -> bool:
    """Whether no other leaf of ``order`` shared ``leaf``'s label last round (a leaf never labelled: alone)."""
    if leaf not in previous_labels:
        return True
    label = previous_labels[leaf]
    return not any(previous_labels.get(other) == label for other in order if other != leaf)
