"""DP-FedBuff's core: each version accounted as a sample of B from population - K, noise per applied buffer (at the
server or as shares on each update), one update per device and buffer, repeatable and resumable state."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
import torch

from devsim.aggregation.fedbuff import FedBuff
from devsim.config import AsyncConfig, ConfigError, FedReviveConfig
from devsim.privacy.buffered import BufferedPrivacy
from devsim.privacy.device import DevicePrivacy
from devsim.privacy.plan import PrivacyPlan

SHAPES = {"w": (60, 40), "b": (40,)}
N, K, B = 200, 20, 8


def async_config(**overrides) -> AsyncConfig:
    values = dict(
        dp="central",
        dp_noise_multiplier=1.1,
        dp_clip=0.5,
        num_leaf_nodes=4,
        devices_per_leaf=N // 4,
        concurrency=K,
        buffer_size=B,
    )
    values.update(overrides)
    return AsyncConfig(**values).validate()


def _updates(version: int, count: int = B) -> list[list[torch.Tensor]]:
    """``count`` device updates of norm about 3 (above every clip norm used here), seeded by ``version``."""
    generator = torch.Generator().manual_seed(version)
    return [[torch.randn(s, generator=generator) * 0.05 for s in SHAPES.values()] for _ in range(count)]


def _apply(privacy: BufferedPrivacy | None, version: int, device: DevicePrivacy, global_lr: float = 1.0) -> dict:
    """One buffer of B clipped updates (noised as ``device`` says, keyed by job) applied to zero weights."""
    buffer = FedBuff(B, global_lr)
    for i, update in enumerate(_updates(version)):
        device.apply_(update, 1000 * version + i, i)
        buffer.add({k: t.numpy().astype(np.float64) for k, t in zip(SHAPES, update, strict=True)}, 0)
    noise = privacy.noise(version, SHAPES) if privacy is not None else None
    weights = buffer.apply({k: np.zeros(s, dtype=np.float32) for k, s in SHAPES.items()}, noise)
    if privacy is not None:
        privacy.applied()
    return weights


def test_each_version_is_accounted_as_a_sample_of_b_from_population_minus_k():
    plan = PrivacyPlan.from_settings(async_config())
    assert (plan.sampling, plan.population, plan.expected, plan.denominator) == ("buffer", N - K, B, B)
    privacy = BufferedPrivacy(plan, seed=0)
    for _ in range(5):
        record = privacy.applied()
    event = dp_accounting.SampledWithoutReplacementDpEvent(N - K, B, dp_accounting.GaussianDpEvent(1.1 / 2))
    library = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    library.compose(event, 5)
    assert f"{record['dp_epsilon']:.3g}" == f"{library.get_epsilon(1 / N**1.1):.3g}"
    assert privacy.summary()["dp_rounds_accounted"] == 5 and "buffers of 8 from 180 idle devices" in privacy.describe()


@pytest.mark.parametrize("placement", ["server", "leaves"])
def test_buffer_noise_has_the_expected_standard_deviation(placement):
    """Deviation of each applied version from the noiseless one (same clipped updates): std global_lr * z * S / B,
    within 5% over many draws; with leaf placement each of the B updates carries a share z * S / sqrt(B)."""
    plan = PrivacyPlan.from_settings(async_config(dp_noise_at=placement))
    privacy = BufferedPrivacy(plan, seed=3, global_lr=0.7)
    job = privacy.job_privacy()
    assert job["noise_std"] == (pytest.approx(1.1 * 0.5 / np.sqrt(B)) if placement == "leaves" else 0.0)
    noisy_device, plain_device = DevicePrivacy(job["clip"], job["noise_std"], 3), DevicePrivacy(job["clip"])
    draws = []
    for version in range(1, 9):
        noisy = _apply(privacy, version, noisy_device, 0.7)
        plain = _apply(None, version, plain_device, 0.7)
        draws.append(np.concatenate([(noisy[k] - plain[k]).ravel() for k in SHAPES]))
    deviation = np.concatenate(draws)
    expected = 0.7 * 1.1 * 0.5 / B
    assert deviation.size >= 19000 and abs(deviation.mean()) < 0.05 * expected
    assert deviation.std() == pytest.approx(expected, rel=0.05)
    assert np.abs(plain["w"]).max() > 0  # the updates were not zero: clipping bounded them, noise came on top


def test_a_run_repeats_bit_for_bit_and_resumes_from_its_state():
    plan = PrivacyPlan.from_settings(async_config(dp_noise_at="leaves"))

    def run(versions, privacy):
        device = DevicePrivacy(plan.clip, privacy.job_privacy()["noise_std"], 1)
        return [_apply(privacy, v, device) for v in versions][-1], dict(privacy.last)

    full, full_record = run(range(1, 7), BufferedPrivacy(plan, 1))
    again, _ = run(range(1, 7), BufferedPrivacy(plan, 1))
    first = BufferedPrivacy(plan, 1)
    run(range(1, 4), first)
    first.accepted(17)
    resumed = BufferedPrivacy(plan, 1)
    resumed.load_state(first.state())
    assert resumed.repeats(17) and resumed.aggregator.accountant.rounds == 3
    resumed_weights, resumed_record = run(range(4, 7), resumed)
    for key in SHAPES:
        assert np.array_equal(full[key], again[key]) and np.array_equal(full[key], resumed_weights[key])
    assert resumed_record == full_record
    # one update alone, seen by a server that knows its device: Gaussian z / sqrt(B), replace-one, every version
    alone = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    alone.compose(dp_accounting.GaussianDpEvent(1.1 / np.sqrt(B) / 2), 6)
    assert full_record["dp_epsilon_one_update"] == pytest.approx(alone.get_epsilon(1 / N**1.1), rel=1e-3)
    assert full_record["dp_epsilon_one_update"] > full_record["dp_epsilon"]


def test_a_buffer_holds_one_update_per_device():
    privacy = BufferedPrivacy(PrivacyPlan.from_settings(async_config()), 0)
    privacy.accepted(5)
    assert privacy.repeats(5) and not privacy.repeats(6)
    privacy.applied()
    assert not privacy.repeats(5)


def test_local_dp_noises_each_update_and_the_server_adds_none():
    privacy = BufferedPrivacy(PrivacyPlan.from_settings(async_config(dp="local")), 0)
    assert privacy.job_privacy() == {"clip": 0.5, "noise_std": pytest.approx(0.55)}
    assert privacy.noise(1, SHAPES) is None


def test_budget_names_the_version_that_would_overspend():
    privacy = BufferedPrivacy(PrivacyPlan.from_settings(async_config()), 0)
    first = privacy.aggregator.accountant.epsilon_at(1)
    assert privacy.over_budget(None, 1) is None and privacy.over_budget(first * 1.01, 1) is None
    message = privacy.over_budget(first * 0.99, 1)
    assert message.startswith("stopped before version 1") and privacy.summary()["dp_stopped"] == message


@pytest.mark.parametrize(
    "overrides, flag",
    [
        (dict(dp_target_quantile=0.5), "--dp-target-quantile"),
        (dict(dp_accountant="pld"), "--dp-accountant"),
        (dict(concurrency=195), "--concurrency"),  # 5 idle devices, fewer than B = 8
    ],
)
def test_what_dp_fedbuff_cannot_do_is_refused_in_one_line(overrides, flag):
    with pytest.raises(ConfigError) as error:
        async_config(**overrides)
    assert flag in str(error.value) and "\n" not in str(error.value)


def test_fedrevive_still_refuses_dp():
    with pytest.raises(ConfigError, match="--dp: central is not available here: FedRevive"):
        FedReviveConfig(dp="central", dp_noise_multiplier=1.0, num_leaf_nodes=2, devices_per_leaf=50).validate()
