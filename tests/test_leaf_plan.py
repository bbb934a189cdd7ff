"""One plan per leaf (workers and devices per batched computation together), with a faked CUDA device and VRAM."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch

from devsim.resources.leaf_plan import balanced_groups, deal_groups, devices_at_once, plan_leaf
from devsim.training.leaf_runner import LeafRoundRunner
from devsim.training.local import DeviceMetrics

GIB = 1024**3
MIB = 1024**2
CNN_PARAMS = 62006


def _gpu_plan(**kwargs):
    args = dict(
        device="cuda:0",
        num_params=CNN_PARAMS,
        batch_size=10,
        device_batch_setting="auto",
        obstacle=None,
        device_bytes=2 * MIB,
        devices_at_once=10,
        leaves_on_host=2,
        leaves_on_gpu=2,
        cpu_cores=16,
        free_vram=53 * GIB,
    )
    args.update(kwargs)
    return plan_leaf(**args)


def test_gpu_leaf_with_a_round_of_ten_runs_one_worker_and_one_group():
    plan = _gpu_plan()
    assert plan.fill_groups and plan.device_batch == 256 and plan.num_workers == 1
    assert plan.reason.startswith("workers=1 device_batch=256 (plan: groups first on cuda:0")
    for number in ("2 * 8 cores per leaf = 16", "53.00 GiB", "2.00 MiB per device", "10 devices at once = 1 groups"):
        assert number in plan.reason, number


@pytest.mark.parametrize(
    ("at_once", "free_gib", "workers", "batch"), [(64, 53, 1, 256), (600, 53, 3, 256), (600, 1, 1, 128)]
)
def test_gpu_workers_follow_the_groups_the_leaf_holds_and_vram(at_once, free_gib, workers, batch):
    plan = _gpu_plan(devices_at_once=at_once, free_vram=free_gib * GIB)
    assert (plan.num_workers, plan.device_batch) == (workers, batch)
    assert plan.num_workers <= math.ceil(at_once / plan.device_batch)


def test_gpu_override_keeps_groups_first():
    plan = _gpu_plan(override=4)
    assert plan.num_workers == 4 and plan.fill_groups
    assert "override from --num-workers, the formula gives 1" in plan.reason


def test_gpu_without_exact_batching_keeps_the_pool_rule():
    plan = _gpu_plan(obstacle="BatchNorm 'bn' uses a cumulative average (momentum=None)")
    assert not plan.fill_groups and plan.device_batch == 1 and plan.num_workers == 16
    assert "pool first on cuda:0, not batched" in plan.reason and "cumulative average" in plan.reason


def test_cpu_plan_is_the_pool_rule_on_two_cores():
    plan = plan_leaf(
        device="cpu",
        num_params=CNN_PARAMS,
        batch_size=10,
        device_batch_setting="auto",
        obstacle=None,
        device_bytes=2 * MIB,
        devices_at_once=10,
        leaves_on_host=2,
        cpu_cores=2,
        free_ram=4 * GIB,
    )
    assert (plan.num_workers, plan.device_batch, plan.fill_groups) == (1, 64, False)
    assert plan.reason.startswith("workers=1 device_batch=64 (plan: pool first on the cpu")


@pytest.mark.parametrize(("count", "size"), [(1, 10), (10, 10), (11, 10), (64, 10), (65, 64), (513, 256)])
def test_balanced_groups(count, size):
    groups = balanced_groups(list(range(count)), size)
    assert len(groups) == math.ceil(count / size)
    assert [d for g in groups for d in g] == list(range(count))
    assert max(map(len, groups)) - min(map(len, groups)) <= 1 and max(map(len, groups)) <= size
    if count > 1:
        assert min(map(len, groups)) >= 2


def test_devices_first_deal_is_the_old_stride():
    assert deal_groups(list(range(5)), 2, 10, fill_groups=False) == [[[0, 2, 4]], [[1, 3]]]
    assert deal_groups(list(range(5)), 16, 10, fill_groups=True) == [[[0, 1, 2, 3, 4]]]


def test_devices_at_once_from_settings():
    assert devices_at_once({"num_leaf_nodes": 2, "device_selection_size": 20, "devices_per_leaf": 50}) == 10
    assert devices_at_once({"num_leaf_nodes": 2, "device_selection_size": None, "devices_per_leaf": 50}) == 50
    assert devices_at_once({"num_leaf_nodes": 2, "concurrency": 25, "devices_per_leaf": 50}) == 13
    assert devices_at_once({}) is None


class _RecordingWorker:
    """A device worker that records the groups it trains (one float entry; delta = device id)."""

    def __init__(self, calls: list, lock: threading.Lock):
        self.keys = ["w"]
        self.torch_device = torch.device("cpu")
        self.calls = calls
        self.lock = lock

    def round_seed(self, device_id: int, round_num: int) -> int:
        return device_id

    def train_devices_batched(self, device_ids, train_seeds, global_tensors, per_device_base=False):
        with self.lock:
            self.calls.append((id(self), list(device_ids)))
        deltas = [torch.tensor([[float(d)] for d in device_ids])]
        return deltas, [DeviceMetrics(d, 1, 1, 0.0, 0.0, 0.0) for d in device_ids]

    def label_histogram(self, device_id: int) -> np.ndarray:
        return np.zeros(2, dtype=np.int64)


def _runner(workers: int, batch: int) -> tuple[LeafRoundRunner, list]:
    calls: list = []
    lock = threading.Lock()
    return LeafRoundRunner([_RecordingWorker(calls, lock) for _ in range(workers)], batch, fill_groups=True), calls


@pytest.mark.parametrize(("devices", "workers", "batch"), [(10, 16, 256), (64, 16, 10), (11, 2, 10), (1, 4, 8)])
def test_gpu_leaf_round_trains_ceil_n_over_batch_groups_on_no_more_workers(devices, workers, batch):
    runner, calls = _runner(workers, batch)
    try:
        result = runner.run_round(0, {"w": np.zeros(1, dtype=np.float32)}, list(range(devices)))
    finally:
        runner.close()
    assert len(calls) == math.ceil(devices / batch)
    assert sorted(d for _, group in calls for d in group) == list(range(devices))
    assert len({worker for worker, _ in calls}) <= len(calls)
    assert result.timing["num_workers"] == min(workers, len(calls))
    assert result.delta_sum["w"][0] == pytest.approx(sum(range(devices)))


def test_gpu_async_call_trains_its_jobs_as_few_groups_however_many_workers():
    runner, calls = _runner(16, 256)
    try:
        payload = runner.run_jobs({"w": np.zeros(1, dtype=np.float32)}, list(range(10)), list(range(10)), [0] * 10)
    finally:
        runner.close()
    assert [group for _, group in calls] == [list(range(10))]
    assert payload["deltas"]["w"][:, 0].tolist() == [float(d) for d in range(10)]


def test_expected_group_sizes_are_what_a_compiled_step_warms():
    from devsim.resources.leaf_plan import LeafPlan, expected_group_sizes

    assert expected_group_sizes(LeafPlan(1, 1, 256, True, ""), 10) == [10]
    assert expected_group_sizes(LeafPlan(2, 1, 10, True, ""), 25) == [8, 9]
    assert expected_group_sizes(LeafPlan(2, 1, 4, False, ""), 10) == [1, 4]
    assert expected_group_sizes(LeafPlan(4, 1, 1, False, ""), 10) == []
    assert expected_group_sizes(LeafPlan(1, 1, 8, True, ""), None) == []
