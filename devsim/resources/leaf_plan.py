"""One plan per leaf: how many workers it runs and how many devices each trains at once, decided together.

Two shapes of plan (:attr:`LeafPlan.fill_groups`):

- **Pool first** (the CPU, and a GPU where the model cannot be batched exactly): the workers are sized by
  :func:`devsim.resources.workers.plan_workers` (cores, free VRAM) and the devices a leaf trains at once are
  dealt over them first (worker ``w`` takes every ``W``-th device); each worker then trains its share
  ``device_batch`` at a time (:func:`devsim.resources.device_batch.plan_device_batch`). On 2 CPU cores that is
  one worker and groups of up to 64.
- **Groups first** (a GPU with the batched path): the unit of work is one batched computation. Its size comes
  from free VRAM and the bytes one more device costs (``plan_device_batch`` with the whole leaf's share of the
  GPU), then the devices a leaf trains at once, ``N``, are cut into ``G = ceil(N / device_batch)`` groups of
  near-equal size (:func:`balanced_groups`) and ``min(W, G)`` workers train them. The worker count is::

      groups_in_vram = floor(fits / device_batch)            # groups of that size that fit at once
      expected       = ceil(devices_at_once / device_batch)  # groups a round (or an async call) brings
      num_workers    = max(1, min(2 * cores_per_leaf, groups_in_vram, expected, max_workers))

  so a leaf that trains 10 devices a round runs one worker and one group of 10, never ten groups of one.

``--num-workers`` overrides the worker count in both shapes; the groups are still formed first on a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from devsim.resources.device_batch import MEMORY_FRACTION, plan_device_batch
from devsim.resources.workers import _fmt_bytes, free_vram_bytes, plan_workers, usable_cpu_cores

__all__ = ["LeafPlan", "balanced_groups", "deal_groups", "devices_at_once", "expected_group_sizes", "plan_leaf"]


@dataclass(frozen=True)
class LeafPlan:
    """A leaf's workers and devices per batched computation, and the one log line that explains them.

    Attributes:
        num_workers: device-training threads to build (>= 1).
        threads_per_worker: torch intra-op threads (``torch.set_num_threads``).
        device_batch: most devices per batched computation (1: one device at a time).
        fill_groups: True: cut the devices into groups of up to ``device_batch`` first, then deal groups over
            workers (GPU, batched); False: deal devices over workers first (pool rule).
        reason: ``plan=...`` with the inputs (cores, free VRAM, bytes per device).
    """

    num_workers: int
    threads_per_worker: int
    device_batch: int
    fill_groups: bool
    reason: str


def balanced_groups(items: list, size: int) -> list[list]:
    """``items`` cut in order into ``ceil(len / size)`` consecutive groups whose sizes differ by at most one.

    ``size`` (>= 1) is the largest group; 11 items at size 10 give groups of 6 and 5, not 10 and 1.
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    if not items:
        return []
    count = -(-len(items) // size)
    base, extra = divmod(len(items), count)
    groups, start = [], 0
    for index in range(count):
        end = start + base + (1 if index < extra else 0)
        groups.append(items[start:end])
        start = end
    return groups


def deal_groups(devices: list[int], num_workers: int, device_batch: int, fill_groups: bool) -> list[list[list[int]]]:
    """Per used worker, its groups of ``devices`` (in order): groups first (``fill_groups``) or devices first.

    Groups first: :func:`balanced_groups` of ``devices`` at ``device_batch``, dealt round-robin over
    ``min(num_workers, groups)`` workers. Devices first: worker ``w`` of ``min(num_workers, len(devices))``
    gets ``devices[w::W]`` as one group (its worker cuts it further by ``device_batch``).
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if not devices:
        return []
    if fill_groups:
        groups = balanced_groups(list(devices), device_batch)
        used = min(num_workers, len(groups))
        return [groups[w::used] for w in range(used)]
    used = min(num_workers, len(devices))
    return [[list(devices[w::used])] for w in range(used)]


def expected_group_sizes(plan: LeafPlan, devices: int | None) -> list[int]:
    """The sizes of the batched groups a round of ``devices`` devices brings under ``plan`` (sorted, distinct;
    empty when the plan does not batch or ``devices`` is unknown): what a compiled step warms at start-up."""
    if plan.device_batch < 2 or not devices:
        return []
    sizes = set()
    for worker in deal_groups(list(range(devices)), plan.num_workers, plan.device_batch, plan.fill_groups):
        for group in worker:
            for start in range(0, len(group), plan.device_batch):
                sizes.add(len(group[start : start + plan.device_batch]))
    return sorted(sizes)


def devices_at_once(settings: dict) -> int | None:
    """Devices a leaf of this run trains at once, from its settings: a sync round's selection share,
    ``ceil(device_selection_size / num_leaf_nodes)`` (all its devices when unset), or an async run's share of the
    ``concurrency`` jobs in flight; None when the settings do not say."""
    leaves = max(1, int(settings.get("num_leaf_nodes", 1) or 1))
    if settings.get("concurrency") is not None:
        return max(1, -(-int(settings["concurrency"]) // leaves))
    selection = settings.get("device_selection_size")
    if selection:
        return max(1, -(-int(selection) // leaves))
    per_leaf = settings.get("devices_per_leaf")
    return int(per_leaf) if per_leaf else None


def plan_leaf(
    *,
    device: str,
    num_params: int,
    batch_size: int,
    device_batch_setting: int | str,
    obstacle,
    device_bytes: int,
    devices_at_once: int | None = None,
    leaves_on_host: int = 1,
    leaves_on_gpu: int = 1,
    override: int | None = None,
    cpu_cores: int | None = None,
    free_vram: int | None = None,
    free_ram: int | None = None,
    max_workers: int = 64,
) -> LeafPlan:
    """Plan one leaf's workers and batched groups (module docstring).

    Args:
        device: the leaf's torch device (``cpu``, ``cuda``, ``cuda:N``).
        num_params: float state entries of the model (pool sizing and the CPU batching threshold).
        batch_size: per-device training batch (samples).
        device_batch_setting: ``--device-batch`` (``auto``, ``off`` or N).
        obstacle: why the model cannot be batched exactly, None, or a function answering that (may run a probe).
        device_bytes: bytes one more device adds to a batched computation (> 0).
        devices_at_once: devices a round (or an async call) brings this leaf; None leaves the worker count
            bounded by cores and memory only.
        leaves_on_host / leaves_on_gpu: leaves sharing this host's cores and RAM / this GPU.
        override: ``--num-workers``.
        cpu_cores / free_vram / free_ram: injected for tests; None queries the machine.
        max_workers: upper bound on the worker count.

    Raises:
        ValueError: an invalid argument, or an explicit ``--device-batch N`` the model cannot batch.
    """
    on_gpu = str(device).startswith("cuda")
    pool = plan_workers(
        device=device,
        num_params=num_params,
        batch_size=batch_size,
        leaves_on_host=leaves_on_host,
        override=override,
        cpu_cores=cpu_cores,
        free_vram=free_vram,
        max_workers=max_workers,
        leaves_on_gpu=leaves_on_gpu,
    )
    if not on_gpu:
        batching = plan_device_batch(
            device_batch_setting,
            obstacle=obstacle,
            device_bytes=device_bytes,
            device=device,
            num_workers=pool.num_workers,
            leaves_on_host=leaves_on_host,
            free_bytes=free_ram,
            num_params=num_params,
        )
        return LeafPlan(
            pool.num_workers,
            pool.threads_per_worker,
            batching.size,
            False,
            f"workers={pool.num_workers} device_batch={batching.size} (plan: pool first on the cpu; "
            f"{pool.reason}; {batching.reason})",
        )
    vram = free_vram_bytes(device) if free_vram is None else free_vram
    batching = plan_device_batch(
        device_batch_setting,
        obstacle=obstacle,
        device_bytes=device_bytes,
        device=device,
        num_workers=1,
        leaves_on_gpu=leaves_on_gpu,
        free_bytes=vram,
        num_params=num_params,
    )
    if batching.size < 2:
        return LeafPlan(
            pool.num_workers,
            pool.threads_per_worker,
            1,
            False,
            f"workers={pool.num_workers} device_batch=1 (plan: pool first on {pool.device}, not batched; "
            f"{pool.reason}; {batching.reason})",
        )
    size = batching.size
    cores = usable_cpu_cores() if cpu_cores is None else cpu_cores
    cores_per_leaf = max(1, cores // leaves_on_host)
    if vram is None:
        in_vram, vram_text = max_workers, "free VRAM unknown"
    else:
        fits = math.floor(vram * MEMORY_FRACTION / leaves_on_gpu / device_bytes)
        in_vram = max(1, fits // size)
        shared = f" / {leaves_on_gpu} leaves" if leaves_on_gpu > 1 else ""
        vram_text = (
            f"free VRAM {_fmt_bytes(vram)} x {MEMORY_FRACTION}{shared} / {_fmt_bytes(device_bytes)} per device"
            f" = {fits} devices = {in_vram} groups of {size}"
        )
    expected = max_workers if devices_at_once is None else max(1, -(-int(devices_at_once) // size))
    at_once = "" if devices_at_once is None else f", {devices_at_once} devices at once = {expected} groups"
    formula = max(1, min(2 * cores_per_leaf, in_vram, expected, max_workers))
    workers = formula if override is None else override
    chosen = "" if override is None else f"override from --num-workers, the formula gives {formula}; "
    reason = (
        f"workers={workers} device_batch={size} (plan: groups first on {pool.device}: the devices a leaf trains at "
        f"once are cut into ceil(N / {size}) near-equal groups, dealt over at most that many workers; {chosen}"
        f"workers = max(1, min(2 * {cores_per_leaf} cores per leaf = {2 * cores_per_leaf}, {vram_text}{at_once}, "
        f"max_workers={max_workers})); {batching.reason}; 1 torch thread per worker)"
    )
    return LeafPlan(workers, 1, size, True, reason)
