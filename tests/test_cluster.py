"""Cluster aggregation (similarity clustering, churn, per-cluster averaging, gate) and hidden leaf groups."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from devsim.aggregation.base import LeafUpdate, Weights
from devsim.aggregation.cluster import (
    ClusterAggregation,
    assignment_churn,
    canonical_labels,
    cluster_by_similarity,
    leaf_models_for_round,
)
from devsim.aggregation.fedavg import FedAvg
from devsim.data.groups import GROUP_KINDS, NUM_INPUT_TRANSFORMS, GroupTransform, apply_group, leaf_group


def _update(leaf: str, step: Weights, weight: float) -> LeafUpdate:
    """A leaf update whose average step is ``step`` over ``weight`` samples."""
    return LeafUpdate(
        leaf=leaf,
        delta_sum={k: (np.asarray(v, dtype=np.float64) * weight).astype(np.float32) for k, v in step.items()},
        total_weight=float(weight),
        num_devices=1,
    )


def _model(head: list[float], body: list[float] | None = None) -> Weights:
    return {
        "body": np.asarray(body if body is not None else [0.0, 0.0], dtype=np.float32),
        "head": np.asarray(head, dtype=np.float32),
    }


# --- cluster_by_similarity -------------------------------------------------------------------------


def test_identical_vectors_form_one_cluster() -> None:
    labels, sim = cluster_by_similarity(np.tile([[1.0, 2.0, 3.0]], (4, 1)), tau=0.7)
    assert labels.tolist() == [0, 0, 0, 0]
    np.testing.assert_allclose(sim, np.ones((4, 4)))


def test_opposite_vectors_are_one_cluster_by_absolute_similarity() -> None:
    labels, sim = cluster_by_similarity(np.array([[1.0, -2.0], [-1.0, 2.0]]), tau=0.7)
    assert labels.tolist() == [0, 0]
    assert sim[0, 1] == pytest.approx(1.0)


def test_orthogonal_groups_are_separate_clusters() -> None:
    vectors = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.1], [0.9, 0.1, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 5.0]])
    labels, sim = cluster_by_similarity(vectors, tau=0.7)
    assert labels.tolist() == [0, 1, 0, 1, 2]
    assert sim.shape == (5, 5)
    assert np.array_equal(sim, sim.T)
    assert np.all((sim >= 0) & (sim <= 1))
    assert sim[0, 1] == 0.0


def test_threshold_edge_is_strict() -> None:
    vectors = np.array([[1.0, 0.0], [3.0, 4.0]])
    _, sim = cluster_by_similarity(vectors, tau=0.5)
    assert sim[0, 1] == pytest.approx(0.6)
    at, _ = cluster_by_similarity(vectors, tau=float(sim[0, 1]))
    below, _ = cluster_by_similarity(vectors, tau=float(np.nextafter(sim[0, 1], -np.inf)))
    assert at.tolist() == [0, 1]
    assert below.tolist() == [0, 0]


def test_one_leaf() -> None:
    labels, sim = cluster_by_similarity(np.array([[0.3, -0.2]]), tau=0.7)
    assert labels.tolist() == [0]
    assert sim.tolist() == [[1.0]]


def test_no_leaves() -> None:
    labels, sim = cluster_by_similarity(np.zeros((0, 3)), tau=0.7)
    assert labels.shape == (0,) and sim.shape == (0, 0)


def test_all_leaves_alike_chain_into_one_cluster() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(size=50)
    vectors = base + 0.01 * rng.normal(size=(8, 50))
    labels, _ = cluster_by_similarity(vectors, tau=0.9)
    assert labels.tolist() == [0] * 8


def test_zero_vector_is_alone() -> None:
    labels, sim = cluster_by_similarity(np.array([[1.0, 1.0], [0.0, 0.0], [2.0, 2.0], [0.0, 0.0]]), tau=0.0)
    assert sim[1].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert sim[3, 3] == 1.0 and sim[1, 3] == 0.0
    assert labels.tolist() == [0, 1, 0, 2]


def test_labels_canonical_and_deterministic() -> None:
    vectors = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0], [3.0, 0.1]])
    labels, _ = cluster_by_similarity(vectors, tau=0.7)
    again, _ = cluster_by_similarity(vectors.copy(), tau=0.7)
    assert labels.tolist() == [0, 1, 0, 1] == again.tolist()
    reordered, _ = cluster_by_similarity(vectors[[1, 0, 3, 2]], tau=0.7)
    assert reordered.tolist() == [0, 1, 0, 1]
    assert canonical_labels(["b", "a", "b", "c"]).tolist() == [0, 1, 0, 2]


def test_invalid_inputs_rejected() -> None:
    with pytest.raises(ValueError):
        cluster_by_similarity(np.array([1.0, 2.0]), tau=0.5)
    with pytest.raises(ValueError):
        cluster_by_similarity(np.array([[np.nan, 1.0]]), tau=0.5)
    with pytest.raises(ValueError):
        cluster_by_similarity(np.ones((2, 2)), tau=float("nan"))


def test_churn_is_permutation_invariant() -> None:
    assert assignment_churn([0, 0, 1, 2], [2, 2, 0, 1]) == 0
    assert assignment_churn([0, 0, 1, 1], [0, 1, 1, 1]) == 4
    assert assignment_churn([0, 0, 1, 1, 2], [0, 0, 1, 1, 1]) == 3
    assert assignment_churn([], []) == 0
    with pytest.raises(ValueError):
        assignment_churn([0], [0, 1])


@settings(max_examples=150, deadline=None)
@given(
    vectors=hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 9), st.integers(1, 4)),
        elements=st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0]) | st.floats(-10, 10),
    ),
    tau=st.floats(0.0, 1.0),
)
def test_partition_is_connected_components_of_strict_graph(vectors: np.ndarray, tau: float) -> None:
    labels, sim = cluster_by_similarity(vectors, tau)
    n = len(vectors)
    assert labels.shape == (n,) and labels.dtype == np.int64
    norms = np.linalg.norm(vectors, axis=1)
    for i in range(n):
        for j in range(n):
            if i == j:
                assert sim[i, j] == 1.0
            elif norms[i] == 0 or norms[j] == 0:
                assert sim[i, j] == 0.0
            else:
                # rows scaled to max |x| = 1 first: cosine is scale-free, and tiny entries (1e-159) would
                # otherwise underflow when squared and make the reference itself inexact
                a, b = vectors[i] / np.abs(vectors[i]).max(), vectors[j] / np.abs(vectors[j]).max()
                expected = abs(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b))
                assert sim[i, j] == pytest.approx(min(expected, 1.0), abs=1e-9)
    adjacency = (sim > tau) & ~np.eye(n, dtype=bool)
    seen = np.full(n, -1)
    component = 0
    for start in range(n):
        if seen[start] >= 0:
            continue
        stack = [start]
        seen[start] = component
        while stack:
            node = stack.pop()
            for nxt in np.flatnonzero(adjacency[node]):
                if seen[nxt] < 0:
                    seen[nxt] = component
                    stack.append(int(nxt))
        component += 1
    assert labels.tolist() == seen.tolist()


# --- ClusterAggregation ------------------------------------------------------------------------------


def _strategy(**kwargs: object) -> ClusterAggregation:
    kwargs.setdefault("last_layer_keys", ["head"])
    return ClusterAggregation(**kwargs)  # type: ignore[arg-type]


def test_cluster_average_is_sample_weighted() -> None:
    start = _model([0.0, 0.0], [1.0, 1.0])
    models = {"a": start, "b": start, "c": start}
    updates = [
        _update("c", {"head": [0.0, 2.0], "body": [1.0, 0.0]}, 2),
        _update("a", {"head": [1.0, 0.0], "body": [4.0, 0.0]}, 1),
        _update("b", {"head": [3.0, 0.0], "body": [0.0, 4.0]}, 3),
    ]
    result = _strategy(similarity_on="last_layer_updates").aggregate_clusters(models, updates)
    assert result.leaf_order == ["a", "b", "c"]
    assert result.labels == {"a": 0, "b": 0, "c": 1}
    assert result.num_clusters == 2 and result.churn == 0 and result.gated == []
    np.testing.assert_allclose(result.leaf_models["a"]["head"], [2.5, 0.0])
    np.testing.assert_allclose(result.leaf_models["a"]["body"], [2.0, 4.0])
    np.testing.assert_allclose(result.leaf_models["b"]["head"], [2.5, 0.0])
    np.testing.assert_allclose(result.leaf_models["c"]["head"], [0.0, 2.0])
    np.testing.assert_allclose(result.leaf_models["c"]["body"], [2.0, 1.0])
    assert result.leaf_models["a"]["head"].dtype == np.float32


def test_global_lr_scales_the_mean_update_around_the_weighted_mean_model() -> None:
    models = {"a": _model([1.0, 0.0], [0.0, 0.0]), "b": _model([2.0, 0.0], [4.0, 0.0])}
    updates = [
        _update("a", {"head": [1.0, 0.0], "body": [2.0, 0.0]}, 1),
        _update("b", {"head": [0.0, 0.0], "body": [0.0, 2.0]}, 3),
    ]
    result = _strategy(global_lr=0.5).aggregate_clusters(models, updates)
    assert result.num_clusters == 1
    mean_body = (1 * np.array([0.0, 0.0]) + 3 * np.array([4.0, 0.0])) / 4
    mean_step = (1 * np.array([2.0, 0.0]) + 3 * np.array([0.0, 2.0])) / 4
    np.testing.assert_allclose(result.leaf_models["a"]["body"], mean_body + 0.5 * mean_step, rtol=1e-6)
    np.testing.assert_allclose(result.leaf_models["b"]["head"], [(1 * 1.0 + 3 * 2.0) / 4 + 0.5 * 0.25, 0.0], rtol=1e-6)
    full = _strategy(global_lr=1.0).aggregate_clusters(models, updates)
    m_a, m_b = np.array([2.0, 0.0]), np.array([4.0, 2.0])
    np.testing.assert_allclose(full.leaf_models["a"]["body"], (1 * m_a + 3 * m_b) / 4, rtol=1e-6)


def test_similarity_on_weights_uses_trained_leaf_models() -> None:
    models = {"a": _model([1.0, 0.0]), "b": _model([0.0, 1.0])}
    updates = [
        _update("a", {"head": [0.0, 0.5], "body": [0, 0]}, 1),
        _update("b", {"head": [0.0, 0.5], "body": [0, 0]}, 1),
    ]
    on_weights = _strategy(similarity_on="last_layer_weights").aggregate_clusters(models, updates)
    on_updates = _strategy(similarity_on="last_layer_updates").aggregate_clusters(models, updates)
    assert on_weights.num_clusters == 2
    assert on_updates.num_clusters == 1
    assert on_weights.similarity[0, 1] == pytest.approx(0.75 / (np.sqrt(1.25) * 1.5))


def test_absent_leaves_keep_model_and_cluster() -> None:
    strategy = _strategy()
    start = _model([1.0, 0.0])
    models = leaf_models_for_round(start, ["a", "b", "c", "d"])
    first = strategy.aggregate_clusters(
        models,
        [
            _update("a", {"head": [0.1, 0.0], "body": [1, 0]}, 1),
            _update("b", {"head": [0.1, 0.0], "body": [0, 1]}, 1),
            _update("c", {"head": [-5.0, 9.0], "body": [0, 0]}, 1),
            _update("d", {"head": [-5.0, 9.0], "body": [0, 0]}, 2),
        ],
    )
    assert first.labels == {"a": 0, "b": 0, "c": 1, "d": 1}
    second_models = leaf_models_for_round(start, ["a", "b", "c", "d"], first.leaf_models)
    second = strategy.aggregate_clusters(
        second_models,
        [
            _update("a", {"head": [0.0, 0.0], "body": [1, 1]}, 1),
            _update("b", {"head": [0.0, 0.0], "body": [1, 1]}, 1),
            _update("c", {"head": [0.0, 0.0], "body": [1, 1]}, 1),
        ],
    )
    assert second.leaf_order == ["a", "b", "c"]
    assert second.leaf_models["d"] is first.leaf_models["d"]
    assert second.labels["d"] != second.labels["c"]
    assert second.labels["a"] == second.labels["b"]
    assert second.churn == 0
    third = strategy.aggregate_clusters(second.leaf_models, [])
    assert third.labels == second.labels and third.churn == 0
    for leaf in "abcd":
        assert third.leaf_models[leaf] is second.leaf_models[leaf]


def test_churn_tracked_across_rounds_and_state_roundtrip() -> None:
    start = _model([1.0, 0.0])
    models = leaf_models_for_round(start, ["a", "b", "c"])
    strategy = _strategy(similarity_on="last_layer_updates")
    steps = {"a": [1.0, 0.0], "b": [1.0, 0.0], "c": [0.0, 1.0]}
    first = strategy.aggregate_clusters(models, [_update(k, {"head": v, "body": [0, 0]}, 1) for k, v in steps.items()])
    assert first.churn == 0
    restored = _strategy(similarity_on="last_layer_updates")
    restored.load_state_dict(strategy.state_dict())
    assert restored.state_dict() == {"previous_labels": {"a": 0, "b": 0, "c": 1}}
    steps = {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [0.0, 1.0]}
    second = restored.aggregate_clusters(models, [_update(k, {"head": v, "body": [0, 0]}, 1) for k, v in steps.items()])
    assert second.labels == {"a": 0, "b": 1, "c": 1}
    assert second.churn == 3
    with pytest.raises(ValueError):
        restored.load_state_dict({})


def test_all_leaves_alike_equals_fedavg() -> None:
    rng = np.random.default_rng(3)
    global_weights = {
        "conv": rng.normal(size=(4, 3)).astype(np.float32),
        "head": (5.0 + rng.normal(size=(10, 4))).astype(np.float32),
    }
    updates = []
    for i in range(6):
        weight = int(rng.integers(5, 50))
        step = {k: 0.01 * rng.normal(size=v.shape) for k, v in global_weights.items()}
        updates.append(_update(f"leaf-{i}", step, weight))
    for lr in (1.0, 0.7):
        expected = FedAvg(global_lr=lr).aggregate(global_weights, updates)
        strategy = _strategy(global_lr=lr, tau=0.9)
        result = strategy.aggregate_clusters({u.leaf: global_weights for u in updates}, updates)
        assert result.num_clusters == 1
        for u in updates:
            for key, value in expected.items():
                np.testing.assert_array_equal(result.leaf_models[u.leaf][key], value)


def test_gate_keeps_previous_model_when_cluster_model_is_worse() -> None:
    models = {"a": _model([1.0, 0.0]), "b": _model([1.0, 0.0]), "c": _model([1.0, 0.0])}
    updates = [
        _update("a", {"head": [0.0, 0.1], "body": [0.0, 0.0]}, 1),
        _update("b", {"head": [0.0, 0.1], "body": [10.0, 0.0]}, 9),
        _update("c", {"head": [0.0, 0.1], "body": [10.0, 0.0]}, 1),
    ]

    def score(leaf: str, weights: Weights) -> float:
        target = {"a": 0.0, "b": 10.0, "c": 10.0}[leaf]
        return -abs(float(weights["body"][0]) - target)

    gated = _strategy(gate_margin=0.5).aggregate_clusters(models, updates, leaf_val_scores=score)
    assert gated.num_clusters == 1
    assert gated.gated == ["a"]
    assert gated.leaf_models["a"] is models["a"]
    np.testing.assert_allclose(gated.leaf_models["b"]["body"], [100.0 / 11.0, 0.0], rtol=1e-6)
    assert gated.labels["a"] == gated.labels["b"]
    lenient = _strategy(gate_margin=20.0).aggregate_clusters(models, updates, leaf_val_scores=score)
    assert lenient.gated == []
    demanding = _strategy(gate_margin=-100.0).aggregate_clusters(models, updates, leaf_val_scores=score)
    assert demanding.gated == ["a", "b", "c"]
    with pytest.raises(ValueError):
        _strategy(gate_margin=0.5).aggregate_clusters(models, updates)


def test_invalid_configuration_and_updates_rejected() -> None:
    with pytest.raises(ValueError):
        _strategy(similarity_on="everything")
    with pytest.raises(ValueError):
        _strategy(last_layer_keys=[])
    with pytest.raises(ValueError):
        _strategy(global_lr=0.0)
    strategy = _strategy(last_layer_keys=["missing"])
    models = {"a": _model([1.0, 0.0])}
    with pytest.raises(ValueError):
        strategy.aggregate_clusters(models, [_update("a", {"head": [1, 0], "body": [0, 0]}, 1)])
    with pytest.raises(ValueError):
        _strategy().aggregate_clusters(models, [_update("z", {"head": [1, 0], "body": [0, 0]}, 1)])
    with pytest.raises(ValueError):
        _strategy().aggregate_clusters(models, [_update("a", {"head": [1, 0], "body": [0, 0]}, 0)])


# --- hidden leaf groups -------------------------------------------------------------------------------


def _images(n: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, size=n).astype(np.int64)


def test_leaf_group_is_round_robin() -> None:
    assert [leaf_group(i, 3) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError):
        leaf_group(0, 0)


@pytest.mark.parametrize("group", range(6))
def test_label_permutation_is_a_bijection_and_group_zero_identity(group: int) -> None:
    perm = GroupTransform("label_permutation", group, seed=4, num_classes=10).label_map()
    assert sorted(perm.tolist()) == list(range(10))
    assert (perm.tolist() == list(range(10))) == (group == 0)
    again = GroupTransform("label_permutation", group, seed=4, num_classes=10).label_map()
    assert np.array_equal(perm, again)
    images, labels = _images()
    new_images, new_labels = apply_group(images, labels, group, "label_permutation", 4, num_classes=10)
    assert np.array_equal(new_images, images)
    assert np.array_equal(new_labels, perm[labels]) and new_labels.dtype == np.int64


def test_label_permutation_requires_num_classes_and_valid_labels() -> None:
    images, labels = _images()
    with pytest.raises(ValueError):
        apply_group(images, labels, 1, "label_permutation", 0)
    with pytest.raises(ValueError):
        apply_group(images, labels + 10, 1, "label_permutation", 0, num_classes=10)
    with pytest.raises(ValueError):
        apply_group(images, labels, 1, "unknown", 0)


def test_input_transforms_deterministic_distinct_and_shape_preserving() -> None:
    images, labels = _images()
    original = images.copy()
    outputs = []
    for group in range(NUM_INPUT_TRANSFORMS):
        out, out_labels = apply_group(images, labels, group, "input_transform", seed=group)
        again, _ = apply_group(images, labels, group, "input_transform", seed=0)
        assert out.shape == images.shape and out.dtype == np.uint8 and out.flags.c_contiguous
        assert np.array_equal(out, again)
        assert np.array_equal(out_labels, labels)
        assert np.array_equal(out, images) == (group == 0)
        outputs.append(out.tobytes())
    assert len(set(outputs)) == NUM_INPUT_TRANSFORMS
    assert np.array_equal(images, original)
    with pytest.raises(ValueError):
        apply_group(images, labels, NUM_INPUT_TRANSFORMS, "input_transform", 0)


def test_input_transform_parts() -> None:
    images, labels = _images(2)
    rotated, _ = apply_group(images, labels, 1, "input_transform")
    assert np.array_equal(rotated, np.rot90(images, 1, axes=(2, 3)))
    inverted, _ = apply_group(images, labels, 4, "input_transform")
    assert np.array_equal(inverted, 255 - images)
    swapped, _ = apply_group(images, labels, 8, "input_transform")
    assert np.array_equal(swapped, images[:, [0, 2, 1]])
    assert set(GROUP_KINDS) == {"label_permutation", "input_transform"}
