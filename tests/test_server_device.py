"""The server's tensor work on a given torch device: FedAvg's aggregation gives the NumPy result to the bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from devsim.aggregation.base import LeafUpdate
from devsim.aggregation.fedavg import DEVICE_MIN_PARAMS, FedAvg


def _case(seed: int = 0):
    rng = np.random.default_rng(seed)
    weights = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float32)}
    updates = [
        LeafUpdate(f"site-{i}", {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in weights.items()}, w, 3)
        for i, w in enumerate((30.0, 12.0, 7.0))
    ]
    return weights, updates


def test_fedavg_on_a_torch_device_matches_numpy_to_the_bit():
    weights, updates = _case()
    want = FedAvg(global_lr=0.7).aggregate(weights, updates)
    got = FedAvg(global_lr=0.7, device="cpu").aggregate(weights, updates)
    for key in weights:
        assert got[key].dtype == np.float32 and got[key].shape == weights[key].shape
        np.testing.assert_array_equal(got[key], want[key])


def test_small_models_stay_in_numpy_on_a_gpu_and_large_ones_move():
    small = {"a": np.zeros(10, dtype=np.float32)}
    large = {"a": np.zeros(DEVICE_MIN_PARAMS, dtype=np.float32)}
    strategy = FedAvg(device="cuda:0")
    assert not strategy._on_device(small) and strategy._on_device(large)
    assert not FedAvg()._on_device(large)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: FedAvg on the GPU against NumPy")
def test_fedavg_on_cuda_matches_numpy():
    weights, updates = _case(1)
    want = FedAvg().aggregate(weights, updates)
    strategy = FedAvg(device="cuda")
    got = strategy._aggregate_torch(weights, updates, 1.0 / sum(u.total_weight for u in updates))
    for key in weights:
        np.testing.assert_array_equal(got[key], want[key])


def test_startup_record_breaks_leaf_setup_down_and_leaves_nvflare_the_rest():
    from devsim.observe.startup import SetupParts, StartupClock

    parts = SetupParts()
    with parts.measure("cuda_init"):
        pass
    record = parts.record()
    assert set(record) == {"cuda_init", "total"} and record["total"] >= record["cuda_init"] >= 0
    clock = StartupClock()
    clock.stamps.update(server_process_started=100.0, server_run_started=112.0)
    first = {"startup": {"cuda_init": 2.0, "plan_and_probe": 1.0, "total": 5.0}, "timing": {}}
    clock.leaf_reply("site-1", first)
    clock.leaf_reply("site-2", {"startup": {"cuda_init": 3.0, "total": 7.0}})
    clock.leaf_reply("site-1", {"startup": {"total": 99.0}})
    assert "startup" not in first
    out = clock.record()
    assert out["leaf_parts_max"] == {"cuda_init": 3.0, "plan_and_probe": 1.0, "total": 7.0}
    assert out["seconds"]["nvflare_and_rest"] == 12.0 - 7.0
    assert "leaves_set_up_to_run" not in out["seconds"]  # a leaf without stamps: no split


def test_the_leaves_stamps_split_what_nvflare_takes_around_their_set_up():
    from devsim.observe.startup import StartupClock

    clock = StartupClock()
    clock.stamps.update(server_process_started=100.0, server_run_started=112.0)
    stamps = [(101.0, 101.5, 104.0), (103.0, 103.0, 110.0)]  # process start, set-up start and end
    for leaf, (process, setup, done) in zip(("site-1", "site-2"), stamps, strict=True):
        parts = {"total": done - setup, "process_to_setup": setup - process, "process_started_at": process}
        clock.leaf_reply(leaf, {"startup": parts | {"setup_done_at": done}})
    out = clock.record()
    assert out["leaf_parts_max"] == {"total": 7.0, "process_to_setup": 0.5}  # the stamps are not parts
    seconds = out["seconds"]
    assert seconds["server_process_to_leaf_processes"] == 3.0  # the later leaf process started at 103
    assert seconds["leaves_set_up_to_run"] == 2.0  # the last set-up ended at 110, the run started at 112


def test_the_commands_exit_keeps_the_leaf_parts():
    from devsim.observe.startup import add_exit

    record = {"stamps": {"last_round_finished": 5.0}, "seconds": {}, "leaf_parts_max": {"total": 2.0}}
    out = add_exit(record, 7.0)
    assert out["leaf_parts_max"] == {"total": 2.0} and out["seconds"]["last_round_to_exit"] == 2.0


def test_the_sync_server_aggregates_in_numpy_on_a_cpu_and_on_the_gpu_when_it_has_one():
    """On a CPU server the NumPy arithmetic (same bits) is faster than torch's: a ResNet-18 round's server aggregate
    took 31.5 ms against 49.0 ms (2 leaves, median of 15 rounds, 2-core CPU)."""
    from devsim.config import SimulationConfig
    from devsim_flare.servers.sync_server import SyncServer

    server = SyncServer({})
    for device, expected in ((torch.device("cpu"), None), (torch.device("cuda:0"), torch.device("cuda:0"))):
        server.device = device
        server.setup_strategy(SimulationConfig())
        assert server.strategy.device == expected


def test_calibrate_keeps_the_faster_path_and_says_so():
    """At start the server times one round's arithmetic both ways and keeps the faster; the bits do not change."""
    import re

    rng = np.random.default_rng(2)
    weights = {"a": rng.standard_normal(DEVICE_MIN_PARAMS).astype(np.float32), "b": np.ones(3, np.float32)}
    strategy = FedAvg(device="cpu")
    line = strategy.calibrate(weights, num_leaves=2)
    device_ms, numpy_ms = (float(x) for x in re.findall(r"([\d.]+) ms", line))
    assert strategy.use_device == (device_ms < numpy_ms), line
    assert line.startswith(f"FedAvg's arithmetic in {'cpu' if strategy.use_device else 'NumPy'}:"), line
    updates = [LeafUpdate("site-1", {k: np.full_like(v, 0.5) for k, v in weights.items()}, 4.0, 2)]
    got = strategy.aggregate(weights, updates)
    want = FedAvg().aggregate(weights, updates)
    assert all(np.array_equal(got[k], want[k]) for k in weights)
    assert FedAvg().calibrate(weights, 2) == "" and FedAvg(device="cpu").calibrate({"a": weights["b"]}, 2) == ""
