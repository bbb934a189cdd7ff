"""Train many simulated devices at once as one batched computation (``torch.func`` over stacked state).

:class:`BatchedTrainer` keeps one copy of the model's state per device, stacked along a new leading
dimension (``(D, *shape)`` for D devices), and takes every device's step together: ``torch.func.vmap``
of ``torch.func.grad`` of a ``functional_call`` of the shared module. It reproduces
:class:`~devsim.training.local.LocalTrainer` device by device, up to float rounding:

- each device sees exactly its own batches (same generator, same reshuffled passes, same random
  crops and flips with ``augment``);
- the update is PyTorch's: SGD with momentum (``buf = momentum * buf + grad``, the first step
  ``buf = grad``; ``p -= lr * buf``) or Adam (``torch.optim.Adam`` with its default betas and eps),
  L2 weight decay added to the gradient, fresh optimizer state per device;
- BatchNorm layers normalise each device's batch with its own statistics and update that device's own
  running mean and variance (the buffers are stacked per device like the weights), so the deltas of
  ``running_mean`` / ``running_var`` match too; GroupNorm has no buffers and needs nothing special;
- devices with unequal shard sizes (hence unequal step counts or a short last batch) are bucketed by
  size: each bucket is one lockstep computation, so nothing is padded and nothing is masked.

:func:`batching_obstacle` says why a model and spec cannot be batched exactly (None when they can):
an optimizer other than SGD/Adam, or a module keeping buffers other than BatchNorm's running
statistics (with a numeric ``momentum``) or :class:`~devsim.models.FeatureTracker`'s.
:func:`batched_device_bytes` estimates what one more device in a batch costs in memory, for sizing.
"""

from __future__ import annotations

import itertools
import math
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from devsim.codec import float_state_keys
from devsim.data.device_shards import ShardPool
from devsim.models import FeatureTracker
from devsim.training.local import DeviceMetrics, LocalTrainingSpec, batch_orders, crop_and_flip

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
OPTIMIZER_STATES = {"sgd": 1, "adam": 2}


def batching_obstacle(model: nn.Module, spec: LocalTrainingSpec) -> str | None:
    """Why ``model`` trained with ``spec`` cannot be batched exactly, or None when it can."""
    if spec.optimizer not in OPTIMIZER_STATES:
        return f"optimizer {spec.optimizer!r} has no batched update (batched: {', '.join(OPTIMIZER_STATES)})"
    for name, module in model.named_modules():
        if not list(module.buffers(recurse=False)):
            continue
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            if module.momentum is None:
                return f"BatchNorm {name!r} uses a cumulative average (momentum=None)"
        elif not isinstance(module, FeatureTracker):
            return f"module {name!r} ({type(module).__name__}) keeps buffers the batched path does not handle"
    return None


def activation_bytes_per_sample(model: nn.Module, sample_shape: tuple[int, ...] = (3, 32, 32)) -> int:
    """Bytes of float32 activations one training sample keeps for the backward pass (estimate).

    Sums the output sizes of every leaf module for one sample (a forward pass in eval mode without
    gradients) and doubles it for the saved inputs and gradient buffers of the backward pass.
    """
    sizes: list[int] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: sizes.append(out.numel()))
        for m in model.modules()
        if not list(m.children())
    ]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            parameter = next(model.parameters())
            model(torch.zeros(1, *sample_shape, device=parameter.device, dtype=parameter.dtype))
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return 2 * 4 * sum(sizes)


def batched_device_bytes(model: nn.Module, spec: LocalTrainingSpec, shard_samples: int) -> int:
    """Memory one device adds to a batch, in bytes (float32).

    ``4 * state * (3 + optimizer states)`` (its weights, gradients, output delta and 1 SGD or 2 Adam
    state tensors) plus ``batch_size * activation_bytes_per_sample`` plus its shard
    (``shard_samples`` images of 3x32x32 float32, stacked for gathering).
    """
    state = sum(t.numel() for t in model.state_dict().values() if t.is_floating_point())
    copies = 3 + OPTIMIZER_STATES.get(spec.optimizer, 2)
    shard = shard_samples * 3 * 32 * 32 * 4
    return 4 * state * copies + spec.batch_size * activation_bytes_per_sample(model) + shard


class BatchedTrainer:
    """Local training of D devices in lockstep on one compute device.

    Args:
        model: the architecture (its current weights are not used; non-float buffers such as
            BatchNorm's ``num_batches_tracked`` start from the model's values); moved to ``device``.
        spec: local training settings (SGD or Adam, any schedule, with or without augmentation).
        device: torch device for the stacked state and the batches.

    Raises:
        ValueError: with :func:`batching_obstacle`'s reason when the model or spec cannot be batched.
    """

    def __init__(self, model: nn.Module, spec: LocalTrainingSpec, device: torch.device):
        obstacle = batching_obstacle(model, spec)
        if obstacle is not None:
            raise ValueError(f"batched training cannot reproduce this setup: {obstacle}")
        self.spec = spec
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.keys = float_state_keys(self.model)
        self.param_keys = [name for name, _ in self.model.named_parameters()]
        self.buffer_keys = [name for name, _ in self.model.named_buffers()]
        missing = set(self.param_keys) - set(self.keys)
        if missing:
            raise ValueError(f"batched training needs floating-point parameters; not float: {sorted(missing)}")

        def loss_and_logits(params: dict, buffers: dict, inputs: torch.Tensor, targets: torch.Tensor):
            logits = functional_call(self.model, (params, buffers), (inputs,))
            return F.cross_entropy(logits, targets), logits

        self._step = vmap(grad_and_value(loss_and_logits, has_aux=True), in_dims=(0, 0, 1, 1))
        self.fold_channels_last = self.device.type == "cpu" and _folds_channels_last(self.model)

    def train(
        self,
        device_ids: list[int],
        global_tensors: list[torch.Tensor],
        shards: list[tuple[torch.Tensor, torch.Tensor]],
        generators: list[torch.Generator],
    ) -> tuple[list[torch.Tensor], list[DeviceMetrics]]:
        """Train every device in ``device_ids`` from ``global_tensors``.

        Args:
            device_ids: logical device ids (metrics only), length D.
            global_tensors: global state on ``self.device``, ordered like ``self.keys``; not modified.
            shards: per device, float32 images (n_i, C, H, W) and int64 labels (n_i,) on ``self.device``;
                sizes may differ (devices are bucketed by size).
            generators: per device, the CPU generator fixing its batch order (as for ``LocalTrainer``).

        Returns:
            One (D, *shape) tensor per key (trained state minus global, rows in ``device_ids`` order) and
            per-device metrics (compute_seconds is the bucket's wall time divided by its size).
        """
        if not device_ids or len(shards) != len(device_ids):
            raise ValueError("device_ids, shards and generators must be non-empty and of equal length")
        sizes = [int(labels.shape[0]) for _, labels in shards]
        starts = [0, *itertools.accumulate(sizes)][:-1]
        pool = ShardPool(
            images=torch.cat([images for images, _ in shards]),
            labels=torch.cat([labels for _, labels in shards]),
            indices=[torch.arange(s, s + n, device=self.device) for s, n in zip(starts, sizes, strict=True)],
        )
        return self.train_pool(device_ids, global_tensors, pool, generators)

    def train_pool(
        self,
        device_ids: list[int],
        global_tensors: list[torch.Tensor],
        pool: ShardPool,
        generators: list[torch.Generator],
    ) -> tuple[list[torch.Tensor], list[DeviceMetrics]]:
        """:meth:`train` with the devices' samples given as rows of one shared tensor (see :class:`ShardPool`).

        Each step gathers only that step's rows (D devices x batch) and prepares them, so a round never
        copies whole shards.
        """
        count = len(device_ids)
        if not count or len(pool.indices) != count or len(generators) != count:
            raise ValueError("device_ids, shards and generators must be non-empty and of equal length")
        buckets: dict[int, list[int]] = {}
        for i, rows in enumerate(pool.indices):
            buckets.setdefault(int(rows.shape[0]), []).append(i)
        if len(buckets) == 1:
            return self._train_bucket(device_ids, global_tensors, pool, generators)
        deltas = [torch.empty((count, *g.shape), dtype=g.dtype, device=self.device) for g in global_tensors]
        metrics: list[DeviceMetrics | None] = [None] * count
        for rows in buckets.values():
            part_pool = ShardPool(pool.images, pool.labels, [pool.indices[i] for i in rows], pool.prepare)
            part, part_metrics = self._train_bucket(
                [device_ids[i] for i in rows], global_tensors, part_pool, [generators[i] for i in rows]
            )
            index = torch.tensor(rows, device=self.device)
            for out, values in zip(deltas, part, strict=True):
                out.index_copy_(0, index, values)
            for i, m in zip(rows, part_metrics, strict=True):
                metrics[i] = m
        return deltas, metrics

    def _train_bucket(
        self,
        device_ids: list[int],
        global_tensors: list[torch.Tensor],
        pool: ShardPool,
        generators: list[torch.Generator],
    ) -> tuple[list[torch.Tensor], list[DeviceMetrics]]:
        """Devices whose shards all hold the same number of samples, in lockstep.

        A step's batch is gathered batch-major, (batch, D, C, H, W), and vmapped over dimension 1: the
        batching rule of a convolution folds D into the channels, (batch, D * C, H, W), which is then a
        view instead of a copy of every step's images. With ``fold_channels_last`` (the CNN on the CPU) the
        batch is stored (batch, H, W, D, C), so that folded view is channels-last.
        """
        started = time.perf_counter()
        count = len(device_ids)
        num_samples = int(pool.indices[0].shape[0])
        steps = self.spec.steps_for(num_samples)
        globals_by_key = dict(zip(self.keys, global_tensors, strict=True))
        model_buffers = dict(self.model.named_buffers())

        def stacked(key: str) -> torch.Tensor:
            source = globals_by_key[key] if key in globals_by_key else model_buffers[key]
            return source.detach().unsqueeze(0).repeat(count, *([1] * source.dim()))

        params = {k: stacked(k) for k in self.param_keys}
        buffers = {k: stacked(k) for k in self.buffer_keys}
        optimizer = _StackedOptimizer(self.spec, list(params.values()))
        device_rows = torch.stack(list(pool.indices)).to(self.device)
        rows = torch.arange(count, device=self.device)[:, None]
        sample_shape = tuple(pool.images.shape[1:])
        loss_sum = torch.zeros(count, device=self.device)
        correct = torch.zeros(count, device=self.device, dtype=torch.int64)
        seen = 0
        orders = [batch_orders(num_samples, steps, self.spec.batch_size, g) for g in generators]
        self.model.train()
        for _ in range(steps):
            index = torch.stack([next(order) for order in orders]).to(self.device, non_blocking=True)
            flat = device_rows[rows, index].t().reshape(-1)
            batch = int(index.shape[1])
            inputs = pool.images.index_select(0, flat).view(batch, count, *sample_shape)
            if self.fold_channels_last and not self.spec.augment:
                inputs = fold_channels_last(inputs)
            if pool.prepare is not None:
                inputs = pool.prepare(inputs)
            targets = pool.labels.index_select(0, flat).view(batch, count)
            if self.spec.augment:
                inputs = torch.stack([crop_and_flip(inputs[:, i], g) for i, g in enumerate(generators)], dim=1)
                if self.fold_channels_last:
                    inputs = fold_channels_last(inputs)
            grads, (loss, logits) = self._step(params, buffers, inputs, targets)
            optimizer.step([grads[k] for k in self.param_keys])
            loss_sum += loss.detach()
            correct += (logits.detach().argmax(dim=-1) == targets.t()).sum(dim=1)
            seen += batch
        trained = {**params, **buffers}
        deltas = [trained[k] - globals_by_key[k].unsqueeze(0) for k in self.keys]
        per_device = (time.perf_counter() - started) / count
        losses, hits = (loss_sum / max(steps, 1)).tolist(), correct.tolist()
        metrics = [
            DeviceMetrics(int(d), num_samples, steps, losses[i], hits[i] / max(seen, 1), per_device)
            for i, d in enumerate(device_ids)
        ]
        return deltas, metrics


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


def _folds_channels_last(model: nn.Module) -> bool:
    """Whether :func:`fold_channels_last` pays and stays exact for ``model``: its first layer with parameters
    is a 2-D convolution and every layer with parameters is a convolution or a linear layer.

    Normalisation layers are left out: vmap cannot run GroupNorm on channels-last input, and on the CPU the
    models that have them (ResNet-18) train one device at a time anyway (see ``device_batch``).
    """
    layers = [m for m in model.modules() if list(m.parameters(recurse=False))]
    return (
        bool(layers) and isinstance(layers[0], nn.Conv2d) and all(isinstance(m, (nn.Conv2d, nn.Linear)) for m in layers)
    )


class _StackedOptimizer:
    """``torch.optim.SGD`` / ``torch.optim.Adam`` arithmetic on stacked (D, *shape) parameters, in place."""

    def __init__(self, spec: LocalTrainingSpec, params: list[torch.Tensor]):
        self.spec = spec
        self.params = params
        self.steps = 0
        self.first: list[torch.Tensor] = []
        self.second: list[torch.Tensor] = []

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor]) -> None:
        spec = self.spec
        if spec.weight_decay:
            grads = torch._foreach_add(grads, self.params, alpha=spec.weight_decay)
        self.steps += 1
        if spec.optimizer == "adam":
            self._adam(grads)
        elif spec.momentum:
            if self.steps == 1:
                self.first = [g.clone() for g in grads]
            else:
                torch._foreach_mul_(self.first, spec.momentum)
                torch._foreach_add_(self.first, grads)
            torch._foreach_add_(self.params, self.first, alpha=-spec.lr)
        else:
            torch._foreach_add_(self.params, grads, alpha=-spec.lr)

    def _adam(self, grads: list[torch.Tensor]) -> None:
        beta1, beta2 = ADAM_BETAS
        if self.steps == 1:
            self.first = [torch.zeros_like(p) for p in self.params]
            self.second = [torch.zeros_like(p) for p in self.params]
        torch._foreach_lerp_(self.first, grads, 1 - beta1)
        torch._foreach_mul_(self.second, beta2)
        torch._foreach_addcmul_(self.second, grads, grads, value=1 - beta2)
        step_size = self.spec.lr / (1 - beta1**self.steps)
        denom = torch._foreach_sqrt(self.second)
        torch._foreach_div_(denom, math.sqrt(1 - beta2**self.steps))
        torch._foreach_add_(denom, ADAM_EPS)
        torch._foreach_addcdiv_(self.params, self.first, denom, value=-step_size)
