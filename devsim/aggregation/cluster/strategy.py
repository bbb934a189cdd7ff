"""Cluster aggregation at the top tier: the strategy that groups leaves and gives each cluster one model.

Each round every leaf with an update has a leaf model ``m = model + delta_sum / total_weight``. One vector per
leaf (:class:`~devsim.aggregation.cluster.compare.LeafComparison`) is compared by cosine; the partition proposed
from the similarities (threshold ``tau`` or chosen per round, :mod:`~devsim.aggregation.cluster.threshold`) takes
effect once confirmed (:mod:`~devsim.aggregation.cluster.confirm`); a cluster in force may be split again
(:mod:`~devsim.aggregation.cluster.resplit`) and a lone leaf may join a cluster
(:mod:`~devsim.aggregation.cluster.lone`). Every member of a cluster receives the cluster's sample-weighted model
next round. docs/concepts.md#cluster-aggregation explains each step and the measurements behind its defaults.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from devsim.aggregation.base import LeafUpdate, Weights
from devsim.aggregation.cluster.compare import LeafComparison
from devsim.aggregation.cluster.confirm import PartitionConfirmation
from devsim.aggregation.cluster.cosine import all_pairs_agree, assignment_churn, cosine_similarity_abs
from devsim.aggregation.cluster.lone import LoneJoins
from devsim.aggregation.cluster.resplit import ClusterResplit
from devsim.aggregation.cluster.result import ClusterResult, checked_updates, weighted_cluster_model
from devsim.aggregation.cluster.similarity import DRIFT_SOURCES, SIMILARITY_SOURCES, SPLIT_SOURCES
from devsim.aggregation.cluster.threshold import (
    DEFAULT_MIN_SILHOUETTE,
    THRESHOLD_METHODS,
    all_in_one_threshold,
    canonical_labels,
    choose_threshold,
    components_above,
    split_summary,
)
from devsim.aggregation.cluster.update_splits import UpdateSplits

AGREE_SOURCES: tuple[str, ...] = ("drift", "updates")
"""Values of ``ClusterAggregation(agree_on=...)``: what "every pair agrees" is judged on (drift sources)."""


class ClusterAggregation:
    """Server-side clustered aggregation over leaves (one model per cluster of similar leaves).

    ``global_lr`` semantics: the cluster model is
    ``mean_w(leaf_model_i) + global_lr * sum_i(delta_sum_i) / sum_i(total_weight_i)`` with ``mean_w``
    the sample-weighted (``total_weight``) mean over the cluster's members of the model each trained
    from. With ``global_lr = 1`` this is the sample-weighted average of the leaf-level models
    ``m``; when all members trained from the same model it is exactly FedAvg restricted to
    the cluster.

    Leaves without an update this round keep their model and their previous cluster (they share a
    label only with other non-updated leaves that shared it before; leaves never clustered are
    singletons). Labels are re-canonicalised each round, so label numbers are not stable across
    rounds; use :func:`assignment_churn` (the ``churn`` field) to track membership changes.

    Accuracy gate (``gate_margin`` not None): for each updated leaf, if
    ``score(leaf, cluster_model) < score(leaf, previous_model) - gate_margin`` the leaf keeps its
    previous model (the one it trained from this round) and is listed in ``gated``; it keeps its
    cluster label. A negative margin demands an improvement of at least ``-gate_margin``.

    Partition settings (docs/concepts.md#cluster-aggregation): ``tau`` fixes the link threshold (None: chosen
    each round by ``threshold_method``, bar ``min_silhouette``); ``centre`` (drift sources, automatic threshold)
    decides the split on centred cosines, ``scale_entries`` scales each entry by its spread first; ``agree_on``
    (one of :data:`AGREE_SOURCES`) is what "every pair agrees" is judged on; ``memory`` smooths the pair
    similarities of ``layer_updates``. Confirmation
    (:class:`~devsim.aggregation.cluster.confirm.PartitionConfirmation`): ``confirm_rounds``, ``confirm_pairs``,
    ``pair_window`` (None, or an int >= ``confirm_rounds``) and ``pair_companion`` (None, or an int >= 1; both
    need ``confirm_pairs``). ``resplit_silhouette`` (:class:`~devsim.aggregation.cluster.resplit.ClusterResplit`)
    and ``lone_pull`` (None, or in [-1, 1); :class:`~devsim.aggregation.cluster.lone.LoneJoins`) apply to every
    source but ``layer_updates``. The constructor's defaults are the earlier behaviour (bar 0.4, no centring, at
    once, no re-split, unscaled, agreement on drift, whole partitions confirmed, no pair window, no companions, no
    lone joins); the cluster job passes ``ClusterConfig``'s values
    (:func:`~devsim.aggregation.cluster.result.config_settings`).
    """

    server_optimizer = None
    """None: one model per cluster takes no server optimizer (``ClusterConfig`` refuses one), as the synchronous
    strategies' interface (:class:`~devsim.aggregation.base.SyncStrategy`) has it."""

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
        self._comparison = LeafComparison(similarity_on, self.last_layer_keys, reference, self.scale_entries)
        # What the round remembers (state_dict): the labels in force and each step's pending evidence.
        self._previous_labels: dict[str, int] = {}
        self._splits = UpdateSplits(self.memory)
        self._confirmation = PartitionConfirmation(
            self.confirm_rounds, self.confirm_pairs, self.pair_window, self.pair_companion
        )
        self._resplits = ClusterResplit(self.resplit_silhouette, self.confirm_rounds)
        self._lone = LoneJoins(self.lone_pull, self.confirm_rounds)

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
        by_leaf = checked_updates(leaf_models, updates, self.last_layer_keys)
        order = sorted(by_leaf)
        models = {leaf: leaf_models[leaf] for leaf in order}

        if order:
            first = order[0]
            self._comparison.start_round(models[first], by_leaf[first])
            vectors = np.stack([self._comparison.vector(models[leaf], by_leaf[leaf]) for leaf in order])
            similarity = cosine_similarity_abs(vectors)
            agreement = None
            if self.agree_on == "updates" and self.similarity_on in DRIFT_SOURCES:
                # Every leaf's drift holds the shrink of the initial weights that all leaves undergo alike
                # (weight decay), which puts every absolute drift cosine near 1 whatever the groups.
                agreement = cosine_similarity_abs(
                    np.stack([self._comparison.update(models[leaf], by_leaf[leaf]) for leaf in order])
                )
            round_labels, thresholds, compared = self._partition(order, models, similarity, vectors, agreement)
        else:
            round_labels, similarity = np.zeros(0, dtype=np.int64), np.zeros((0, 0))
            thresholds, compared = [], similarity
        pending = self._confirmation.pending[1] if self._confirmation.pending is not None else 0
        checks: list[dict[str, Any]] = []
        adopters: set[str] = set()
        if self.resplit_silhouette is not None and self.similarity_on not in SPLIT_SOURCES:
            round_labels, checks, adopters = self._resplits.refine(
                order, models, by_leaf, round_labels, self._previous_labels, self._comparison, self._confirmation
            )
        lone: list[dict[str, Any]] = []
        if self.lone_pull is not None and self.similarity_on not in SPLIT_SOURCES:
            round_labels, lone, joined = self._lone.joins(
                order, models, by_leaf, round_labels, self._previous_labels, self._resplits.apart, self._comparison
            )
            adopters |= joined

        new_models: dict[str, Weights] = dict(leaf_models)
        gated: list[str] = []
        for cluster in range(int(round_labels.max()) + 1 if order else 0):
            members = [leaf for leaf, label in zip(order, round_labels.tolist(), strict=True) if label == cluster]
            # Leaves that joined this cluster after a re-split trained from another model: they take the
            # model of the members that trained from this cluster's, without contributing.
            own = [m for m in members if m not in adopters] or members
            cluster_model = weighted_cluster_model([models[m] for m in own], [by_leaf[m] for m in own], self.global_lr)
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
        if self._splits.pair_similarity:
            state["pair_similarity"] = [[a, b, value] for (a, b), value in sorted(self._splits.pair_similarity.items())]
        confirmation = self._confirmation
        if confirmation.pending is not None:
            state["pending"] = {"labels": dict(confirmation.pending[0]), "rounds": confirmation.pending[1]}
        if self._resplits.apart:
            state["apart"] = [[a, b] for a, b in sorted(self._resplits.apart)]
        if confirmation.history:
            state["history"] = [dict(entry) for entry in confirmation.history]
        if self._lone.pending:
            state["lone_pending"] = [
                {"leaf": leaf, "target": list(target), "rounds": rounds}
                for leaf, (target, rounds) in sorted(self._lone.pending.items())
            ]
        if self._resplits.pending:
            state["split_pending"] = [
                {"members": list(members), "labels": list(labels), "rounds": rounds}
                for members, (labels, rounds) in sorted(self._resplits.pending.items())
            ]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        labels = state.get("previous_labels")
        if not isinstance(labels, Mapping):
            raise ValueError("state must hold 'previous_labels' as a mapping of leaf name to int label")
        self._previous_labels = {str(leaf): int(label) for leaf, label in labels.items()}
        self._splits.pair_similarity = {(str(a), str(b)): float(v) for a, b, v in state.get("pair_similarity", [])}
        pending = state.get("pending")
        self._confirmation.pending = None
        if pending is not None:
            proposal = tuple(sorted((str(leaf), int(label)) for leaf, label in pending["labels"].items()))
            self._confirmation.pending = (proposal, int(pending["rounds"]))
        self._resplits.apart = {(str(a), str(b)) for a, b in state.get("apart", [])}
        self._confirmation.history = [
            tuple(sorted((str(leaf), int(label)) for leaf, label in entry.items()))
            for entry in state.get("history", [])
        ]
        self._resplits.pending = {
            tuple(str(m) for m in entry["members"]): (tuple(int(x) for x in entry["labels"]), int(entry["rounds"]))
            for entry in state.get("split_pending", [])
        }
        self._lone.pending = {
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

        Weight and drift sources: one threshold over all pairs, the proposal confirmed (:meth:`_confirmed`).
        Split sources: each group of leaves that trained from one model is split on its own
        (:class:`~devsim.aggregation.cluster.update_splits.UpdateSplits`; pairs not compared are NaN).
        """
        if self.similarity_on in SPLIT_SOURCES:
            return self._splits.partition(order, models, similarity, self.tau, self.threshold_method)
        threshold, compared, agree, fallback = self.tau, similarity, None, "together"
        centred = threshold is None and self.similarity_on in DRIFT_SOURCES and self.centre
        if threshold is None and self.similarity_on in DRIFT_SOURCES:
            # Merging is hard to undo (members then share a model), so without a clear split every
            # leaf stays alone; the split is judged on centred drift, agreement on absolute cosines.
            fallback, agree = "alone", similarity if agreement is None else agreement
            if centred:
                compared = self._comparison.centred(vectors)
        if self._resplits.apart:
            # Pairs a re-split separated: their drifts still hold the history they shared.
            compared = self._resplits.keep_apart(order, compared, -1.0 if centred else 0.0)
            agree = None if agree is None else self._resplits.keep_apart(order, agree, 0.0)
        if threshold is None:
            alone = len({self._previous_labels.get(leaf, ("alone", leaf)) for leaf in order}) == len(order)
            if self.centre and agree is not None and alone and all_pairs_agree(agree):
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

    def _confirmed(self, order: list[str], proposal: np.ndarray, at_once: bool = False) -> np.ndarray:
        """The labels of ``order`` in force after this round's ``proposal``
        (:meth:`~devsim.aggregation.cluster.confirm.PartitionConfirmation.confirmed`)."""
        return self._confirmation.confirmed(order, proposal, self._previous_labels, at_once)

    def _cluster_id(self, leaf: str, round_of: Mapping[str, int]) -> tuple[str, Any]:
        """Pre-canonical cluster id: this round's cluster, else the previous label, else a singleton."""
        if leaf in round_of:
            return ("round", round_of[leaf])
        if leaf in self._previous_labels:
            return ("kept", self._previous_labels[leaf])
        return ("alone", leaf)
