"""Device task processor: one simulated device's local training on the run's task (built-in or the user's).

One processor instance is one *worker*: it owns a model and an optimizer reused for every device it trains. The
task (model factory, data, loss, metrics) is loaded once per process (:func:`devsim.tasks.task_from_settings`) and
its training split, partitioned into device shards, is shared by all processors in it (see
:func:`shared_data_source`). Model, global weights and data are placed on the GPU when one is present.

Two ways in:
- :meth:`train_device` / :meth:`accumulate_delta`: the fast path used by this project's leaf node, which keeps
  everything on the compute device and sums deltas in place.
- :meth:`process_task`: NVFlare's edge ``DeviceTaskProcessor`` interface, so the same processor runs inside NVFlare's
  own edge device simulation; it returns a NumPy delta.
"""

from __future__ import annotations

import inspect
import threading
import zlib
from typing import Any

import numpy as np
import torch
from nvflare.edge.simulation.device_task_processor import DeviceTaskProcessor
from nvflare.edge.web.models.job_response import JobResponse
from nvflare.edge.web.models.task_response import TaskResponse

from devsim.codec import numpy_to_tensors, tensors_to_numpy
from devsim.data.device_shards import DeviceDataSource
from devsim.resources.threads import one_torch_thread
from devsim.seeding import derive_seed
from devsim.tasks import Task, task_from_settings
from devsim.tasks.shards import grouped_task, task_partitioner
from devsim.training.batched import BatchedTrainer, batched_device_bytes
from devsim.training.compiled_step import CompileChoice, CompiledGroups, probe_compiled, resolve_compile
from devsim.training.local import DeviceMetrics, LocalTrainer, LocalTrainingSpec, Objective
from devsim.training.probe.batch_probe import TOLERANCE, ProbeOutcome, probe_batching
from devsim.training.probe.probe_cache import cached_probe, task_probe_key

_SHARED_LOCK = threading.Lock()
_SHARED_SOURCES: dict[tuple, DeviceDataSource] = {}
_PROBES: dict[tuple, ProbeOutcome] = {}


def default_torch_device() -> torch.device:
    """``cuda`` (the first visible GPU) when one is present, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def shared_data_source(
    task: Task,
    *,
    partition: str,
    alpha: float,
    samples_per_device: int,
    seed: int,
    device: torch.device,
    hidden_group: int = 0,
    group_kind: str = "label_permutation",
    data_seed: int = 0,
) -> DeviceDataSource:
    """The process-wide device data of ``task`` for these settings, built on first use only. The cache holds one
    entry (the job's), never one per device."""
    key = (id(task), hidden_group, group_kind, data_seed, partition, alpha, samples_per_device, seed, str(device))
    with _SHARED_LOCK:
        source = _SHARED_SOURCES.get(key)
        if source is None:
            seen = grouped_task(task, hidden_group, group_kind, seed=data_seed)
            partitioner = task_partitioner(seen, partition, samples_per_device, seed, alpha)
            _SHARED_SOURCES.clear()
            source = DeviceDataSource(seen.x_train, seen.y_train, partitioner, device, seen.prepare)
            _SHARED_SOURCES[key] = source
        return source


class TaskDeviceProcessor(DeviceTaskProcessor):
    """Local training for one simulated device at a time; the constructor takes plain values only (they
    travel in NVFlare's job configuration): the task's name (``task``, or the built-in ``dataset``/``model``
    and their data settings), the partition and the local training settings."""

    track_features = False
    probe_cached_in: str | None = None  # the file the batching verdict came from (None: probed here, or not yet)

    def __init__(
        self,
        task: str | None = None,
        dataset: str = "synthetic",
        data_root: str | None = None,
        data_seed: int = 0,
        synthetic_train_size: int = 20000,
        synthetic_test_size: int = 2000,
        model: str = "cnn",
        partition: str = "auto",
        alpha: float = 0.5,
        samples_per_device: int = 100,
        local_epochs: int = 1,
        local_iterations: int | None = None,
        batch_size: int = 10,
        optimizer: str = "sgd",
        lr: float = 0.05,
        momentum: float = 0.9,
        augment: bool = False,
        prox_mu: float = 0.0,
        seed: int = 0,
        hidden_group: int = 0,
        group_kind: str = "label_permutation",
        compile: str = "auto",
        compute_device: str | None = None,
    ):
        super().__init__()
        self.task = task
        self.dataset = dataset
        self.data_root = data_root
        self.data_seed = data_seed
        self.synthetic_train_size = synthetic_train_size
        self.synthetic_test_size = synthetic_test_size
        self.model = model
        self.partition = partition
        self.alpha = alpha
        self.samples_per_device = samples_per_device
        self.local_epochs = local_epochs
        self.local_iterations = local_iterations
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.lr = lr
        self.momentum = momentum
        self.augment = augment
        self.prox_mu = prox_mu
        self.seed = seed
        self.hidden_group = hidden_group
        self.group_kind = group_kind
        self.compile = compile
        self.compute_device = compute_device
        self.torch_device = torch.device(compute_device) if compute_device else default_torch_device()
        self._task: Task | None = None
        self._data: DeviceDataSource | None = None
        self._trainer: LocalTrainer | None = None
        self._batched: BatchedTrainer | None = None

    @classmethod
    def from_settings(cls, settings: dict[str, Any], compute_device: str | None = None) -> TaskDeviceProcessor:
        """Build from a run configuration dict, ignoring keys the processor does not take."""
        names = set(inspect.signature(TaskDeviceProcessor.__init__).parameters) - {"self", "compute_device"}
        return cls(**{k: settings[k] for k in names if k in settings}, compute_device=compute_device)

    def task_settings(self) -> dict[str, Any]:
        """The settings that name this processor's task (see :func:`devsim.tasks.task_from_settings`)."""
        return {
            "task": self.task,
            "dataset": self.dataset,
            "model": self.model,
            "data_root": self.data_root,
            "data_seed": self.data_seed,
            "synthetic_train_size": self.synthetic_train_size,
            "synthetic_test_size": self.synthetic_test_size,
        }

    @property
    def keys(self) -> list[str]:
        return self._ready().keys

    @property
    def num_params(self) -> int:
        return sum(t.numel() for t in self._ready().state_tensors)

    @property
    def objective(self) -> Objective:
        """The task's loss, classification flag and augmentation, as the trainers take them."""
        task = self._ready_task()
        return Objective(task.loss, task.classification, task.augment)

    def setup(self, job: JobResponse | None = None) -> None:
        """Load the task and its shared data (first processor in the process only) and build this worker's model."""
        if self._trainer is not None:
            return
        task = self._ready_task()
        self._data = shared_data_source(
            task,
            partition=self.partition,
            alpha=self.alpha,
            samples_per_device=self.samples_per_device,
            seed=self.seed,
            device=self.torch_device,
            hidden_group=self.hidden_group,
            group_kind=self.group_kind,
            data_seed=self.data_seed,
        )
        spec = LocalTrainingSpec.from_settings(self)
        net = task.build_model(track_features=self.track_features)
        self._trainer = LocalTrainer(net, spec, self.torch_device, self.objective)

    def shutdown(self) -> None:
        """Drop this worker's model; the shared task and data stay for other workers in the process."""
        self._trainer = None
        self._batched = None
        self._data = None

    def train_device(self, device_id: int, round_num: int, global_tensors: list[torch.Tensor]) -> DeviceMetrics:
        """Train ``device_id`` for ``round_num`` from ``global_tensors`` (on this worker's device).

        The batch order depends only on ``(seed, round_num, device_id)``.
        """
        return self.train_with_seed(device_id, self.round_seed(device_id, round_num), global_tensors)

    def train_with_seed(self, device_id: int, train_seed: int, global_tensors: list[torch.Tensor]) -> DeviceMetrics:
        """Train ``device_id`` from ``global_tensors`` with batch order and augmentation fixed by ``train_seed``."""
        trainer = self._ready()
        inputs, targets = self._data.shard(device_id)
        return trainer.train(device_id, global_tensors, inputs, targets, torch.Generator().manual_seed(train_seed))

    def train_devices_batched(
        self,
        device_ids: list[int],
        train_seeds: list[int],
        global_tensors: list[torch.Tensor],
        per_device_base: bool = False,
    ) -> tuple[list[torch.Tensor], list[DeviceMetrics]]:
        """Train ``device_ids`` together as one vmapped computation (see :mod:`devsim.training.batched`).

        Device ``device_ids[i]`` uses the batch order of ``train_seeds[i]``, exactly as
        :meth:`train_with_seed` would. Returns one (D, *shape) delta tensor per entry of ``keys``
        and per-device metrics. With ``per_device_base`` ``global_tensors`` are stacked (D, *shape): each
        device starts from its own row.

        One device (D = 1) trains with :meth:`train_with_seed`, bit for bit as the thread pool would: vmapping a
        lone device pays the batched step's fixed costs for nothing (digits CNN, one thread: 19-21 ms against
        9.5-10 ms). Only then is the worker's own model state changed.
        """
        if len(device_ids) == 1:
            start = [t[0] for t in global_tensors] if per_device_base else global_tensors
            metrics = self.train_with_seed(device_ids[0], train_seeds[0], start)
            return [d.unsqueeze(0) for d in self.delta(start)], [metrics]
        batched = self._batched_trainer()
        generators = [torch.Generator().manual_seed(int(s)) for s in train_seeds]
        pool = self._data.shard_pool(device_ids)
        return batched.train_pool(device_ids, global_tensors, pool, generators, per_device_base)

    def _batched_trainer(self) -> BatchedTrainer | CompiledGroups:
        """This worker's batched trainer: compiled and padded to buckets when :meth:`compile_choice` says so."""
        if self._batched is None:
            trainer, choice = self._ready(), self.compile_choice()

            def build(options: dict | None = None) -> BatchedTrainer:
                return BatchedTrainer(
                    trainer.model, trainer.spec, self.torch_device, self.objective, self._example_input(), options
                )

            self._batched = CompiledGroups(build(choice.options), fallback=build) if choice.enabled else build()
        return self._batched

    def compile_choice(self) -> CompileChoice:
        """``--compile`` resolved for this process's task and device (once; ``auto`` on a GPU runs
        :func:`devsim.training.compiled_step.probe_compiled`: exact and faster, or eager)."""
        trainer = self._ready()
        key = ("compile", id(self._task), trainer.spec, str(self.torch_device), self.compile)
        with _SHARED_LOCK:
            choice = _PROBES.get(key)
        if choice is None:
            choice = resolve_compile(
                self.compile, self.torch_device, probe=self._probe_compiled, num_params=self.num_params
            )
            with _SHARED_LOCK:
                _PROBES[key] = choice
        return choice

    def _probe_compiled(self) -> str | None:
        task, trainer = self._ready_task(), self._ready()
        state = trainer.model.state_dict()
        start = [state[k].detach().clone() for k in trainer.keys]

        def build(options: dict | None) -> BatchedTrainer:
            model = task.build_model(track_features=self.track_features).to(self.torch_device)
            model.load_state_dict(state)
            return BatchedTrainer(
                model, trainer.spec, self.torch_device, self.objective, self._example_input(), compile_options=options
            )

        return probe_compiled(build, self._data.shard_pool([0, 1, 2]), start, TOLERANCE)

    def warm_compiled(self, group_sizes: list[int]) -> list[int]:
        """Compile the buckets of these batched group sizes now (start-up) when the step is compiled; the buckets
        warmed (none when eager)."""
        batched = self._batched_trainer()
        if not isinstance(batched, CompiledGroups):
            return []
        state = self._ready().model.state_dict()
        start = [state[k].detach().clone() for k in self._ready().keys]
        return batched.warm(group_sizes, self._data.shard_pool([0, 1, 2, 3]), start)

    def batching_obstacle(self, timed: bool = True) -> str | None:
        """Why this worker's devices cannot be trained as one batch (None: they can).

        Decided once per process on a probe (:func:`devsim.training.probe.batch_probe.probe_batching`): three small
        devices trained one at a time and batched from the same weights must get the same updates, and with
        ``timed`` (``--device-batch auto``) batched training must also be faster here. An explicit
        ``--device-batch N`` checks exactness only, so the path, and with it the float rounding, does not
        depend on how loaded the machine was when the leaf started.
        """
        return self.batching_probe(timed).obstacle

    def batching_probe(self, timed: bool = True) -> ProbeOutcome:
        """The probe's outcome for this process's task and training settings (run on first use)."""
        trainer = self._ready()
        key = (id(self._task), trainer.spec, str(self.torch_device), self.track_features, timed)
        with _SHARED_LOCK:
            outcome = _PROBES.get(key)
        if outcome is None:
            task = self._ready_task()
            with one_torch_thread():
                outcome, self.probe_cached_in = cached_probe(
                    task_probe_key(task, trainer.spec, self.objective, self.torch_device, timed, self.track_features),
                    lambda: probe_batching(
                        lambda: task.build_model(track_features=self.track_features),
                        trainer.spec,
                        self.objective,
                        self._data.shard_pool([]),
                        self.torch_device,
                        timed=timed,
                    ),
                )
            with _SHARED_LOCK:
                _PROBES.clear()
                _PROBES[key] = outcome
        self.batching_note = outcome.note
        return outcome

    def batched_device_bytes(self) -> int:
        """Bytes one more device adds to a batched computation (for sizing ``device_batch``)."""
        trainer = self._ready()
        with one_torch_thread():
            return batched_device_bytes(trainer.model, trainer.spec, self.samples_per_device, self._example_input())

    def _example_input(self) -> torch.Tensor:
        """One model input row ``(1, ...)``: the first training row, prepared."""
        self._ready()
        example = self._data.inputs[:1]
        return self._data.prepare(example) if self._data.prepare is not None else example

    def round_seed(self, device_id: int, round_num: int) -> int:
        """The batch-order seed of ``device_id`` in synchronous round ``round_num``."""
        return derive_seed(self.seed, "train", round_num, device_id)

    def delta_into(self, out: list[torch.Tensor], global_tensors: list[torch.Tensor]) -> None:
        """Write ``trained - global`` of the device trained last into ``out`` (reused buffers)."""
        with torch.no_grad():
            torch._foreach_copy_(out, self._ready().state_tensors)
            torch._foreach_sub_(out, global_tensors)

    def label_histogram(self, device_id: int) -> np.ndarray:
        """Samples per class in ``device_id``'s shard, int64 (num_classes,) (classification tasks)."""
        self._ready()
        return self._data.partitioner.device_label_histogram(device_id)

    def delta(self, global_tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """``trained - global`` for the device trained last, one tensor per entry of ``keys``."""
        out = [torch.zeros_like(t) for t in global_tensors]
        self._ready().accumulate_delta(out, global_tensors, 1.0)
        return out

    def accumulate_delta(self, accumulator: list[torch.Tensor], global_tensors: list[torch.Tensor], weight: float):
        self._ready().accumulate_delta(accumulator, global_tensors, weight)

    def process_task(self, task: TaskResponse) -> dict:
        """NVFlare edge entry point.

        ``task.task_data`` holds ``weights`` (dict of float32 arrays) and optionally ``round``;
        the device id comes from the simulated device. Returns ``delta`` (float32 arrays),
        ``num_samples`` and ``metrics``.
        """
        self.setup()
        data = task.task_data or {}
        if "weights" not in data:
            raise ValueError("task_data must contain 'weights' (a dict of float32 arrays)")
        round_num = int(data.get("round", 0))
        device_id = _device_number(self.device.device_id if self.device else 0)
        trainer = self._ready()
        global_tensors = numpy_to_tensors(data["weights"], trainer.keys, self.torch_device)
        metrics = self.train_device(device_id, round_num, global_tensors)
        return {
            "delta": tensors_to_numpy(trainer.keys, self.delta(global_tensors)),
            "num_samples": metrics.num_samples,
            "metrics": {"loss": metrics.loss, "accuracy": metrics.accuracy, "steps": metrics.steps},
        }

    def _ready_task(self) -> Task:
        if self._task is None:
            self._task = task_from_settings(self.task_settings())
        return self._task

    def _ready(self) -> LocalTrainer:
        if self._trainer is None:
            self.setup()
        return self._trainer


def _device_number(device_id: int | str) -> int:
    """Integer id for a device: digits are used as is, other names are hashed (stable across processes)."""
    text = str(device_id)
    return int(text) if text.isdigit() else zlib.crc32(text.encode("utf-8")) & 0x7FFFFFFF
