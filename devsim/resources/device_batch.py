"""How many devices a leaf's worker trains at once as one batched computation (``--device-batch``).

:func:`plan_device_batch` turns the setting into a size and one log line saying which path was taken
and why:

- ``off`` (or 1): the thread pool trains one device at a time per worker.
- ``N`` > 1: N devices per batch, as asked (refused with the obstacle when the worker cannot batch
  exactly); the line notes when N exceeds what free memory was estimated to hold.
- ``auto``: batch when the worker can reproduce one-at-a-time training exactly (``obstacle`` is None),
  with the size sized from free memory the way :mod:`devsim.resources.workers` sizes the pool::

      sharing  = num_workers * (leaves_on_gpu on a GPU, else leaves_on_host)
      fits     = floor(free_bytes * MEMORY_FRACTION / sharing / device_bytes)
      size     = min(fits, AUTO_MAX_CPU or AUTO_MAX_GPU)

  where ``free_bytes`` is free VRAM on a GPU (``torch.cuda.mem_get_info``) and available RAM on the
  CPU (``MemAvailable`` of ``/proc/meminfo``), and ``device_bytes`` the estimated cost of one more
  device in a batch (weights, gradients, optimizer state, delta, activations and shard; see
  :func:`devsim.training.batched.batched_device_bytes`). A size below 2 falls back to the thread pool.
  The caps bound the gain-less tail: on 2 CPU cores the small CNN gains little beyond 64 devices.

  On the CPU, ``auto`` keeps models above ``AUTO_CPU_MAX_PARAMS`` in the thread pool: their per-device
  steps are compute-bound, vmapped (grouped) convolutions do the same FLOPs less efficiently than one
  device's batch, and ResNet-18 (batch 10) measured 1.0-2.2x slower batched than one device at a time on one core
  (2026-11-23, load 12-15). Batching pays where per-step overhead dominates: small models, or a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from devsim.resources.workers import _fmt_bytes, free_vram_bytes

__all__ = [
    "AUTO_CPU_MAX_PARAMS",
    "AUTO_MAX_CPU",
    "AUTO_MAX_GPU",
    "MEMORY_FRACTION",
    "DeviceBatchPlan",
    "free_ram_bytes",
    "plan_device_batch",
]

AUTO_MAX_CPU = 64
AUTO_CPU_MAX_PARAMS = 2_000_000
AUTO_MAX_GPU = 256
MEMORY_FRACTION = 0.5


@dataclass(frozen=True)
class DeviceBatchPlan:
    """Devices per batched computation (1: the thread pool, one device at a time) and why."""

    size: int
    reason: str


def free_ram_bytes() -> int | None:
    """Available RAM in bytes (``MemAvailable`` in ``/proc/meminfo``); None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def plan_device_batch(
    setting: int | str,
    *,
    obstacle: str | None | Callable[[], str | None],
    device_bytes: int,
    device: str,
    num_workers: int,
    leaves_on_host: int = 1,
    leaves_on_gpu: int = 1,
    free_bytes: int | None = None,
    num_params: int = 0,
) -> DeviceBatchPlan:
    """Resolve ``--device-batch`` (``"auto"``, ``"off"`` or an int >= 1) for one leaf.

    Args:
        setting: the configured value.
        obstacle: why the worker cannot batch exactly (see ``batching_obstacle``), None when it can; or a
            function returning that, called only when the answer decides the plan (it may run a probe).
        device_bytes: estimated bytes one more device adds to a batch (> 0).
        device: the worker's torch device (``"cpu"``, ``"cuda"``, ``"cuda:N"``).
        num_workers: workers of this leaf, each running its own batches at the same time.
        leaves_on_host / leaves_on_gpu: leaves sharing this host's RAM / this GPU's VRAM.
        free_bytes: free memory to size from; None queries VRAM (GPU) or RAM (CPU).
        num_params: float state entries of the model (``auto`` on the CPU batches up to ``AUTO_CPU_MAX_PARAMS``).

    Raises:
        ValueError: for a malformed setting, or an explicit N > 1 that the worker cannot batch.
    """
    if setting == "off" or setting == 1:
        return DeviceBatchPlan(1, "device_batch=off: thread pool, one device at a time per worker")
    if setting != "auto" and not (isinstance(setting, int) and not isinstance(setting, bool) and setting > 1):
        raise ValueError(f"device_batch must be 'auto', 'off' or an integer >= 1, got {setting!r}")
    if device_bytes <= 0:
        raise ValueError(f"device_bytes must be > 0, got {device_bytes}")
    on_gpu = device.startswith("cuda")
    if setting == "auto" and not on_gpu and num_params > AUTO_CPU_MAX_PARAMS:
        return DeviceBatchPlan(
            1,
            f"device_batch=auto -> thread pool, one device at a time: {num_params:,} parameters are compute-bound "
            f"on the CPU (batched above {AUTO_CPU_MAX_PARAMS:,} only on a GPU or with --device-batch N)",
        )
    if callable(obstacle):
        obstacle = obstacle()
    if obstacle is not None:
        if setting == "auto":
            return DeviceBatchPlan(1, f"device_batch=auto -> thread pool, one device at a time: {obstacle}")
        raise ValueError(f"--device-batch {setting}: {obstacle}")
    if free_bytes is None:
        free_bytes = free_vram_bytes(device) if on_gpu else free_ram_bytes()
    sharing = max(1, num_workers) * max(1, leaves_on_gpu if on_gpu else leaves_on_host)
    cap = AUTO_MAX_GPU if on_gpu else AUTO_MAX_CPU
    memory = "VRAM" if on_gpu else "RAM"
    if free_bytes is None:
        fits, inputs = cap, f"free {memory} unknown, cap {cap}"
    else:
        fits = math.floor(free_bytes * MEMORY_FRACTION / sharing / device_bytes)
        inputs = (
            f"free {memory} {_fmt_bytes(free_bytes)} x {MEMORY_FRACTION} / {sharing} workers sharing it / "
            f"{_fmt_bytes(device_bytes)} per device = {fits}"
        )
    if setting != "auto":
        note = f"; above the {fits} that memory was estimated to hold" if setting > fits else ""
        return DeviceBatchPlan(setting, f"device_batch={setting} (as set; {inputs}{note})")
    size = min(fits, cap)
    if size < 2:
        return DeviceBatchPlan(1, f"device_batch=auto -> thread pool, one device at a time: {inputs}")
    return DeviceBatchPlan(
        size, f"device_batch=auto -> {size} devices per batched computation (min({inputs}, cap {cap}))"
    )
