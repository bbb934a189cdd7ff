"""Differential privacy at the leaf: every device's update is clipped where it is computed, on the thread-pool
path and on the batched path alike, and enters the leaf's sum once (not weighted by its samples)."""

from __future__ import annotations

import numpy as np
import pytest

from devsim.codec import model_to_numpy
from devsim.models import build_model
from devsim.privacy.device import DevicePrivacy
from devsim.training.leaf_runner import LeafRoundRunner
from tests.conftest import small_processors

DEVICES = list(range(8))


@pytest.fixture(scope="module")
def rounds(single_torch_thread):
    """One round of 8 devices without DP, and with a clip norm below every device's update norm, on both paths."""
    weights = model_to_numpy(build_model("cnn"))
    out = {}
    for name, batch in (("loop", 1), ("batched", 4)):
        runner = LeafRoundRunner(small_processors(1), device_batch=batch)
        try:
            plain = runner.run_round(2, weights, DEVICES)
            clipped = runner.run_round(2, weights, DEVICES, privacy=DevicePrivacy(1e-3))
            loose = runner.run_round(2, weights, DEVICES, privacy=DevicePrivacy(1e6))
        finally:
            runner.close()
        out[name] = (plain, clipped, loose)
    return out


def _norm(delta_sum: dict) -> float:
    return float(np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in delta_sum.values())))


@pytest.mark.parametrize("path", ["loop", "batched"])
def test_each_device_is_clipped_and_counted_once(rounds, path):
    plain, clipped, loose = rounds[path]
    assert _norm(clipped.delta_sum) <= len(DEVICES) * 1e-3 * (1 + 1e-5)
    assert clipped.counts["dp_below_clip"] == 0 and loose.counts["dp_below_clip"] == len(DEVICES)
    samples = plain.device_metrics[0].num_samples
    for key in plain.delta_sum:  # without clipping, DP's unweighted sum is the sample-weighted sum / samples
        np.testing.assert_allclose(loose.delta_sum[key] * samples, plain.delta_sum[key], rtol=1e-4, atol=1e-6)


def test_loop_and_batched_paths_clip_alike(rounds):
    for key in rounds["loop"][1].delta_sum:
        np.testing.assert_allclose(
            rounds["batched"][1].delta_sum[key], rounds["loop"][1].delta_sum[key], rtol=1e-3, atol=1e-9
        )


@pytest.mark.parametrize("batch", [1, 4])
def test_async_jobs_are_clipped_and_noised_on_the_leaf(single_torch_thread, batch):
    """DP-FedBuff: each job's own delta leaves the leaf clipped to S and, with a noise std (local DP or leaf
    placement's share), with Gaussian noise of that std keyed by the job's train seed."""
    weights = model_to_numpy(build_model("cnn"))
    runner = LeafRoundRunner(small_processors(1), device_batch=batch)
    try:
        args = (weights, DEVICES, DEVICES, [100 + d for d in DEVICES])
        clipped = runner.run_jobs(*args, privacy=DevicePrivacy(1e-3))
        noised = runner.run_jobs(*args, privacy=DevicePrivacy(1e-3, 0.01, seed=4))
    finally:
        runner.close()
    rows = np.sqrt(
        sum(np.sum(v.astype(np.float64) ** 2, axis=tuple(range(1, v.ndim))) for v in clipped["deltas"].values())
    )
    assert rows.shape == (len(DEVICES),) and np.all(rows <= 1e-3 * (1 + 1e-5)) and np.all(rows > 0.9e-3)
    deviation = np.concatenate([(noised["deltas"][k] - clipped["deltas"][k]).ravel() for k in clipped["deltas"]])
    assert deviation.size > 100_000 and deviation.std() == pytest.approx(0.01, rel=0.05)
    first, second = (
        np.concatenate([(noised["deltas"][k] - clipped["deltas"][k])[i].ravel() for k in weights]) for i in (0, 1)
    )
    assert not np.allclose(first, second)  # each job draws its own noise
