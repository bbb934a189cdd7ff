"""Worker-pool sizing for a leaf node that trains many simulated devices in a ThreadPoolExecutor.

A leaf trains its simulated devices concurrently, one device per worker thread. :func:`plan_workers`
chooses how many workers to run and how many torch intra-op threads each should use (the pool rule; a leaf on a
GPU that batches plans its workers from its batched groups instead, see :mod:`devsim.resources.leaf_plan`):

``cores_per_leaf = max(1, cores // leaves_on_host)`` where ``cores`` is the number of usable CPU
cores (:func:`usable_cpu_cores`, i.e. the process's CPU affinity) and ``leaves_on_host`` the number of
leaf processes sharing this host.

CPU (``device == "cpu"``)::

    num_workers = min(cores_per_leaf, max_workers)
    threads_per_worker = max(1, cores_per_leaf // num_workers)      # 1 unless capped by max_workers

One single-threaded torch worker per core beats fewer multi-threaded ones for the small per-device
batches of cross-device FL: intra-op parallelism has little to split in a batch of 32 small images.

GPU (``device == "cuda"`` or ``"cuda:N"``)::

    per_worker_bytes = estimate_worker_vram_bytes(num_params, batch_size)
    vram_workers = floor(free_vram * vram_fraction / leaves_on_gpu / per_worker_bytes)
    num_workers = max(1, min(vram_workers, 2 * cores_per_leaf, max_workers))
    threads_per_worker = 1

The CPU threads mostly launch kernels and collate batches, so up to two workers per core keep the GPU
busy; VRAM bounds the total. ``free_vram`` is that of the leaf's own GPU (the one it sees as
``cuda:0`` when ``--gpus`` spreads the leaves, see :mod:`devsim.resources.gpu_placement`), shared by the
``leaves_on_gpu`` leaves placed on it, which all size their pools at the same time. When free VRAM
cannot be queried (no CUDA) the VRAM term is dropped.

``override`` (>= 1, from ``--num-workers``) replaces ``num_workers``; the rest of the plan is derived
as above and ``reason`` notes what the formula would have chosen.

``threads_per_worker`` is meant for ``torch.set_num_threads`` in the leaf process. Torch's intra-op
thread setting is process-wide rather than per Python thread, so it is a per-op cap that every worker
shares; with the default plan (one worker per core) it is 1 and no oversubscription can occur.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

__all__ = [
    "BYTES_PER_PARAM",
    "DEFAULT_ACTIVATION_BYTES_PER_SAMPLE",
    "PARAM_COPIES_PER_WORKER",
    "WorkerPlan",
    "estimate_worker_vram_bytes",
    "free_vram_bytes",
    "plan_workers",
    "usable_cpu_cores",
]

BYTES_PER_PARAM = 4
PARAM_COPIES_PER_WORKER = 4
DEFAULT_ACTIVATION_BYTES_PER_SAMPLE = 4 * 1024 * 1024
_OVERRIDE_HINT = "override with --num-workers"


@dataclass(frozen=True)
class WorkerPlan:
    """How a leaf sizes its device-training thread pool.

    Attributes:
        num_workers: concurrent device-training threads (>= 1).
        threads_per_worker: torch intra-op threads each worker should use (>= 1).
        device: ``"cpu"`` or ``"cuda:N"``.
        reason: one human-readable line with the formula and its inputs, for leaf start-up logs.
    """

    num_workers: int
    threads_per_worker: int
    device: str
    reason: str


def usable_cpu_cores() -> int:
    """CPU cores this process may run on: ``os.sched_getaffinity(0)`` if available, else ``os.cpu_count()``.

    Always at least 1.
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def free_vram_bytes(device: str | torch.device) -> int | None:
    """Free memory in bytes on CUDA ``device`` (``torch.cuda.mem_get_info``); None when CUDA is unusable."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    try:
        free, _total = torch.cuda.mem_get_info(dev)
    except (RuntimeError, AssertionError):
        return None
    return int(free)


def estimate_worker_vram_bytes(
    num_params: int,
    batch_size: int,
    activation_bytes_per_sample: int = DEFAULT_ACTIVATION_BYTES_PER_SAMPLE,
) -> int:
    """Rough GPU memory footprint of one training worker, in bytes.

    ``PARAM_COPIES_PER_WORKER * BYTES_PER_PARAM * num_params`` (four float32 copies of the model: weights,
    gradients, SGD momentum and the received global weights kept for computing the update) plus
    ``batch_size * activation_bytes_per_sample`` (activations kept for the backward pass; the 4 MiB
    default is generous for a CIFAR ResNet-18 sample and far above the small CNN's needs).
    """
    if num_params < 0:
        raise ValueError(f"num_params must be >= 0, got {num_params}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if activation_bytes_per_sample < 0:
        raise ValueError(f"activation_bytes_per_sample must be >= 0, got {activation_bytes_per_sample}")
    weights = PARAM_COPIES_PER_WORKER * BYTES_PER_PARAM * num_params
    return weights + batch_size * activation_bytes_per_sample


def _fmt_bytes(num_bytes: float) -> str:
    """Format a byte count as GiB (>= 1 GiB) or MiB with two decimals."""
    gib = 1024**3
    if num_bytes >= gib:
        return f"{num_bytes / gib:.2f} GiB"
    return f"{num_bytes / 1024**2:.2f} MiB"


def _normalize_device(device: str) -> str:
    """Return ``"cpu"`` or ``"cuda:N"``; raise ValueError naming ``device`` otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from exc
    if dev.type == "cpu":
        return "cpu"
    if dev.type == "cuda":
        return f"cuda:{dev.index or 0}"
    raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def _plural(count: int, singular: str, plural: str) -> str:
    """``singular`` when ``count == 1``, else ``plural``."""
    return singular if count == 1 else plural


def _threads_text(threads: int) -> str:
    """``"1 torch thread per worker"`` / ``"N torch threads per worker"``."""
    return f"{threads} torch {_plural(threads, 'thread', 'threads')} per worker"


def _cpu_plan(cores: int, leaves_on_host: int, cores_per_leaf: int, max_workers: int) -> tuple[int, int, str]:
    """CPU formula: ``(num_workers, threads_per_worker, explanation)``."""
    num_workers = min(cores_per_leaf, max_workers)
    threads = max(1, cores_per_leaf // num_workers)
    text = (
        f"cpu: {cores} usable cores / {leaves_on_host} {_plural(leaves_on_host, 'leaf', 'leaves')} on host"
        f" = {cores_per_leaf}"
        f"{f', capped at max_workers={max_workers}' if num_workers < cores_per_leaf else ''}"
    )
    return num_workers, threads, text


def _gpu_plan(
    device: str,
    free_vram: int | None,
    per_worker: int,
    vram_fraction: float,
    leaves_on_gpu: int,
    cores_per_leaf: int,
    max_workers: int,
) -> tuple[int, str]:
    """GPU formula: ``(num_workers, explanation)``; the VRAM term is dropped when ``free_vram`` is None."""
    cpu_cap = 2 * cores_per_leaf
    if free_vram is None:
        num_workers = max(1, min(cpu_cap, max_workers))
        text = (
            f"{device}: free VRAM unknown; min(2 * {cores_per_leaf} cores per leaf = {cpu_cap}, "
            f"max_workers={max_workers})"
        )
        return num_workers, text
    vram_workers = math.floor(free_vram * vram_fraction / leaves_on_gpu / per_worker)
    num_workers = max(1, min(vram_workers, cpu_cap, max_workers))
    shared = f" / {leaves_on_gpu} leaves on this GPU" if leaves_on_gpu > 1 else ""
    text = (
        f"{device}: max(1, min(vram {vram_workers} = floor({_fmt_bytes(free_vram)} free * {vram_fraction:g}"
        f"{shared} / {_fmt_bytes(per_worker)} per worker), 2 * {cores_per_leaf} cores per leaf = {cpu_cap}, "
        f"max_workers={max_workers}))"
    )
    return num_workers, text


def _validate(
    *,
    num_params: int,
    batch_size: int,
    leaves_on_host: int,
    override: int | None,
    cpu_cores: int | None,
    free_vram: int | None,
    max_workers: int,
    vram_fraction: float,
    leaves_on_gpu: int,
) -> None:
    """Raise ValueError naming the first invalid argument of :func:`plan_workers`."""
    checks = [
        (override is not None and override < 1, f"num_workers (override) must be >= 1, got {override}"),
        (leaves_on_host < 1, f"leaves_on_host must be >= 1, got {leaves_on_host}"),
        (leaves_on_gpu < 1, f"leaves_on_gpu must be >= 1, got {leaves_on_gpu}"),
        (num_params < 0, f"num_params must be >= 0, got {num_params}"),
        (batch_size < 1, f"batch_size must be >= 1, got {batch_size}"),
        (cpu_cores is not None and cpu_cores < 1, f"cpu_cores must be >= 1, got {cpu_cores}"),
        (free_vram is not None and free_vram < 0, f"free_vram must be >= 0, got {free_vram}"),
        (max_workers < 1, f"max_workers must be >= 1, got {max_workers}"),
        (not 0.0 < vram_fraction <= 1.0, f"vram_fraction must be in (0, 1], got {vram_fraction}"),
    ]
    for failed, message in checks:
        if failed:
            raise ValueError(message)


def plan_workers(
    *,
    device: str,
    num_params: int,
    batch_size: int,
    leaves_on_host: int = 1,
    override: int | None = None,
    cpu_cores: int | None = None,
    free_vram: int | None = None,
    max_workers: int = 64,
    vram_fraction: float = 0.8,
    leaves_on_gpu: int = 1,
) -> WorkerPlan:
    """Size a leaf's worker pool with the formula in the module docstring.

    Args:
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (``"cuda"`` means ``"cuda:0"``).
        num_params: model parameter count (scalars), for the VRAM estimate.
        batch_size: per-device training batch size (samples), for the VRAM estimate.
        leaves_on_host: leaf processes sharing this host's CPU cores (>= 1).
        override: explicit worker count from ``--num-workers`` (>= 1); wins over the formula.
        cpu_cores: usable cores; None queries :func:`usable_cpu_cores` (tests inject a value).
        free_vram: free GPU memory in bytes; None queries :func:`free_vram_bytes` (tests inject a value).
        max_workers: upper bound on the formula's worker count.
        vram_fraction: share of the free VRAM the workers may use, in (0, 1].
        leaves_on_gpu: leaf processes sharing this leaf's GPU (>= 1); each plans with its share.

    Raises:
        ValueError: on an invalid argument; the message names it (``num_workers`` for ``override``).
    """
    _validate(
        num_params=num_params,
        batch_size=batch_size,
        leaves_on_host=leaves_on_host,
        override=override,
        cpu_cores=cpu_cores,
        free_vram=free_vram,
        max_workers=max_workers,
        vram_fraction=vram_fraction,
        leaves_on_gpu=leaves_on_gpu,
    )
    dev = _normalize_device(device)
    cores = usable_cpu_cores() if cpu_cores is None else cpu_cores
    cores_per_leaf = max(1, cores // leaves_on_host)
    if dev == "cpu":
        num_workers, threads, text = _cpu_plan(cores, leaves_on_host, cores_per_leaf, max_workers)
    else:
        vram = free_vram_bytes(dev) if free_vram is None else free_vram
        per_worker = estimate_worker_vram_bytes(num_params, batch_size)
        num_workers, text = _gpu_plan(dev, vram, per_worker, vram_fraction, leaves_on_gpu, cores_per_leaf, max_workers)
        threads = 1
    if override is None:
        reason = f"workers={num_workers} ({text}; {_threads_text(threads)}; {_OVERRIDE_HINT})"
        return WorkerPlan(num_workers, threads, dev, reason)
    if dev == "cpu":
        threads = max(1, cores_per_leaf // override)
    reason = (
        f"workers={override} (override from --num-workers; formula would give {num_workers}: {text}; "
        f"{_threads_text(threads)})"
    )
    return WorkerPlan(override, threads, dev, reason)
