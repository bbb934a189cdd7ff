"""The channels-last fold of the batched path: when it pays and stays exact for a model, and the layout itself.

vmap's convolution rule folds the device dimension of a batched step into the channels; storing each step's
rows (batch, H, W, D, C) makes that fold a channels-last view, which oneDNN's grouped convolutions run faster
on the CPU. :func:`folds_channels_last` decides per model (only convolutions, linear layers, ReLU and reshapes
in its forward pass); :func:`fold_channels_last` lays a batch out.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode


def fold_channels_last(inputs: torch.Tensor) -> torch.Tensor:
    """The same (batch, D, C, H, W) values stored as (batch, H, W, D, C): channels last once folded.

    vmap's convolution rule folds the device dimension into the channels, ``(batch, D * C, H, W)``; with
    this storage the fold is a view in channels-last layout, for which oneDNN's grouped convolutions are
    1.6x faster on the CPU than in the default layout (the whole step of 50 CNN devices x batch 10 on one
    core: 38.7 -> 23.6 ms, same gradients up to float rounding). Later layers keep the layout.
    """
    if inputs.dim() != 5:
        return inputs
    return inputs.permute(0, 3, 4, 1, 2).contiguous().permute(0, 3, 4, 1, 2)


def folds_channels_last(model: nn.Module, example: torch.Tensor | None = None) -> bool:
    """Whether :func:`fold_channels_last` pays and stays exact for ``model``: its first layer with parameters
    is a 2-D convolution, every layer with parameters is a convolution or a linear layer, and (given an
    ``example`` input) its forward pass calls nothing but :data:`FOLD_SAFE_CALLS`.

    Normalisation layers are left out: vmap cannot run GroupNorm on channels-last input, and on the CPU the
    models that have them (ResNet-18) train one device at a time anyway (see ``device_batch``). Pooling is left
    out too: a LeNet-style model (two 5x5 convolutions with 2x2 max pooling, 28x28 inputs) trained 64 devices
    at 6,100 samples/s on one core folded and 7,600 unfolded (max pooling and ReLU's backward on the folded
    layout cost 40% more), against 7,500 one device at a time.
    """
    layers = [m for m in model.modules() if list(m.parameters(recurse=False))]
    if not (
        bool(layers) and isinstance(layers[0], nn.Conv2d) and all(isinstance(m, (nn.Conv2d, nn.Linear)) for m in layers)
    ):
        return False
    return example is None or _forward_calls(model, example) <= FOLD_SAFE_CALLS


FOLD_SAFE_CALLS = frozenset({"conv2d", "linear", "relu", "relu_", "flatten", "view", "reshape", "dim", "__get__"})
"""Torch functions a model's forward may call for the folded channels-last layout to be used."""


class _CallRecorder(TorchFunctionMode):
    """Records the names of the torch functions (and tensor methods) called while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _forward_calls(model: nn.Module, example: torch.Tensor) -> set[str]:
    """Names of the torch functions ``model`` calls on ``example`` (eval mode, no gradients; mode restored)."""
    recorder = _CallRecorder()
    was_training = model.training
    inputs = example[:1].to(next(model.parameters()).device)
    try:
        model.eval()
        with torch.no_grad(), recorder:
            model(inputs)
    finally:
        model.train(was_training)
    return recorder.names
