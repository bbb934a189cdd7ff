"""When a proposed partition of the leaves takes effect: once confirmed over consecutive rounds, or pair by pair.

Labels are ``int64`` arrays over ``order`` (leaf names, sorted); a proposal is keyed by ``((leaf, label), ...)``
so that it only counts again for the same partition of the same leaves.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from devsim.aggregation.cluster.threshold import canonical_labels, components_above

Proposal = tuple[tuple[str, int], ...]
"""A partition as ``((leaf, label), ...)`` in leaf order."""


class PartitionConfirmation:
    """The proposals awaiting confirmation (``pending``) and the recent proposals that pairs vote with (``history``).

    Args:
        rounds: Consecutive rounds the same proposal must be made before it takes effect (1: at once).
        pairs: Let pairs proposed together often enough join without the whole partition (``confirm_pairs``).
        window: Count a pair's votes over this many recent proposals (None: the last ``rounds`` only).
        companion: With pair votes, a lone leaf proposed with every member of a growing cluster in each of the
            last ``companion`` proposals joins it (None: never).
    """

    def __init__(self, rounds: int, pairs: bool, window: int | None, companion: int | None):
        self.rounds = rounds
        self.pairs = pairs
        self.window = window
        self.companion = companion
        self.pending: tuple[Proposal, int] | None = None
        self.history: list[Proposal] = []

    def confirmed(
        self, order: list[str], proposal: np.ndarray, previous_labels: Mapping[str, int], at_once: bool = False
    ) -> np.ndarray:
        """The labels of ``order`` in force after this round's ``proposal``.

        The partition in force is ``previous_labels`` of ``order`` (leaves never labelled: alone). A different
        proposal replaces it once the same partition of the same leaves was proposed ``rounds`` rounds in a row
        (or at once with ``at_once``); any other round (the partition in force proposed again, or a different
        proposal) restarts the count. With ``pairs``, besides, the pairs of leaves proposed together in each of
        the last ``rounds`` rounds (of the same leaves) join, with the clusters in force: a leaf that changes
        sides in one round holds back only itself, not every other group. With ``window``, a pair joins once
        proposed together in ``rounds`` of the last ``window`` proposals, counted across changes of the clusters
        in force (a re-split restarts them); with ``companion``, a lone leaf joins a cluster that grows by those
        votes when proposed with all its members in each of the last ``companion`` proposals (:meth:`companions`).
        """
        if self.rounds == 1 or at_once:
            self.pending, self.history = None, []
            return proposal
        current = canonical_labels([previous_labels.get(leaf, ("alone", leaf)) for leaf in order])
        key = tuple(zip(order, proposal.tolist(), strict=True))
        window = self.rounds if self.window is None else self.window
        if self.pairs:
            same_leaves = bool(self.history) and [leaf for leaf, _ in self.history[-1]] == order
            self.history = [*(self.history if same_leaves else [])[-(window - 1) :], key]
        if np.array_equal(current, proposal):
            self.pending = None
            return proposal
        count = self.pending[1] + 1 if self.pending is not None and self.pending[0] == key else 1
        if count >= self.rounds:
            self.took_effect()
            return proposal
        self.pending = (key, count)
        if self.pairs and len(self.history) >= self.rounds:
            # Linked: together in force, or together in `rounds` of the last `window` proposals (without
            # a window: in every one of the last `rounds`).
            pairs = [np.equal.outer(row, row) for row in ([label for _, label in entry] for entry in self.history)]
            together = (np.sum(pairs, axis=0) >= self.rounds) | np.equal.outer(current, current)
            joined = components_above(together.astype(np.float64), 0.5)
            if self.companion is not None and not np.array_equal(joined, current):
                joined = self.companions(current, joined, np.all(pairs[-self.companion :], axis=0))
            if not np.array_equal(joined, current):
                self.took_effect()
                return joined
        return current

    @staticmethod
    def companions(current: np.ndarray, joined: np.ndarray, recent: np.ndarray) -> np.ndarray:
        """``joined`` (the clusters after this round's pair votes) with each leaf that is alone in ``current`` and
        in ``joined`` added to the one cluster that grew by votes this round and that it was proposed together
        with, every member, in each of the last ``companion`` proposals (``recent``, (L, L) bool: the pairs
        together in all of them); a leaf that qualifies for two such clusters, or for none, stays alone. Only a
        cluster that grows draws companions: once its members share a model, a leaf left alone is held apart by
        their closely agreeing drifts."""
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

    def took_effect(self) -> None:
        """A proposal (or pairs of it) took effect: the count restarts; so do the pair votes, unless they are
        counted over a ``window`` (a pair's votes stay evidence about the pair whatever joined meanwhile)."""
        self.pending = None
        if self.window is None:
            self.history = []

    def split_took_effect(self) -> None:
        """A re-split took effect: votes counted over a ``window`` before it would join its parts again."""
        if self.window is not None:
            self.history = []
