"""Per-device state stacked along a leading dimension, and PyTorch's optimizers applied to any rows of it.

The batched trainer (:mod:`devsim.training.batched`) keeps every device's weights, buffers and optimizer state
as ``(D, *shape)`` tensors. A step may involve all devices or only some (ragged lockstep): a
:class:`StackedRows` names which, and :class:`StackedOptimizer` updates exactly those rows with SGD (momentum)
or Adam arithmetic identical to ``torch.optim``'s.
"""

from __future__ import annotations

import math

import torch

from devsim.training.local import LocalTrainingSpec

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
OPTIMIZER_STATES = {"sgd": 1, "adam": 2}


class StackedRows:
    """The stacked rows a group of devices occupies: a contiguous range (state taken as views, updated in
    place) or an index (state gathered, updated, scattered back)."""

    def __init__(self, start: int, stop: int, index: torch.Tensor | None = None):
        self.start, self.stop, self.index = start, stop, index

    @property
    def copies(self) -> bool:
        return self.index is not None

    def take(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.index is None:
            return tensor[self.start : self.stop]
        return tensor.index_select(0, self.index.to(tensor.device))

    def put(self, full: list[torch.Tensor], parts: list[torch.Tensor]) -> None:
        if self.index is not None:
            for whole, part in zip(full, parts, strict=True):
                whole.index_copy_(0, self.index.to(whole.device), part)

    def add(self, tensor: torch.Tensor, values: torch.Tensor) -> None:
        if self.index is None:
            tensor[self.start : self.stop] += values.to(tensor.device)
        else:
            tensor.index_add_(0, self.index.to(tensor.device), values.to(tensor.device))


class StackedOptimizer:
    """``torch.optim.SGD`` / ``torch.optim.Adam`` arithmetic on stacked (D, *shape) parameters, in place, for any
    subset of the stacked rows (:class:`StackedRows`) at a time. State starts at zero for every device."""

    def __init__(self, spec: LocalTrainingSpec, params: list[torch.Tensor]):
        self.spec = spec
        self.params = params
        uses_first = spec.optimizer == "adam" or bool(spec.momentum)
        self.first = [torch.zeros_like(p) for p in params] if uses_first else []
        self.second = [torch.zeros_like(p) for p in params] if spec.optimizer == "adam" else []

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], rows: StackedRows, params: list[torch.Tensor], steps: int) -> None:
        """Update ``params`` (``rows`` of :attr:`params`, as taken for the forward pass) with ``grads``; ``steps``
        is how many steps these devices have taken, this one included."""
        spec = self.spec
        first = [rows.take(m) for m in self.first]
        second = [rows.take(v) for v in self.second]
        if spec.weight_decay:
            grads = torch._foreach_add(grads, params, alpha=spec.weight_decay)
        if spec.optimizer == "adam":
            _adam(params, first, second, grads, spec.lr, steps)
        elif spec.momentum:
            torch._foreach_mul_(first, spec.momentum)
            torch._foreach_add_(first, grads)
            torch._foreach_add_(params, first, alpha=-spec.lr)
        else:
            torch._foreach_add_(params, grads, alpha=-spec.lr)
        if rows.copies:
            rows.put(self.params, params)
            rows.put(self.first, first)
            rows.put(self.second, second)


def _adam(
    params: list[torch.Tensor],
    first: list[torch.Tensor],
    second: list[torch.Tensor],
    grads: list[torch.Tensor],
    lr: float,
    steps: int,
) -> None:
    beta1, beta2 = ADAM_BETAS
    torch._foreach_lerp_(first, grads, 1 - beta1)
    torch._foreach_mul_(second, beta2)
    torch._foreach_addcmul_(second, grads, grads, value=1 - beta2)
    step_size = lr / (1 - beta1**steps)
    denom = torch._foreach_sqrt(second)
    torch._foreach_div_(denom, math.sqrt(1 - beta2**steps))
    torch._foreach_add_(denom, ADAM_EPS)
    torch._foreach_addcdiv_(params, first, denom, value=-step_size)
