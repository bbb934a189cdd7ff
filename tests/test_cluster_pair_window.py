"""Issue #33, last failures: pairs confirmed over a window of proposals (``pair_window``), and leaves proposed with
their group just before it joins joining along (``pair_companion``)."""

from __future__ import annotations

import numpy as np
import pytest

from devsim.aggregation.base import LeafUpdate
from devsim.aggregation.cluster import ClusterAggregation, config_settings
from devsim.config import ClusterConfig, ConfigError

REFERENCE = {"w.weight": np.zeros(8, np.float32)}


def _strategy(**kwargs) -> ClusterAggregation:
    settings = {"min_silhouette": 0.25, "centre": True, "confirm_rounds": 3, "confirm_pairs": True, **kwargs}
    return ClusterAggregation(
        tau=None, similarity_on="model_drift", last_layer_keys=["w.weight"], reference=REFERENCE, **settings
    )


def _run(strategy: ClusterAggregation, rounds: list[str]) -> list[str]:
    """One round per entry of ``rounds``: leaves with the same letter in it end the round on the same drift (one
    axis per letter, a little noise), so the proposal puts them together. Returns the partition in force after
    each round, written the same way (leaves in order, first leaf of each cluster's letter)."""
    leaves = [f"leaf-{i}" for i in range(len(rounds[0]))]
    models = {leaf: REFERENCE for leaf in leaves}
    out = []
    for number, letters in enumerate(rounds):
        noise = np.random.default_rng(number).normal(0, 0.02, (len(leaves), 8))
        updates = []
        for leaf, letter, n in zip(leaves, letters, noise, strict=True):
            target = np.eye(8)[ord(letter) - ord("a")] * 2.0 + n
            delta = (target - models[leaf]["w.weight"]).astype(np.float32)
            updates.append(LeafUpdate(leaf, {"w.weight": delta}, 1.0, 1))
        result = strategy.aggregate_clusters(models, updates)
        models = result.leaf_models
        labels = [result.labels[leaf] for leaf in leaves]
        out.append("".join("abcdefgh"[labels.index(label)] for label in labels))
    return out


# Leaves 0-1 and 2-3 are proposed together in rounds 2, 3 and 5, every leaf alone in rounds 1 and 4 (4 axes).
GAP = ["abcd", "aacc", "aacc", "abcd", "aacc"]


def test_a_pair_together_in_three_of_five_proposals_joins_without_three_in_a_row() -> None:
    assert _run(_strategy(), GAP)[-1] == "abcd"  # every one of the last 3: never, the gap breaks it
    assert _run(_strategy(pair_window=5), GAP)[-1] == "aacc"


# Leaves 0-2 and 3-4 are together in rounds 2-4; leaf 5 is alone until round 2, then with 3-4 in rounds 3 and 4
# (2 votes when 3-4 join at round 4); leaf 6 stays alone.


def test_a_leaf_proposed_with_its_group_in_the_last_two_rounds_joins_along_with_it() -> None:
    rounds = ["abcdefg", "aaaddfg", "aaadddg", "aaadddg"]
    assert _run(_strategy(pair_window=5), rounds)[-1] == "aaaddfg"  # leaf 5 has 2 votes of 3: it waits
    assert _run(_strategy(pair_window=5, pair_companion=2), rounds)[-1] == "aaadddg"


def test_companions_join_only_a_cluster_that_grows_by_votes() -> None:
    """Together in the last 2 proposals is no evidence on its own (2 noisy early proposals): with no pair at 3
    votes nothing joins, and when 0-1 and 4-5 join by votes, 2-3 (together in the last 2 only) still wait."""
    companions = _strategy(pair_window=5, pair_companion=2)
    assert _run(companions, ["abcdefg", "abcdefg", "aaddefg", "aaddefg"])[-1] == "abcdefg"
    assert _run(_strategy(pair_window=5, pair_companion=2), ["aaaeee", "aaccee", "aaccee"])[-1] == "aacdee"


def test_a_leaf_that_changes_sides_joins_neither_group_without_three_votes_for_one() -> None:
    """Leaf 4 goes with the 0-1 group, then the 2-3 group, by turns: 2 votes each of 5, never 3."""
    rounds = ["abcde", "aacca", "aaccc", "aacce", "aacca", "aaccc"]
    history = _run(_strategy(pair_window=5, pair_companion=2), rounds)
    assert history[-1][:4] == "aacc" and history[-1][4] not in "ac"
    for partition in history:
        assert partition[4] not in partition[:4]


def test_votes_count_across_joins_and_survive_state_dict() -> None:
    strategy = _strategy(pair_window=5)
    _run(strategy, GAP[:4])
    state = strategy.state_dict()
    assert len(state["history"]) == 4
    restored = _strategy(pair_window=5)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    # The whole history is kept after a join (without a window it restarts).
    joined = _strategy(pair_window=5)
    _run(joined, GAP)
    assert len(joined.state_dict()["history"]) == 5
    plain = _strategy()
    _run(plain, ["abcd", "aacc", "aacc", "aacc"])
    assert "history" not in plain.state_dict()


def test_strategy_checks() -> None:
    with pytest.raises(ValueError, match=r"pair_window must be None or an int >= confirm_rounds \(3\), got 2"):
        _strategy(pair_window=2)
    with pytest.raises(ValueError, match="pair_companion must be None or an int >= 1, got 0"):
        _strategy(pair_companion=0)
    with pytest.raises(ValueError, match="need confirm_pairs=True"):
        _strategy(confirm_pairs=False, pair_window=5)


def test_config_turns_both_on_and_checks_them() -> None:
    config = ClusterConfig()
    assert (config.pair_window, config.pair_companion) == (5, 2)
    settings = config_settings(config)
    assert settings["pair_window"] == 5 and settings["pair_companion"] == 2
    with pytest.raises(
        ConfigError, match=r"--pair-window: 2 is below --confirm-rounds \(3\); allowed: unset or an int >= it"
    ):
        ClusterConfig(pair_window=2).validate()
    with pytest.raises(ConfigError, match="--pair-window: '5' has type str; expected int"):
        ClusterConfig(pair_window="5").validate()
    with pytest.raises(ConfigError, match="--pair-companion: 0 is below the minimum of 1"):
        ClusterConfig(pair_companion=0).validate()
    # Without pair confirmation both are left out.
    off = config_settings(ClusterConfig(confirm_pairs=False).validate())
    assert off["pair_window"] is None and off["pair_companion"] is None
    # The constructor keeps the rule before: pairs together in each of the last confirm_rounds proposals.
    plain = ClusterAggregation(tau=None, similarity_on="model_drift", last_layer_keys=["w.weight"], reference=REFERENCE)
    assert plain.pair_window is None and plain.pair_companion is None
