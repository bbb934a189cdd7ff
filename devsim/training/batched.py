"""Train many simulated devices at once as one batched computation (``torch.func`` over stacked state).

:class:`BatchedTrainer` keeps one copy of the model's state per device, stacked along a new leading
dimension (``(D, *shape)`` for D devices), and takes every device's step together: ``torch.func.vmap``
of ``torch.func.grad`` of the shared module called with each device's tensors and the task's loss
(:func:`devsim.training.flat_step.batched_step`). It reproduces
:class:`~devsim.training.local.LocalTrainer` device by device, up to float rounding:

- each device sees exactly its own batches (same generator, same reshuffled passes, same augmentation);
- the update is PyTorch's: SGD with momentum (``buf = momentum * buf + grad`` from ``buf = 0``, which is
  ``buf = grad`` at the first step; ``p -= lr * buf``) or Adam (``torch.optim.Adam`` with its default betas and
  eps), L2 weight decay added to the gradient, fresh optimizer state per device;
- BatchNorm layers normalise each device's batch with its own statistics and update that device's own
  running mean and variance (buffers are stacked per device like the weights);
- devices with unequal shards (natural partitions: every user holds a different number of samples) run in
  one ragged lockstep: devices are ordered by step count, at step ``t`` only those with more than ``t`` steps
  take part (a prefix of the stack, so its state is a view), and devices whose batch at ``t`` is short (the
  end of a pass) take that step as their own group of equal batch size. Nothing is padded or masked: every
  device's arithmetic is the one it would do alone.

:func:`batching_obstacle` says why a model and spec cannot be batched (None when they can): an optimizer other
than SGD/Adam, or a BatchNorm with a cumulative average. Whether a task's model gives the same updates batched
is checked on a probe before a leaf batches it (:func:`devsim.training.probe.batch_probe.probe_batching`).
:func:`batched_device_bytes` estimates what one more device in a batch costs in memory, for sizing.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from devsim.codec import float_state_keys
from devsim.data.device_shards import ShardPool
from devsim.training.channels_last import fold_channels_last, folds_channels_last
from devsim.training.flat_step import batched_step
from devsim.training.graphed_step import GRAPH_OPTIONS, GraphedStep
from devsim.training.local import (
    DeviceMetrics,
    LocalTrainingSpec,
    Objective,
    batch_orders,
    crop_and_flip,
    host_to_device,
)
from devsim.training.stacked import OPTIMIZER_STATES, StackedOptimizer, StackedRows


def batching_obstacle(model: nn.Module, spec: LocalTrainingSpec) -> str | None:
    """Why ``model`` trained with ``spec`` cannot be batched, or None when nothing rules it out."""
    if spec.optimizer not in OPTIMIZER_STATES:
        return f"optimizer {spec.optimizer!r} has no batched update (batched: {', '.join(OPTIMIZER_STATES)})"
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.momentum is None:
            return f"BatchNorm {name!r} uses a cumulative average (momentum=None)"
    return None


def activation_bytes_per_sample(model: nn.Module, example: torch.Tensor | None = None) -> int:
    """Bytes of float32 activations one training sample keeps for the backward pass (estimate).

    Sums the output sizes of every leaf module for ``example`` (one model input row ``(1, ...)``; default a
    zero 3x32x32 image) in a forward pass in eval mode without gradients, and doubles it for the saved inputs
    and gradient buffers of the backward pass.
    """
    sizes: list[int] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: sizes.append(out.numel() if isinstance(out, torch.Tensor) else 0))
        for m in model.modules()
        if not list(m.children())
    ]
    parameter = next(model.parameters())
    if example is None:
        example = torch.zeros(1, 3, 32, 32, dtype=parameter.dtype)
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(example[:1].to(parameter.device))
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return 2 * 4 * sum(sizes)


def batched_device_bytes(
    model: nn.Module, spec: LocalTrainingSpec, shard_samples: int, example: torch.Tensor | None = None
) -> int:
    """Memory one device adds to a batch, in bytes.

    ``4 * state * (3 + optimizer states)`` (its weights, gradients, output delta and 1 SGD or 2 Adam state
    tensors) plus ``batch_size * activation_bytes_per_sample`` plus its shard (``shard_samples`` model inputs
    like ``example``, one prepared input row; default 3x32x32 float32 images).
    """
    state = sum(t.numel() for t in model.state_dict().values() if t.is_floating_point())
    copies = 3 + OPTIMIZER_STATES.get(spec.optimizer, 2)
    row_bytes = 3 * 32 * 32 * 4 if example is None else example[0].numel() * example.element_size()
    return (
        4 * state * copies + spec.batch_size * activation_bytes_per_sample(model, example) + shard_samples * row_bytes
    )


class BatchedTrainer:
    """Local training of D devices in (ragged) lockstep on one compute device.

    Args:
        model: the architecture (its current weights are not used; non-float buffers such as
            BatchNorm's ``num_batches_tracked`` start from the model's values); moved to ``device``.
        spec: local training settings (SGD or Adam, any schedule, with or without augmentation).
        device: torch device for the stacked state and the batches.
        objective: the task's loss, classification flag and augmentation (default: cross-entropy, accuracy,
            crop and flip).
        example: one model input row ``(1, ...)``, to check which operations the model runs (see
            :func:`devsim.training.channels_last.folds_channels_last`); None trusts its layers alone.
        compile_options: :data:`~devsim.training.graphed_step.GRAPH_OPTIONS` replays the vmapped step from CUDA
            graphs captured per shape (:class:`~devsim.training.graphed_step.GraphedStep`; on the CPU the same
            mechanism without the graph); any other dict is ``torch.compile`` keyword arguments (e.g. ``{"mode":
            "reduce-overhead"}``: every group size and batch size compiles once, seconds each, and rounds
            differently from eager); None runs it eagerly. The leaves choose with ``--compile``
            (:mod:`devsim.training.compiled_step`).

    Raises:
        ValueError: with :func:`batching_obstacle`'s reason when the model or spec cannot be batched.
    """

    def __init__(
        self,
        model: nn.Module,
        spec: LocalTrainingSpec,
        device: torch.device,
        objective: Objective | None = None,
        example: torch.Tensor | None = None,
        compile_options: dict | None = None,
    ):
        obstacle = batching_obstacle(model, spec)
        if obstacle is not None:
            raise ValueError(f"batched training cannot reproduce this setup: {obstacle}")
        self.spec = spec
        self.objective = objective if objective is not None else Objective(augment=crop_and_flip)
        self.augment = self.objective.augmentation(spec)
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.keys = float_state_keys(self.model)
        self.param_keys = [name for name, _ in self.model.named_parameters()]
        self.buffer_keys = [name for name, _ in self.model.named_buffers()]
        missing = set(self.param_keys) - set(self.keys)
        if missing:
            raise ValueError(f"batched training needs floating-point parameters; not float: {sorted(missing)}")
        self._step = batched_step(self.model, self.objective.loss, self.param_keys, self.buffer_keys)
        self.graphed = compile_options == GRAPH_OPTIONS
        if self.graphed:
            self._step = GraphedStep(self._step, capture=self.device.type == "cuda")
        elif compile_options is not None:
            self._step = torch.compile(self._step, **{"dynamic": False, **compile_options})
        self.fold_channels_last = self.device.type == "cpu" and folds_channels_last(self.model, example)

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
            shards: per device, model inputs (n_i, ...) and targets (n_i, ...) on ``self.device``; sizes may differ.
            generators: per device, the CPU generator fixing its batch order (as for ``LocalTrainer``).

        Returns:
            One (D, *shape) tensor per key (trained state minus global, rows in ``device_ids`` order) and
            per-device metrics (compute_seconds is the call's wall time divided by D).
        """
        if not device_ids or len(shards) != len(device_ids):
            raise ValueError("device_ids, shards and generators must be non-empty and of equal length")
        starts, offset = [], 0
        for _, targets in shards:
            starts.append(offset)
            offset += int(targets.shape[0])
        pool = ShardPool(
            inputs=torch.cat([inputs for inputs, _ in shards]),
            targets=torch.cat([targets for _, targets in shards]),
            indices=[
                torch.arange(s, s + int(t.shape[0]), device=self.device)
                for s, (_, t) in zip(starts, shards, strict=True)
            ],
        )
        return self.train_pool(device_ids, global_tensors, pool, generators)

    def train_pool(
        self,
        device_ids: list[int],
        global_tensors: list[torch.Tensor],
        pool: ShardPool,
        generators: list[torch.Generator],
        per_device_base: bool = False,
    ) -> tuple[list[torch.Tensor], list[DeviceMetrics]]:
        """:meth:`train` with the devices' samples given as rows of one shared tensor (see :class:`ShardPool`).

        With ``per_device_base`` each entry of ``global_tensors`` is stacked per device, (D, *shape): device
        ``i`` starts from row ``i`` and its delta is taken against it (asynchronous jobs of different model
        versions trained together); otherwise every device starts from the same ``global_tensors``.

        Each step gathers only that step's rows (devices x batch) and prepares them, so a round never copies
        whole shards. A step's batch is gathered batch-major, (batch, D, ...), and vmapped over dimension 1: the
        batching rule of a convolution folds D into the channels, (batch, D * C, H, W), which is then a view
        instead of a copy of every step's images. With ``fold_channels_last`` (convolutional nets on the CPU)
        the batch is stored (batch, H, W, D, C), so that folded view is channels-last.
        """
        count = len(device_ids)
        if not count or len(pool.indices) != count or len(generators) != count:
            raise ValueError("device_ids, shards and generators must be non-empty and of equal length")
        started = time.perf_counter()
        sizes = [int(rows.shape[0]) for rows in pool.indices]
        steps = [self.spec.steps_for(n) for n in sizes]
        order = sorted(range(count), key=lambda i: -steps[i])
        if per_device_base:
            if any(int(t.shape[0]) != count for t in global_tensors):
                raise ValueError(f"per-device bases must have {count} rows, one per device")
            if order != list(range(count)):
                positions = torch.tensor(order, device=self.device)
                global_tensors = [t.index_select(0, positions) for t in global_tensors]
        run = _Lockstep(
            self,
            global_tensors,
            pool,
            [sizes[i] for i in order],
            [pool.indices[i] for i in order],
            per_device_base,
        )
        orders = [batch_orders(sizes[i], steps[i], self.spec.batch_size, generators[i]) for i in order]
        ordered_generators = [generators[i] for i in order]
        ordered_steps = [steps[i] for i in order]
        active = count
        for step in range(ordered_steps[0]):
            while ordered_steps[active - 1] <= step:
                active -= 1
            batches = [next(orders[p]) for p in range(active)]
            for rows, positions in _groups_by_batch_size(batches):
                run.step(rows, [batches[p] for p in positions], [ordered_generators[p] for p in positions], step)
        deltas, losses, hits = run.finish()
        if order != list(range(count)):
            inverse = torch.empty(count, dtype=torch.int64)
            inverse[torch.tensor(order)] = torch.arange(count)
            deltas = [d.index_select(0, inverse.to(self.device)) for d in deltas]
            losses, hits = ([values[j] for j in inverse.tolist()] for values in (losses, hits))
        per_device = (time.perf_counter() - started) / count
        classification = self.objective.classification
        metrics = [
            DeviceMetrics(
                int(d),
                sizes[i],
                steps[i],
                losses[i] / max(steps[i], 1),
                hits[i] / max(samples_seen(sizes[i], steps[i], self.spec.batch_size), 1)
                if classification
                else math.nan,
                per_device,
            )
            for i, d in enumerate(device_ids)
        ]
        return deltas, metrics


def _groups_by_batch_size(batches: list[torch.Tensor]) -> list[tuple[StackedRows, list[int]]]:
    """Positions of the active devices grouped by this step's batch size; each group's rows. Almost every
    step has one group (every device at a full batch): the prefix ``0 .. len(batches)``."""
    size_of = [int(b.shape[0]) for b in batches]
    if min(size_of) == max(size_of):
        return [(StackedRows(0, len(batches)), list(range(len(batches))))]
    groups: dict[int, list[int]] = {}
    for position, size in enumerate(size_of):
        groups.setdefault(size, []).append(position)
    out = []
    for positions in groups.values():
        if positions[-1] - positions[0] + 1 == len(positions):
            out.append((StackedRows(positions[0], positions[-1] + 1), positions))
        else:
            out.append((StackedRows(0, 0, torch.tensor(positions)), positions))
    return out


def samples_seen(num_samples: int, steps: int, batch_size: int) -> int:
    """Samples a device with ``num_samples`` sees in ``steps`` steps of :func:`batch_orders` (passes of full
    batches and one short last batch, repeated)."""
    per_pass = [batch_size] * (num_samples // batch_size) + (
        [num_samples % batch_size] if num_samples % batch_size else []
    )
    passes, rest = divmod(steps, len(per_pass))
    return passes * num_samples + sum(per_pass[:rest])


class _Lockstep:
    """The stacked state and tallies of one :meth:`BatchedTrainer.train_pool` call (devices in step order)."""

    def __init__(
        self,
        trainer: BatchedTrainer,
        global_tensors: list[torch.Tensor],
        pool: ShardPool,
        sizes: list[int],
        indices: list[torch.Tensor],
        per_device_base: bool = False,
    ):
        self.trainer = trainer
        self.pool = pool
        device = trainer.device
        count = len(sizes)
        self.globals_by_key = dict(zip(trainer.keys, global_tensors, strict=True))
        self.per_device_base = per_device_base
        model_buffers = dict(trainer.model.named_buffers())

        def stacked(key: str) -> torch.Tensor:
            if key in self.globals_by_key and per_device_base:
                return self.globals_by_key[key].detach().clone()
            source = self.globals_by_key[key] if key in self.globals_by_key else model_buffers[key]
            return source.detach().unsqueeze(0).repeat(count, *([1] * source.dim()))

        self.params = [stacked(k) for k in trainer.param_keys]
        self.prox_bases = [self.globals_by_key[k] for k in trainer.param_keys]
        """Each parameter's starting weights, for FedProx's term: one global tensor, or (D, *shape) per device."""
        self.buffers = [stacked(k) for k in trainer.buffer_keys]
        self.optimizer = StackedOptimizer(trainer.spec, self.params)
        if min(sizes) == max(sizes):
            self.device_rows = torch.stack(indices).to(device)
        else:
            self.device_rows = torch.zeros((count, max(sizes)), dtype=torch.int64, device=device)
            for position, rows in enumerate(indices):
                self.device_rows[position, : rows.shape[0]] = rows
        self.sample_shape = tuple(pool.inputs.shape[1:])
        self.target_shape = tuple(pool.targets.shape[1:])
        self.loss_sum = torch.zeros(count, device=device)
        self.correct = torch.zeros(count, device=device, dtype=torch.int64)
        trainer.model.train()

    def step(
        self, rows: StackedRows, batches: list[torch.Tensor], generators: list[torch.Generator], step: int
    ) -> None:
        """One optimizer step of the devices in ``rows`` (all with batches of the same size)."""
        trainer = self.trainer
        device = trainer.device
        index = host_to_device(torch.stack(batches), device)
        group, batch = int(index.shape[0]), int(index.shape[1])
        flat = rows.take(self.device_rows).gather(1, index).t().reshape(-1)
        inputs = self.pool.inputs.index_select(0, flat).view(batch, group, *self.sample_shape)
        fold = trainer.fold_channels_last and inputs.dim() == 5
        if fold and trainer.augment is None:
            inputs = fold_channels_last(inputs)
        if self.pool.prepare is not None:
            inputs = self.pool.prepare(inputs)
        targets = self.pool.targets.index_select(0, flat).view(batch, group, *self.target_shape)
        if trainer.augment is not None:
            inputs = torch.stack([trainer.augment(inputs[:, j], g) for j, g in enumerate(generators)], dim=1)
            if fold:
                inputs = fold_channels_last(inputs)
        params = tuple(rows.take(v) for v in self.params)
        buffers = tuple(rows.take(v) for v in self.buffers)
        grads, (loss, outputs) = trainer._step(params, buffers, inputs, targets)
        grads = list(grads)
        if trainer.spec.prox_mu:
            grads = self._with_prox(grads, params, rows)
        self.optimizer.step(grads, rows, list(params), step + 1)
        rows.put(self.buffers, list(buffers))
        rows.add(self.loss_sum, loss.detach())
        if trainer.objective.classification:
            rows.add(self.correct, (outputs.detach().argmax(dim=-1) == targets.t()).sum(dim=1))

    def _with_prox(
        self, grads: list[torch.Tensor], params: tuple[torch.Tensor, ...], rows: StackedRows
    ) -> list[torch.Tensor]:
        """FedProx: ``grad + prox_mu * (w - w_start)`` per parameter, ``w_start`` each device's starting weights
        (the one global model broadcast over the devices, or each device's own base)."""
        bases = [rows.take(b) for b in self.prox_bases] if self.per_device_base else self.prox_bases
        mu = self.trainer.spec.prox_mu
        return [torch.add(g, p.detach() - b, alpha=mu) for g, p, b in zip(grads, params, bases, strict=True)]

    def finish(self) -> tuple[list[torch.Tensor], list[float], list[int]]:
        """Per key the (D, *shape) deltas, and per device its summed loss and correct predictions."""
        trainer = self.trainer
        trained = dict(zip([*trainer.param_keys, *trainer.buffer_keys], [*self.params, *self.buffers], strict=True))
        bases = self.globals_by_key
        deltas = [trained[k] - (bases[k] if self.per_device_base else bases[k].unsqueeze(0)) for k in trainer.keys]
        return deltas, self.loss_sum.tolist(), self.correct.tolist()
