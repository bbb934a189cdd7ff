"""Cluster aggregation over leaves: leaves whose models point the same way share one model.

:class:`ClusterAggregation` is the strategy; its parts, one job each: :mod:`.similarity` (the vector compared per
leaf), :mod:`.cosine` (cosines and the partitions they give), :mod:`.threshold` (choosing the link threshold,
scoring partitions), :mod:`.confirm` (when a proposed partition takes effect), :mod:`.resplit` (splitting a wrong
merge on the members' updates), :mod:`.lone` (a lone leaf joining the cluster its updates pull towards) and
:mod:`.result` (the round's outcome, the settings from ``ClusterConfig``). docs/concepts.md#cluster-aggregation
describes the method.
"""

from devsim.aggregation.cluster.cosine import (
    assignment_churn,
    cluster_by_similarity,
    cosine_similarity_abs,
    cosine_similarity_centred,
)
from devsim.aggregation.cluster.resplit import JOIN_PULL
from devsim.aggregation.cluster.result import ClusterResult, config_settings, leaf_models_for_round
from devsim.aggregation.cluster.similarity import SIMILARITY_SOURCES
from devsim.aggregation.cluster.strategy import AGREE_SOURCES, ClusterAggregation
from devsim.aggregation.cluster.threshold import THRESHOLD_METHODS, canonical_labels, components_above

__all__ = [
    "AGREE_SOURCES",
    "JOIN_PULL",
    "SIMILARITY_SOURCES",
    "THRESHOLD_METHODS",
    "ClusterAggregation",
    "ClusterResult",
    "assignment_churn",
    "canonical_labels",
    "cluster_by_similarity",
    "components_above",
    "config_settings",
    "cosine_similarity_abs",
    "cosine_similarity_centred",
    "leaf_models_for_round",
]
