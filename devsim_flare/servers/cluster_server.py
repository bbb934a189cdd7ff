"""Cluster aggregation across leaf nodes (synchronous rounds).

Each round every selected leaf trains from its cluster's model; the server forms each leaf's new
model, groups leaves by the absolute cosine similarity of the vectors ``--similarity-on`` names
(linked above ``--tau``, or above a threshold chosen each round when it is unset), averages
sample-weighted within each cluster and sends each leaf its cluster's model next round. Cluster
labels, the similarity matrix, the link threshold(s) used, how clear the split was (within-cluster
minimum, between-cluster maximum) and the assignment churn are recorded every round; evaluation is
per leaf, on the test set as that leaf's hidden group sees it.

The optional accuracy gate scores models on the server's copy of a leaf's group view of the test
set, standing in for the leaf's own held-out data (a simulation shortcut, documented).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from devsim.aggregation import LeafUpdate
from devsim.aggregation.cluster import ClusterAggregation, config_settings
from devsim.config import ClusterConfig
from devsim.models import last_layer_names
from devsim.observe.checkpoint import weights_to_tensors
from devsim_flare.servers.sync_server import SyncServer, Weights


class ClusterServer(SyncServer):
    """Server-side Collab object for cluster aggregation."""

    method = "cluster"
    config_cls = ClusterConfig

    def setup_strategy(self, config: ClusterConfig) -> None:
        keys = last_layer_names(self.task.build_model())
        self.strategy = ClusterAggregation(
            last_layer_keys=keys,
            threshold_method="silhouette",
            global_lr=config.global_lr,
            gate_margin=config.gate_margin,
            reference=self.weights,
            **config_settings(config),
        )
        self.current: dict[str, Weights] = {leaf: self.weights for leaf in self.leaves}

    def leaf_models(self, leaves: list[str]) -> dict[str, Weights]:
        return {leaf: self.current[leaf] for leaf in leaves}

    def aggregate(self, round_num: int, payloads: dict[str, dict], assignments: dict[str, np.ndarray]) -> dict:
        updates = [
            LeafUpdate(leaf, payloads[leaf]["delta_sum"], payloads[leaf]["total_weight"], len(assignments[leaf]))
            for leaf in self.leaves
            if leaf in payloads
        ]
        scorer = None
        if self.config.gate_margin is not None:
            scorer = lambda leaf, weights: self.score(weights, self.leaf_groups[leaf]).score  # noqa: E731
        result = self.strategy.aggregate_clusters(dict(self.current), updates, leaf_val_scores=scorer)
        self.current = dict(result.leaf_models)
        self.weights = _mean_model(list(self.current.values()))
        return {
            "num_clusters": int(result.num_clusters),
            "cluster_labels": {leaf: int(label) for leaf, label in result.labels.items()},
            "similarity_leaves": list(result.leaf_order),
            "similarity": np.round(result.similarity, 4).tolist(),
            "cluster_thresholds": [round(t, 4) for t in result.thresholds],
            "similarity_summary": _rounded(result.similarity_summary),
            "churn": int(result.churn),
            "pending_rounds": int(result.pending),
            "resplit": [
                {**check, "silhouette": None if check["silhouette"] is None else round(check["silhouette"], 4)}
                for check in result.resplit
            ],
            "gated": list(result.gated),
        }

    def evaluate(self) -> dict:
        """Global view (mean of all leaf models on the plain test set) and each leaf's own model on its
        group's view of the test set; models shared by a cluster are scored once per group."""
        overall = self.score(self.weights)
        cache: dict[tuple[int, int], float] = {}
        leaf_accuracy = {}
        for leaf, model in self.current.items():
            key = (id(model), self.leaf_groups[leaf])
            if key not in cache:
                cache[key] = self.score(model, self.leaf_groups[leaf]).accuracy
            leaf_accuracy[leaf] = cache[key]
        labels = self.strategy.state_dict().get("previous_labels", {})
        by_cluster: dict[int, list[float]] = {}
        for leaf, accuracy in leaf_accuracy.items():
            by_cluster.setdefault(int(labels.get(leaf, -1)), []).append(accuracy)
        cluster_accuracy = {str(label): float(np.mean(values)) for label, values in sorted(by_cluster.items())}
        return {
            **overall.record(),
            "cluster_accuracy": cluster_accuracy,
            **self._leaf_fields(leaf_accuracy),
        }

    def save_outputs(self, output_dir: str) -> None:
        """Besides ``final_model.pt`` (the mean of all leaf models), ``leaf_models.pt``: leaf -> its model."""
        torch.save(
            {leaf: weights_to_tensors(model) for leaf, model in self.current.items()},
            os.path.join(output_dir, "leaf_models.pt"),
        )

    def strategy_state(self) -> dict:
        return {"cluster": self.strategy.state_dict(), "leaf_models": self.current}

    def load_strategy_state(self, state: dict) -> None:
        self.strategy.load_state_dict(state["cluster"])
        self.current = state["leaf_models"]
        self.weights = _mean_model(list(self.current.values()))


def _rounded(summary: dict) -> dict:
    """The similarity summary with numbers rounded to 4 decimals (lists element-wise, None kept)."""
    out = {}
    for key, value in summary.items():
        if isinstance(value, list):
            out[key] = [round(float(v), 4) for v in value]
        else:
            out[key] = None if value is None else round(float(value), 4)
    return out


def _mean_model(models: list[Weights]) -> Weights:
    """Equal-weight average of models (the run's global view)."""
    return {k: np.mean([m[k] for m in models], axis=0).astype(np.float32) for k in models[0]}
