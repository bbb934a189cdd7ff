"""Issue #33, last failure: a leaf alone joins the cluster in force that its update prefers (``lone_pull``)."""

from __future__ import annotations

import numpy as np
import pytest

from devsim.aggregation.base import LeafUpdate
from devsim.aggregation.cluster import JOIN_PULL, ClusterAggregation, ClusterResult, config_settings
from devsim.config import ClusterConfig
from tests.cluster_drift import KEY, ZERO, drift_strategy

# In force: a-c share m0, d-e share m1, f alone (its drift on an axis of its own, so the drifts keep it alone).
IN_FORCE = {"a": 0, "b": 0, "c": 0, "d": 1, "e": 1, "f": 2}
TOWARDS_M1 = [-0.1, 0.1, 0.0, 0.0]  # from mf: towards m1 (pull 0.5), away from m0 (-0.5); prefers m1 by 1.0
TOWARDS_M0 = [0.1, -0.1, 0.0, 0.0]
BOTH = [0.1, 0.1, -0.1, 0.0]  # towards m0 and m1 alike (pull 0.82 to each), preference 0


def _strategy(
    lone_pull: float | None = ClusterConfig.lone_pull, labels: dict[str, int] = IN_FORCE
) -> ClusterAggregation:
    return drift_strategy(labels, confirm_rounds=3, lone_pull=lone_pull)


def _start(labels: dict[str, int] = IN_FORCE) -> dict[str, dict[str, np.ndarray]]:
    """Label 0: m0, label 1: m1 (each one shared dict); f: mf; any other leaf a model of its own."""
    shared = {0: {KEY: np.float32([3, 0, 0, 0])}, 1: {KEY: np.float32([0, 3, 0, 0])}}
    models = {leaf: shared.get(label, {KEY: np.float32([0, 0, 0, label])}) for leaf, label in labels.items()}
    models["f"] = {KEY: np.float32([0, 0, 3, 0])}
    return models


def _run(strategy: ClusterAggregation, f_pulls: list[list[float]], labels: dict[str, int] = IN_FORCE):
    """One round per entry of ``f_pulls`` (f's update that round); the others' updates are small noise."""
    models, results = _start(labels), []
    for rnd, pull in enumerate(f_pulls):
        rng = np.random.default_rng(rnd)
        rows = {leaf: rng.normal(0, 0.003, 4) for leaf in labels}
        rows["f"] = np.asarray(pull) + rng.normal(0, 0.003, 4)
        updates = [LeafUpdate(leaf, {KEY: v.astype(np.float32)}, 1.0, 1) for leaf, v in rows.items()]
        result = strategy.aggregate_clusters(models, updates)
        results.append((result, updates))
        models = result.leaf_models
    return results


def test_a_lone_leaf_that_prefers_one_cluster_in_three_rounds_joins_it_with_its_model() -> None:
    rounds = _run(_strategy(), [TOWARDS_M1] * 3)
    for result, _ in rounds[:2]:
        assert result.labels == IN_FORCE
    (first, _), (_, _), (third, updates) = rounds
    (record,) = first.lone
    assert record["leaf"] == "f" and record["clusters"] == [["a", "b", "c"], ["d", "e"]]
    assert record["target"] == ["d", "e"] and record["rounds"] == 1 and record["joined"] is False
    assert record["pull"][1] > 0.45 and record["pull"][0] < -0.45 and record["preference"] > 0.95
    assert third.lone[0]["rounds"] == 3 and third.lone[0]["joined"] is True
    assert third.labels == {"a": 0, "b": 0, "c": 0, "d": 1, "e": 1, "f": 1}
    # f takes d and e's model, to which it did not contribute.
    assert third.leaf_models["f"] is third.leaf_models["d"]
    before = rounds[1][0].leaf_models["d"][KEY]
    expected = before + np.mean([u.delta_sum[KEY] for u in updates if u.leaf in "de"], axis=0)
    np.testing.assert_allclose(third.leaf_models["d"][KEY], expected, atol=1e-6)


def test_without_the_rule_or_below_the_bars_the_leaf_stays_alone() -> None:
    assert _run(_strategy(lone_pull=None), [TOWARDS_M1] * 4)[-1][0].labels == IN_FORCE
    assert all(not result.lone for result, _ in _run(_strategy(lone_pull=None), [TOWARDS_M1] * 2))
    # Pulled towards both clusters alike (what they learnt alike): no preference, no target.
    both = _run(_strategy(), [BOTH] * 4)
    assert both[-1][0].labels == IN_FORCE
    assert all(result.lone[0]["target"] is None and result.lone[0]["rounds"] == 0 for result, _ in both)
    assert min(both[0][0].lone[0]["pull"]) > JOIN_PULL


def test_a_leaf_that_changes_its_preference_restarts_the_count() -> None:
    rounds = _run(_strategy(), [TOWARDS_M1, TOWARDS_M1, TOWARDS_M0, TOWARDS_M0, TOWARDS_M1])
    assert [r.lone[0]["rounds"] for r, _ in rounds] == [1, 2, 1, 2, 1]
    assert [r.lone[0]["target"][0] for r, _ in rounds] == ["d", "d", "a", "a", "d"]
    assert rounds[-1][0].labels == IN_FORCE


def test_only_next_to_two_clusters_in_force() -> None:
    """With one cluster in force its model may simply be further on than the lone leaf's: no comparison."""
    labels = {"a": 0, "b": 0, "c": 0, "d": 1, "e": 5, "f": 2}
    strategy = _strategy(labels=labels)
    rounds = _run(strategy, [TOWARDS_M1] * 3, labels)
    assert all(not result.lone for result, _ in rounds)
    assert rounds[-1][0].labels["f"] != rounds[-1][0].labels["a"]


def test_pending_joins_survive_state_dict() -> None:
    strategy = _strategy()
    _run(strategy, [TOWARDS_M1] * 2)
    state = strategy.state_dict()
    assert state["lone_pending"] == [{"leaf": "f", "target": ["d", "e"], "rounds": 2}]
    restored = _strategy()
    restored.load_state_dict(state)
    assert restored.state_dict() == state


def test_checks_and_the_job_default() -> None:
    for bad in (1.0, -1.5, float("nan"), True):
        with pytest.raises(ValueError, match="lone_pull must lie in"):
            _strategy(lone_pull=bad)
    plain = ClusterAggregation(tau=None, similarity_on="model_drift", last_layer_keys=[KEY], reference=ZERO)
    assert plain.lone_pull is None
    assert config_settings(ClusterConfig().validate())["lone_pull"] == ClusterConfig.lone_pull == 0.25
    assert isinstance(ClusterResult({}, {}, np.zeros((0, 0)), [], 0, 0).lone, list)
