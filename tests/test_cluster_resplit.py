"""Issue #20: a confirmed cluster splits again when its members' updates disagree over rounds."""

from __future__ import annotations

import numpy as np
import pytest

from devsim.aggregation.base import LeafUpdate
from devsim.aggregation.cluster import ClusterAggregation, ClusterResult
from devsim.aggregation.cluster.similarity import update_vector
from devsim.config import ClusterConfig, ConfigError
from tests.cluster_drift import KEY, drift_strategy

# Two clusters in force: a wrong one (d belongs with e and f) and a correct pair.
WRONG = {"a": 0, "b": 0, "c": 0, "d": 0, "e": 1, "f": 1}


def _model(values: list[float]) -> dict[str, np.ndarray]:
    return {KEY: np.asarray(values, np.float32)}


def _strategy(resplit: float | None = 0.2, confirm: int = 2, labels: dict[str, int] = WRONG) -> ClusterAggregation:
    return drift_strategy(labels, confirm_rounds=confirm, resplit_silhouette=resplit)


def _start() -> dict[str, dict[str, np.ndarray]]:
    """a-d share model m0, e-f share m1; their drifts keep the clusters in force as they are."""
    m0, m1 = _model([3, 0, 0, 0]), _model([0, -3, 0, 0])
    return {leaf: m0 if label == 0 else m1 for leaf, label in WRONG.items()}


def _updates(rnd: int, d_disagrees: bool) -> list[LeafUpdate]:
    """Small updates: every leaf pulls along axis 1 with a little noise that differs per round; when
    ``d_disagrees``, d pulls towards m1 instead (from m0: down axes 0 and 1)."""
    rng = np.random.default_rng(rnd)
    rows = {leaf: np.array([0.0, 0.1, 0.0, 0.0]) + rng.normal(0, 0.01, 4) for leaf in "abcdef"}
    if d_disagrees:
        rows["d"] = np.array([-0.1, -0.1, 0.0, 0.0]) + rng.normal(0, 0.01, 4)
    return [LeafUpdate(leaf, {KEY: v.astype(np.float32)}, 1.0, 1) for leaf, v in rows.items()]


def _run(strategy: ClusterAggregation, rounds: int, d_disagrees: bool) -> list[ClusterResult]:
    models, results = _start(), []
    for rnd in range(rounds):
        result = strategy.aggregate_clusters(models, _updates(rnd, d_disagrees))
        models = result.leaf_models
        results.append(result)
    return results


def test_a_wrong_cluster_whose_updates_disagree_splits_after_confirmation_and_the_odd_leaf_joins_its_group() -> None:
    first, second = _run(_strategy(confirm=2), 2, d_disagrees=True)
    # Round 1: the split {a, b, c} | {d} is proposed once; the cluster holds.
    assert first.labels == WRONG
    (check,) = first.resplit
    assert check["members"] == ["a", "b", "c", "d"] and check["parts"] == [["a", "b", "c"], ["d"]]
    assert check["rounds"] == 1 and check["split"] is False and check["silhouette"] > 0.2
    # Round 2: confirmed. d's update pulls m0 towards m1, so d joins e and f and takes their model.
    assert second.labels == {"a": 0, "b": 0, "c": 0, "d": 1, "e": 1, "f": 1}
    (check,) = second.resplit
    assert check["split"] is True and check["rounds"] == 2
    assert check["joined"] == [None, ["e", "f"]]
    assert check["pull"][1] > 0.5 and check["pull"][0] < 0
    assert second.leaf_models["d"] is second.leaf_models["e"]
    # e and f's model is theirs alone: d, which trained from m0, did not contribute to it.
    expected = first.leaf_models["e"][KEY] + np.mean([u.delta_sum[KEY] for u in _updates(1, True)][4:], axis=0)
    np.testing.assert_allclose(second.leaf_models["e"][KEY], expected, atol=1e-6)


def test_without_resplit_the_wrong_cluster_holds() -> None:
    results = _run(_strategy(resplit=None, confirm=2), 4, d_disagrees=True)
    assert all(r.labels == WRONG and r.resplit == [] for r in results)


def test_a_cluster_whose_members_agree_never_splits() -> None:
    results = _run(_strategy(confirm=2), 8, d_disagrees=False)
    assert all(r.labels == WRONG for r in results)
    assert all(not check["split"] for r in results for check in r.resplit)


def test_a_split_needs_the_same_split_in_consecutive_rounds() -> None:
    strategy = _strategy(confirm=3)
    models = _start()
    for rnd, disagrees in enumerate([True, True, False, True, True]):
        result = strategy.aggregate_clusters(models, _updates(rnd, disagrees))
        models = result.leaf_models
        assert result.labels == WRONG, rnd
    assert strategy.state_dict()["split_pending"] == [
        {"members": ["a", "b", "c", "d"], "labels": [0, 0, 0, 1], "rounds": 2}
    ]
    result = strategy.aggregate_clusters(models, _updates(5, True))
    assert result.labels["d"] == result.labels["e"] != result.labels["a"]


def test_pairs_a_split_separated_stay_apart_and_the_state_round_trips() -> None:
    """d split off a, b, c but joined nobody; its drift still equals theirs (shared history), which would
    merge it back after confirmation. Kept apart, it stays alone."""
    labels = {"a": 0, "b": 0, "c": 0, "d": 1, "e": 2, "f": 2}
    m0, m1 = _model([3, 0, 0, 0]), _model([0, -3, 0, 0])
    models = {leaf: m1 if leaf in "ef" else m0 for leaf in labels}
    plain, kept = _strategy(resplit=0.2, confirm=2, labels=labels), _strategy(resplit=0.2, confirm=2, labels=labels)
    state = kept.state_dict() | {"apart": [["a", "d"], ["b", "d"], ["c", "d"]]}
    kept.load_state_dict(state)
    restored = _strategy(labels=labels)
    restored.load_state_dict(kept.state_dict())
    assert restored.state_dict() == kept.state_dict() == state
    for rnd in range(3):
        updates = _updates(rnd, d_disagrees=False)
        merged = plain.aggregate_clusters(models, updates)
        apart = kept.aggregate_clusters(models, updates)
        assert apart.labels["d"] not in (apart.labels["a"], apart.labels["e"])
    assert merged.labels["d"] == merged.labels["a"]
    assert kept.state_dict()["apart"] == state["apart"]


def test_update_vector_takes_the_update_on_the_entries_of_the_source() -> None:
    model = {"fc1.weight": np.ones((2, 2), np.float32), "fc2.weight": np.ones(2, np.float32)}
    delta = {"fc1.weight": np.full((2, 2), 6.0, np.float32), "fc2.weight": np.array([0.0, 3.0], np.float32)}
    update = LeafUpdate("x", delta, 3.0, 1)
    whole = update_vector("model_drift", model, update, last_layer_keys=["fc2.weight"])
    np.testing.assert_allclose(whole, [2, 2, 2, 2, 0, 1])
    layers = update_vector("layer_drift", model, update, last_layer_keys=["fc2.weight"])
    np.testing.assert_allclose(layers, [0.5, 0.5, 0.5, 0.5, 0, 1])
    last = update_vector("last_layer_weights", model, update, last_layer_keys=["fc2.weight"])
    np.testing.assert_allclose(last, [0, 1])
    with pytest.raises(ValueError, match="similarity_on"):
        update_vector("nope", model, update, last_layer_keys=["fc2.weight"])


def test_resplit_settings_are_checked() -> None:
    assert ClusterConfig().validate().resplit_silhouette == 0.2
    assert ClusterConfig(resplit_silhouette=None).validate().resplit_silhouette is None
    with pytest.raises(ConfigError, match="resplit-silhouette"):
        ClusterConfig(resplit_silhouette=1.0).validate()
    with pytest.raises(ValueError, match="resplit_silhouette"):
        _strategy(resplit=float("nan"))
