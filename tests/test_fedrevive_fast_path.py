"""FedRevive's fast server path: vectorised teachers equal the loop, fused generator upsampling, KD reuse."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from devsim.aggregation.fedrevive import Synthesizer, SyntheticPool, distill
from devsim.aggregation.fedrevive._common import adam
from devsim.aggregation.fedrevive.ensemble import TeacherEnsemble, loop_forward, stacked_running_stats
from devsim.aggregation.fedrevive.generator import Generator, upsample_conv3x3
from devsim.aggregation.fedrevive.inputs import augment_inputs
from devsim.codec import model_to_numpy
from devsim.models import build_model, feature_trackers
from tests.test_fedrevive import _arrival_inputs, _reviver, one_hot_q, tiny_config, toy_images, toy_teacher

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def _random_teachers(name: str, count: int) -> list[torch.nn.Module]:
    """Distinct tracked models with non-trivial tracker statistics (and BatchNorm buffers where present)."""
    torch.manual_seed(7)
    models = [build_model(name, track_features=True) for _ in range(count)]
    for model in models:
        for module in model.modules():
            if hasattr(module, "running_mean"):
                module.running_mean.normal_()
                module.running_var.uniform_(0.5, 2.0)
    return [model.eval() for model in models]


@pytest.mark.parametrize(("name", "count", "batch"), [("cnn", 3, 6), ("resnet18", 2, 2)])
def test_ensemble_matches_teacher_loop(name: str, count: int, batch: int) -> None:
    teachers = _random_teachers(name, count)
    ensemble = TeacherEnsemble(teachers)
    shared = torch.randn(batch, 3, 32, 32, requires_grad=True)
    logits, moments = ensemble.forward(shared, shared=True, capture=True)
    ref_logits, ref_moments = loop_forward(teachers, shared, shared=True, capture=True)
    assert logits.shape == (count, batch, 10) and len(moments) == len(feature_trackers(teachers[0])) > 0
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-5)
    for (mean, sq), (ref_mean, ref_sq) in zip(moments, ref_moments, strict=True):
        torch.testing.assert_close(mean, ref_mean, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(sq, ref_sq, rtol=1e-4, atol=1e-5)

    def objective(out: torch.Tensor, stats) -> torch.Tensor:
        return out.square().sum() + sum(m.sum() + s.sum() for m, s in stats)

    (grad,) = torch.autograd.grad(objective(logits, moments), shared)
    (ref_grad,) = torch.autograd.grad(objective(ref_logits, ref_moments), shared)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-5)
    each = torch.randn(count, batch, 3, 32, 32)
    torch.testing.assert_close(
        ensemble.forward(each, shared=False)[0], loop_forward(teachers, each, shared=False)[0], rtol=1e-4, atol=1e-5
    )
    means, variances = stacked_running_stats(teachers)
    for got, want in zip(ensemble.running_means + ensemble.running_vars, means + variances, strict=True):
        torch.testing.assert_close(got, want)
    assert all(p.grad is None for model in teachers for p in model.parameters())
    assert all(t.sample_mean is None for t in feature_trackers(teachers[0]) + ensemble.trackers)


def _teacher_pairs() -> list[tuple[torch.nn.Module, np.ndarray]]:
    return [(toy_teacher((0, 1, 2, 3)), one_hot_q((0, 1, 2, 3))), (toy_teacher((4, 5, 6), 1), one_hot_q((4, 5, 6)))]


def test_synthesis_vectorised_equals_loop() -> None:
    student = build_model("cnn", track_features=True)
    results, pools = [], []
    for batching in ("synthesis", "off"):
        torch.manual_seed(3)
        synthesizer = Synthesizer(tiny_config(teacher_batching=batching), seed=4)
        runs = [synthesizer.synthesize(_teacher_pairs(), student, warm=warm) for warm in (False, True)]
        results.append(runs)
        pools.append(synthesizer.pool.items())
    for fast, slow in zip(*results, strict=True):
        assert fast.keys() == slow.keys()
        for key in fast:
            assert fast[key] == pytest.approx(slow[key], rel=1e-4, abs=1e-6), key
    assert torch.equal(pools[0][1], pools[1][1])
    torch.testing.assert_close(pools[0][0], pools[1][0], rtol=1e-4, atol=1e-4)


def test_distill_vectorised_equals_loop() -> None:
    pool = SyntheticPool(capacity=64, dtype="float32")
    labels = torch.arange(7).repeat(9)
    pool.add(toy_images(labels, torch.Generator().manual_seed(0)), labels)
    torch.manual_seed(5)
    weights = model_to_numpy(build_model("cnn", track_features=True))
    deltas, losses = [], []
    for batching in ("all", "off"):
        step_losses: list[float] = []
        deltas.append(
            distill(
                weights,
                _teacher_pairs(),
                pool,
                tiny_config(kd_iterations=4, teacher_batching=batching),
                student=build_model("cnn", track_features=True),
                generator=torch.Generator().manual_seed(1),
                losses=step_losses,
            )
        )
        losses.append(step_losses)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
    for key in weights:
        np.testing.assert_allclose(deltas[0][key], deltas[1][key], rtol=1e-3, atol=1e-6)
    assert any(np.any(deltas[0][key]) for key in weights)


def test_pool_sample_each_follows_each_row() -> None:
    pool = SyntheticPool(capacity=20, item_shape=(1, 2, 2), dtype="float32")
    labels = torch.arange(20) % 4
    pool.add(labels[:, None, None, None].float().expand(20, 1, 2, 2) / 4, labels)
    weights = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0.5, 0.5], [0, 0, 0, 0]])
    images, drawn = pool.sample_each(200, weights, torch.Generator().manual_seed(0))
    assert images.shape == (3, 200, 1, 2, 2) and drawn.shape == (3, 200)
    assert set(drawn[0].tolist()) == {0} and set(drawn[1].tolist()) == {2, 3} and set(drawn[2].tolist()) == {0, 1, 2, 3}
    torch.testing.assert_close(images[:, :, 0, 0, 0], drawn.float() / 4)


def test_kd_interval_reuses_last_kd_delta() -> None:
    reviver = _reviver(kd_interval=2, generation_interval=100)
    global_w, base, client = _arrival_inputs(0)
    q = one_hot_q((0, 1, 2, 3))
    plain = {k: client[k] - base[k] for k in client}
    _, info = reviver.on_arrival(global_w, 6, base, client, q, 4)
    assert not info["synthesized"]
    reviver.synthesizer.synthesize(reviver._loaded_teachers())
    flags, deltas, betas, loaded = [], [], [], []
    for version, staleness in [(9, 4), (10, 1), (11, 4), (12, 4)]:
        delta, info = reviver.on_arrival(global_w, version, base, client, q, staleness)
        flags.append((info["distilled"], info["kd_reused"]))
        deltas.append(delta)
        betas.append(info["beta"])
        loaded.append(reviver.teachers[0].uid in reviver._teacher_modules)
    assert flags == [(True, False), (False, True), (True, False), (False, True)]
    assert loaded == [True, False, True, False]  # a reuse-only arrival loads no teacher module
    assert (reviver.state.kd_runs, reviver.kd_updates) == (2, 4)
    params = [k for k in plain if ".running_" not in k]

    def kd_part(delta: dict, weight: float) -> dict:
        return {k: (delta[k] - (1 - weight) * plain[k]) / weight for k in params}

    first, reused = kd_part(deltas[0], betas[0]), kd_part(deltas[1], betas[1])
    for k in params:
        np.testing.assert_allclose(first[k], reused[k], rtol=1e-3, atol=1e-6)
    assert any(not np.allclose(first[k], kd_part(deltas[2], betas[2])[k]) for k in params)
    restored = _reviver(kd_interval=2, generation_interval=100)
    restored.load_state_dict(reviver.state_dict())
    delta_a, info_a = reviver.on_arrival(global_w, 13, base, client, q, 4)
    delta_b, info_b = restored.on_arrival(global_w, 13, base, client, q, 4)
    assert info_a["distilled"] and info_b["distilled"]
    assert all(np.array_equal(delta_a[k], delta_b[k]) for k in delta_a)


@pytest.mark.parametrize("bias", [False, True])
def test_upsample_conv_equals_interpolate_then_conv(bias: bool) -> None:
    torch.manual_seed(3)
    x = torch.randn(3, 5, 6, 7, requires_grad=True)
    conv = torch.nn.Conv2d(5, 4, 3, padding=1, bias=bias)
    fused = upsample_conv3x3(x, conv.weight, conv.bias)
    reference = conv(torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest"))
    assert fused.shape == reference.shape == (3, 4, 12, 14)
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-5)
    inputs = [x, conv.weight] + ([conv.bias] if bias else [])
    grads = torch.autograd.grad(fused.square().sum(), inputs)
    ref_grads = torch.autograd.grad(reference.square().sum(), inputs)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels_last", [True, False])
def test_generator_fused_upsample_matches_reference(channels_last: bool) -> None:
    """The fused upsample-convolutions, channels-last or not, against the literal layers in the default layout."""
    torch.manual_seed(4)
    fused = Generator(latent_dim=16, width=8, num_classes=5).train()
    fused.channels_last = channels_last
    literal = copy.deepcopy(fused)
    literal.fused_upsample = literal.channels_last = False
    z, labels = torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 4, 0])
    out, ref = fused(z, labels), literal(z, labels)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    out.square().sum().backward()
    ref.square().sum().backward()
    # Summation order differs: errors are relative to the largest entry. Channels-last sums BatchNorm's weight and
    # bias gradients (over batch and pixels, terms that largely cancel) in another order: up to 3e-5 of it.
    tolerance = 1e-4 if channels_last else 1e-5
    for (name, got), want in zip(fused.named_parameters(), literal.parameters(), strict=True):
        scale = float(want.grad.abs().max())
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=tolerance * scale, msg=name)
    for got, want in zip(fused.buffers(), literal.buffers(), strict=True):  # BatchNorm running statistics
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_fused_adam_matches_default_adam() -> None:
    torch.manual_seed(5)
    fused_model = Generator(latent_dim=16, width=8, num_classes=5)
    plain_model = copy.deepcopy(fused_model)
    kwargs = {"lr": 3e-3, "betas": (0.5, 0.999), "weight_decay": 1e-5}
    fused_opt = adam(fused_model.parameters(), torch.device("cpu"), **kwargs)
    plain_opt = torch.optim.Adam(plain_model.parameters(), **kwargs)
    assert fused_opt.param_groups[0]["fused"]
    z, labels = torch.randn(4, 16), torch.tensor([0, 1, 2, 3])
    for _ in range(4):
        for model, opt in ((fused_model, fused_opt), (plain_model, plain_opt)):
            opt.zero_grad()
            model(z, labels).square().mean().backward()
            opt.step()
    for got, want in zip(fused_model.parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_augment_crop_equals_per_sample_slices() -> None:
    images = torch.rand(5, 3, 8, 6)
    mean, std = torch.tensor([0.5, 0.4, 0.3]), torch.tensor([0.2, 0.25, 0.3])
    out = augment_inputs(images, mean, std, padding=2, generator=torch.Generator().manual_seed(9))
    draws = torch.Generator().manual_seed(9)  # the same draws in the same order: offsets, then flips
    offsets = torch.randint(0, 5, (2, 5), generator=draws)
    flips = torch.rand(5, generator=draws) < 0.5
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2), mode="reflect")
    for i in range(5):
        row, col = int(offsets[0, i]), int(offsets[1, i])
        crop = padded[i, :, row : row + 8, col : col + 6]
        crop = crop.flip(2) if flips[i] else crop
        torch.testing.assert_close(out[i], (crop - mean.view(3, 1, 1)) / std.view(3, 1, 1))
