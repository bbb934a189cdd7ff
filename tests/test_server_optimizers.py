"""Server optimizers (FedAvgM, FedAdagrad, FedAdam, FedYogi) in FedAvg and FedBuff: the formulas, the state a
checkpoint carries, the flags' checks, and runs in the simulator that learn and resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from devsim.aggregation.base import LeafUpdate
from devsim.aggregation.fedavg import FedAvg
from devsim.aggregation.fedbuff import FedBuff
from devsim.aggregation.server_optimizers import SERVER_OPTIMIZERS, ServerOptimizer
from devsim.config import AsyncConfig, ClusterConfig, ConfigError, SimulationConfig
from tests.conftest import SMALL_RUN, find_results, refused_job, run_job

B1, B2, TAU, LR = 0.8, 0.95, 1e-2, 0.1


def _reference(name: str, deltas: list[np.ndarray], w: np.ndarray) -> np.ndarray:
    """The methods written out literally, one scalar at a time, in float64."""
    w = w.astype(np.float64).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for delta in deltas:
        for i in range(w.size):
            d = float(delta.flat[i])
            if name == "sgd":
                w.flat[i] += LR * d
                continue
            if name == "momentum":
                m.flat[i] = B1 * m.flat[i] + d
                w.flat[i] += LR * m.flat[i]
                continue
            m.flat[i] = B1 * m.flat[i] + (1 - B1) * d
            if name == "adagrad":
                v.flat[i] = v.flat[i] + d * d
            elif name == "adam":
                v.flat[i] = B2 * v.flat[i] + (1 - B2) * d * d
            else:
                v.flat[i] = v.flat[i] - (1 - B2) * d * d * np.sign(v.flat[i] - d * d)
            w.flat[i] += LR * m.flat[i] / (np.sqrt(v.flat[i]) + TAU)
    return w


@pytest.mark.parametrize("name", SERVER_OPTIMIZERS)
def test_each_optimizer_follows_its_formula_over_rounds(name):
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal(12).astype(np.float32)
    deltas = [rng.standard_normal(12) * scale for scale in (0.5, 0.1, 1.0, 0.02)]
    optimizer = ServerOptimizer(name, LR, B1, B2, TAU)
    weights = {"a": w0}
    for delta in deltas:
        weights = optimizer.apply(weights, {"a": delta})
    # float32 weights between rounds against float64 throughout: equal to float32 rounding
    np.testing.assert_allclose(weights["a"], _reference(name, deltas, w0), rtol=1e-5, atol=1e-6)


def _updates(rng, shapes, leaves=3):
    return [
        LeafUpdate(f"site-{i}", {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}, 5.0 + i, 2)
        for i in range(leaves)
    ]


def test_fedavg_with_sgd_is_plain_fedavg_to_the_bit_and_adam_uses_the_weighted_mean():
    rng = np.random.default_rng(0)
    shapes = {"w": (4, 3), "b": (3,)}
    weights = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    updates = _updates(rng, shapes)
    plain = FedAvg(global_lr=0.7).aggregate(weights, updates)
    with_sgd = FedAvg(global_lr=0.7, server_optimizer=ServerOptimizer("sgd", 0.7)).aggregate(weights, updates)
    for key in weights:
        np.testing.assert_array_equal(plain[key], with_sgd[key])
    adam = ServerOptimizer("adam", 0.05)
    got = FedAvg(global_lr=0.05, server_optimizer=adam).aggregate(weights, updates)
    total = sum(u.total_weight for u in updates)
    mean = {k: sum(u.delta_sum[k].astype(np.float64) for u in updates) / total for k in shapes}
    want = ServerOptimizer("adam", 0.05).apply(weights, mean)
    for key in weights:
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-7)
    # the first Adam step moves every coordinate by about eta * (1 - beta1) / sqrt(1 - beta2), whatever its size
    step = np.abs(got["w"].astype(np.float64) - weights["w"])
    assert np.all(step < 0.05 * 0.1 / np.sqrt(0.01) * 1.01)


def test_state_round_trip_continues_exactly_and_a_changed_method_is_refused():
    rng = np.random.default_rng(1)
    deltas = [{"a": rng.standard_normal(5)} for _ in range(4)]
    whole = ServerOptimizer("yogi", 0.05)
    weights = {"a": np.zeros(5, np.float32)}
    for delta in deltas:
        weights = whole.apply(weights, delta)
    first = ServerOptimizer("yogi", 0.05)
    half = {"a": np.zeros(5, np.float32)}
    for delta in deltas[:2]:
        half = first.apply(half, delta)
    second = ServerOptimizer("yogi", 0.05)
    second.load_state_dict(first.state_dict())
    for delta in deltas[2:]:
        half = second.apply(half, delta)
    np.testing.assert_array_equal(half["a"], weights["a"])
    with pytest.raises(ValueError, match="'yogi'; this run's is 'adam'"):
        ServerOptimizer("adam", 0.05).load_state_dict(first.state_dict())
    with pytest.raises(ValueError, match="'sgd'; this run's is 'adam'"):
        FedAvg(server_optimizer=ServerOptimizer("adam", 0.05)).load_state_dict({})


@pytest.mark.parametrize(
    ("values", "field", "words"),
    [
        ({"server_optimizer": "lamb"}, "server_optimizer", "sgd, momentum, adagrad, adam, yogi"),
        ({"server_momentum": 1.0}, "server_momentum", "[0, 1)"),
        ({"server_beta2": -0.1}, "server_beta2", "[0, 1)"),
        ({"server_tau": 0.0}, "server_tau", "> 0"),
    ],
)
def test_bad_server_optimizer_settings_name_the_field(values, field, words):
    with pytest.raises(ConfigError) as error:
        SimulationConfig.from_dict({"dataset": "synthetic", **values})
    assert error.value.field_name == field and words in str(error.value)


def test_cluster_aggregation_refuses_a_server_optimizer_and_async_takes_one():
    with pytest.raises(ConfigError, match="allowed there: sgd") as error:
        ClusterConfig.from_dict({"dataset": "synthetic", "server_optimizer": "momentum"})
    assert error.value.field_name == "server_optimizer"
    assert AsyncConfig.from_dict({"dataset": "synthetic", "server_optimizer": "yogi"}).server_optimizer == "yogi"


def test_fedbuff_sends_the_buffer_mean_through_the_optimizer_and_checkpoints_its_moments():
    rng = np.random.default_rng(2)
    deltas = [({"a": rng.standard_normal(6).astype(np.float32)}, tau) for tau in (0, 3, 1, 0, 2, 5)]

    def run(buffer, weights, items):
        for delta, staleness in items:
            buffer.add(delta, staleness)
            if buffer.ready():
                weights = buffer.apply(weights)
        return weights

    def make():
        return FedBuff(2, 0.1, "polynomial", server_optimizer=ServerOptimizer("momentum", 0.1, beta1=0.5))

    start = {"a": np.zeros(6, np.float32)}
    whole = run(make(), start, deltas)
    optimizer = ServerOptimizer("momentum", 0.1, beta1=0.5)  # by hand: momentum on each full buffer's mean
    weights, buffer = start, FedBuff(2, 1.0, "polynomial")
    for i in range(0, len(deltas), 2):
        for delta, tau in deltas[i : i + 2]:
            buffer.add(delta, tau)
        mean = {"a": buffer.state_dict()["sum"]["a"] / 2}
        buffer.reset()
        weights = optimizer.apply(weights, mean)
    np.testing.assert_array_equal(whole["a"], weights["a"])
    first = make()
    half = run(first, start, deltas[:3])  # stopped with one update buffered
    second = make()
    second.load_state_dict(first.state_dict())
    np.testing.assert_array_equal(run(second, half, deltas[3:])["a"], whole["a"])
    with pytest.raises(ValueError, match="'momentum'; this run's is 'sgd'"):
        FedBuff(2, 0.1).load_state_dict(first.state_dict())


def test_dp_sends_the_noised_mean_through_the_optimizer():
    """DP-FedAdam and DP-FedBuff with momentum: the optimizer takes ``(sum + noise) / denominator`` (the noise the
    plain DP step adds, drawn from the same seed and round), so the guarantee is DP-FedAvg's, post-processed."""
    from devsim.privacy.noise import gaussian_like
    from devsim.privacy.plan import PrivacyPlan
    from devsim.privacy.server import LeafSum, PrivateAggregator

    config = SimulationConfig(dp="central", dp_noise_multiplier=1.0, dp_clip=0.5, num_leaf_nodes=2, devices_per_leaf=10)
    plan = PrivacyPlan.from_settings(config)
    rng = np.random.default_rng(4)
    shapes = {"a": (7,), "b": (2, 3)}
    rounds = [[LeafSum({k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}, 3)] for _ in "123"]
    aggregator = PrivateAggregator(plan, 9, 2, server_optimizer=ServerOptimizer("adam", 0.05))
    by_hand = ServerOptimizer("adam", 0.05)
    weights = expected = {k: np.zeros(v, np.float32) for k, v in shapes.items()}
    for round_num, leaves in enumerate(rounds):
        weights, record = aggregator.aggregate(round_num, weights, leaves)
        noise = gaussian_like(shapes, aggregator.server_noise_std(1), 9, "dp-noise", round_num)
        mean = {k: (leaves[0].delta_sum[k].astype(np.float64) + noise[k]) / plan.denominator for k in shapes}
        expected = by_hand.apply(expected, mean)
        assert record["dp_epsilon"] > 0
    for k in shapes:
        np.testing.assert_array_equal(weights[k], expected[k])
    assert "then adam" in aggregator.describe()

    buffer = FedBuff(2, 0.1, server_optimizer=ServerOptimizer("momentum", 0.1, beta1=0.5))
    deltas = [{"a": rng.standard_normal(7).astype(np.float32)} for _ in range(2)]
    noise = {"a": rng.standard_normal(7).astype(np.float32)}
    for delta in deltas:
        buffer.add(delta, 0)
    noised = buffer.apply({"a": np.zeros(7, np.float32)}, noise)
    mean = {"a": (deltas[0]["a"].astype(np.float64) + deltas[1]["a"] + noise["a"]) / 2}
    np.testing.assert_array_equal(noised["a"], ServerOptimizer("momentum", 0.1).apply({"a": np.zeros(7)}, mean)["a"])


def test_the_fedavg_job_refuses_a_bad_server_optimizer_in_one_line(tmp_path):
    stderr = refused_job("pt_job_fedavg.py", ["--server-optimizer", "lamb", "--workspace", str(tmp_path)], tmp_path)
    assert "server_optimizer" in stderr or "--server-optimizer" in stderr
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_fedadam_run_learns_and_resumes_bit_for_bit(tmp_path):
    """A FedAdam run in the simulator learns (above chance) and records its optimizer; stopped after round 3 and
    resumed, it ends with the uninterrupted run's weights to the bit (the moments travel in the checkpoint)."""
    args = [*SMALL_RUN, "--server-optimizer", "adam", "--global-lr", "0.03"]
    run_job("pt_job_fedavg.py", [*args, "--workspace", str(tmp_path / "a")], tmp_path)
    results = find_results(tmp_path / "a" / "runs")
    assert results["config"]["server_optimizer"] == "adam"
    assert results["summary"]["final_accuracy"] > 0.5, results["summary"]
    uninterrupted = torch.load(results["summary"]["final_model"])
    run_dir, common = tmp_path / "run", ["--workspace", str(tmp_path / "b")]
    run_job("pt_job_fedavg.py", [*args, *common, "--output-dir", str(run_dir), "--stop-after-round", "3"], tmp_path)
    run_job("pt_job_fedavg.py", ["--resume", str(run_dir), *common], tmp_path)
    resumed = torch.load(run_dir / "final_model.pt")
    for key in uninterrupted:
        assert torch.equal(uninterrupted[key], resumed[key]), key


@pytest.mark.slow
def test_fedbuff_with_server_momentum_learns_and_resumes(tmp_path):
    """FedBuff with FedAvgM's momentum on each full buffer learns; stopped at version 20 and resumed, it gives the
    uninterrupted run's arrivals and weights to the bit (the momentum travels in the checkpoint). Devices train one at
    a time: relaunched jobs trained in other batched groups round differently, which momentum amplifies."""
    from tests.test_e2e_async import ASYNC_RUN, _arrivals

    args = [*ASYNC_RUN, "--server-optimizer", "momentum", "--server-momentum", "0.5", "--device-batch", "off"]
    whole = run_job("pt_job_fedbuff.py", [*args, "--workspace", str(tmp_path / "a")], tmp_path)
    assert "server optimizer momentum, eta 0.3, beta1 0.5" in whole.stdout
    results = find_results(tmp_path / "a" / "runs")
    assert results["summary"]["final_accuracy"] > results["rounds"][0]["accuracy"] + 0.25
    run_dir, common = tmp_path / "run", ["--workspace", str(tmp_path / "b")]
    run_job("pt_job_fedbuff.py", [*args, *common, "--output-dir", str(run_dir), "--stop-after-version", "20"], tmp_path)
    run_job("pt_job_fedbuff.py", ["--resume", str(run_dir), *common], tmp_path)
    assert _arrivals(run_dir) == _arrivals(tmp_path / "a")
    uninterrupted = torch.load(results["summary"]["final_model"])
    resumed = torch.load(run_dir / "final_model.pt")
    for key in uninterrupted:
        assert torch.equal(uninterrupted[key], resumed[key]), key
