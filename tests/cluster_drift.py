"""A drift-similarity cluster strategy over one 4-value entry, with clusters already in force: the setting of the
re-split and lone-pull tests."""

from __future__ import annotations

import numpy as np

from devsim.aggregation.cluster import ClusterAggregation

KEY = "w.weight"
ZERO = {KEY: np.zeros(4, np.float32)}


def drift_strategy(labels: dict[str, int], **options) -> ClusterAggregation:
    """Centred model-drift clustering (silhouette floor 0.25) with ``options``, after a round that left ``labels``
    (leaf -> cluster) in force."""
    strategy = ClusterAggregation(
        tau=None,
        similarity_on="model_drift",
        last_layer_keys=[KEY],
        reference=ZERO,
        min_silhouette=0.25,
        centre=True,
        **options,
    )
    strategy.load_state_dict({"previous_labels": dict(labels)})
    return strategy
