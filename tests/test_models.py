"""Tests for devsim.models: parameter counts, shapes, classifier keys, trainability."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from devsim.models import (
    MODEL_NAMES,
    Cifar10ConvNet,
    ResNet18,
    build_model,
    count_parameters,
    last_layer_names,
)


def _overfit(seed: int, max_steps: int = 200) -> tuple[float, list[float]]:
    """Train the CNN on 64 random samples until train accuracy > 90% or ``max_steps`` steps.

    Returns (train accuracy of the final model, per-step losses).
    """
    torch.manual_seed(seed)
    model = build_model("cnn")
    x = torch.randn(64, 3, 32, 32)
    y = torch.randint(0, 10, (64,))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []
    accuracy = 0.0
    for _ in range(max_steps):
        logits = model(x)
        accuracy = (logits.argmax(dim=1) == y).float().mean().item()
        if accuracy > 0.9:
            break
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return accuracy, losses


def test_model_names() -> None:
    assert MODEL_NAMES == ("cnn", "resnet18", "resnet18_nonorm")


def test_cnn_param_count() -> None:
    # conv1 456 + conv2 2416 + fc1 48120 + fc2 10164 + fc3 850
    assert count_parameters(build_model("cnn")) == 62006
    assert count_parameters(build_model("cnn", num_classes=100)) == 62006 - 850 + 84 * 100 + 100


def test_resnet18_param_counts() -> None:
    assert count_parameters(build_model("resnet18")) == 11_173_962
    assert count_parameters(build_model("resnet18_nonorm")) == 11_169_162
    assert count_parameters(ResNet18(norm="group")) == 11_173_962


@pytest.mark.parametrize("num_classes", [10, 100])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_shape(name: str, num_classes: int) -> None:
    model = build_model(name, num_classes=num_classes)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(3, 3, 32, 32))
    assert out.shape == (3, num_classes)
    assert model.num_classes == num_classes


def test_group_norm_forward_and_attrs() -> None:
    model = ResNet18(num_classes=7, norm="group")
    assert (model.num_classes, model.norm) == (7, "group")
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)


def test_nonorm_has_no_norm_layers_and_conv_bias() -> None:
    model = build_model("resnet18_nonorm")
    assert model.norm == "none"
    assert not any(isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)) for m in model.modules())
    assert all(m.bias is not None for m in model.modules() if isinstance(m, nn.Conv2d))


def test_batchnorm_convs_have_no_bias() -> None:
    model = build_model("resnet18")
    assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Conv2d))


def test_build_model_unknown_name() -> None:
    with pytest.raises(ValueError, match="model") as info:
        build_model("vgg")
    for name in MODEL_NAMES:
        assert name in str(info.value)


def test_bad_norm() -> None:
    with pytest.raises(ValueError, match="norm"):
        ResNet18(norm="layer")


@pytest.mark.parametrize("num_classes", [10, 100])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_last_layer_names(name: str, num_classes: int) -> None:
    model = build_model(name, num_classes=num_classes)
    state = model.state_dict()
    weight_key, bias_key = last_layer_names(model)
    assert weight_key.endswith(".weight") and bias_key.endswith(".bias")
    assert state[weight_key].shape[0] == num_classes
    assert state[weight_key].ndim == 2
    assert state[bias_key].shape == (num_classes,)
    assert list(state)[-2:] == [weight_key, bias_key]


def test_last_layer_names_fall_back_to_the_last_linear_layer() -> None:
    assert last_layer_names(nn.Linear(2, 2)) == ["weight", "bias"]
    user_model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3, bias=False))
    assert last_layer_names(user_model) == ["2.weight"]
    with pytest.raises(ValueError, match="no nn.Linear"):
        last_layer_names(nn.Sequential(nn.Conv2d(3, 4, 3)))
    odd = nn.Sequential(nn.Conv2d(3, 4, 3))
    odd.classifier_name = "0"
    with pytest.raises(ValueError, match="is not an nn.Linear"):
        last_layer_names(odd)


def test_cnn_constructor_attr() -> None:
    assert Cifar10ConvNet(num_classes=5).num_classes == 5


def test_count_parameters_trainable_only() -> None:
    model = build_model("cnn")
    model.conv1.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == 62006 - 456
    assert count_parameters(model) == 62006


def test_cnn_overfits_and_is_deterministic() -> None:
    accuracy, losses = _overfit(seed=0)
    assert accuracy > 0.9
    assert len(losses) < 200
    assert losses[-1] < losses[0]
    assert _overfit(seed=0) == (accuracy, losses)
