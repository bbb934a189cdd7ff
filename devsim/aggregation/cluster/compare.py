"""What the strategy compares for each leaf, and which leaves can be compared on their updates.

A leaf's vector (:func:`~devsim.aggregation.cluster.similarity.leaf_vector`) decides the partition; its update
vector (:func:`~devsim.aggregation.cluster.similarity.update_vector`, the same entries) says where its data pull
the model it trained from, so only leaves that trained from one model compare on updates. Vectors are
``float64`` ``(D,)``; stacks of them ``(L, D)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from devsim.aggregation.base import LeafUpdate, Weights
from devsim.aggregation.cluster.cosine import cosine_similarity_centred, pair_cosine
from devsim.aggregation.cluster.similarity import entry_sizes, leaf_vector, scale_entries, update_vector


def same_model_groups(order: list[str], models: Mapping[str, Weights]) -> list[list[int]]:
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


@dataclass
class LeafComparison:
    """The vectors of ``similarity_on`` for one leaf and the cosines built on them.

    Attributes:
        similarity_on: One of :data:`~devsim.aggregation.cluster.similarity.SIMILARITY_SOURCES`.
        last_layer_keys: Model entries of the classifier's last layer.
        reference: The initial model (drift sources), or None.
        scale: Divide each model entry's columns by its spread across the leaves before a centred cosine.
        sizes: Sizes of the entries that make up a vector, in order (set each round by :meth:`start_round`).
    """

    similarity_on: str
    last_layer_keys: list[str]
    reference: Weights | None
    scale: bool
    sizes: list[int] = field(default_factory=list)

    def start_round(self, model: Weights, update: LeafUpdate) -> None:
        """Take this round's entry sizes from one leaf's model and update."""
        self.sizes = entry_sizes(self.similarity_on, model, update, last_layer_keys=self.last_layer_keys)

    def vector(self, model: Weights, update: LeafUpdate) -> np.ndarray:
        """The vector compared for one leaf (what the partition is decided on)."""
        return leaf_vector(
            self.similarity_on, model, update, last_layer_keys=self.last_layer_keys, reference=self.reference
        )

    def update(self, model: Weights, update: LeafUpdate) -> np.ndarray:
        """The update counterpart of the compared vector for one leaf (what a re-split compares)."""
        return update_vector(self.similarity_on, model, update, last_layer_keys=self.last_layer_keys)

    def centred(self, vectors: np.ndarray) -> np.ndarray:
        """Centred cosines ``(L, L)`` of ``vectors`` ``(L, D)``; with ``scale`` each entry is divided by its
        spread across the rows first."""
        return cosine_similarity_centred(scale_entries(vectors, self.sizes) if self.scale else vectors)

    def step(self, model: Weights, start: Weights, end: Weights) -> np.ndarray:
        """The step from ``start`` to ``end`` on the entries of an update vector from ``model``."""
        step = {k: np.asarray(end[k], np.float64) - np.asarray(start[k], np.float64) for k in model}
        return update_vector(
            self.similarity_on, model, LeafUpdate("", step, 1.0, 0), last_layer_keys=self.last_layer_keys
        )

    def step_cosine(self, update: np.ndarray, model: Weights, start: Weights, end: Weights) -> float:
        """Cosine of ``update`` (a leaf's update vector, from ``model``) with the step from ``start`` to ``end``:
        > 0 when the leaf's data pull its model that way."""
        return pair_cosine(update, self.step(model, start, end))

    def pull(self, vectors: np.ndarray, part: np.ndarray, model: Weights, other: Weights) -> float:
        """Cosine of a part's mean update minus the other members' mean update (``vectors`` ``(L, D)`` rows,
        ``part`` an ``(L,)`` boolean mask) with the step from the cluster's ``model`` to ``other``: > 0 when the
        part's data pull the shared model towards ``other``, about 0 for an unrelated direction."""
        direction = vectors[part].mean(axis=0) - vectors[~part].mean(axis=0)
        return pair_cosine(direction, self.step(model, model, other))
