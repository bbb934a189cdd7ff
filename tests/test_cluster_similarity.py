"""Cluster similarity sources, threshold selection and partition scores (fast, pure numpy)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devsim.aggregation.base import LeafUpdate
from devsim.aggregation.cluster import ClusterAggregation, canonical_labels, components_above
from devsim.aggregation.cluster.similarity import layer_blocks, leaf_vector
from devsim.aggregation.cluster.threshold import (
    adjusted_rand_index,
    candidate_thresholds,
    choose_threshold,
    largest_gap_threshold,
    silhouette,
    silhouette_threshold,
    split_summary,
)


def block_similarity(groups: list[int], within: float, between: float, noise: float, seed: int) -> np.ndarray:
    """Symmetric similarity with ``within`` inside groups and ``between`` across, plus uniform noise."""
    rng = np.random.default_rng(seed)
    g = np.asarray(groups)
    s = np.where(g[:, None] == g[None, :], within, between) + rng.uniform(-noise, noise, (len(g), len(g)))
    s = (s + s.T) / 2
    np.fill_diagonal(s, 1.0)
    return np.clip(s, 0.0, 1.0)


def test_ari_matches_known_values() -> None:
    assert adjusted_rand_index([0, 0, 1, 1], [1, 1, 0, 0]) == 1.0
    assert adjusted_rand_index([0, 0, 1, 1], [0, 1, 0, 1]) == pytest.approx(-0.5)
    # scikit-learn's documented example: adjusted_rand_score([0, 0, 1, 2], [0, 0, 1, 1]) == 0.5714...
    assert adjusted_rand_index([0, 0, 1, 2], [0, 0, 1, 1]) == pytest.approx(0.5714285714285714)
    assert adjusted_rand_index([0, 0, 0, 0], [0, 0, 0, 0]) == 1.0
    with pytest.raises(ValueError, match="differ in length"):
        adjusted_rand_index([0, 1], [0, 1, 2])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=2, max_size=12), st.integers(0, 10**6))
def test_ari_is_one_on_relabelled_partition_and_symmetric(labels: list[int], seed: int) -> None:
    perm = np.random.default_rng(seed).permutation(4)
    relabelled = perm[np.asarray(labels)]
    assert adjusted_rand_index(labels, relabelled) == pytest.approx(1.0)
    other = np.random.default_rng(seed + 1).integers(0, 3, len(labels))
    assert adjusted_rand_index(labels, other) == pytest.approx(adjusted_rand_index(other, labels))
    assert adjusted_rand_index(labels, other) <= 1.0 + 1e-12


def test_silhouette_perfect_blocks_and_degenerate_partitions() -> None:
    s = block_similarity([0, 0, 1, 1], within=1.0, between=0.0, noise=0.0, seed=0)
    assert silhouette(s, [0, 0, 1, 1]) == pytest.approx(1.0)
    assert silhouette(s, [0, 1, 0, 1]) < 0
    assert np.isnan(silhouette(s, [0, 0, 0, 0]))
    assert np.isnan(silhouette(s, [0, 1, 2, 3]))


@settings(max_examples=80, deadline=None)
@given(
    st.integers(2, 4),
    st.integers(2, 4),
    st.floats(0.6, 0.95),
    st.floats(0.0, 0.25),
    st.integers(0, 10**6),
)
def test_silhouette_threshold_recovers_separated_blocks(
    num_groups: int, per_group: int, within: float, gap_fraction: float, seed: int
) -> None:
    """Whenever every within-group pair is above every between-group pair by a clear margin (block
    silhouette above the 0.4 minimum: within >= 0.6, between <= within / 4), the silhouette threshold
    recovers the groups exactly (any group count, any shuffle of the leaves)."""
    rng = np.random.default_rng(seed)
    groups = rng.permutation(np.repeat(np.arange(num_groups), per_group)).tolist()
    between = within * gap_fraction
    noise = min(0.05, (within - between) / 6)
    s = block_similarity(groups, within, between, noise, seed)
    labels = components_above(s, silhouette_threshold(s))
    assert adjusted_rand_index(groups, labels) == 1.0
    summary = split_summary(s, labels, [silhouette_threshold(s)])
    assert summary["margin"] is not None and summary["margin"] > 0


def test_no_structure_gives_one_cluster() -> None:
    s = block_similarity([0] * 6, within=0.8, between=0.8, noise=0.05, seed=3)
    tau = silhouette_threshold(s)
    assert canonical_labels(components_above(s, tau)).max() == 0
    summary = split_summary(s, components_above(s, tau), [tau])
    assert summary["between_max"] is None and summary["within_min"] == pytest.approx(s[np.triu_indices(6, 1)].min())


def test_gap_threshold_and_candidates() -> None:
    s = block_similarity([0, 0, 1, 1, 2, 2], within=0.9, between=0.1, noise=0.02, seed=1)
    tau = largest_gap_threshold(s)
    assert 0.12 < tau < 0.88
    assert adjusted_rand_index([0, 0, 1, 1, 2, 2], components_above(s, tau)) == 1.0
    assert np.all(np.diff(candidate_thresholds(s)) > 0)
    assert choose_threshold(s, "gap") == tau
    with pytest.raises(ValueError, match="silhouette, gap"):
        choose_threshold(s, "median")


def _update(leaf: str, values: dict[str, list[float]], weight: float = 2.0) -> LeafUpdate:
    return LeafUpdate(leaf, {k: np.asarray(v, dtype=np.float32) * weight for k, v in values.items()}, weight, 1)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 4))
def test_layer_normalised_cosine_is_mean_of_layer_cosines(seed: int, layers: int) -> None:
    """With per-layer unit blocks the cosine of two leaves is the mean over layers of their per-layer cosines."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 50, layers)
    model = {f"l{i}.weight": np.zeros(n, np.float32) for i, n in enumerate(sizes)}
    a = {k: rng.normal(size=v.shape).tolist() for k, v in model.items()}
    b = {k: rng.normal(size=v.shape).tolist() for k, v in model.items()}
    va = leaf_vector("layer_updates", model, _update("a", a), last_layer_keys=["l0.weight"])
    vb = leaf_vector("layer_updates", model, _update("b", b), last_layer_keys=["l0.weight"])
    per_layer = [np.dot(a[k], b[k]) / (np.linalg.norm(a[k]) * np.linalg.norm(b[k])) for k in model]
    cosine = va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb))
    assert cosine == pytest.approx(np.mean(per_layer), abs=1e-5)
    assert layer_blocks(["a.b.weight", "a.b.bias", "c.weight"]) == [["a.b.weight", "a.b.bias"], ["c.weight"]]


def test_split_source_links_only_leaves_that_trained_from_one_model() -> None:
    shared = {"f.weight": np.zeros(3, np.float32), "head.weight": np.zeros(2, np.float32)}
    other = {"f.weight": np.ones(3, np.float32), "head.weight": np.zeros(2, np.float32)}
    same_direction = {"f.weight": [1.0, 0.0, 0.0], "head.weight": [1.0, 0.0]}
    models = {"a": shared, "b": dict(shared), "c": other}
    updates = [_update(leaf, same_direction) for leaf in models]
    strategy = ClusterAggregation(tau=None, similarity_on="layer_updates", last_layer_keys=["head.weight"])
    result = strategy.aggregate_clusters(models, updates)
    # a and b trained from equal models and point the same way: one cluster; c is never compared with them.
    assert result.labels == {"a": 0, "b": 0, "c": 1}
    assert result.similarity[0, 2] == pytest.approx(1.0)
    assert result.similarity_summary["between_max"] is None
    assert len(result.thresholds) == 2
    assert len(strategy.state_dict()["pair_similarity"]) == 1
    restored = ClusterAggregation(tau=None, similarity_on="layer_updates", last_layer_keys=["head.weight"])
    restored.load_state_dict(strategy.state_dict())
    assert restored.state_dict() == strategy.state_dict()


def test_split_source_smooths_pair_similarity_over_rounds() -> None:
    model = {"f.weight": np.zeros(2, np.float32)}
    strategy = ClusterAggregation(tau=0.5, similarity_on="layer_updates", last_layer_keys=["f.weight"], memory=0.5)
    first = strategy.aggregate_clusters(
        {"a": model, "b": model}, [_update("a", {"f.weight": [1, 0]}), _update("b", {"f.weight": [1, 0]})]
    )
    assert first.labels == {"a": 0, "b": 0}
    shared = first.leaf_models["a"]
    second = strategy.aggregate_clusters(
        {"a": shared, "b": shared}, [_update("a", {"f.weight": [1, 0]}), _update("b", {"f.weight": [0, 1]})]
    )
    # raw similarity 0, smoothed 0.5 * 1 + 0.5 * 0 = 0.5: not above tau = 0.5, so the pair splits.
    assert second.similarity_summary["between_max"] == pytest.approx(0.5)
    assert second.labels == {"a": 0, "b": 1}
    with pytest.raises(ValueError, match="memory"):
        ClusterAggregation(tau=0.5, similarity_on="layer_updates", last_layer_keys=["f.weight"], memory=1.0)
