"""Which convolution weight gradients the batched step uses (``--conv-grads auto|cudnn|unfold``).

Under ``vmap`` every 2-D convolution with per-device weights runs as one grouped convolution, and cuDNN's
weight gradient of that shape is its generic kernel: on an H200 it took 85% of the GPU time of the 64-device CNN
step (profile section of ``benchmarks/gpu_suite.py``). ``unfold``
(:class:`devsim.training.flat_step.UnfoldConvGrads`) computes the same gradients as one batched matrix product over
the unfolded input instead; the forward pass and the input gradients stay cuDNN's.

:func:`resolve_conv_grads` decides:

- ``cudnn`` / ``unfold``: as set.
- ``auto``: ``cudnn`` on the CPU (there unfold was 2.8x slower for the built-in CNN, 8 devices, 2 cores) and for
  models without a 2-D convolution; on a GPU, ``unfold`` when :func:`probe_conv_grads` finds it exact (one step's
  updates within the probe tolerance of cuDNN's) and faster on :data:`TIMED_DEVICES` devices with the run's own
  step (eager or replayed from CUDA graphs), else ``cudnn``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from devsim.data.device_shards import ShardPool
from devsim.resources.settings import CONV_GRADS_SETTINGS
from devsim.training.batched import BatchedTrainer
from devsim.training.local import LocalTrainingSpec

__all__ = [
    "CONV_GRADS_SETTINGS",
    "ConvGradsChoice",
    "TIMED_DEVICES",
    "probe_conv_grads",
    "resolve_conv_grads",
    "unfoldable_convolutions",
]

TIMED_DEVICES = 16
"""Devices of the probe's timing (a group size the leaves meet; a 3-device group hides what large groups cost)."""


@dataclass(frozen=True)
class ConvGradsChoice:
    """The batched step's convolution weight gradients (``cudnn`` or ``unfold``) and why (one log phrase)."""

    value: str
    reason: str


def unfoldable_convolutions(model: nn.Module) -> int:
    """How many of ``model``'s ``nn.Conv2d`` layers the unfold path takes (groups 1, numeric padding)."""
    return sum(
        1 for m in model.modules() if isinstance(m, nn.Conv2d) and m.groups == 1 and not isinstance(m.padding, str)
    )


def resolve_conv_grads(
    setting: str,
    device: torch.device | str,
    model: nn.Module,
    probe: Callable[[], tuple[bool, str]] | None = None,
) -> ConvGradsChoice:
    """``--conv-grads`` resolved for ``model`` on ``device``; ``probe`` (called only for ``auto`` on a GPU with
    convolutions to change) returns whether unfold is exact and faster, and the figures that say so.

    Raises:
        ValueError: ``setting`` is not one of :data:`CONV_GRADS_SETTINGS`.
    """
    if setting not in CONV_GRADS_SETTINGS:
        raise ValueError(f"conv_grads must be one of {', '.join(CONV_GRADS_SETTINGS)}, got {setting!r}")
    if setting != "auto":
        return ConvGradsChoice(setting, f"conv_grads={setting} (as set)")
    convolutions = unfoldable_convolutions(model)
    if not convolutions:
        return ConvGradsChoice("cudnn", "conv_grads=auto -> cudnn: no 2-D convolution to change")
    if torch.device(device).type != "cuda":
        return ConvGradsChoice("cudnn", "conv_grads=auto -> cudnn on the CPU")
    if probe is None:
        return ConvGradsChoice("cudnn", "conv_grads=auto -> cudnn (not probed)")
    faster, figures = probe()
    chosen = "unfold" if faster else "cudnn"
    return ConvGradsChoice(chosen, f"conv_grads=auto -> {chosen} ({convolutions} convolutions; {figures})")


def probe_conv_grads(
    build_trainer: Callable[[str, LocalTrainingSpec | None], BatchedTrainer],
    pool: ShardPool,
    global_tensors: list[torch.Tensor],
    tolerance: float,
    repeats: int = 3,
) -> tuple[bool, str]:
    """Whether unfold weight gradients are exact and faster than cuDNN's here, and the figures (one phrase).

    Exact: one local step of three probe devices from the same weights, both ways, must agree within
    ``tolerance`` of the largest update (one step, because deep nets with batch normalisation amplify rounding over
    several). Faster: the run's own local training of ``pool``'s devices (up to :data:`TIMED_DEVICES`), warm, best
    of ``repeats`` calls each, alternated.

    Args:
        build_trainer: ``build_trainer(conv_grads, spec)`` -> a fresh :class:`BatchedTrainer` of the run's model and
            step (eager or replayed), with ``spec`` in place of the run's when given.
        pool: the devices' shards (at least three).
        global_tensors: the start weights, on the trainer's device.
        tolerance: largest allowed ``max |unfold - cudnn| / max |cudnn|`` of the one-step updates.
    """
    try:
        reference = build_trainer("cudnn", None)
        one_step = dataclasses.replace(reference.spec, iterations=1, epochs=1)
        first = ShardPool(pool.inputs, pool.targets, list(pool.indices[:3]), pool.prepare)
        want, _ = _train(build_trainer("cudnn", one_step), first, global_tensors)
        got, _ = _train(build_trainer("unfold", one_step), first, global_tensors)
    except Exception as error:  # noqa: BLE001 - a model the unfold path cannot run keeps cuDNN
        return False, f"unfold failed on the probe: {type(error).__name__}: {str(error)[:200]}"
    largest = max(float(w.abs().max()) for w in want)
    worst = max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True)) / max(largest, 1e-30)
    if worst > tolerance:
        return False, f"unfold updates differ by {worst:.1e} of the largest on the probe"
    timed = ShardPool(pool.inputs, pool.targets, list(pool.indices[:TIMED_DEVICES]), pool.prepare)
    candidate = build_trainer("unfold", None)
    _train(reference, timed, global_tensors)
    _train(candidate, timed, global_tensors)
    cudnn_best = unfold_best = float("inf")
    for _ in range(repeats):
        cudnn_best = min(cudnn_best, _train(reference, timed, global_tensors)[1])
        unfold_best = min(unfold_best, _train(candidate, timed, global_tensors)[1])
    figures = (
        f"{len(timed.indices)} probe devices: unfold {unfold_best * 1e3:.1f} ms, cudnn {cudnn_best * 1e3:.1f} ms, "
        f"one step within {worst:.0e}"
    )
    return unfold_best < cudnn_best, figures


def _train(trainer: BatchedTrainer, pool: ShardPool, global_tensors: list[torch.Tensor]):
    """``trainer``'s deltas for ``pool``'s devices (seeds 0, 1, ...) and the call's wall seconds (synchronised)."""
    ids = list(range(len(pool.indices)))
    synchronize = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda *_: None)
    synchronize(trainer.device)
    started = time.perf_counter()
    deltas, _ = trainer.train_pool(ids, global_tensors, pool, [torch.Generator().manual_seed(i) for i in ids])
    synchronize(trainer.device)
    return deltas, time.perf_counter() - started
