"""FedRevive for any classification task: what the generator makes (devsim.aggregation.fedrevive.inputs), the MLP
generator for non-image inputs, a task's own generator, and synthesis / KD on tabular and 1x28x28 inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from devsim.aggregation.fedrevive import (
    DFKDConfig,
    MLPGenerator,
    Synthesizer,
    distill,
    generator_obstacle,
    input_space,
)
from devsim.aggregation.fedrevive.generator import Generator
from devsim.aggregation.fedrevive.inputs import augment_inputs
from devsim.codec import model_to_numpy
from devsim.data.datasets import CIFAR10_MEAN, CIFAR10_STD
from devsim.models import build_model
from devsim.tasks import TaskHooks, make_task

pytestmark = pytest.mark.usefixtures("single_torch_thread")

FEATURES, TABULAR_CLASSES = 20, 5


def _split(x: np.ndarray, classes: int) -> dict:
    labels = np.arange(len(x)) % classes
    half = len(x) // 2
    return {"x_train": x[:half], "y_train": labels[:half], "x_test": x[half:], "y_test": labels[half:]}


def tabular_x(rows: int = 96) -> np.ndarray:
    """Float32 rows ``(rows, 20)``: feature ``j`` spread over ``[-j, 2j + 1]``; feature 0 of the test half is
    constant (a zero range)."""
    rng = np.random.default_rng(0)
    scale = np.arange(FEATURES, dtype=np.float32)
    x = (-scale + rng.random((rows, FEATURES), dtype=np.float32) * (3 * scale + 1)).astype(np.float32)
    x[rows // 2 :, 0] = 0.25
    return x


def tabular_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, TABULAR_CLASSES))


def tabular_task(**hooks):
    data = _split(tabular_x(), TABULAR_CLASSES)
    return make_task(TaskHooks(origin="t", model=tabular_model, data=lambda: data, **hooks), "t")


def image_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))


def image_task():
    """Float 1x28x28 images with values in [-1, 3]."""
    x = (torch.rand(64, 1, 28, 28, generator=torch.Generator().manual_seed(1)) * 4 - 1).numpy()
    data = _split(x, 10)
    return make_task(TaskHooks(origin="t", model=image_model, data=lambda: data), "t")


class TokenModel(nn.Module):
    """Token ids ``(B, 12)`` -> logits ``(B, 3)``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(50, 8), nn.Linear(8, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens).mean(dim=1))


def token_task(**hooks):
    x = np.random.default_rng(0).integers(0, 50, (32, 12)).astype(np.int64)
    data = _split(x, 3)
    return make_task(TaskHooks(origin="t", model=TokenModel, data=lambda: data, **hooks), "t")


class OffsetGenerator(nn.Module):
    """A task generator hook whose outputs ``5 + 3 * Linear(z)`` lie far outside (0, 1)."""

    def __init__(self, latent_dim: int, num_classes: int) -> None:
        super().__init__()
        self.fc, self.embed = nn.Linear(latent_dim, FEATURES), nn.Embedding(num_classes, latent_dim)

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return 5.0 + 3.0 * self.fc(z + self.embed(labels))


def small_config(task, **overrides) -> DFKDConfig:
    settings = dict(latent_dim=16, generator_width=8, synth_batch_size=16, pool_capacity=32, pool_dtype="float32")
    settings.update(kd_iterations=2, kd_batch_per_teacher=8, num_classes=task.num_classes)
    settings.update(input_space(task).dfkd_settings())
    settings.update(overrides)
    return DFKDConfig(**settings)


def teachers_of(task, count: int = 2) -> list[tuple[nn.Module, np.ndarray]]:
    torch.manual_seed(0)
    q = np.full(task.num_classes, 1.0 / task.num_classes)
    return [(task.build_model(track_features=True), q) for _ in range(count)]


# ---------------------------------------------------------------- obstacles and input spaces


def test_obstacle_for_token_ids_unless_the_task_brings_a_generator() -> None:
    reason = generator_obstacle(token_task())
    assert reason is not None and "\n" not in reason
    assert "int64 (token ids)" in reason and "generator(latent_dim, num_classes)" in reason and "FedBuff" in reason
    with pytest.raises(ValueError, match="token ids"):
        input_space(token_task())
    hooked = token_task(generator=OffsetGenerator)
    assert generator_obstacle(hooked) is None
    space = input_space(hooked)
    assert space.generator is OffsetGenerator and not space.float_inputs and not space.image
    assert space.shape == (12,) and "normalize_mean" not in space.dfkd_settings()


def test_obstacle_for_a_user_uint8_task_but_not_a_builtin_one() -> None:
    x = np.random.default_rng(0).integers(0, 256, (32, 3, 32, 32)).astype(np.uint8)
    data = _split(x, 10)

    def cnn(track_features: bool = False) -> nn.Module:
        return build_model("cnn", track_features=track_features)

    hooks = TaskHooks(origin="t", model=cnn, data=lambda: data, prepare=lambda rows: rows.float() / 255)
    reason = generator_obstacle(make_task(hooks, "t"))
    assert reason is not None and "uint8" in reason and "float32" in reason
    stats = ((0.1, 0.2, 0.3), (0.5, 0.25, 0.125))
    builtin = make_task(hooks, "t", builtin=True, pixel_stats=stats)
    assert generator_obstacle(builtin) is None
    space = input_space(builtin)
    assert space.shape == (3, 32, 32) and space.image and (space.mean, space.std) == stats


def test_default_config_means_cifar_images() -> None:
    config = DFKDConfig()
    assert config.input_shape == (3, 32, 32) and config.image and config.task_generator is None
    assert (config.normalize_mean, config.normalize_std) == (CIFAR10_MEAN, CIFAR10_STD)
    with pytest.raises(ValueError, match="per channel"):
        DFKDConfig(input_shape=(FEATURES,))
    assert not DFKDConfig(input_shape=(FEATURES,), normalize_mean=(0.0,) * 20, normalize_std=(1.0,) * 20).image


def test_affine_map_sends_generator_outputs_into_the_test_range() -> None:
    task = tabular_task()
    space = input_space(task)
    assert space.shape == (FEATURES,) and not space.image and space.float_inputs
    assert len(space.mean) == len(space.std) == FEATURES and np.all(np.isfinite(space.std))
    mean, std = torch.tensor(space.mean), torch.tensor(space.std)
    lo, hi = task.x_test.min(axis=0), task.x_test.max(axis=0)
    ends = augment_inputs(torch.stack([torch.zeros(FEATURES), torch.ones(FEATURES)]), mean, std, crop_flip=False)
    np.testing.assert_allclose(ends[0].numpy(), lo, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ends[1].numpy(), hi, rtol=1e-5, atol=1e-4)
    inside = augment_inputs(torch.rand(50, FEATURES), mean, std, crop_flip=False).numpy()
    assert np.all(inside >= lo - 1e-4) and np.all(inside <= hi + 1e-4)
    assert np.ptp(inside[:, 0]) < 1e-4  # the constant test feature stays (almost) constant
    task = image_task()
    image = input_space(task)
    assert image.shape == (1, 28, 28) and image.image and len(image.mean) == 1
    ends = torch.tensor([0.0, 1.0]).view(2, 1, 1, 1).expand(2, 1, 28, 28)
    ends = augment_inputs(ends, torch.tensor(image.mean), torch.tensor(image.std), crop_flip=False)
    assert float(ends[0].max()) == pytest.approx(float(task.x_test.min()), abs=1e-5)
    assert float(ends[1].min()) == pytest.approx(float(task.x_test.max()), abs=1e-5)


def test_mlp_generator_shape_range_and_parameter_split() -> None:
    generator = MLPGenerator((4, 5), latent_dim=8, width=3, num_classes=2)
    with torch.no_grad():
        out = generator(torch.randn(6, 8), torch.tensor([0, 1, 0, 1, 0, 1]))
    assert out.shape == (6, 4, 5) and float(out.min()) > 0 and float(out.max()) < 1
    assert generator.body[-2].out_features == 20 and generator.body[0].out_features == 6
    assert len(generator.body_parameters()) + len(generator.embedding_parameters()) == len(list(generator.parameters()))


# ---------------------------------------------------------------- synthesis and KD on any input shape


@pytest.mark.parametrize(("make", "generator_type"), [(tabular_task, MLPGenerator), (image_task, Generator)])
@pytest.mark.parametrize("batching", ["synthesis", "all"])
def test_synthesis_and_distill_on_task_inputs(make, generator_type, batching: str) -> None:
    task = make()
    config = small_config(task, teacher_batching=batching)
    synthesizer = Synthesizer(config, seed=0)
    assert isinstance(synthesizer.generator, generator_type)
    teachers = teachers_of(task)
    student = task.build_model(track_features=True)
    result = synthesizer.synthesize(teachers, student, warm=True)
    assert all(np.isfinite(value) for value in result.values()) and result["feat"] == 0.0
    items, labels = synthesizer.pool.items()
    assert items.shape == (config.synth_batch_size, *task.sample_shape) and labels.shape == (config.synth_batch_size,)
    assert float(items.min()) >= 0.0 and float(items.max()) <= 1.0
    weights = model_to_numpy(student)
    losses: list[float] = []
    delta = distill(
        weights, teachers, synthesizer.pool, config, student=student, generator=torch.Generator(), losses=losses
    )
    assert list(delta) == list(weights) and len(losses) == config.kd_iterations
    assert all(delta[k].shape == weights[k].shape and np.all(np.isfinite(delta[k])) for k in delta)
    assert any(np.any(delta[k]) for k in delta)


def test_task_generator_outputs_are_model_inputs_stored_unclamped() -> None:
    task = tabular_task(generator=OffsetGenerator)
    config = small_config(task, teacher_batching="off")
    assert config.task_generator is OffsetGenerator and not config.image
    synthesizer = Synthesizer(config, seed=0)
    assert isinstance(synthesizer.generator, OffsetGenerator)
    teachers = teachers_of(task, count=1)
    seen: list[torch.Tensor] = []
    teachers[0][0].register_forward_hook(lambda module, args, out: seen.append(args[0].detach().clone()))
    synthesizer.synthesize(teachers)
    items, _ = synthesizer.pool.items()
    assert synthesizer.pool.dtype == "float32" and not synthesizer.pool.clamp
    assert items.shape == (config.synth_batch_size, FEATURES) and float(items.max()) > 1.0
    assert any(torch.equal(items, inputs) for inputs in seen)  # the teachers saw exactly the stored outputs
    delta = distill(model_to_numpy(task.build_model()), teachers, synthesizer.pool, config, student=task.build_model())
    assert all(np.all(np.isfinite(value)) for value in delta.values())
