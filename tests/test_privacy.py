"""Differential privacy core: the accountant against dp-accounting, clipping, noise, sampling, settings."""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np
import pytest
import torch

from devsim.config import ClusterConfig, ConfigError, FedReviveConfig, SimulationConfig
from devsim.privacy.accountant import RunAccountant, epsilon_after
from devsim.privacy.clipping import clip_, clip_rows_, next_clip
from devsim.privacy.device import DevicePrivacy
from devsim.privacy.noise import with_gaussian
from devsim.privacy.plan import PrivacyPlan, default_delta, resolve_noise_multiplier, sum_noise_multiplier
from devsim.privacy.sampling import poisson_select
from devsim.privacy.server import LeafSum, PrivateAggregator

MNIST_EVENT = dp_accounting.PoissonSampledDpEvent(256 / 60000, dp_accounting.GaussianDpEvent(1.1))
SHAPES = {"w": (50, 40), "b": (40,)}


def dp_config(**overrides) -> SimulationConfig:
    values = dict(dp="central", dp_noise_multiplier=1.0, dp_clip=0.5, num_leaf_nodes=2, devices_per_leaf=50)
    values.update(overrides)
    return SimulationConfig(**values)


def test_accountant_reproduces_the_dp_sgd_mnist_figures():
    """q = 256/60,000, z = 1.1, 14,062 steps, delta 1e-5: 2.597 (RDP) and 2.382 (PLD) with dp-accounting 0.6.0."""
    assert round(epsilon_after(MNIST_EVENT, 14062, 1e-5, "rdp"), 3) == 2.597
    assert round(epsilon_after(MNIST_EVENT, 14062, 1e-5, "pld"), 3) == 2.382
    assert round(RunAccountant(MNIST_EVENT, 1e-5, "rdp").epsilon_at(14062), 3) == 2.597


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_run_accountant_matches_a_fresh_library_accountant_round_by_round(kind):
    event = dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(0.9))
    accountant = RunAccountant(event, 1e-5, kind)
    steps = [accountant.step() for _ in range(30)]
    for rounds in (1, 7, 30):
        assert steps[rounds - 1] == pytest.approx(epsilon_after(event, rounds, 1e-5, kind), rel=1e-3)
    assert steps == sorted(steps) and steps[0] > 0


def test_a_budget_look_ahead_then_a_step_gives_the_steps_own_epsilon():
    """``--dp-budget`` asks for epsilon one round ahead before each round; the PLD it composed is the one the step
    keeps, so the run's epsilons are those of stepping alone, bit for bit."""
    event = dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(0.9))
    looking, stepping = RunAccountant(event, 1e-5, "pld"), RunAccountant(event, 1e-5, "pld")
    for _ in range(8):
        ahead = looking.epsilon_at(looking.rounds + 1)
        assert looking.step() == ahead == stepping.step()


def test_accountant_state_restores_the_same_epsilon():
    event = dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.2))
    for kind in ("rdp", "pld"):
        first = RunAccountant(event, 1e-5, kind)
        for _ in range(12):
            first.step()
        second = RunAccountant(event, 1e-5, kind)
        second.load_state(first.state())
        assert second.rounds == 12 and second.step() == pytest.approx(first.step(), rel=1e-6)


def test_fixed_size_sampling_is_accounted_as_replace_one_with_twice_the_sensitivity():
    plan = PrivacyPlan.from_settings(dp_config(dp_sampling="fixed"))
    event = plan.event()
    assert isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent)
    assert event.event.noise_multiplier == pytest.approx(0.5) and plan.replace_one
    poisson = PrivacyPlan.from_settings(dp_config())
    assert poisson.new_accountant().epsilon_at(5) < plan.new_accountant().epsilon_at(5)


@pytest.mark.parametrize("kind, rounds, target", [("rdp", 30, 4.0)])  # a PLD solve: ~10 PLDs, 45 s here
def test_dp_epsilon_solves_the_smallest_noise_multiplier_for_the_rounds(kind, rounds, target):
    config = dp_config(dp_noise_multiplier=None, dp_epsilon=target, dp_accountant=kind, num_rounds=rounds)
    z = resolve_noise_multiplier(config, config.num_rounds)
    plan = PrivacyPlan.from_settings(dataclasses.replace(config, dp_noise_multiplier=z))
    assert plan.new_accountant().epsilon_at(rounds) <= target
    looser = PrivacyPlan.from_settings(dataclasses.replace(config, dp_noise_multiplier=z * 0.99))
    assert looser.new_accountant().epsilon_at(rounds) > target * 0.999


def test_unreachable_target_epsilon_is_refused():
    config = dp_config(dp_noise_multiplier=None, dp_epsilon=0.01, dp_target_quantile=0.5, num_rounds=50)
    with pytest.raises(ValueError, match="cannot be reached"):
        resolve_noise_multiplier(config, config.num_rounds)


def test_clipping_bounds_each_update_and_leaves_small_ones_alone():
    update = [torch.full((3, 4), 1.0), torch.full((5,), 2.0)]  # norm sqrt(12 + 20)
    norm = clip_(update, 2.0)
    assert norm == pytest.approx(math.sqrt(32))
    assert float(torch.linalg.vector_norm(torch.cat([t.flatten() for t in update]))) == pytest.approx(2.0, rel=1e-6)
    small = [torch.full((3,), 0.1)]
    clip_(small, 2.0)
    assert torch.equal(small[0], torch.full((3,), 0.1))


def test_batched_rows_clip_as_each_device_alone():
    torch.manual_seed(0)
    rows = [torch.randn(6, 4, 3), torch.randn(6, 7)]
    alone = [[t[i].clone() for t in rows] for i in range(6)]
    norms = clip_rows_(rows, 3.0)
    for i, update in enumerate(alone):
        assert float(norms[i]) == pytest.approx(clip_(update, 3.0), rel=1e-5)
        for t, expected in zip(rows, update, strict=True):
            torch.testing.assert_close(t[i], expected)


def test_device_privacy_counts_below_clip_and_adds_seeded_local_noise():
    rows = [torch.tensor([[0.1, 0.0], [3.0, 4.0]])]
    below = DevicePrivacy(1.0).apply_rows_(rows, 0, [5, 6])
    assert below == [True, False]
    a, b = [torch.zeros(1000)], [torch.zeros(1000)]
    DevicePrivacy(1.0, 0.5, seed=3).apply_(a, 2, 9)
    DevicePrivacy(1.0, 0.5, seed=3).apply_(b, 2, 9)
    assert torch.equal(a[0], b[0]) and float(a[0].std()) == pytest.approx(0.5, rel=0.1)


def test_poisson_selection_is_seeded_and_has_the_rate():
    first = poisson_select(7, 3, 5000, 0.02)
    assert np.array_equal(first, poisson_select(7, 3, 5000, 0.02))
    sizes = [poisson_select(7, r, 5000, 0.02).size for r in range(200)]
    assert np.mean(sizes) == pytest.approx(100, rel=0.05) and len(set(sizes)) > 5


def _deviation(aggregator: PrivateAggregator, round_num: int, leaves: list[LeafSum]) -> np.ndarray:
    zero = {k: np.zeros(s, dtype=np.float32) for k, s in SHAPES.items()}
    new, _ = aggregator.aggregate(round_num, zero, leaves)
    return np.concatenate([v.ravel() for v in new.values()])


def _zero_sum() -> dict:
    return {k: np.zeros(s, dtype=np.float32) for k, s in SHAPES.items()}


@pytest.mark.parametrize("placement", ["server", "leaves"])
def test_aggregate_noise_has_the_expected_standard_deviation(placement):
    """Deviation of the aggregate from the noiseless one: std z * S / expected devices * global_lr, within 5% over
    many draws; with leaf placement each of 4 leaves adds its share (one leaf missing: the server tops it up)."""
    config = dp_config(dp_noise_multiplier=1.3, dp_clip=0.7, num_leaf_nodes=4, devices_per_leaf=25)
    plan = PrivacyPlan.from_settings(dataclasses.replace(config, dp_noise_at=placement))
    aggregator = PrivateAggregator(plan, seed=5, num_leaves=4, global_lr=0.8)
    expected = 1.3 * 0.7 / plan.denominator * 0.8
    draws = []
    for round_num in range(20):
        if placement == "server":
            leaves = [LeafSum(_zero_sum(), 5)]
        else:
            std = aggregator.leaf_noise_std()
            present = 3 if round_num % 2 else 4
            leaves = [
                LeafSum(with_gaussian(_zero_sum(), std, 5, "dp-leaf-noise", round_num, i), 5) for i in range(present)
            ]
        draws.append(_deviation(aggregator, round_num, leaves))
    deviation = np.concatenate(draws)
    assert deviation.size >= 40000 and abs(deviation.mean()) < 0.05 * expected
    assert deviation.std() == pytest.approx(expected, rel=0.05)


def test_aggregate_repeats_bit_for_bit_and_resumes_from_its_state():
    plan = PrivacyPlan.from_settings(dp_config(dp_target_quantile=0.5))
    sums = [LeafSum({k: np.full(s, 0.01, np.float32) for k, s in SHAPES.items()}, 10, 7)]

    def run(rounds, aggregator, weights):
        for r in rounds:
            weights, record = aggregator.aggregate(r, weights, sums)
        return weights, record

    start = {k: np.zeros(s, dtype=np.float32) for k, s in SHAPES.items()}
    full_weights, full_record = run(range(6), PrivateAggregator(plan, 1, 2), start)
    again, _ = run(range(6), PrivateAggregator(plan, 1, 2), start)
    first = PrivateAggregator(plan, 1, 2)
    half, _ = run(range(3), first, start)
    resumed = PrivateAggregator(plan, 1, 2)
    resumed.load_state(first.state())
    resumed_weights, resumed_record = run(range(3, 6), resumed, half)
    for key in SHAPES:
        assert np.array_equal(full_weights[key], again[key]) and np.array_equal(full_weights[key], resumed_weights[key])
    assert resumed_record == full_record and full_record["dp_clip"] != plan.clip


def test_adaptive_clip_moves_towards_the_target_quantile():
    assert next_clip(1.0, 0.9, 0.5, 0.2) < 1.0 < next_clip(1.0, 0.1, 0.5, 0.2)
    assert sum_noise_multiplier(1.0, 10.0) > 1.0 and sum_noise_multiplier(1.0, None) == 1.0
    with pytest.raises(ValueError, match="count noise"):
        sum_noise_multiplier(5.0, 1.0)


def test_budget_says_which_round_would_overspend():
    aggregator = PrivateAggregator(PrivacyPlan.from_settings(dp_config()), 0, 2)
    first = aggregator.accountant.epsilon_at(1)
    assert aggregator.would_exceed(None) is None and aggregator.would_exceed(first * 1.01) is None
    assert aggregator.would_exceed(first * 0.99) == pytest.approx(first)


def test_default_delta_is_below_one_over_the_population():
    plan = PrivacyPlan.from_settings(dp_config())
    assert plan.delta == pytest.approx(default_delta(100)) and plan.delta < 1 / 100


@pytest.mark.parametrize(
    "overrides, flag",
    [
        (dict(dp_clip=0.0), "--dp-clip"),
        (dict(dp_clip=-1.0), "--dp-clip"),
        (dict(dp_noise_multiplier=-0.5), "--dp-noise-multiplier"),
        (dict(dp_delta=0.0), "--dp-delta"),
        (dict(dp_delta=1.5), "--dp-delta"),
        (dict(dp_delta=0.02), "--dp-delta"),  # above 1 / population (100 devices)
        (dict(dp_noise_multiplier=None), "--dp:"),
        (dict(dp_epsilon=-1.0), "--dp-epsilon"),
        (dict(dp="laplace"), "--dp:"),
        (dict(dp_sampling="fixed", dp_accountant="pld"), "--dp-accountant"),
        (dict(update_codec="topk"), "--update-codec"),
        (dict(dp_target_quantile=1.0), "--dp-target-quantile"),
        (dict(dp_target_quantile=0.5, dp_noise_at="leaves"), "--dp-target-quantile"),
        (dict(dp="local", dp_noise_at="leaves"), "--dp-noise-at"),
    ],
)
def test_bad_privacy_settings_get_one_line_naming_the_flag(overrides, flag):
    with pytest.raises(ConfigError) as error:
        dp_config(**overrides).validate()
    assert flag in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("config_cls", [FedReviveConfig, ClusterConfig])
def test_methods_without_dp_refuse_it_in_one_line(config_cls):
    with pytest.raises(ConfigError, match="--dp: central is not available"):
        config_cls(dp="central", dp_noise_multiplier=1.0, num_leaf_nodes=2, devices_per_leaf=50).validate()


def test_dp_off_leaves_every_setting_valid():
    SimulationConfig(dp_clip=1.0).validate()
    dp_config().validate()


def test_local_dp_aggregate_noise_has_the_expected_standard_deviation():
    """Local DP: m devices each add z * S to a zero update; the aggregate's deviation is sqrt(m) z S / expected."""
    plan = PrivacyPlan.from_settings(dp_config(dp="local", dp_noise_multiplier=0.6, dp_clip=0.5))
    aggregator = PrivateAggregator(plan, seed=2, num_leaves=2)
    device = aggregator.device_privacy()
    assert device.local_noise_std == pytest.approx(0.3) and aggregator.server_noise_std(2) == 0.0
    devices = 9
    summed = {k: np.zeros(s, dtype=np.float32) for k, s in SHAPES.items()}
    for device_id in range(devices):
        update = [torch.zeros(s) for s in SHAPES.values()]
        device.apply_(update, 0, device_id)
        for key, t in zip(SHAPES, update, strict=True):
            summed[key] += t.numpy()
    deviation = _deviation(aggregator, 0, [LeafSum(summed, devices)])
    assert deviation.std() == pytest.approx(math.sqrt(devices) * 0.3 / plan.denominator, rel=0.05)


def test_leaf_placement_also_accounts_one_leaf_sum_alone():
    """With noise split over L leaves, one leaf's sum carries z / sqrt(L): its epsilon is reported beside the run's."""
    plan = PrivacyPlan.from_settings(dp_config(dp_noise_at="leaves", num_leaf_nodes=4, devices_per_leaf=25))
    aggregator = PrivateAggregator(plan, seed=0, num_leaves=4)
    _, record = aggregator.aggregate(0, _zero_sum(), [LeafSum(_zero_sum(), 3)])
    alone = PrivacyPlan.from_settings(dp_config(dp_noise_multiplier=0.5, num_leaf_nodes=4, devices_per_leaf=25))
    assert record["dp_epsilon_one_leaf_sum"] == pytest.approx(alone.new_accountant().epsilon_at(1))
    assert record["dp_epsilon_one_leaf_sum"] > record["dp_epsilon"]
    resumed = PrivateAggregator(plan, seed=0, num_leaves=4)
    resumed.load_state(aggregator.state())
    assert resumed.leaf_accountant.rounds == 1


def test_the_noised_norm_bound_holds_for_honest_noised_updates():
    """Clipped updates plus N(0, std^2) noise stay under :func:`noised_norm_bound` (the leaf's limit under local DP),
    which is still far below an absurd update."""
    from devsim.privacy.noise import noised_norm_bound

    rng = np.random.default_rng(0)
    size, clip, std = 62_006, 1.0, 0.5
    bound = noised_norm_bound(clip, std, size)
    for _ in range(20):
        update = rng.standard_normal(size)
        update *= clip / np.linalg.norm(update)
        assert np.linalg.norm(update + std * rng.standard_normal(size)) < bound
    assert 125 < bound < 132


def test_the_noise_note_compares_the_noise_on_a_mean_update_with_the_clip_norm():
    """Central: z sqrt(d) / denominator; local: each of the m expected devices adds its own, z sqrt(m d) / denominator.
    Above 1 the line says what quietens it; a large enough denominator brings it under."""
    central = PrivateAggregator(PrivacyPlan.from_settings(dp_config()), 0, 2)  # z 1, 20 selected of 100
    assert central.noise_to_clip(62_500) == pytest.approx(250 / 20)
    assert "norm about 12.5 x S" in central.noise_note(62_500) and "quieten" in central.noise_note(62_500)
    local = PrivateAggregator(PrivacyPlan.from_settings(dp_config(dp="local", dp_noise_multiplier=0.5)), 0, 2)
    assert local.noise_to_clip(62_500) == pytest.approx(0.5 * math.sqrt(20 * 62_500) / 20)
    wide = dp_config(num_leaf_nodes=10, devices_per_leaf=1000, device_selection_size=5000)
    quiet = PrivateAggregator(PrivacyPlan.from_settings(wide), 0, 10)
    assert quiet.noise_to_clip(62_500) == pytest.approx(0.05) and "quieten" not in quiet.noise_note(62_500)
