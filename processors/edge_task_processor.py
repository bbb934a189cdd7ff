"""Adapter that runs :class:`TaskDeviceProcessor` (any task) inside NVFlare's own edge device simulation.

NVFlare 2.9's edge stack (``EdgeModelExecutor`` + ``TPORunner`` + ``Simulator``) talks to a task
processor in DXO dicts:

- the task is ``DXO(kind=WEIGHTS, data={name: nested list}, meta={"model_version": v})`` as a dict
  (``BuffModelManager`` turns every global model into Python lists);
- the result must be ``DXO(kind=WEIGHT_DIFF, data={"dict": {name: delta}, "count": 1})`` as a dict;
  ``ModelUpdateDXOAggregator`` accepts NumPy arrays there, so deltas go back as float32 arrays.

The stock ``TPODeviceFactory`` deep-copies the processor for every simulated device (and for every
selection poll), so this object holds plain settings only. The real work is done by one
:class:`TaskDeviceProcessor` per simulator worker thread, kept in a module-level cache: models and
optimizers are built once per thread, the training data once per process.

Simulated device ids are ``"<uuid>#<i>"`` with ``i`` in ``[0, devices_per_leaf)``; the leaf runner sets
:attr:`leaf_index` (from the site name ``site-N``), and the data shard is that of device
``leaf_index * devices_per_leaf + i``, as in this project's own leaf nodes.
"""

from __future__ import annotations

import threading
import zlib
from typing import Any

import numpy as np
from nvflare.apis.dxo import DXO, DataKind, from_dict
from nvflare.edge.constants import MsgKey, SpecialDeviceId
from nvflare.edge.simulation.device_task_processor import DeviceTaskProcessor
from nvflare.edge.web.models.job_response import JobResponse
from nvflare.edge.web.models.task_response import TaskResponse

from devsim.codec import numpy_to_tensors, tensors_to_numpy
from devsim.tasks import task_from_settings
from processors.task_processor import TaskDeviceProcessor, default_torch_device

_WORKERS_LOCK = threading.Lock()
_WORKERS: dict[tuple, TaskDeviceProcessor] = {}


def _settings_key(settings: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in settings.items()))


def worker_for_thread(settings: dict[str, Any]) -> TaskDeviceProcessor:
    """The calling thread's processor for ``settings`` (built on first use)."""
    key = (_settings_key(settings), threading.get_ident())
    with _WORKERS_LOCK:
        worker = _WORKERS.get(key)
        if worker is None:
            worker = TaskDeviceProcessor.from_settings(settings)
            _WORKERS[key] = worker
    worker.setup()
    return worker


def clear_workers() -> None:
    """Drop every cached worker (their models); the shared training data stays cached."""
    with _WORKERS_LOCK:
        for worker in _WORKERS.values():
            worker.shutdown()
        _WORKERS.clear()


def device_number(device_id: str, leaf_index: int, devices_per_leaf: int) -> int:
    """Population-wide device number of a simulated edge device id ``"<uuid>#<i>"``."""
    text = str(device_id)
    _, sep, tail = text.rpartition(SpecialDeviceId.NUM_INDICATOR)
    if sep and tail.isdigit():
        return leaf_index * devices_per_leaf + int(tail)
    return zlib.crc32(text.encode("utf-8")) & 0x7FFFFFFF


def _global_tensors(worker: TaskDeviceProcessor, payload: dict, version: int) -> list:
    """The global model of ``payload`` as tensors on the worker's device, converted once per version per thread.

    The leaf hands every device of a version the same weight objects (lists or arrays), so the
    conversion is cached on the worker, keyed by the version and the identity of the first weight.
    """
    keys = worker.keys
    missing = [k for k in keys if k not in payload]
    if missing:
        raise ValueError(f"global model payload lacks {len(missing)} model keys, e.g. {missing[0]!r}")
    marker = (version, id(payload[keys[0]]))
    cached = getattr(worker, "_edge_global", None)
    if cached is not None and cached[0] == marker:
        return cached[1]
    weights = {k: np.asarray(payload[k], dtype=np.float32) for k in keys}
    tensors = numpy_to_tensors(weights, keys, worker.torch_device)
    worker._edge_global = (marker, tensors)
    return tensors


class EdgeTaskProcessor(DeviceTaskProcessor):
    """NVFlare edge ``DeviceTaskProcessor`` wrapping :class:`TaskDeviceProcessor`.

    Args:
        settings: keyword arguments of :class:`TaskDeviceProcessor` (unknown keys are ignored),
            e.g. ``{"dataset": "synthetic", "samples_per_device": 100, "lr": 0.05}``.
        devices_per_leaf: number of simulated devices per leaf (``SimulationConfig.num_devices``).
    """

    def __init__(self, settings: dict | None = None, devices_per_leaf: int = 100):
        DeviceTaskProcessor.__init__(self)
        self.settings = dict(settings or {})
        self.devices_per_leaf = int(devices_per_leaf)
        self.leaf_index = 0

    def setup(self, job: JobResponse | None = None) -> None:
        """Nothing per job: the per-thread worker is built on the first task."""

    def shutdown(self) -> None:
        """Nothing per device: workers are shared by every device of the leaf."""

    def describe_compute(self) -> tuple[str, int, int]:
        """(torch device, model parameter count, batch size) for sizing a leaf's worker pool."""
        net = task_from_settings(self.settings).build_model()
        num_params = sum(p.numel() for p in net.parameters())
        return str(default_torch_device()), num_params, int(self.settings.get("batch_size", 10))

    def process_task(self, task: TaskResponse) -> dict:
        """NVFlare's per-device entry point: the stock runner gives each device its own copy (``self.device``)."""
        return self.process_device_task(self.device.device_id if self.device else "0", task)

    def process_device_task(self, device_id: str, task: TaskResponse) -> dict:
        """Train simulated device ``device_id`` on ``task``; returns the WEIGHT_DIFF DXO as a dict.

        Thread-safe: each calling thread trains with its own cached model, so one instance can serve
        every device of a leaf (the fast runner shares it).
        """
        dxo = from_dict(task.task_data)
        if dxo.data_kind != DataKind.WEIGHTS or not isinstance(dxo.data, dict):
            raise ValueError(f"expected a WEIGHTS DXO with a dict payload, got {dxo.data_kind}")
        version = int(dxo.get_meta_prop(MsgKey.MODEL_VERSION, 0) or 0)
        worker = worker_for_thread(self.settings)
        keys = worker.keys
        global_tensors = _global_tensors(worker, dxo.data, version)
        number = device_number(device_id, self.leaf_index, self.devices_per_leaf)
        metrics = worker.train_device(number, version, global_tensors)
        delta = tensors_to_numpy(keys, worker.delta(global_tensors))
        result = DXO(
            data_kind=DataKind.WEIGHT_DIFF,
            data={"dict": delta, "count": 1},
            meta={
                "device": number,
                "model_version": version,
                "num_samples": int(metrics.num_samples),
                "loss": float(metrics.loss),
                "accuracy": float(metrics.accuracy),
            },
        )
        return result.to_dict()
