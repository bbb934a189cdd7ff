"""Population, seeding, codec, local training, leaf rounds and FedAvg: fast, NVFlare-free."""

import sys

import numpy as np
import pytest
import torch

from devsim.aggregation import FedAvg, LeafUpdate
from devsim.codec import load_numpy_into_model, model_to_numpy, numpy_to_tensors
from devsim.models import build_model
from devsim.population.devices import DevicePopulation, natural_sort
from devsim.seeding import derive_seed
from devsim.training.leaf_runner import LeafRoundRunner
from devsim.training.local import LocalTrainer, LocalTrainingSpec
from tests.conftest import small_processors


def test_core_does_not_import_nvflare():
    import importlib
    import subprocess

    code = (
        "import sys, devsim.config, devsim.population.devices, devsim.training.local, devsim.training.leaf_runner, "
        "devsim.aggregation, devsim.codec, devsim.training.evaluation, devsim.resources.workers, devsim.data; "
        "assert not any(m.startswith('nvflare') for m in sys.modules), 'core imported nvflare'"
    )
    importlib.invalidate_caches()
    subprocess.run([sys.executable, "-c", code], check=True)


def test_selection_is_seeded_sorted_and_unique():
    pop = DevicePopulation(num_leaf_nodes=3, devices_per_leaf=10, seed=7)
    a, b = pop.select(4, 12), pop.select(4, 12)
    assert np.array_equal(a, b)
    assert len(set(a.tolist())) == 12 and np.all(np.diff(a) > 0)
    assert not np.array_equal(pop.select(5, 12), a)
    assert not np.array_equal(DevicePopulation(3, 10, seed=8).select(4, 12), a)


def test_group_by_leaf_covers_selection():
    pop = DevicePopulation(num_leaf_nodes=4, devices_per_leaf=25, seed=0)
    selected = pop.select(0, 40)
    groups = pop.group_by_leaf(selected)
    assert sorted(d for ds in groups.values() for d in ds) == selected.tolist()
    for leaf, devices in groups.items():
        assert all(d in pop.leaf_devices(leaf) for d in devices)


def test_population_rejects_bad_sizes():
    with pytest.raises(ValueError):
        DevicePopulation(0, 10)
    with pytest.raises(ValueError):
        DevicePopulation(2, 10).select(0, 21)


def test_natural_sort():
    assert natural_sort(["site-10", "site-2", "site-1"]) == ["site-1", "site-2", "site-10"]


def test_derived_seeds_differ_by_purpose_and_ids():
    assert derive_seed(0, "train", 1, 2) == derive_seed(0, "train", 1, 2)
    assert len({derive_seed(0, "train", 1, 2), derive_seed(0, "select", 1, 2), derive_seed(0, "train", 2, 1)}) == 3


def test_codec_round_trip_is_float32_numpy():
    model = build_model("cnn")
    weights = model_to_numpy(model)
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in weights.values())
    other = build_model("cnn")
    load_numpy_into_model(other, weights)
    for key, value in other.state_dict().items():
        assert np.array_equal(value.numpy(), weights[key])
    with pytest.raises(ValueError, match="shape"):
        load_numpy_into_model(other, weights | {"fc3.bias": np.zeros(3, np.float32)})


def test_local_trainer_learns_and_reuses_model():
    torch.manual_seed(0)
    images = torch.randn(64, 3, 32, 32)
    labels = torch.arange(64) % 4
    images[torch.arange(64), labels % 3] += 2.0
    model = build_model("cnn")
    trainer = LocalTrainer(model, LocalTrainingSpec(epochs=30, batch_size=16, lr=0.05, momentum=0.9), "cpu")
    start = [t.clone() for t in trainer.state_tensors]
    metrics = trainer.train(0, start, images, labels, torch.Generator().manual_seed(0))
    assert metrics.steps == 30 * 4 and metrics.num_samples == 64
    assert metrics.accuracy > 0.6
    assert trainer.model is model
    acc = [torch.zeros_like(t) for t in start]
    trainer.accumulate_delta(acc, start, 2.0)
    for a, local, s in zip(acc, trainer.state_tensors, start, strict=True):
        assert torch.allclose(a, 2.0 * (local - s), atol=1e-6)


def test_fixed_iterations_cycle_through_the_shard():
    spec = LocalTrainingSpec(iterations=7, batch_size=10)
    assert spec.steps_for(25) == 7
    assert LocalTrainingSpec(epochs=2, batch_size=10).steps_for(25) == 6
    trainer = LocalTrainer(build_model("cnn"), spec, "cpu")
    metrics = trainer.train(
        0,
        [t.clone() for t in trainer.state_tensors],
        torch.randn(25, 3, 32, 32),
        torch.zeros(25, dtype=torch.int64),
        torch.Generator().manual_seed(1),
    )
    assert metrics.steps == 7


def test_fedavg_weighted_mean_and_global_lr():
    w = {"a": np.zeros(3, np.float32)}
    updates = [
        LeafUpdate("site-1", {"a": np.array([2.0, 0, 0], np.float32)}, 2.0, 1),
        LeafUpdate("site-2", {"a": np.array([0, 6.0, 0], np.float32)}, 2.0, 1),
    ]
    assert np.allclose(FedAvg(1.0).aggregate(w, updates)["a"], [0.5, 1.5, 0])
    assert np.allclose(FedAvg(2.0).aggregate(w, updates)["a"], [1.0, 3.0, 0])
    with pytest.raises(ValueError):
        FedAvg(1.0).aggregate(w, [])


def _processors(n, **kw):
    """Processors on a larger Dirichlet-partitioned synthetic set (40 samples a device)."""
    settings = dict(synthetic_train_size=2000, synthetic_test_size=200, samples_per_device=40)
    return small_processors(n, **(settings | dict(partition="dirichlet", alpha=0.5) | kw))


def test_leaf_round_is_independent_of_worker_count():
    weights = model_to_numpy(build_model("cnn"))
    devices = [5, 1, 9, 3, 7]
    one = LeafRoundRunner(_processors(1))
    three = LeafRoundRunner(_processors(3))
    try:
        r1 = one.run_round(2, weights, devices)
        r3 = three.run_round(2, weights, devices)
    finally:
        one.close()
        three.close()
    assert r1.total_weight == r3.total_weight == 5 * 40
    assert [m.device_id for m in r1.device_metrics] == [1, 3, 5, 7, 9]
    for key in weights:
        np.testing.assert_allclose(r1.delta_sum[key], r3.delta_sum[key], rtol=1e-5, atol=1e-6)
    payload = r3.to_payload()
    assert payload["device_metrics"]["device_id"].dtype == np.int64
    assert all(isinstance(v, np.ndarray) for v in payload["delta_sum"].values())


def test_leaf_round_repeats_bit_for_bit():
    weights = model_to_numpy(build_model("cnn"))
    runner = LeafRoundRunner(_processors(2))
    try:
        a = runner.run_round(0, weights, [0, 2, 4, 6])
        b = runner.run_round(0, weights, [0, 2, 4, 6])
    finally:
        runner.close()
    for key in weights:
        assert np.array_equal(a.delta_sum[key], b.delta_sum[key])


def test_process_task_edge_interface_returns_numpy_delta():
    from nvflare.edge.web.models.task_response import TaskResponse

    proc = _processors(1)[0]
    weights = model_to_numpy(build_model("cnn"))
    out = proc.process_task(TaskResponse("OK", task_data={"weights": weights, "round": 0}))
    assert set(out) == {"delta", "num_samples", "metrics"}
    assert out["num_samples"] == 40
    assert all(v.dtype == np.float32 and v.shape == weights[k].shape for k, v in out["delta"].items())
    assert any(np.abs(v).sum() > 0 for v in out["delta"].values())
    assert numpy_to_tensors(out["delta"], list(weights), torch.device("cpu"))


def test_rejected_devices_leave_the_leaf_sum_unchanged():
    from devsim.population.dropout import DropoutModel
    from devsim.population.faults import FaultInjector

    weights = model_to_numpy(build_model("cnn"))
    devices = list(range(12))
    faults = FaultInjector(("nan", "inf", "norm"), 0.4, seed=3)
    faulty = [d for d in devices if faults.device_fault(0, d) is not None]
    assert faulty and len(faulty) < len(devices)
    runner = LeafRoundRunner(_processors(1))
    try:
        hit = runner.run_round(0, weights, devices, DropoutModel(), faults, max_norm=1e3)
        clean = runner.run_round(0, weights, [d for d in devices if d not in faulty])
    finally:
        runner.close()
    assert hit.counts["rejected"] == len(faulty)
    assert all(f"device {d}:" in " ".join(hit.rejections) for d in faulty)
    assert hit.total_weight == clean.total_weight
    for key in weights:
        assert np.array_equal(hit.delta_sum[key], clean.delta_sum[key]), key


def test_dropout_skips_silent_and_discards_dropped_devices():
    from devsim.population.dropout import DropoutModel

    weights = model_to_numpy(build_model("cnn"))
    dropout = DropoutModel(0.3, 0.2, seed=1)
    outcomes = dropout.outcomes(0, list(range(20)))
    runner = LeafRoundRunner(_processors(1))
    try:
        result = runner.run_round(0, weights, list(range(20)), dropout)
    finally:
        runner.close()
    assert result.counts["dropped"] == sum(o == "dropped" for o in outcomes.values())
    assert result.counts["silent"] == sum(o == "silent" for o in outcomes.values())
    assert [m.device_id for m in result.device_metrics] == [d for d, o in sorted(outcomes.items()) if o == "ok"]


def test_runtime_env_defaults_keep_user_values_and_can_be_switched_off():
    from devsim_flare.recipe import RUNTIME_ENV_DEFAULTS, apply_runtime_env_defaults

    environ = {"MALLOC_ARENA_MAX": "4"}
    applied = apply_runtime_env_defaults(environ)
    assert environ["MALLOC_ARENA_MAX"] == "4" and "MALLOC_ARENA_MAX" not in applied
    assert all(environ[k] == v for k, v in applied.items()) and len(applied) == len(RUNTIME_ENV_DEFAULTS) - 1
    off = {"DEVSIM_RUNTIME_ENV_DEFAULTS": "0"}
    assert apply_runtime_env_defaults(off) == {} and set(off) == {"DEVSIM_RUNTIME_ENV_DEFAULTS"}
