"""Whether a task's model may be trained many devices at once: checked once, on a probe.

The batched path (:mod:`devsim.training.batched`) runs any model through ``torch.func``'s ``vmap``. That gives the
same updates as training one device at a time for most models, but not for all: a model that draws random numbers
(dropout) or calls ``.item()`` cannot run under ``vmap``, one whose operators have no batching rule runs them
through a per-sample loop (PyTorch warns "There is a performance drop ..."), and a model that keeps state outside
its buffers would diverge. :func:`probe_batching` trains three small probe devices both ways from the same weights,
on rows of the task's own training data, with shards of different sizes (short batches and different step counts, as
a natural partition has), and returns why the model may not be batched, or None. The updates must agree within
:data:`TOLERANCE` of the largest, or, for a model that amplifies float rounding (deep nets with batch
normalisation), within :data:`ROUNDING_FACTOR` times what one rounding step of the start weights moves the
one-at-a-time updates themselves (:func:`rounding_sensitivity`, measured only when the first test fails).
Exact is not enough: on the CPU,
and wherever PyTorch warned of a per-sample loop, both ways are also timed on :data:`TIMED_DEVICES` devices at the
run's batch size (warm, alternated, fastest of five), and the batched path is kept only when it takes at most
:data:`SPEED_MARGIN` of the one-at-a-time time. Measured on a 2-core CPU (2026-11-27): the built-in CNN and small
MLPs batch 2-3x faster; a GRU over 32 characters and a LeNet-style CNN (max pooling, 1.1M multiply-adds a sample)
1.6-1.7x faster in the job's rounds; the CPU LSTM 5x slower. The timing makes the choice
depend on the machine; both paths give the same updates up to float rounding, and the leaf prints the one it took
(``--device-batch off`` or ``N`` pins it).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from devsim.codec import float_state_keys
from devsim.data.device_shards import ShardPool
from devsim.training.batched import BatchedTrainer, batching_obstacle
from devsim.training.local import LocalTrainer, LocalTrainingSpec, Objective

PROBE_BATCH = 4
"""Batch size of the probe devices (smaller than most runs': the probe is about exactness, not speed)."""

TOLERANCE = 1e-3
"""Largest allowed ``max |batched - single| / max |single|`` over the probe's deltas (float rounding is ~1e-6)."""

ROUNDING_FACTOR = 4.0
"""A difference above :data:`TOLERANCE` still counts as rounding when it is at most this many times the one-at-a-time
path's own rounding sensitivity (:func:`rounding_sensitivity`): deep nets with batch normalisation amplify float32
rounding by orders of magnitude over a few steps (ResNet-18 on the probe: 6e-2 of the largest update from start
weights moved by one rounding step, where the batched path differs by 1.4e-1), so no other arithmetic order can
match them closer."""

NUDGE = 2.0**-23
"""Relative size of the start-weight nudge of :func:`rounding_sensitivity` (one float32 rounding step)."""

SLOW_FALLBACK = "There is a performance drop"
TIMED_DEVICES = 16
"""Devices in the timing comparison (:data:`TIMED_STEPS` local steps each at the run's batch size)."""

TIMED_STEPS = 5
"""Local steps of each timed device. With 2 the batched path's fixed cost per call weighed more than in a run's
rounds: the digits CNN's batched/one-at-a-time ratio was 0.70-0.86 on the 2-core CPU (median 0.77, against the 0.8
margin: two of three probes in a row refused it), with 5 0.64-0.72 (median 0.69)."""

SPEED_MARGIN = 0.8
"""The batched path is taken when it trains the timed devices in at most this fraction of the one-at-a-time time.
Below 1 because batching pays less with more devices for compute-bound models (measured with 2 timed steps, before
the batched step lost its per-step Python, a GRU's batched/single time: 0.92 at
8 devices, 0.94 at 16, 1.04 at 64), and a leaf batches up to 64: the margin keeps such models in the thread pool."""


@dataclass(frozen=True)
class ProbeOutcome:
    """The verdict (``obstacle`` None: batch it), the probe's wall seconds both ways, and a note when the batched
    path was accepted on the rounding-sensitivity rule (:data:`ROUNDING_FACTOR`)."""

    obstacle: str | None
    single_seconds: float = 0.0
    batched_seconds: float = 0.0
    note: str = ""


@contextmanager
def deterministic_kernels(device: torch.device) -> Iterator[None]:
    """On a CUDA ``device``, cuDNN's deterministic algorithms (and PyTorch's, warning where an op has none) inside the
    block; the flags are restored after it. Elsewhere nothing changes (CPU kernels are deterministic already).
    Several cuDNN weight-gradient algorithms sum with atomics, so on a GPU a model that amplifies rounding gives a
    different one-at-a-time run each time: measured without this, ResNet-18's runs differed by more than
    :data:`TOLERANCE` and the rounding rule could excuse nothing (H200, 2026-11-27)."""
    if device.type != "cuda":
        yield
        return
    saved = (
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*deterministic.*")
            yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[0], saved[1]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])


def rounding_sensitivity(
    make_trainer: Callable[[], LocalTrainer],
    global_tensors: list[torch.Tensor],
    shards: list[tuple[torch.Tensor, torch.Tensor]],
    seeds: list[int],
    expected: list[list[torch.Tensor]],
    device: torch.device,
) -> float:
    """How far the one-at-a-time path's own deltas move (``max |nudged - reference|``, absolute) when every float
    start weight is moved by a relative :data:`NUDGE` (fixed random signs): the float rounding noise this model
    amplifies over the probe's steps. ``expected``: the deltas from the exact start weights, per device and key,
    which are the reference on the CPU; on a CUDA ``device`` the reference is a new run under
    :func:`deterministic_kernels`, as are the runs compared with it. ``make_trainer`` builds a fresh trainer of a
    fresh model (state a model keeps outside its tensors starts anew). 0.0 when a fresh model from the exact start
    weights does not give the reference again within :data:`TOLERANCE` (the model is not reproducible, so its
    rounding cannot excuse anything)."""
    noise = torch.Generator().manual_seed(7)
    nudged = [
        t * (1 + (torch.rand(t.shape, generator=noise) - 0.5).to(t.device) * 2 * NUDGE) if t.is_floating_point() else t
        for t in global_tensors
    ]
    largest = max(float(e.abs().max()) for device_deltas in expected for e in device_deltas)
    with deterministic_kernels(device):
        if device.type == "cuda":
            expected = _one_at_a_time(make_trainer(), global_tensors, shards, seeds)

        def distance(start: list[torch.Tensor]) -> float:
            return _largest_difference(_one_at_a_time(make_trainer(), start, shards, seeds), expected)

        if distance(global_tensors) > TOLERANCE * largest:
            return 0.0
        return distance(nudged)


def _one_at_a_time(
    trainer: LocalTrainer,
    start: list[torch.Tensor],
    shards: list[tuple[torch.Tensor, torch.Tensor]],
    seeds: list[int],
) -> list[list[torch.Tensor]]:
    """Each probe device's delta per key, trained one at a time from ``start`` (device ``i`` with ``seeds[i]``)."""
    deltas = []
    for i, (inputs, targets) in enumerate(shards):
        trainer.train(i, start, inputs, targets, torch.Generator().manual_seed(seeds[i]))
        deltas.append([(t - g).detach() for t, g in zip(trainer.state_tensors, start, strict=True)])
    return deltas


def _shards(pool: ShardPool, indices: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(prepared inputs, targets) of ``pool``'s rows ``indices[i]`` for each probe device ``i``."""
    return [
        (pool.prepare(pool.inputs[rows]) if pool.prepare is not None else pool.inputs[rows], pool.targets[rows])
        for rows in indices
    ]


def _largest_difference(first: list[list[torch.Tensor]], second: list[list[torch.Tensor]]) -> float:
    """``max |first - second|`` over devices and keys (both per device, per key)."""
    return max(
        float((a - b).abs().max())
        for row_a, row_b in zip(first, second, strict=True)
        for a, b in zip(row_a, row_b, strict=True)
    )


def probe_batching(
    model_fn: Callable[[], nn.Module],
    spec: LocalTrainingSpec,
    objective: Objective,
    pool: ShardPool,
    device: torch.device,
    timed: bool = True,
) -> ProbeOutcome:
    """Train three probe devices one at a time and batched from the same weights; compare their deltas; then (with
    ``timed``, on the CPU or after a per-sample-loop warning) time both ways.

    Args:
        model_fn: builds a fresh model of the task (called twice; the second copy gets the first's weights).
        spec: the run's local training settings (the probe uses epochs=1 and batch size
            ``min(batch_size, PROBE_BATCH)``, so the probe stays cheap).
        objective: the task's loss, classification flag and augmentation.
        pool: the training rows (a leaf's shared train split); the probe devices use its first rows.
        device: the compute device.
        timed: time both ways before allowing the batched path (False: exactness only).
    """
    obstacle = batching_obstacle(model_fn(), spec)
    if obstacle is not None:
        return ProbeOutcome(obstacle)
    batch = min(spec.batch_size, PROBE_BATCH)
    probe_spec = dataclasses.replace(spec, epochs=1, iterations=None, batch_size=batch)
    total = int(pool.inputs.shape[0])
    sizes = [batch + 2, 2 * batch, 3 * batch + 2]
    starts = [0, sizes[0], sizes[0] + sizes[1]]
    indices = [torch.arange(s, s + n, device=device) % total for s, n in zip(starts, sizes, strict=True)]
    reference = model_fn().to(device)
    keys = float_state_keys(reference)
    state = reference.state_dict()
    global_tensors = [state[k].detach().clone() for k in keys]
    twin = model_fn().to(device)
    twin.load_state_dict(state)
    seeds = [101, 202, 303]
    try:
        started = time.perf_counter()
        shards = _shards(pool, indices)
        expected = _one_at_a_time(LocalTrainer(reference, probe_spec, device, objective), global_tensors, shards, seeds)
        single_seconds = time.perf_counter() - started
    except Exception as error:
        return ProbeOutcome(f"the model does not train on the probe one device at a time: {_short(error)}")
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer = BatchedTrainer(twin, probe_spec, device, objective)
            probe_pool = ShardPool(pool.inputs, pool.targets, indices, pool.prepare)
            deltas, _ = trainer.train_pool([0, 1, 2], global_tensors, probe_pool, generators)
        except Exception as error:
            return ProbeOutcome(f"vmap cannot run the model: {_short(error)}", single_seconds)
    batched_seconds = time.perf_counter() - started
    largest = max(max(float(e.abs().max()) for e in device_deltas) for device_deltas in expected)
    worst = _largest_difference([[d[i] for d in deltas] for i in range(len(indices))], expected)
    note = ""
    if largest > 0 and worst / largest > TOLERANCE or largest == 0 and worst > 0:
        relative = worst / max(largest, 1e-30)
        fresh = lambda: LocalTrainer(model_fn().to(device), probe_spec, device, objective)  # noqa: E731
        sensitivity = rounding_sensitivity(fresh, global_tensors, shards, seeds, expected, device)
        sensitivity /= max(largest, 1e-30)
        if relative > ROUNDING_FACTOR * sensitivity:
            return ProbeOutcome(
                f"batched updates differ from one-at-a-time updates by {relative:.1e} of the largest update (allowed "
                f"{TOLERANCE:g}, or {ROUNDING_FACTOR:g}x the {sensitivity:.1e} that one float32 rounding step of the "
                "start weights moves them): the model keeps state or randomness the batched path cannot reproduce",
                single_seconds,
                batched_seconds,
            )
        note = (
            f"batched updates differ from one-at-a-time ones by {relative:.1e} of the largest update, within "
            f"{ROUNDING_FACTOR:g}x of the {sensitivity:.1e} that one float32 rounding step of the start weights "
            "moves the one-at-a-time updates themselves (the model amplifies rounding)"
        )
    slow = [str(w.message) for w in caught if SLOW_FALLBACK in str(w.message)]
    if not timed or (not slow and device.type != "cpu"):
        return ProbeOutcome(None, single_seconds, batched_seconds, note)
    single_time, batched_time = _timed(model_fn, spec, objective, pool, device, global_tensors)
    if batched_time <= SPEED_MARGIN * single_time:
        return ProbeOutcome(None, single_time, batched_time, note)
    if slow:
        operator = slow[0].split("batching rule for ")[-1].split(".")[0] if "batching rule for" in slow[0] else "an op"
        reason = f"vmap has no batching rule for {operator} and loops over samples"
    else:
        reason = "batched training is not faster for this model on this CPU"
    return ProbeOutcome(
        f"{reason}: {TIMED_DEVICES} devices took {batched_time * 1e3:.1f} ms batched against "
        f"{single_time * 1e3:.1f} ms one at a time (batched needs at most {SPEED_MARGIN:g}x)",
        single_time,
        batched_time,
    )


def _timed(
    model_fn: Callable[[], nn.Module],
    spec: LocalTrainingSpec,
    objective: Objective,
    pool: ShardPool,
    device: torch.device,
    global_tensors: list[torch.Tensor],
) -> tuple[float, float]:
    """Seconds of :data:`TIMED_STEPS` local steps of :data:`TIMED_DEVICES` devices one at a time and batched (the
    fastest of :data:`TIMED_REPEATS` alternated warm runs each, after one untimed run), at the run's batch size."""
    timed_spec = dataclasses.replace(spec, iterations=TIMED_STEPS)
    total = int(pool.inputs.shape[0])
    rows = [
        torch.arange(i * 2 * spec.batch_size, (i + 1) * 2 * spec.batch_size, device=device) % total
        for i in range(TIMED_DEVICES)
    ]
    single = LocalTrainer(model_fn().to(device), timed_spec, device, objective)
    example = pool.inputs[:1]
    example = pool.prepare(example) if pool.prepare is not None else example
    batched = BatchedTrainer(model_fn().to(device), timed_spec, device, objective, example)
    shards = _shards(pool, rows)

    def run_single() -> None:
        for i, (inputs, targets) in enumerate(shards):
            single.train(i, global_tensors, inputs, targets, torch.Generator().manual_seed(i))

    def run_batched() -> None:
        generators = [torch.Generator().manual_seed(i) for i in range(TIMED_DEVICES)]
        batched.train_pool(
            list(range(TIMED_DEVICES)),
            global_tensors,
            ShardPool(pool.inputs, pool.targets, rows, pool.prepare),
            generators,
        )

    return _best_of_interleaved(run_single, run_batched)


TIMED_REPEATS = 5
"""Warm runs of each way, alternated; the fastest of each counts. Each run takes some 10-50 ms, so one burst of a
neighbour (the other leaves probe at the same moment) can double a single run: with two runs each the built-in
CNN once came out slower batched on a 2-core machine and a leaf chose the thread pool (a 3x slower round)."""


def _best_of_interleaved(first: Callable[[], None], second: Callable[[], None]) -> tuple[float, float]:
    """Fastest seconds of ``first`` and of ``second`` over :data:`TIMED_REPEATS` alternated warm runs each."""
    best = [float("inf"), float("inf")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first()
        second()
        for _ in range(TIMED_REPEATS):
            for position, run in enumerate((first, second)):
                started = time.perf_counter()
                run()
                best[position] = min(best[position], time.perf_counter() - started)
    return best[0], best[1]


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]
