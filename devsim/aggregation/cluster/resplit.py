"""Undoing a wrong merge: a cluster in force is split when its members' updates disagree, round after round.

Once a leaf shares a cluster's model its drift follows the cluster's, so drift cannot show that it does not
belong; the members' updates can, since they all trained from one model. Labels are ``int64`` arrays over
``order`` (leaf names, sorted).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from devsim.aggregation.base import LeafUpdate, Weights
from devsim.aggregation.cluster.compare import LeafComparison, same_model_groups
from devsim.aggregation.cluster.confirm import PartitionConfirmation
from devsim.aggregation.cluster.threshold import canonical_labels, components_above, silhouette, silhouette_threshold

JOIN_PULL: float = 0.15
"""A part split off a cluster joins another cluster when its pull towards that cluster's model
(:meth:`~devsim.aggregation.cluster.compare.LeafComparison.pull`) exceeds this; a lone leaf needs it too
(docs/concepts.md#cluster-aggregation gives the values measured)."""


class ClusterResplit:
    """The splits of clusters in force awaiting confirmation, and the pairs of leaves a split separated.

    Args:
        bar: Silhouette a split of a cluster's centred update cosines must exceed (``resplit_silhouette``;
            None: no re-split, only :meth:`keep_apart` of pairs restored from a saved state).
        rounds: Consecutive rounds the same split of the same members must be proposed (``confirm_rounds``).
    """

    def __init__(self, bar: float | None, rounds: int):
        self.bar = bar
        self.rounds = rounds
        self.pending: dict[tuple[str, ...], tuple[tuple[int, ...], int]] = {}
        self.apart: set[tuple[str, str]] = set()

    def keep_apart(self, order: list[str], similarity: np.ndarray, floor: float) -> np.ndarray:
        """A copy of ``similarity`` ``(L, L)`` over ``order`` with the pairs that a split separated set to ``floor``:
        their drifts still hold the history they shared."""
        out = np.array(similarity, dtype=np.float64, copy=True)
        index = {leaf: i for i, leaf in enumerate(order)}
        for a, b in self.apart:
            if a in index and b in index:
                out[index[a], index[b]] = out[index[b], index[a]] = floor
        return out

    def refine(
        self,
        order: list[str],
        models: Mapping[str, Weights],
        by_leaf: Mapping[str, LeafUpdate],
        labels: np.ndarray,
        previous_labels: Mapping[str, int],
        comparison: LeafComparison,
        confirmation: PartitionConfirmation,
    ) -> tuple[np.ndarray, list[dict[str, Any]], set[str]]:
        """``labels`` of ``order`` refined by the splits of clusters in force that take effect this round, the
        records (``ClusterResult.resplit``) and the leaves that joined another cluster (adopters: they take that
        cluster's model without contributing to it).

        A cluster in force is a label of ``previous_labels``; its members of ``order`` that trained from the same
        model (3 or more; 2 centred vectors always point opposite ways) are checked on the centred cosines of
        their updates. The best split is proposed when its silhouette exceeds ``bar`` and takes effect once the
        same split of the same members was proposed ``rounds`` rounds in a row. A split that takes effect divides
        those members as proposed; leaves of their cluster in ``labels`` that were not checked stay with the part
        of the first member. Splits awaiting confirmation are forgotten when their members are not checked again
        with the same split proposed. A part whose pull towards another cluster of this round exceeds
        :data:`JOIN_PULL` joins the cluster with the highest pull: it takes that cluster's label and model.
        """
        assert self.bar is not None
        clusters: dict[int, list[str]] = {}
        for leaf in order:
            if leaf in previous_labels:
                clusters.setdefault(previous_labels[leaf], []).append(leaf)
        index = {leaf: i for i, leaf in enumerate(order)}
        ids: list[tuple[int, int]] = [(int(label), 0) for label in labels.tolist()]
        pending: dict[tuple[str, ...], tuple[tuple[int, ...], int]] = {}
        checks: list[dict[str, Any]] = []
        adopters: set[str] = set()
        for members in sorted(clusters.values()):
            for group in same_model_groups(members, models):
                if len(group) < 3:
                    continue
                names = tuple(members[i] for i in group)
                vectors = np.stack([comparison.update(models[leaf], by_leaf[leaf]) for leaf in names])
                compared = comparison.centred(vectors)
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
                if not (np.isfinite(best) and best > self.bar + 1e-12):
                    continue
                key = tuple(candidate.tolist())
                earlier = self.pending.get(names)
                count = earlier[1] + 1 if earlier is not None and earlier[0] == key else 1
                parts = [[leaf for leaf, p in zip(names, key, strict=True) if p == n] for n in range(max(key) + 1)]
                check.update(parts=parts, rounds=count)
                if count < self.rounds:
                    pending[names] = (key, count)
                    continue
                check["split"] = True
                confirmation.split_took_effect()
                for leaf, part in zip(names, key, strict=True):
                    ids[index[leaf]] = (ids[index[leaf]][0], part)
                for (a, part_a), (b, part_b) in itertools.combinations(zip(names, key, strict=True), 2):
                    if part_a != part_b:
                        self.apart.add((a, b))
                others = [
                    other[0] for other in sorted(clusters.values()) if other is not members and other[0] not in names
                ]
                check["pull"], check["joined"] = [], []
                for n, part in enumerate(parts):
                    mask = np.array([p == n for p in key])
                    pulls = [comparison.pull(vectors, mask, models[names[0]], models[leaf]) for leaf in others]
                    best_pull = max(pulls, default=None)
                    target = others[pulls.index(best_pull)] if best_pull is not None and best_pull > JOIN_PULL else None
                    check["pull"].append(best_pull)
                    joined = None if target is None else _members_in_force(target, order, previous_labels)
                    check["joined"].append(joined)
                    if target is not None:
                        for leaf in part:
                            ids[index[leaf]] = ids[index[target]]
                            adopters.add(leaf)
        self.pending = pending
        return canonical_labels(ids), checks, adopters


def _members_in_force(leaf: str, order: list[str], previous_labels: Mapping[str, int]) -> list[str]:
    """The leaves of ``order`` that shared ``leaf``'s label last round (its cluster in force)."""
    label = previous_labels[leaf]
    return [other for other in order if previous_labels.get(other) == label]
