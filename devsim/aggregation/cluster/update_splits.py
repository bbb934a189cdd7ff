"""The partition for a split source (``layer_updates``): each group of leaves that trained from one model is
split on its own, on pair similarities smoothed over rounds, so clusters only ever split.

One round's updates mean the same thing only for leaves that started from the same model, so leaves of
different groups are never compared or linked. Similarities are ``(L, L)`` over ``order`` (leaf names, sorted).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from devsim.aggregation.base import Weights
from devsim.aggregation.cluster.compare import same_model_groups
from devsim.aggregation.cluster.threshold import canonical_labels, choose_threshold, components_above


class UpdateSplits:
    """The smoothed similarity of each pair that keeps training from a shared model.

    Args:
        memory: Weight of the previous value: ``memory * previous + (1 - memory) * current``, in [0, 1).
    """

    def __init__(self, memory: float):
        self.memory = memory
        self.pair_similarity: dict[tuple[str, str], float] = {}

    def partition(
        self,
        order: list[str],
        models: Mapping[str, Weights],
        similarity: np.ndarray,
        tau: float | None,
        threshold_method: str,
    ) -> tuple[np.ndarray, list[float], np.ndarray]:
        """This round's labels of ``order``, one threshold per group (``tau``, or chosen by ``threshold_method``;
        in order of the groups' first leaf) and the smoothed similarities they were decided on (pairs of
        different groups NaN). Pairs that no longer share a model are forgotten."""
        compared = np.full(similarity.shape, np.nan)
        ids: list[tuple[int, int]] = [(0, 0)] * len(order)
        thresholds: list[float] = []
        memory: dict[tuple[str, str], float] = {}
        for number, members in enumerate(same_model_groups(order, models)):
            for i in members:
                for j in members:
                    key = (order[min(i, j)], order[max(i, j)])
                    value = float(similarity[i, j])
                    if i != j and key in self.pair_similarity:
                        value = self.memory * self.pair_similarity[key] + (1.0 - self.memory) * value
                    compared[i, j] = value
                    if i < j:
                        memory[key] = value
            sub = compared[np.ix_(members, members)]
            threshold = tau if tau is not None else choose_threshold(sub, threshold_method)
            thresholds.append(float(threshold))
            for i, label in zip(members, components_above(sub, threshold).tolist(), strict=True):
                ids[i] = (number, label)
        self.pair_similarity = memory
        return canonical_labels(ids), thresholds, compared
