"""The batched step replayed from CUDA graphs or compiled, for a few bucketed group sizes
(``--compile off|auto|graphs|on``).

:class:`CompiledGroups` wraps a :class:`~devsim.training.batched.BatchedTrainer` whose vmapped step is captured
(``graphs``: :class:`~devsim.training.graphed_step.GraphedStep`, CUDA graphs of the eager step, one per group
size: a capture costs milliseconds) or compiled (``on``: ``torch.compile``, ``reduce-overhead`` on a GPU). A
compiled step pads every group of D devices to the smallest bucket P >= D (:data:`BUCKETS`) with copies of its last
device: same shard rows, a generator in the same state, the same start weights. vmap keeps every device's
arithmetic to its own row, so the padded rows cannot change the real devices' updates; they are dropped from the
result. A run then compiles one shape per bucket it meets (a handful) instead of one per group size.
:meth:`CompiledGroups.warm` builds the shapes a leaf's plan expects at start-up.

Which path is used (:func:`resolve_compile`):

- ``off``: eager.
- ``graphs``: CUDA graphs captured from the eager step on a GPU (eager's kernels, so eager's updates; a shape costs
  a few eager steps to capture, not a compilation); eager on the CPU, which has no graphs.
- ``on``: ``torch.compile`` on any device (``reduce-overhead``, i.e. inductor's kernels in CUDA graphs, on a GPU;
  inductor on the CPU): fused kernels, but each bucket compiles for seconds (10-21 s a leaf's start on an H200).
- ``auto``: ``graphs`` on a GPU when :func:`probe_compiled` finds the replayed, padded step exact (same deltas as
  eager within :data:`devsim.training.probe.batch_probe.TOLERANCE`) and faster warm, for models up to
  :data:`AUTO_MAX_PARAMS` (launch-bound small models); eager on the CPU.

Padding the whole group rather than each step keeps every step's state a view; a ragged group (unequal shards,
short last batches) still takes some steps in smaller sub-groups, each a further shape.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from devsim.data.device_shards import ShardPool
from devsim.training.batched import BatchedTrainer
from devsim.training.graphed_step import GRAPH_OPTIONS
from devsim.training.local import DeviceMetrics

__all__ = [
    "AUTO_MAX_PARAMS",
    "BUCKETS",
    "COMPILE_SETTINGS",
    "CompileChoice",
    "CompiledGroups",
    "bucket_for",
    "compile_options_for",
    "probe_compiled",
    "resolve_compile",
]

COMPILE_SETTINGS = ("off", "auto", "graphs", "on")
BUCKETS = (2, 4, 8, 16, 32, 64, 128, 256)
"""Group sizes the replayed or compiled step is built for; a group of D devices runs padded to the smallest
bucket >= D."""

AUTO_MAX_PARAMS = 2_000_000
"""``auto`` compiles models with at most this many float state entries (``on`` compiles any)."""

RECOMPILE_LIMIT = 64
"""Dynamo's per-function cache of compiled shapes is raised to at least this (its default, 8, is one per bucket)."""


def bucket_for(count: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The smallest bucket >= ``count`` (>= 1); ``count`` itself above the largest bucket."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return next((b for b in buckets if b >= count), count)


def compile_options_for(device: torch.device | str) -> dict:
    """``torch.compile`` options of the batched step (``--compile on``): CUDA graphs (``reduce-overhead``) on a GPU,
    inductor's default mode on the CPU; static shapes."""
    return {"mode": "reduce-overhead"} if torch.device(device).type == "cuda" else {}


def probe_options_for(device: torch.device | str) -> dict:
    """The trainer options ``auto`` probes and adopts on ``device``: :data:`GRAPH_OPTIONS` on a GPU."""
    return dict(GRAPH_OPTIONS) if torch.device(device).type == "cuda" else compile_options_for(device)


@dataclass(frozen=True)
class CompileChoice:
    """Whether the batched step runs compiled, with which ``torch.compile`` options, and why (one log phrase)."""

    enabled: bool
    options: dict | None
    reason: str


def resolve_compile(setting: str, device: torch.device | str, probe=None, num_params: int = 0) -> CompileChoice:
    """Resolve ``--compile`` for ``device`` and a model of ``num_params`` float state entries; ``probe`` (called only
    when ``auto`` on a GPU still considers CUDA graphs) returns None when the replayed step is exact and faster, else
    why not.

    Raises:
        ValueError: ``setting`` is not one of :data:`COMPILE_SETTINGS`.
    """
    if setting not in COMPILE_SETTINGS:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_SETTINGS)}, got {setting!r}")
    on_gpu = torch.device(device).type == "cuda"
    if setting == "off":
        return CompileChoice(False, None, "compile=off: eager batched step")
    padded = f"groups padded to buckets {BUCKETS}"
    exact = "one graph per group size"
    if setting == "on":
        mode = "torch.compile reduce-overhead (inductor + CUDA graphs)" if on_gpu else "torch.compile (inductor)"
        return CompileChoice(True, compile_options_for(device), f"compile=on: {mode}, {padded}")
    if not on_gpu:
        return CompileChoice(False, None, f"compile={setting} -> eager on the CPU (no CUDA graphs; on compiles)")
    if setting == "graphs":
        return CompileChoice(True, dict(GRAPH_OPTIONS), f"compile=graphs: CUDA graphs, {exact}")
    if num_params > AUTO_MAX_PARAMS:
        return CompileChoice(
            False,
            None,
            f"compile=auto -> eager: {num_params:,} parameters (auto captures models up to {AUTO_MAX_PARAMS:,}; "
            "--compile graphs forces it)",
        )
    obstacle = probe() if probe is not None else None
    if obstacle is not None:
        return CompileChoice(False, None, f"compile=auto -> eager: {obstacle}")
    return CompileChoice(
        True, dict(GRAPH_OPTIONS), f"compile=auto -> CUDA graphs (exact and faster on the probe), {exact}"
    )


def _raise_recompile_limit() -> None:
    import torch._dynamo

    config = torch._dynamo.config
    config.cache_size_limit = max(config.cache_size_limit, RECOMPILE_LIMIT)
    if hasattr(config, "accumulated_cache_size_limit"):
        config.accumulated_cache_size_limit = max(config.accumulated_cache_size_limit, 4 * RECOMPILE_LIMIT)


def _copy_generator(generator: torch.Generator) -> torch.Generator:
    twin = torch.Generator(device=generator.device)
    twin.set_state(generator.get_state())
    return twin


class CompiledGroups:
    """A compiled :class:`BatchedTrainer` whose groups run padded to :data:`BUCKETS` (same ``train_pool`` API).

    Args:
        trainer: built with ``compile_options`` (see :func:`compile_options_for`).
        buckets: the padded group sizes; None: :data:`BUCKETS` for a compiled step, none (every group at its own
            size) for CUDA graphs, whose capture of a new size costs milliseconds rather than padded arithmetic.
        fallback: builds an eager trainer of the same model; when a compiled call raises (a shape or thread the
            probe did not meet), the group is trained again eagerly, unpadded, and every later group too, with one
            printed line saying why. None: the error propagates.
    """

    def __init__(
        self,
        trainer: BatchedTrainer,
        buckets: tuple[int, ...] | None = None,
        fallback: Callable[[], BatchedTrainer] | None = None,
    ):
        if not trainer.graphed:
            _raise_recompile_limit()
        self.trainer = trainer
        self.fallback = fallback
        self.eager: BatchedTrainer | None = None
        if buckets is None:
            buckets = () if trainer.graphed else BUCKETS
        self.buckets = tuple(sorted(buckets))
        self.keys = trainer.keys
        self.cuda = trainer.device.type == "cuda"
        self.cudagraph_trees = self.cuda and not trainer.graphed  # torch.compile's reduce-overhead marks each call

    def train_pool(
        self,
        device_ids: list[int],
        global_tensors: list[torch.Tensor],
        pool: ShardPool,
        generators: list[torch.Generator],
        per_device_base: bool = False,
    ) -> tuple[list[torch.Tensor], list[DeviceMetrics]]:
        """:meth:`BatchedTrainer.train_pool` of the group padded to its bucket; only the real devices' rows and
        metrics come back (``compute_seconds``: the padded call's wall time over the real devices)."""
        count = len(device_ids)
        if not count or len(pool.indices) != count or len(generators) != count:
            raise ValueError("device_ids, shards and generators must be non-empty and of equal length")
        if self.eager is not None:
            return self.eager.train_pool(device_ids, global_tensors, pool, generators, per_device_base)
        if self.fallback is None:
            return self._padded(device_ids, global_tensors, pool, generators, per_device_base)
        states = [g.get_state() for g in generators]
        try:
            return self._padded(device_ids, global_tensors, pool, generators, per_device_base)
        except Exception as error:  # noqa: BLE001 - any failure of the compiled step: train eagerly from here on
            print(f"[compile] compiled step failed ({type(error).__name__}: {str(error)[:200]}); eager from now on")
            self.eager = self.fallback()
            for generator, state in zip(generators, states, strict=True):
                generator.set_state(state)
            return self.eager.train_pool(device_ids, global_tensors, pool, generators, per_device_base)

    def _padded(
        self,
        device_ids: list[int],
        global_tensors: list[torch.Tensor],
        pool: ShardPool,
        generators: list[torch.Generator],
        per_device_base: bool,
    ) -> tuple[list[torch.Tensor], list[DeviceMetrics]]:
        count = len(device_ids)
        padded = bucket_for(count, self.buckets) - count
        if padded:
            device_ids = [*device_ids, *[device_ids[-1]] * padded]
            pool = ShardPool(pool.inputs, pool.targets, [*pool.indices, *[pool.indices[-1]] * padded], pool.prepare)
            generators = [*generators, *(_copy_generator(generators[-1]) for _ in range(padded))]
            if per_device_base:
                global_tensors = [torch.cat([t, t[-1:].expand(padded, *t.shape[1:])]) for t in global_tensors]
        if self.cudagraph_trees:
            torch.compiler.cudagraph_mark_step_begin()
        started = time.perf_counter()
        deltas, metrics = self.trainer.train_pool(device_ids, global_tensors, pool, generators, per_device_base)
        per_device = (time.perf_counter() - started) / count
        deltas = [d[:count].clone() if self.cuda else d[:count] for d in deltas]
        return deltas, [dataclasses.replace(m, compute_seconds=per_device) for m in metrics[:count]]

    def warm(self, sizes: list[int], pool: ShardPool, global_tensors: list[torch.Tensor]) -> list[int]:
        """Compile the buckets of these group sizes now (each trains its bucket of devices on ``pool``'s first
        shards once, results dropped); returns the buckets warmed, in order."""
        warmed = sorted({bucket_for(max(1, s), self.buckets) for s in sizes if s > 1})
        for bucket in warmed:
            indices = [pool.indices[i % len(pool.indices)] for i in range(bucket)]
            self.train_pool(
                list(range(bucket)),
                global_tensors,
                ShardPool(pool.inputs, pool.targets, indices, pool.prepare),
                [torch.Generator().manual_seed(i) for i in range(bucket)],
            )
        return warmed


def probe_compiled(
    build_trainer, pool: ShardPool, global_tensors: list[torch.Tensor], tolerance: float, repeats: int = 3
) -> str | None:
    """Why the replayed (or compiled), padded step should not be used, or None: three probe devices (padded to 4)
    trained eager and through :func:`probe_options_for` (CUDA graphs on a GPU) from the same weights must agree
    within ``tolerance`` of the largest update, and the replayed call (warm) must be faster than the eager one
    (best of ``repeats``).

    Args:
        build_trainer: ``build_trainer(compile_options)`` -> a fresh :class:`BatchedTrainer` (None: eager).
        pool: at least three devices' shards (only the first three are used).
        global_tensors: the start weights, on the trainer's device.
        tolerance: largest allowed ``max |compiled - eager| / max |eager|``.
    """
    eager = build_trainer(None)
    device = eager.device
    options = probe_options_for(device)
    try:
        compiled = CompiledGroups(build_trainer(options))
    except Exception as error:  # noqa: BLE001 - any failure to build means: stay eager
        what = "CUDA graphs" if options == GRAPH_OPTIONS else "torch.compile"
        return f"{what} failed: {type(error).__name__}: {str(error)[:200]}"
    probe = ShardPool(pool.inputs, pool.targets, list(pool.indices[:3]), pool.prepare)
    ids = [0, 1, 2]

    def run(trainer) -> tuple[float, list[torch.Tensor]]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        deltas, _ = trainer.train_pool(ids, global_tensors, probe, [torch.Generator().manual_seed(i) for i in ids])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started, deltas

    try:
        _, want = run(eager)
        _, got = run(compiled)
        eager_best = min(run(eager)[0] for _ in range(repeats))
        compiled_best = min(run(compiled)[0] for _ in range(repeats))
    except Exception as error:  # noqa: BLE001 - a model that does not compile stays eager
        return f"the replayed step failed on the probe: {type(error).__name__}: {str(error)[:200]}"
    largest = max(float(w.abs().max()) for w in want)
    worst = max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True))
    if worst > tolerance * max(largest, 1e-30):
        return f"replayed updates differ from eager by {worst / max(largest, 1e-30):.1e} of the largest update"
    if compiled_best >= eager_best:
        return f"replayed not faster on the probe ({compiled_best * 1e3:.1f} ms against {eager_best * 1e3:.1f} ms)"
    return None
