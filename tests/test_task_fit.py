"""Flags fitted to a task before anything starts: natural partitions, and refusals that name the flag."""

from __future__ import annotations

import numpy as np
import pytest

from devsim.config import ClusterConfig, ConfigError, FedReviveConfig, SimulationConfig
from devsim.data.partition import NaturalPartitioner
from devsim.tasks import load_task
from devsim.tasks.fit import fit_config
from devsim.tasks.shards import grouped_task, task_partitioner
from tests.test_tasks import GOOD, write_task

REGRESSION = (
    GOOD.replace("y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)", "y = x[:, :1] * 2.0").replace(
        "nn.Linear(16, 3)", "nn.Linear(16, 1)"
    )
    + "\ndef loss(outputs, targets):\n    return ((outputs - targets) ** 2).mean()\n"
)
IMAGES = """
import numpy as np
from torch import nn

def model():
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))

def data():
    rng = np.random.default_rng(1)
    x = rng.random(size=(50, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, size=50)
    return {"x_train": x[:40], "y_train": y[:40], "x_test": x[40:], "y_test": y[40:]}
"""
TOKENS = """
import numpy as np
from torch import nn

def model():
    return nn.Sequential(nn.Embedding(20, 8), nn.Flatten(), nn.Linear(8 * 6, 20))

def data():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 20, size=(50, 6))
    return {"x_train": x[:40], "y_train": x[:40, -1], "x_test": x[40:], "y_test": x[40:, -1]}
"""


@pytest.fixture
def tasks(tmp_path):
    return {
        name: load_task({"task": write_task(tmp_path, body, f"{name}.py")})
        for name, body in (("owners", GOOD), ("regression", REGRESSION), ("images", IMAGES), ("tokens", TOKENS))
    }


def test_owners_make_a_natural_partition_and_size_the_population(tasks):
    config, notes = fit_config(SimulationConfig(num_leaf_nodes=3, device_selection_size=3), tasks["owners"])
    assert config.partition == "natural" and config.devices_per_leaf == 3 and config.samples_per_device == 4
    assert "10 owners -> 3 leaves x 3 devices" in notes[0] and "1 owners with the largest ids are left out" in notes[0]
    explicit, _ = fit_config(SimulationConfig(partition="iid", samples_per_device=10), tasks["owners"])
    assert explicit.partition == "iid" and explicit.devices_per_leaf == 50


def test_auto_is_dirichlet_without_owners(tasks):
    config, notes = fit_config(SimulationConfig(samples_per_device=10), tasks["images"])
    assert config.partition == "dirichlet" and notes == []


@pytest.mark.parametrize(
    "task, config, flag, needle",
    [
        ("images", SimulationConfig(partition="natural"), "--partition", "natural needs owner_train"),
        ("regression", SimulationConfig(partition="dirichlet"), "--partition", "needs class ids"),
        ("owners", SimulationConfig(num_leaf_nodes=11, device_selection_size=1), "--num-leaf-nodes", "names 10 owners"),
        ("images", SimulationConfig(samples_per_device=41), "--samples-per-device", "more than the 40 training"),
        ("owners", SimulationConfig(augment=True), "--augment", "defines no augment"),
        (
            "regression",
            SimulationConfig(partition="iid", hidden_groups=2, samples_per_device=10),
            "--group-kind",
            "not classification",
        ),
        (
            "owners",
            SimulationConfig(hidden_groups=2, group_kind="input_transform"),
            "--group-kind",
            "square images",
        ),
        (
            "images",
            SimulationConfig(samples_per_device=10, hidden_groups=9, group_kind="input_transform", num_leaf_nodes=9),
            "--hidden-groups",
            "allowed: 1..8",
        ),
        ("tokens", FedReviveConfig(samples_per_device=10), "--task", "define generator(latent_dim, num_classes)"),
        ("regression", FedReviveConfig(partition="iid", samples_per_device=10), "--task", "classification"),
        (
            "images",
            ClusterConfig(samples_per_device=10, similarity_on="last_layer_weights"),
            "--similarity-on",
            None,
        ),
    ],
)
def test_flags_the_task_cannot_honour_are_refused_by_name(tasks, task, config, flag, needle):
    if needle is None:
        fit_config(config, tasks[task])
        return
    with pytest.raises(ConfigError) as caught:
        fit_config(config, tasks[task])
    assert str(caught.value).startswith(flag) and needle in str(caught.value), str(caught.value)


def test_natural_shards_are_the_owners_samples():
    owners = np.array([7, 3, 7, 9, 3, 3, 12])
    part = NaturalPartitioner(owners, labels=np.array([0, 1, 0, 1, 1, 0, 2]), num_classes=3)
    assert part.num_devices == 4 and part.shard_sizes().tolist() == [3, 2, 1, 1]
    assert part.device_indices(0).tolist() == [1, 4, 5] and part.device_indices(1).tolist() == [0, 2]
    assert part.device_label_histogram(0).tolist() == [1, 2, 0]
    with pytest.raises(ValueError, match="outside the 4 devices"):
        part.device_indices(4)


def test_hidden_groups_transform_any_square_image_task(tasks):
    images = tasks["images"]
    turned = grouped_task(images, 1, "input_transform", seed=0)
    assert np.array_equal(turned.x_train, np.rot90(images.x_train, 1, axes=(2, 3)))
    inverted = grouped_task(images, 4, "input_transform", seed=0)
    assert np.array_equal(inverted.x_train, -images.x_train)
    relabelled = grouped_task(tasks["owners"], 1, "label_permutation", seed=0)
    assert not np.array_equal(relabelled.y_train, tasks["owners"].y_train)
    assert np.array_equal(relabelled.x_train, tasks["owners"].x_train)


def test_iid_shards_for_a_task_without_class_ids(tasks):
    part = task_partitioner(tasks["regression"], "iid", 8, seed=0, alpha=0.5)
    assert part.labels is None and part.device_indices(3).shape == (8,)
    with pytest.raises(ValueError, match="class labels"):
        part.device_label_histogram(0)


LARGE_MODEL = IMAGES.replace("nn.Linear(4 * 6 * 6, 10)", "nn.Linear(4 * 6 * 6, 10), nn.Linear(10, 60000)")


def test_tensor_transfer_auto_follows_the_model_size(tasks, tmp_path):
    """Small models travel inline in NVFlare's messages; one over 2 MiB of float32 state keeps NVFlare's download,
    with a note, unless shared memory carries the model; an explicit choice is kept whatever the size."""
    images = tasks["images"]
    assert images.probe.model_bytes == 4 * (4 * 1 * 3 * 3 + 4 + 4 * 6 * 6 * 10 + 10)
    config, notes = fit_config(SimulationConfig(samples_per_device=10), images)
    assert config.tensor_transfer == "inline" and notes == []
    large = load_task({"task": write_task(tmp_path, LARGE_MODEL, "large.py")})
    assert large.probe.model_bytes > 2 * 2**20
    config, notes = fit_config(SimulationConfig(samples_per_device=10), large)
    assert config.tensor_transfer == "download" and "--tensor-transfer inline" in notes[-1]
    kept, _ = fit_config(SimulationConfig(samples_per_device=10, tensor_transfer="inline"), large)
    assert kept.tensor_transfer == "inline"
    shared, notes = fit_config(SimulationConfig(samples_per_device=10, shared_memory="on"), large)
    assert shared.tensor_transfer == "inline" and notes == []  # the model goes through files, not the messages
    kept, _ = fit_config(SimulationConfig(samples_per_device=10, shared_memory="on", tensor_transfer="download"), large)
    assert kept.tensor_transfer == "download"


def test_tensor_transfer_values():
    from devsim_flare.recipe import tensor_transfer_params

    assert tensor_transfer_params("inline") == {"np_download_chunk_size": 0}  # arrays inside the message
    assert tensor_transfer_params("download") == {}  # NVFlare's default
    with pytest.raises(ConfigError, match="--tensor-transfer.*auto, inline, download"):
        SimulationConfig(tensor_transfer="stream").validate()
