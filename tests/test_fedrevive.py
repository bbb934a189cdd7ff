"""Tests for devsim.aggregation.fedrevive (server-side data-free KD) and the feature trackers in devsim.models."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn

from devsim.aggregation.fedrevive import (
    DFKDConfig,
    GaussianProbeEstimator,
    Generator,
    Reviver,
    ReviverConfig,
    Synthesizer,
    SyntheticPool,
    TeacherBuffer,
    beta,
    distill,
    proportions_from_counts,
    proportions_from_labels,
    scaled_s_max,
)
from devsim.aggregation.fedrevive._common import class_weight_matrix, kl_per_sample
from devsim.aggregation.fedrevive.inputs import augment_inputs
from devsim.codec import load_numpy_into_model, model_to_numpy
from devsim.models import FeatureTracker, build_model, feature_trackers

pytestmark = pytest.mark.usefixtures("single_torch_thread")

MEAN = (0.5, 0.5, 0.5)
STD = (0.25, 0.25, 0.25)


def tiny_config(**overrides) -> DFKDConfig:
    """DFKD settings small enough for CPU tests; learning rates and loss weights keep the spec's defaults."""
    settings = dict(
        latent_dim=32,
        generator_width=16,
        synth_batch_size=16,
        pool_capacity=64,
        pool_dtype="float32",
        normalize_mean=MEAN,
        normalize_std=STD,
        kd_batch_per_teacher=16,
    )
    settings.update(overrides)
    return DFKDConfig(**settings)


def toy_images(labels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Images on [0, 1]: a per-class colour (fixed palette) times a per-class vertical ramp, plus noise."""
    palette = torch.rand(10, 3, generator=torch.Generator().manual_seed(123))
    ramp = torch.linspace(0.0, 1.0, 32)
    slopes = torch.linspace(-0.5, 0.5, 10)
    base = palette[labels][:, :, None, None] + slopes[labels][:, None, None, None] * (ramp[None, None, :, None] - 0.5)
    noise = 0.05 * torch.randn(len(labels), 3, 32, 32, generator=generator)
    return (base + noise).clamp(0.0, 1.0)


def train_toy_teacher(classes: list[int], seed: int, steps: int = 60) -> nn.Module:
    """A tracked CNN trained (train mode, so trackers record statistics) on toy images of ``classes``."""
    torch.manual_seed(seed)
    model = build_model("cnn", track_features=True)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    choices = torch.tensor(classes)
    mean, std = torch.tensor(MEAN), torch.tensor(STD)
    for _ in range(steps):
        labels = choices[torch.randint(0, len(classes), (32,), generator=generator)]
        images = augment_inputs(toy_images(labels, generator), mean, std, generator=generator, crop_flip=False)
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@functools.cache
def _toy_teacher_weights(classes: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    return model_to_numpy(train_toy_teacher(list(classes), seed))


def toy_teacher(classes: tuple[int, ...] = (0, 1, 2, 3), seed: int = 0) -> nn.Module:
    """A fresh module holding the (cached) toy teacher trained on ``classes``."""
    model = build_model("cnn", track_features=True)
    load_numpy_into_model(model, _toy_teacher_weights(classes, seed))
    return model.eval()


def one_hot_q(classes: tuple[int, ...], num_classes: int = 10) -> np.ndarray:
    q = np.zeros(num_classes)
    q[list(classes)] = 1.0
    return q / q.sum()


# ---------------------------------------------------------------- feature trackers


def test_tracker_matches_batchnorm_running_stats() -> None:
    tracker, bn = FeatureTracker(4), nn.BatchNorm2d(4, affine=False)
    for seed in range(3):
        x = torch.randn(5, 4, 6, 6, generator=torch.Generator().manual_seed(seed)) * 3 + 1
        assert torch.equal(tracker(x), x)
        bn(x)
    torch.testing.assert_close(tracker.running_mean, bn.running_mean)
    torch.testing.assert_close(tracker.running_var, bn.running_var)
    tracker.eval()
    before = tracker.running_mean.clone()
    tracker(torch.randn(5, 4, 6, 6))
    assert torch.equal(tracker.running_mean, before)


def test_tracker_capture_stats_with_grad_and_weights() -> None:
    tracker = FeatureTracker(3).eval()
    tracker.capture = True
    x = torch.randn(8, 3, 5, 5, requires_grad=True)
    tracker(x)
    torch.testing.assert_close(tracker.last_mean, x.mean(dim=(0, 2, 3)))
    torch.testing.assert_close(tracker.last_var, x.var(dim=(0, 2, 3), unbiased=False))
    weights = torch.tensor([1.0, 1.0, 0, 0, 0, 0, 0, 0])
    mean, var = tracker.batch_stats(weights)
    torch.testing.assert_close(mean, x[:2].mean(dim=(0, 2, 3)))
    torch.testing.assert_close(var, x[:2].var(dim=(0, 2, 3), unbiased=False))
    (mean.sum() + var.sum()).backward()
    assert x.grad is not None and x.grad[2:].abs().sum() == 0
    tracker.clear()
    with pytest.raises(RuntimeError):
        tracker.batch_stats()


@pytest.mark.parametrize(("name", "count"), [("cnn", 2), ("resnet18_nonorm", 17)])
def test_models_with_trackers(name: str, count: int) -> None:
    plain, tracked = build_model(name), build_model(name, track_features=True)
    assert not plain.track_features and tracked.track_features
    assert feature_trackers(plain) == [] and len(feature_trackers(tracked)) == count
    extra = [key for key in tracked.state_dict() if key not in plain.state_dict()]
    assert len(extra) == 2 * count and all(".running_" in key for key in extra)
    assert [k for k in tracked.state_dict() if k not in extra] == list(plain.state_dict())
    tracked.load_state_dict(plain.state_dict(), strict=False)
    x = torch.randn(2, 3, 32, 32)
    plain.eval(), tracked.eval()
    torch.testing.assert_close(plain(x), tracked(x))


# ---------------------------------------------------------------- staleness, teachers, proportions


@pytest.mark.parametrize(("tau", "expected"), [(0, 0.0), (50, 0.25), (75, 0.5), (100, 0.75), (150, 1.0), (200, 1.0)])
def test_beta_schedule(tau: float, expected: float) -> None:
    assert beta(tau, 75) == pytest.approx(expected, abs=1e-12)


def test_beta_monotone_and_validation() -> None:
    values = [beta(t, 10) for t in np.linspace(0, 30, 61)]
    assert all(b >= a for a, b in zip(values, values[1:], strict=False))
    assert beta(0, 10) == 0.0 and beta(10, 10) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        beta(-1, 75)
    with pytest.raises(ValueError):
        beta(1, 0)


def test_scaled_s_max() -> None:
    assert scaled_s_max(100, 1) == pytest.approx(75.0)
    assert scaled_s_max(8, 2) == pytest.approx(3.0)
    assert scaled_s_max(1, 4) == 1.0
    with pytest.raises(ValueError):
        scaled_s_max(0, 1)


def test_teacher_buffer_bound_and_order() -> None:
    buffer = TeacherBuffer(capacity=3)
    for i in range(5):
        buffer.push({"w": np.full(2, i, np.float32)}, np.array([1.0, 3.0]))
    assert len(buffer) == 3
    assert [int(t.weights["w"][0]) for t in buffer] == [4, 3, 2]
    assert [t.uid for t in buffer] == [4, 3, 2]
    assert buffer[0].q == pytest.approx([0.25, 0.75])
    restored = TeacherBuffer(capacity=3)
    restored.load_state_dict(buffer.state_dict())
    assert [t.uid for t in restored] == [4, 3, 2]
    assert restored.push({"w": np.zeros(2)}, np.ones(2)).uid == 5
    with pytest.raises(ValueError):
        buffer.push({}, np.zeros(2))


def test_histogram_proportions() -> None:
    assert proportions_from_counts(np.array([1, 3, 0])) == pytest.approx([0.25, 0.75, 0.0])
    assert proportions_from_labels(np.array([2, 2, 0, 1]), 4) == pytest.approx([0.25, 0.25, 0.5, 0.0])
    with pytest.raises(ValueError):
        proportions_from_counts(np.zeros(3))
    with pytest.raises(ValueError):
        proportions_from_labels(np.array([5]), 4)


def test_class_weight_matrix_columns_sum_to_one() -> None:
    qs = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    weights = class_weight_matrix(qs)
    torch.testing.assert_close(weights, torch.tensor([[1 / 3, 1.0, 0.5], [2 / 3, 0.0, 0.5]]))


def _biased_model(target: int, seed: int) -> nn.Module:
    """A tracked CNN trained for a few steps to predict ``target`` on Gaussian inputs."""
    torch.manual_seed(seed)
    model = build_model("cnn", track_features=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(8):
        loss = nn.functional.cross_entropy(model(torch.randn(16, 3, 32, 32)), torch.full((16,), target))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def test_gaussian_probe_estimator() -> None:
    estimator = GaussianProbeEstimator(num_probes=64, temperature=0.8, uploads_per_client=2, seed=0, max_devices=2)
    first = estimator.observe("a", _biased_model(3, seed=0))
    assert first.sum() == pytest.approx(1.0) and int(first.argmax()) == 3 and first[3] > 0.5
    assert not estimator.is_frozen("a")
    second = estimator.observe("a", _biased_model(3, seed=1))
    assert estimator.is_frozen("a") and second.sum() == pytest.approx(1.0) and int(second.argmax()) == 3
    other = _biased_model(7, seed=2)
    assert estimator.observe("a", other) == pytest.approx(second)
    assert int(estimator.observe("b", other).argmax()) == 7
    estimator.observe("c", other)
    assert len(estimator) == 2 and estimator.get("a") is None
    clone = GaussianProbeEstimator(seed=0, max_devices=2)
    clone.load_state_dict(estimator.state_dict())
    assert clone.get("c") == pytest.approx(estimator.get("c"))


# ---------------------------------------------------------------- generator, augmentation, pool


def test_generator_shape_and_range() -> None:
    generator = Generator()
    with torch.no_grad():
        images = generator(torch.randn(4, 256), torch.tensor([0, 1, 2, 9]))
    assert images.shape == (4, 3, 32, 32)
    assert float(images.min()) >= 0.0 and float(images.max()) <= 1.0  # sigmoid range
    small = Generator(latent_dim=8, width=4, num_classes=3)
    assert small(torch.randn(2, 8)).shape == (2, 3, 32, 32)
    assert Generator(latent_dim=8, width=4, image_size=(16, 24), channels=1)(torch.randn(2, 8)).shape == (2, 1, 16, 24)
    embedding = {id(p) for p in small.embedding_parameters()}
    assert len(small.body_parameters()) + len(embedding) == len(list(small.parameters()))


def test_augment_crop_flip_normalise() -> None:
    images = torch.rand(6, 3, 32, 32, requires_grad=True)
    mean, std = torch.tensor(MEAN), torch.tensor(STD)
    plain = augment_inputs(images, mean, std, padding=4, crop_flip=False)
    torch.testing.assert_close(plain, (images - 0.5) / 0.25)
    out = augment_inputs(images, mean, std, padding=4, generator=torch.Generator().manual_seed(0))
    assert out.shape == images.shape
    out.sum().backward()
    assert images.grad is not None and images.grad.abs().sum() > 0
    flat = torch.rand(2, 3, 32, 32).mean(dim=(2, 3), keepdim=True).expand(2, 3, 32, 32)
    constant = augment_inputs(flat, mean, std, padding=4, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(constant, (flat - 0.5) / 0.25)


def test_pool_is_bounded_fifo() -> None:
    pool = SyntheticPool(capacity=5, item_shape=(1, 2, 2), dtype="float32")
    values = torch.linspace(0, 1, 9)
    pool.add(values[:3, None, None, None].expand(3, 1, 2, 2), torch.arange(3))
    pool.add(values[3:9, None, None, None].expand(6, 1, 2, 2), torch.arange(3, 9))
    images, labels = pool.items()
    assert len(pool) == 5 and pool.total_added == 9
    assert labels.tolist() == [4, 5, 6, 7, 8]
    torch.testing.assert_close(images[:, 0, 0, 0], values[4:9])
    sampled, sampled_labels = pool.sample(50, torch.tensor([0.0] * 6 + [1.0, 0, 0]), torch.Generator().manual_seed(0))
    assert set(sampled_labels.tolist()) == {6} and sampled.shape == (50, 1, 2, 2)
    restored = SyntheticPool(capacity=5, item_shape=(1, 2, 2), dtype="uint8")
    restored.load_state_dict(pool.state_dict())
    assert restored.labels.tolist() == [4, 5, 6, 7, 8]
    torch.testing.assert_close(restored.items()[0], images, atol=1 / 255, rtol=0)
    with pytest.raises(ValueError):
        SyntheticPool(capacity=2, item_shape=(1, 2, 2)).sample(1)


# ---------------------------------------------------------------- synthesis and distillation


@pytest.mark.parametrize(("overrides", "key"), [({}, "loss"), ({"ce_weight": 0.0, "feat_weight": 1.0}, "feat")])
def test_synthesis_losses_fall_on_toy_teacher(overrides: dict, key: str) -> None:
    teacher = toy_teacher()
    synthesizer = Synthesizer(tiny_config(**overrides), seed=0)
    losses = [synthesizer.synthesize([(teacher, one_hot_q((0, 1, 2, 3)))])[key] for _ in range(30)]
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])
    assert synthesizer.calls == 30 and len(synthesizer.pool) == 64
    assert set(synthesizer.pool.labels.tolist()) <= {0, 1, 2, 3}
    assert all(p.grad is None for p in teacher.parameters())


def test_synthesis_adversarial_term_and_gradients_restored() -> None:
    teacher, student = toy_teacher(), build_model("cnn", track_features=True)
    student.train()
    synthesizer = Synthesizer(tiny_config(), seed=1)
    cold = synthesizer.synthesize([(teacher, one_hot_q((0, 1, 2, 3)))], student, warm=False)
    warm = synthesizer.synthesize([(teacher, one_hot_q((0, 1, 2, 3)))], student, warm=True)
    assert cold["adv"] == 0.0 and warm["adv"] <= 0.0
    assert student.training and all(p.requires_grad and p.grad is None for p in student.parameters())


def test_distill_moves_student_toward_teachers() -> None:
    config = tiny_config(kd_iterations=20)
    teachers = [(toy_teacher((0, 1, 2, 3)), one_hot_q((0, 1, 2, 3))), (toy_teacher((4, 5, 6), 1), one_hot_q((4, 5, 6)))]
    pool = SyntheticPool(capacity=64, dtype="float32")
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(7).repeat(9)
    pool.add(toy_images(labels, generator), labels)
    torch.manual_seed(5)
    student = build_model("cnn", track_features=True)
    weights = model_to_numpy(student)
    probes, _ = pool.items()
    probes = (probes - 0.5) / 0.25

    def divergence() -> float:
        with torch.no_grad():
            return sum(float(kl_per_sample(t(probes), student.eval()(probes)).mean()) for t, _ in teachers)

    before = divergence()
    losses: list[float] = []
    delta = distill(weights, teachers, pool, config, student=student, generator=generator, losses=losses)
    after = divergence()
    assert after < 0.99 * before and len(losses) == 20
    assert set(delta) == set(weights) and all(delta[k].dtype == np.float32 for k in delta)
    assert all(not np.any(delta[k]) for k in delta if ".running_" in k)
    load_numpy_into_model(student, {k: weights[k] + delta[k] for k in weights})
    assert divergence() == pytest.approx(after, rel=1e-4)


# ---------------------------------------------------------------- reviver


def _reviver(**overrides) -> Reviver:
    settings = dict(s_max=2.0, freeze_version=5, warmup_version=8, dfkd=tiny_config(kd_iterations=2))
    settings.update(overrides)
    return Reviver(lambda: build_model("cnn", track_features=True), ReviverConfig(**settings), "cpu", seed=3)


def _arrival_inputs(seed: int) -> tuple[dict, dict, dict]:
    torch.manual_seed(seed)
    global_w = model_to_numpy(build_model("cnn", track_features=True))
    base = {k: v + np.float32(0.01) for k, v in global_w.items()}
    client = _toy_teacher_weights((0, 1, 2, 3), 0)
    return global_w, base, client


def test_reviver_gates_and_counters() -> None:
    reviver = _reviver(generation_interval=2)
    global_w, base, client = _arrival_inputs(0)
    q = one_hot_q((0, 1, 2, 3))
    plain = {k: client[k] - base[k] for k in client}

    def arrive(version: int, staleness: float) -> tuple[dict, dict]:
        return reviver.on_arrival(global_w, version, base, client, q, staleness)

    for version, staleness in [(20, 0), (3, 3)]:
        delta, info = arrive(version, staleness)
        assert not info["synthesized"] and not info["distilled"]
        assert all(np.array_equal(delta[k], plain[k]) for k in plain)
    delta, info = arrive(6, 4)
    assert info["synthesized"] and not info["distilled"] and info["beta"] == 1.0
    assert all(np.array_equal(delta[k], plain[k]) for k in plain)
    assert (reviver.synth_steps, reviver.kd_updates, len(reviver.pool)) == (1, 0, 16)
    delta, info = arrive(9, 3)
    assert not info["synthesized"] and info["distilled"] and reviver.kd_updates == 1
    assert np.isfinite(info["kd_loss"]) and info["seconds"] >= info["kd_seconds"] > 0
    assert any(not np.allclose(delta[k], plain[k]) for k in plain if ".running_" not in k)
    assert all(np.array_equal(delta[k], plain[k]) for k in plain if ".running_" in k)
    delta, info = arrive(10, 3)
    assert info["synthesized"] and info["distilled"] and info["synth_ce"] > 0
    assert (reviver.synth_steps, reviver.kd_updates, len(reviver.teachers)) == (2, 2, 5)
    delta, info = arrive(12, 1)
    assert 0 < info["beta"] < 1 and info["distilled"]
    assert all(delta[k].dtype == np.float32 for k in delta)


def test_reviver_state_dict_round_trip() -> None:
    first = _reviver()
    global_w, base, client = _arrival_inputs(1)
    q = one_hot_q((0, 1, 2, 3))
    for version in (6, 9):
        first.on_arrival(global_w, version, base, client, q, 4)
    state = first.state_dict()
    second = _reviver()
    second.load_state_dict(state)
    assert (second.synth_steps, second.kd_updates, len(second.teachers)) == (2, 1, 2)
    for a, b in zip(first.synthesizer.generator.parameters(), second.synthesizer.generator.parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(first.pool.items()[0], second.pool.items()[0])
    delta_a, info_a = first.on_arrival(global_w, 10, base, client, q, 4)
    delta_b, info_b = second.on_arrival(global_w, 10, base, client, q, 4)
    assert info_a["synth_loss"] == info_b["synth_loss"] and info_a["kd_loss"] == info_b["kd_loss"]
    assert all(np.array_equal(delta_a[k], delta_b[k]) for k in delta_a)


def _background_run(delays: list[float], stop_at: int | None = None, resume: dict | None = None):
    """Versions 1..12 with two arrivals each (the second client a little different); the background work is slowed
    by ``delays`` (seconds, cycled), as a busy machine would. Returns the arrivals' deltas and the landings; with
    ``stop_at`` also the state at that version (and stops), with ``resume`` continues from such a state."""
    import itertools
    import time as clock

    torch.manual_seed(0)  # the generator's initial weights
    reviver = _reviver(generation_interval=2, kd_interval=3, distill_lag=2)
    original = reviver._revive
    pauses = itertools.cycle(delays)

    def slowed(*args):
        clock.sleep(next(pauses))
        return original(*args)

    reviver._revive = slowed
    start = 1
    if resume is not None:
        reviver.load_state_dict(resume["state"])
        start = resume["version"] + 1
    global_w, base, client = _arrival_inputs(2)
    other = {k: v + np.float32(0.02) for k, v in client.items()}
    q = one_hot_q((0, 1, 2, 3))
    deltas, landings = [], []
    try:
        for version in range(start, 13):
            weights = {k: v + np.float32(0.001 * version) for k, v in global_w.items()}
            landed = reviver.on_version(weights, version)  # the version is made, then its arrivals come
            landings.append((version, landed["landed"], landed.get("synthesized"), landed.get("distilled")))
            for client_w in (client, other):
                delta, info = reviver.on_arrival(weights, version, base, client_w, q, 4)
                deltas.append(delta)
                assert not info["synthesized"] and not info["distilled"]  # never on the arrival path
            if version == stop_at:
                return deltas, landings, reviver.state_dict()
    finally:
        reviver.close()
    return deltas, landings, None


def test_background_distillation_lands_by_version_whatever_the_timing() -> None:
    fast, landings, _ = _background_run([0.0])
    slow, _, _ = _background_run([0.05, 0.0, 0.2])
    assert len(fast) == len(slow) == 24
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(fast, slow, strict=True) for k in a)
    # freeze 5, warm-up 8: synthesis from version 6 (every 2), KD from 9 (every 3), each landing 2 versions later
    started = {v: (v >= 5 and v % 2 == 0, v > 8 and v % 3 == 0) for v in range(2, 13)}  # a teacher from 2 on
    for version, landed, synthesized, distilled in landings:
        source = started.get(version - 2, (False, False))
        assert landed == any(source), version
        if landed:
            assert (synthesized, distilled) == source, version
    plain = {k: fast[0][k] for k in fast[0]}
    blended = [i for i, d in enumerate(fast) if any(not np.array_equal(d[k], plain[k]) for k in ("fc3.weight",))]
    # the first KD work reads version 9 and lands at 11: the arrivals of versions 11 and 12 blend it (the first
    # client's arrivals are compared: the second client's delta differs from the first's anyway)
    first_client = [i for i in blended if i % 2 == 0]
    assert first_client == [20, 22]


def test_background_distillation_resumes_from_a_checkpoint_bit_for_bit() -> None:
    whole, _, _ = _background_run([0.0])
    head, _, state = _background_run([0.1], stop_at=9)
    tail, _, _ = _background_run([0.0], resume={"state": state, "version": 9})
    assert len(head) + len(tail) == len(whole)
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(whole, head + tail, strict=True) for k in a)
    with pytest.raises(ValueError, match="distill_lag"):
        ReviverConfig(distill_lag=-1)


def test_a_restore_waits_for_the_thread_that_builds_the_meta_optimizer(monkeypatch) -> None:
    """The background thread's first job builds the generator's meta-optimizer; a restore right after construction
    must not be overwritten by it (building it is slowed here on that thread, as the import it triggers is on a busy
    machine)."""
    import threading
    import time as clock

    from devsim.aggregation.fedrevive import synthesis

    _, _, state = _background_run([0.0], stop_at=9)
    saved = state["synthesizer"]["meta_optimizer"]["state"]
    assert saved  # the meta-optimizer has stepped
    build = synthesis.adam

    def slow_off_the_main_thread(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            clock.sleep(0.3)
        return build(*args, **kwargs)

    monkeypatch.setattr(synthesis, "adam", slow_off_the_main_thread)
    reviver = _reviver(generation_interval=2, kd_interval=3, distill_lag=2)
    try:
        reviver.load_state_dict(state)
    finally:
        reviver.close()  # the thread's job has finished after this
    restored = reviver.synthesizer.meta_optimizer.state_dict()["state"]
    assert restored.keys() == saved.keys()
    assert all(torch.equal(restored[i][key], saved[i][key]) for i in saved for key in saved[i])


def test_the_last_version_drops_background_work_that_would_land_after_it() -> None:
    """At the run's last version the work started but not landed is dropped: the running distillation stops at its
    next iteration (here one of 20,000, over a minute of work left) instead of running to its end, and nothing
    changes the reviver's state after ``abandon_pending`` returns."""
    import threading

    reviver = _reviver(generation_interval=2, kd_interval=3, distill_lag=2)
    global_w, base, client = _arrival_inputs(2)
    q = one_hot_q((0, 1, 2, 3))
    try:
        for version in range(1, 12):
            weights = {k: v + np.float32(0.001 * version) for k, v in global_w.items()}
            reviver.on_version(weights, version)
            reviver.on_arrival(weights, version, base, client, q, 4)
        reviver.settle()
        reviver.config.dfkd.kd_iterations = 20_000  # version 12's KD: longer than the limits below
        reviver.on_version(global_w, 12)
        assert list(reviver._pending) == [14]  # version 12's synthesis and KD land 2 versions later, after the run
        runs_before = reviver.state.kd_runs
        dropped: list[int] = []
        abandon = threading.Thread(target=lambda: dropped.append(reviver.abandon_pending()), daemon=True)
        abandon.start()
        abandon.join(timeout=30)
        assert not abandon.is_alive() and dropped == [1]
        state = reviver.state_dict()
        assert state["pending"] == {} and reviver.state.kd_runs == runs_before  # stopped unread, not finished
        assert not reviver._abandon.is_set()
        assert reviver._background_executor().submit(lambda: "idle").result(timeout=30) == "idle"  # nothing running
    finally:
        reviver.config.dfkd.kd_iterations = 2
        reviver.close()
