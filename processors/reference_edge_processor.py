"""Benchmark baseline only, not for use: a device processor written the way NVFlare's edge examples write theirs.

A deliberately faithful (and therefore slow) baseline: it exists so that
``benchmarks/stock_edge_comparison.py`` can time this project against NVFlare's own edge simulation run
the way NVFlare's PyTorch edge examples run it. Do not use it for real work: use
:class:`~processors.edge_task_processor.EdgeTaskProcessor`.

The per-task pattern follows the structure of NVFlare's example CIFAR-10 PyTorch task processors,
expressed here in this project's terms:

- the task's global model arrives as nested Python lists (NVFlare's ``BuffModelManager`` payload) and
  every entry is converted with ``torch.tensor``;
- a fresh model is built for every task and the global state is loaded with ``load_state_dict``;
- the device's ``Dataset`` and a shuffling ``DataLoader`` are created for every task, and samples are
  converted image by image in ``__getitem__`` (what a torchvision ``ToTensor`` / ``Normalize`` pipeline does);
- a new SGD optimizer trains for the task's epochs;
- the result is the full state-dict difference, every entry turned into a Python list, in a
  ``WEIGHT_DIFF`` DXO with ``count`` 1 (what NVFlare's ``ModelUpdateDXOAggregator`` sums).

Two deliberate departures keep the baseline from being slower than it needs to be (both make this
project's measured speedup a lower bound):

- torchvision cannot be imported here, so the images come from this project's data loading
  (:func:`devsim.data.load_dataset` and the run's partitioner). The arrays are loaded once per process
  and cached unless ``reload_data_per_task`` is set (NVFlare's example instantiates its torchvision
  dataset, which reads the data files, in every task);
- the DataLoader uses ``loader_workers`` worker processes, 0 by default (NVFlare's example uses 2).

The workload itself (model, samples per device, shards, epochs, batch size, learning rate, momentum)
is the one this project's processor trains, so both sides do the same SGD steps on the same samples.
The processor holds plain settings only: NVFlare's stock device factory deep-copies it for every
simulated device and every selection poll.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from nvflare.apis.dxo import DXO, DataKind, from_dict
from nvflare.edge.simulation.device_task_processor import DeviceTaskProcessor
from nvflare.edge.web.models.job_response import JobResponse
from nvflare.edge.web.models.task_response import TaskResponse
from torch.utils.data import DataLoader, Dataset

from devsim.config import DATASET_CLASSES
from devsim.data import ImageDataset, load_dataset
from devsim.data.partition import Partitioner, make_partitioner
from devsim.models import build_model
from processors.edge_task_processor import device_number

_RAW_LOCK = threading.Lock()
_RAW_CACHE: dict[tuple, tuple[ImageDataset, Partitioner]] = {}


def _raw_data(settings: dict[str, Any], cached: bool) -> tuple[ImageDataset, Partitioner]:
    """The run's training arrays and partitioner (this project's loader), from a per-process cache when ``cached``."""
    key = tuple(
        settings.get(name)
        for name in (
            "dataset",
            "data_root",
            "data_seed",
            "synthetic_train_size",
            "synthetic_test_size",
            "partition",
            "alpha",
            "samples_per_device",
            "seed",
        )
    )
    if cached:
        with _RAW_LOCK:
            if key in _RAW_CACHE:
                return _RAW_CACHE[key]
    train = load_dataset(
        settings.get("dataset", "synthetic"),
        settings.get("data_root"),
        train=True,
        seed=int(settings.get("data_seed", 0)),
        synthetic_train_size=int(settings.get("synthetic_train_size", 20000)),
        synthetic_test_size=int(settings.get("synthetic_test_size", 2000)),
    )
    partitioner = make_partitioner(
        settings.get("partition", "dirichlet"),
        train.labels,
        train.num_classes,
        int(settings.get("samples_per_device", 100)),
        int(settings.get("seed", 0)),
        alpha=float(settings.get("alpha", 0.5)),
    )
    if cached:
        with _RAW_LOCK:
            _RAW_CACHE[key] = (train, partitioner)
    return train, partitioner


class DeviceShardDataset(Dataset):
    """One device's samples, converted one image at a time (uint8 -> float in [0, 1] -> normalised)."""

    def __init__(self, train: ImageDataset, indices: np.ndarray):
        self.images = train.images
        self.labels = train.labels
        self.indices = [int(i) for i in indices]
        self.mean = torch.tensor(train.mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(train.std, dtype=torch.float32).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, item: int) -> tuple[torch.Tensor, int]:
        index = self.indices[item]
        image = torch.from_numpy(self.images[index]).to(torch.float32).div(255.0)
        return (image - self.mean) / self.std, int(self.labels[index])


class ReferenceEdgeTaskProcessor(DeviceTaskProcessor):
    """Per-task model, Dataset and DataLoader, list payloads: the stock baseline of the edge benchmark.

    Args:
        settings: the run's processor settings (as ``jobs/pt_job_edge.py`` builds them): dataset,
            data_root, data_seed, synthetic sizes, model, partition, alpha, samples_per_device,
            local_epochs, batch_size, lr, momentum (default 0.9), seed.
        devices_per_leaf: simulated devices per leaf (maps device ids to this project's shards).
        loader_workers: DataLoader worker processes per task (NVFlare's example: 2).
        reload_data_per_task: load the training arrays in every task, as the example's torchvision
            dataset does, instead of once per process.
    """

    def __init__(
        self,
        settings: dict | None = None,
        devices_per_leaf: int = 100,
        loader_workers: int = 0,
        reload_data_per_task: bool = False,
    ):
        DeviceTaskProcessor.__init__(self)
        self.settings = dict(settings or {})
        self.devices_per_leaf = int(devices_per_leaf)
        self.loader_workers = int(loader_workers)
        self.reload_data_per_task = bool(reload_data_per_task)
        self.leaf_index = 0

    def setup(self, job: JobResponse) -> None:
        """Nothing per job (as in NVFlare's example)."""

    def shutdown(self) -> None:
        """Nothing to release (as in NVFlare's example)."""

    def _train(self, global_model: dict[str, torch.Tensor]) -> dict[str, list]:
        s = self.settings
        train, partitioner = _raw_data(s, cached=not self.reload_data_per_task)
        device_id = self.device.device_id if self.device else "0"
        number = device_number(device_id, self.leaf_index, self.devices_per_leaf)
        dataset = DeviceShardDataset(train, partitioner.device_indices(number))
        loader = DataLoader(
            dataset, batch_size=int(s.get("batch_size", 10)), shuffle=True, num_workers=self.loader_workers
        )

        dataset_name = s.get("dataset", "synthetic")
        net = build_model(s.get("model", "cnn"), num_classes=DATASET_CLASSES[dataset_name])
        net.load_state_dict(global_model)
        optimizer = torch.optim.SGD(
            net.parameters(), lr=float(s.get("lr", 0.05)), momentum=float(s.get("momentum", 0.9))
        )
        net.train()
        for _ in range(int(s.get("local_epochs", 1))):
            for inputs, labels in loader:
                optimizer.zero_grad()
                loss = F.cross_entropy(net(inputs), labels)
                loss.backward()
                optimizer.step()

        diff = {}
        for key, value in net.state_dict().items():
            diff[key] = (value.cpu().numpy() - global_model[key].numpy()).tolist()
        return diff

    def process_task(self, task: TaskResponse) -> dict:
        """Train this device on the task's global model; returns a WEIGHT_DIFF DXO dict with list values."""
        task_data = task.task_data
        if not isinstance(task_data, dict):
            raise ValueError(f"expected the task data to be a dict, got {type(task_data).__name__}")
        model = from_dict(task_data)
        if model.data_kind != DataKind.WEIGHTS:
            raise ValueError(f"expected a {DataKind.WEIGHTS} DXO, got {model.data_kind}")
        if not isinstance(model.data, dict):
            raise ValueError(f"expected the global model to be a dict, got {type(model.data).__name__}")
        global_model = {k: torch.tensor(v) for k, v in model.data.items()}
        diff = self._train(global_model)
        return DXO(data_kind=DataKind.WEIGHT_DIFF, data={"dict": diff, "count": 1}).to_dict()
