"""PyTorch models for 32x32x3 image inputs (CIFAR-10 / CIFAR-100).

All models take a float tensor of shape ``(B, 3, 32, 32)`` and return unnormalised logits of shape
``(B, num_classes)``.

Every model class carries a ``classifier_name`` class attribute: the module name of its final
``nn.Linear``. :func:`last_layer_names` turns that into the two ``state_dict`` keys
(``<name>.weight`` of shape ``(num_classes, in_features)`` and ``<name>.bias`` of shape
``(num_classes,)``), which cluster aggregation uses to compare or average only the classifier head.

Parameter counts (10 classes): ``cnn`` 62,006; ``resnet18`` 11,173,962; ``resnet18_nonorm`` 11,169,162.

``track_features=True`` inserts a :class:`FeatureTracker` after every convolution on the main path (2 in the
CNN, 17 in ResNet-18: the stem and both convs of each block). Trackers are identities that keep BatchNorm-style
running per-channel feature statistics as buffers (``<tracker>.running_mean`` / ``<tracker>.running_var``), which
FedRevive's data-free distillation matches on synthetic images. They add no parameters; with the default
``track_features=False`` no tracker is registered and ``state_dict`` keys are unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "MODEL_NAMES",
    "NORM_TYPES",
    "BasicBlock",
    "Cifar10ConvNet",
    "FeatureTracker",
    "ResNet18",
    "build_model",
    "count_parameters",
    "feature_trackers",
    "last_layer_names",
]

MODEL_NAMES: tuple[str, ...] = ("cnn", "resnet18", "resnet18_nonorm")
NORM_TYPES: tuple[str, ...] = ("batch", "group", "none")

_GROUP_NORM_MAX_GROUPS = 32


class FeatureTracker(nn.Module):
    """Identity layer that records per-channel statistics of the features passing through it.

    Input ``x`` has shape ``(B, C, ...)`` (e.g. ``(B, C, H, W)`` after a conv); statistics are per channel
    ``C`` over the batch and all trailing (spatial) positions.

    * In train mode every forward updates the buffers ``running_mean`` and ``running_var`` (shape ``(C,)``,
      float32) exactly like ``nn.BatchNorm2d`` with ``momentum`` (0.1): ``r <- (1 - m) * r + m * batch_stat``,
      with the unbiased batch variance. Initial values are 0 and 1. Eval mode leaves them unchanged.
    * With ``capture = True`` (any mode) every forward also keeps, with autograd history, the per-sample
      moments ``sample_mean`` and ``sample_sq_mean`` (shape ``(B, C)``: mean of ``x`` and of ``x ** 2`` over
      the trailing positions). :meth:`batch_stats` turns them into (optionally sample-weighted) batch mean /
      biased variance; ``last_mean`` / ``last_var`` are the unweighted ones. :meth:`clear` drops them.
    """

    def __init__(self, num_channels: int, momentum: float = 0.1) -> None:
        super().__init__()
        self.num_channels = num_channels
        self.momentum = momentum
        self.capture = False
        self.sample_mean: torch.Tensor | None = None
        self.sample_sq_mean: torch.Tensor | None = None
        self.register_buffer("running_mean", torch.zeros(num_channels))
        self.register_buffer("running_var", torch.ones(num_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``x`` unchanged, updating running statistics (train mode) and captured moments."""
        if self.training:
            with torch.no_grad():
                dims = [d for d in range(x.dim()) if d != 1]
                count = x.numel() // x.shape[1]
                mean = x.mean(dim=dims)
                var = x.var(dim=dims, correction=1 if count > 1 else 0)
                self.running_mean.mul_(1.0 - self.momentum).add_(mean.to(self.running_mean.dtype), alpha=self.momentum)
                self.running_var.mul_(1.0 - self.momentum).add_(var.to(self.running_var.dtype), alpha=self.momentum)
        if self.capture:
            flat = x.flatten(2) if x.dim() > 2 else x.unsqueeze(2)
            self.sample_mean = flat.mean(dim=2)
            self.sample_sq_mean = flat.square().mean(dim=2)
        return x

    def batch_stats(self, sample_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean and biased variance ``(C,), (C,)`` of the last captured batch.

        ``sample_weights`` (shape ``(B,)``, non-negative, not all zero) weights the samples; they are
        normalised to sum to 1. Raises RuntimeError if nothing was captured.
        """
        if self.sample_mean is None or self.sample_sq_mean is None:
            raise RuntimeError("FeatureTracker.capture was off during the last forward; nothing captured")
        if sample_weights is None:
            mean = self.sample_mean.mean(dim=0)
            sq_mean = self.sample_sq_mean.mean(dim=0)
        else:
            weights = (sample_weights / sample_weights.sum()).to(self.sample_mean.dtype)
            mean = weights @ self.sample_mean
            sq_mean = weights @ self.sample_sq_mean
        return mean, (sq_mean - mean.square()).clamp_min(0.0)

    @property
    def last_mean(self) -> torch.Tensor:
        """Unweighted per-channel mean ``(C,)`` of the last captured batch (with autograd history)."""
        return self.batch_stats()[0]

    @property
    def last_var(self) -> torch.Tensor:
        """Unweighted per-channel biased variance ``(C,)`` of the last captured batch (with autograd history)."""
        return self.batch_stats()[1]

    def clear(self) -> None:
        """Drop the captured moments (and the autograd graph they hold)."""
        self.sample_mean = None
        self.sample_sq_mean = None

    def extra_repr(self) -> str:
        return f"{self.num_channels}, momentum={self.momentum}"


def _tracker(track_features: bool, channels: int) -> nn.Module:
    """A :class:`FeatureTracker` when ``track_features`` is on, else a parameter- and buffer-free Identity."""
    return FeatureTracker(channels) if track_features else nn.Identity()


def feature_trackers(model: nn.Module) -> list[FeatureTracker]:
    """All :class:`FeatureTracker` modules of ``model`` in registration (forward) order."""
    return [m for m in model.modules() if isinstance(m, FeatureTracker)]


class Cifar10ConvNet(nn.Module):
    """Small CNN from NVFlare's edge examples (62,006 parameters for 10 classes).

    Layout (shapes per sample): input (3, 32, 32) -> conv1 5x5 stride 2 -> (6, 14, 14) -> ReLU
    -> conv2 5x5 stride 2 -> (16, 5, 5) -> ReLU -> flatten (400) -> fc1 (120) -> ReLU -> fc2 (84)
    -> ReLU -> fc3 (num_classes).

    With ``track_features`` a :class:`FeatureTracker` (``tracker1`` / ``tracker2``) follows conv1 and conv2
    (before the ReLU).
    """

    classifier_name = "fc3"

    def __init__(self, num_classes: int = 10, track_features: bool = False) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.track_features = track_features
        self.conv1 = nn.Conv2d(3, 6, kernel_size=5, stride=2)
        self.tracker1 = _tracker(track_features, 6)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5, stride=2)
        self.tracker2 = _tracker(track_features, 16)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images ``(B, 3, 32, 32)`` to logits ``(B, num_classes)``."""
        x = self.relu(self.tracker1(self.conv1(x)))
        x = self.relu(self.tracker2(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


def _make_norm(norm: str, channels: int) -> nn.Module:
    """Return the normalisation layer for ``channels`` feature maps.

    ``"batch"`` -> BatchNorm2d; ``"group"`` -> GroupNorm with ``min(32, channels)`` groups;
    ``"none"`` -> Identity.
    """
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    if norm == "group":
        return nn.GroupNorm(min(_GROUP_NORM_MAX_GROUPS, channels), channels)
    if norm == "none":
        return nn.Identity()
    raise ValueError(f"norm must be one of {NORM_TYPES}, got {norm!r}")


def _conv(in_channels: int, out_channels: int, kernel_size: int, stride: int, norm: str) -> nn.Conv2d:
    """Conv2d with 'same'-style padding; bias only when there is no normalisation layer after it."""
    return nn.Conv2d(
        in_channels,
        out_channels,
        kernel_size=kernel_size,
        stride=stride,
        padding=kernel_size // 2,
        bias=norm == "none",
    )


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with a residual connection.

    Maps ``(B, in_channels, H, W)`` to ``(B, out_channels, H / stride, W / stride)``. When the shape
    changes the shortcut is a 1x1 strided conv followed by the norm layer. With ``track_features`` a
    :class:`FeatureTracker` (``tracker1`` / ``tracker2``) follows each of the two 3x3 convs (before the norm).
    """

    def __init__(
        self, in_channels: int, out_channels: int, stride: int = 1, norm: str = "batch", track_features: bool = False
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.stride = stride
        self.norm = norm
        self.track_features = track_features
        self.conv1 = _conv(in_channels, out_channels, 3, stride, norm)
        self.tracker1 = _tracker(track_features, out_channels)
        self.bn1 = _make_norm(norm, out_channels)
        self.conv2 = _conv(out_channels, out_channels, 3, 1, norm)
        self.tracker2 = _tracker(track_features, out_channels)
        self.bn2 = _make_norm(norm, out_channels)
        self.relu = nn.ReLU()
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = nn.Sequential(
                _conv(in_channels, out_channels, 1, stride, norm), _make_norm(norm, out_channels)
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``x`` of shape ``(B, in_channels, H, W)``."""
        out = self.relu(self.bn1(self.tracker1(self.conv1(x))))
        out = self.bn2(self.tracker2(self.conv2(out)))
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR-style ResNet-18 (11,173,962 parameters for 10 classes with batch norm).

    3x3 stem conv (64 channels, stride 1, no max-pool), four stages of two BasicBlocks with
    64/128/256/512 channels and strides 1/2/2/2 (spatial 32 -> 32 -> 16 -> 8 -> 4), global average
    pooling and a linear classifier ``fc``.

    ``norm`` selects the normalisation layer: ``"batch"`` (BatchNorm2d), ``"group"`` (GroupNorm with
    ``min(32, channels)`` groups; no running statistics, which suits federated averaging on non-IID
    data) or ``"none"`` (Identity; convolutions then keep their bias).

    ``track_features`` adds a :class:`FeatureTracker` after the stem conv (``tracker0``) and after both 3x3
    convs of every block: 17 trackers.
    """

    classifier_name = "fc"

    def __init__(self, num_classes: int = 10, norm: str = "batch", track_features: bool = False) -> None:
        super().__init__()
        if norm not in NORM_TYPES:
            raise ValueError(f"norm must be one of {NORM_TYPES}, got {norm!r}")
        self.num_classes = num_classes
        self.norm = norm
        self.track_features = track_features
        self.conv1 = _conv(3, 64, 3, 1, norm)
        self.tracker0 = _tracker(track_features, 64)
        self.bn1 = _make_norm(norm, 64)
        self.relu = nn.ReLU()
        self.layer1 = self._make_stage(64, 64, 1)
        self.layer2 = self._make_stage(64, 128, 2)
        self.layer3 = self._make_stage(128, 256, 2)
        self.layer4 = self._make_stage(256, 512, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def _make_stage(self, in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
        """Two BasicBlocks; only the first one changes channels / resolution."""
        return nn.Sequential(
            BasicBlock(in_channels, out_channels, stride, self.norm, self.track_features),
            BasicBlock(out_channels, out_channels, 1, self.norm, self.track_features),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images ``(B, 3, 32, 32)`` to logits ``(B, num_classes)``."""
        x = self.relu(self.bn1(self.tracker0(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def last_layer_names(model: nn.Module) -> list[str]:
    """Return the ``state_dict`` keys of the model's final linear layer (weight, then bias when it has one).

    Uses the model's ``classifier_name`` attribute when it has one (the built-in models); otherwise the last
    ``nn.Linear`` registered in the model (a user's model: usually its output layer). Raises ValueError when
    ``classifier_name`` does not name an ``nn.Linear`` or the model has no linear layer at all.
    """
    name = getattr(model, "classifier_name", None)
    if name is None:
        linear = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        if not linear:
            raise ValueError(
                f"model {type(model).__name__} has no nn.Linear layer to compare as its last layer; compare whole "
                "models instead (--similarity-on model_drift, layer_drift or layer_updates)"
            )
        name = linear[-1]
    if not isinstance(name, str):
        raise ValueError(f"classifier_name of {type(model).__name__} must be a module name, got {name!r}")
    layer = model.get_submodule(name)
    if not isinstance(layer, nn.Linear):
        raise ValueError(f"classifier_name {name!r} of {type(model).__name__} is not an nn.Linear")
    prefix = f"{name}." if name else ""
    return [f"{prefix}weight"] + ([f"{prefix}bias"] if layer.bias is not None else [])


def build_model(name: str, num_classes: int = 10, track_features: bool = False) -> nn.Module:
    """Build a freshly initialised model by name (one of :data:`MODEL_NAMES`).

    ``"cnn"`` -> :class:`Cifar10ConvNet`; ``"resnet18"`` -> :class:`ResNet18` with batch norm;
    ``"resnet18_nonorm"`` -> :class:`ResNet18` without normalisation. ``track_features`` inserts
    :class:`FeatureTracker` layers (see the module docstring).
    """
    if name == "cnn":
        return Cifar10ConvNet(num_classes=num_classes, track_features=track_features)
    if name == "resnet18":
        return ResNet18(num_classes=num_classes, norm="batch", track_features=track_features)
    if name == "resnet18_nonorm":
        return ResNet18(num_classes=num_classes, norm="none", track_features=track_features)
    raise ValueError(f"model must be one of {MODEL_NAMES}, got {name!r}")


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters (buffers such as BatchNorm running stats excluded)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
