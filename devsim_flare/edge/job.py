"""This project's device processor inside NVFlare 2.9's own edge hierarchy (EdgeJob + device simulator).

``nvflare.edge.tools.edge_fed_buff_recipe`` cannot be imported here: it imports
``nvflare.edge.widgets.evaluator``, which imports torchvision at module level. :class:`DevsimEdgeRecipe`
therefore assembles the same components as ``EdgeFedBuffRecipe`` itself, from modules that do not
import torchvision:

- server: :class:`SeededModelPersistor` (initial model from the run seed, as the Collab jobs build it),
  :class:`NumpyBuffModelManager` (NVFlare's ``BuffModelManager`` with float32 arrays instead of lists;
  the stock one with ``numpy_payloads=False``), :class:`~devsim_flare.edge.selection.SeededDeviceManager`
  (NVFlare's ``BuffDeviceManager`` with seeded selections), ``ModelUpdateAssessor`` under
  ``ScatterAndGatherForEdge`` (``EdgeJob.configure_server``), plus :class:`EdgeGlobalEvaluator` (ours,
  in place of the torchvision ``GlobalEvaluator``) that scores every global model version on the run's
  test split and writes ``edge_results.json`` and ``final_model.pt``;
- every client (leaf): ``EdgeTaskReceiver``, :class:`~devsim_flare.edge.screen.ScreenedUpdateAggrFactory` (NVFlare's
  sum of device updates, each checked first), ``EdgeModelExecutor``
  (``EdgeJob.configure_client``), the device processor
  :class:`~processors.edge_task_processor.EdgeTaskProcessor` and a device runner:
  :class:`~devsim_flare.edge.runner.FastEdgeRunner` (default) or :class:`EdgeLeafRunner` (NVFlare's
  ``TPORunner`` plus the leaf index, so device shards are distinct across leaves).

FedAvg is the synchronous corner of FedBuff: selection size = buffer size = ``min_hole_to_fill``.

Runs in ``SimEnv`` / ``nvflare simulator`` only in the flat topology (every client is a leaf, threads
equal clients). Export follows NVFlare's recipe convention (``--export --export-dir DIR``).

This module is longer than 400 lines on purpose: the components above are configured together (their
ids and settings refer to one another) and read best side by side.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Any

import numpy as np
import torch
from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.model import ModelLearnable, ModelLearnableKey, make_model_learnable
from nvflare.app_common.abstract.model_persistor import ModelPersistor
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType
from nvflare.edge.assessors.buff_model_manager import BuffModelManager, _ModelState
from nvflare.edge.assessors.model_update import ModelUpdateAssessor
from nvflare.edge.tools.edge_job import EdgeJob
from nvflare.edge.widgets.tpo_runner import TPORunner
from nvflare.recipe.spec import Recipe
from nvflare.widgets.widget import Widget

from devsim.aggregation.server_optimizers import BETA1, BETA2, TAU, server_optimizer_for
from devsim.codec import float_state_keys, load_numpy_into_model
from devsim.observe.progress import format_metrics
from devsim.observe.results import RunRecorder
from devsim.seeding import derive_seed
from devsim.tasks import task_from_settings
from devsim_flare.edge.screen import ScreenedUpdateAggregator, ScreenedUpdateAggrFactory
from devsim_flare.edge.selection import SeededDeviceManager, leaf_index_of
from processors.edge_task_processor import EdgeTaskProcessor

EDGE_METHOD = "edge"
RESULTS_FILE = "edge_results.json"
FINAL_MODEL_FILE = "final_model.pt"
MODES = ("fedavg", "fedbuff")
RUNNERS = ("fast", "stock")
STOCK_RUNNER_WORKERS = 4
REJECTED_UPDATES_PROP = "devsim.rejected_updates"
"""FL context property: device updates the leaves' screens left out so far (set with each new global model)."""


class EdgeLeafRunner(TPORunner):
    """NVFlare's ``TPORunner`` that also tells the task processor which leaf it runs on.

    The stock device factory deep-copies the processor per device after ``ABOUT_TO_START_RUN``, so
    the copies inherit ``leaf_index``.
    """

    def _tpo_about_to_start(self, event_type: str, fl_ctx: FLContext):
        super()._tpo_about_to_start(event_type, fl_ctx)
        if self.tpo is not None and hasattr(self.tpo, "leaf_index"):
            self.tpo.leaf_index = leaf_index_of(fl_ctx.get_identity_name())
            self.log_info(fl_ctx, f"leaf index {self.tpo.leaf_index}, {self.num_devices} devices")


class EdgeGlobalEvaluator(Widget):
    """Scores each new global model version (``GLOBAL_WEIGHTS_UPDATED``) on the run's test split.

    Writes ``edge_results.json`` (one record per evaluated version: accuracy, loss, seconds since the
    job started and since the previous version) after every version, and ``final_model.pt`` (the last
    global state dict) at the end of the run, into ``output_dir`` (absolute) or the server's run folder.
    The same records go to ``results.json`` in the Collab jobs' layout (``method`` "edge", ``config``,
    ``rounds`` keyed by ``version``, and at the end ``summary``: final and initial accuracy, final loss and
    metrics, versions, rejected updates, wall seconds, the final model's path), which ``compare_runs.py``,
    ``plot_runs.py`` and the Python API read as they read every other job's.

    Args:
        settings: the processor settings (dataset, model, data_seed, synthetic sizes, data_root).
        eval_frequency: evaluate every N-th version (the last one is evaluated at the end in any case).
        output_dir: where to write; None for the job's run folder on the server.
        job: the job's own settings (mode, versions, leaves, ...), kept in ``results.json``'s ``config``.
    """

    def __init__(
        self,
        settings: dict | None = None,
        eval_frequency: int = 1,
        output_dir: str | None = None,
        job: dict | None = None,
    ):
        Widget.__init__(self)
        self.settings = dict(settings or {})
        self.eval_frequency = int(eval_frequency)
        self.output_dir = output_dir
        self.job = dict(job or {})
        self._recorder: RunRecorder | None = None
        self._lock = threading.Lock()
        self._model = None
        self._evaluator = None
        self._records: list[dict[str, Any]] = []
        self._last_weights = None
        self._last_version = None
        self._started = None
        self._previous = None
        self._folder = None
        self._rejected: int | None = None
        self.register_event_handler(EventType.START_RUN, self._start)
        self.register_event_handler(AppEventType.GLOBAL_WEIGHTS_UPDATED, self._on_global_model)
        self.register_event_handler(EventType.END_RUN, self._end)

    def _start(self, event_type: str, fl_ctx: FLContext):
        from devsim.training.evaluation import Evaluator
        from processors.task_processor import default_torch_device

        device = default_torch_device()
        task = task_from_settings(self.settings)
        self._evaluator = Evaluator.for_task(task, device)
        self._model = task.build_model().to(device)
        if self.output_dir and os.path.isabs(self.output_dir):
            self._folder = self.output_dir
        else:
            run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
            self._folder = os.path.join(run_dir, self.output_dir or "devsim_edge")
        os.makedirs(self._folder, exist_ok=True)
        self._recorder = RunRecorder(self._folder, {**self.settings, **self.job}, method="edge", task=task.record())
        self._started = self._previous = time.perf_counter()
        self.log_info(fl_ctx, f"edge evaluator: {len(task.y_test)} test samples; results in {self._folder}")

    def _on_global_model(self, event_type: str, fl_ctx: FLContext):
        learnable = fl_ctx.get_prop(AppConstants.GLOBAL_MODEL)
        version = int(fl_ctx.get_prop(AppConstants.CURRENT_ROUND) or 0)
        if not learnable or ModelLearnableKey.WEIGHTS not in learnable or self._evaluator is None:
            return
        now = time.perf_counter()
        keys = float_state_keys(self._model)
        weights = {k: np.asarray(learnable[ModelLearnableKey.WEIGHTS][k], dtype=np.float32) for k in keys}
        with self._lock:
            self._last_weights, self._last_version = weights, version
            self._rejected = fl_ctx.get_prop(REJECTED_UPDATES_PROP)
            if version % self.eval_frequency and version != 1:
                return
            line = self._evaluate(version, weights, now)
        self.log_info(fl_ctx, line)
        print(line, flush=True)

    def _evaluate(self, version: int, weights: dict[str, np.ndarray], now: float) -> str:
        """Score ``weights`` (global model ``version``), record them in both results files, and return the console
        line (caller holds the lock)."""
        load_numpy_into_model(self._model, weights)
        result = self._evaluator.evaluate(self._model)
        record = {
            "version": version,
            **result.record(),
            **({} if self._rejected is None else {"rejected_updates": int(self._rejected)}),
            "elapsed_s": round(now - self._started, 4),
            "since_previous_s": round(now - self._previous, 4),
        }
        if self._records:  # the Collab layout's wall time per record (plot_runs.py adds them up)
            record["round_seconds"] = record["since_previous_s"]
        self._previous = now
        self._records.append(record)
        self._write()
        self._recorder.add_round(record)
        return (
            f"[edge] version {version}  {format_metrics(result.loss, result.metrics)}  "
            f"elapsed {record['elapsed_s']:.1f}s  (+{record['since_previous_s']:.2f}s)"
        )

    def _write(self):
        payload = {"settings": self.settings, "records": self._records}
        path = os.path.join(self._folder, RESULTS_FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as stream:
            json.dump(payload, stream, indent=1)
        os.replace(path + ".tmp", path)

    def _end(self, event_type: str, fl_ctx: FLContext):
        with self._lock:
            if self._last_weights is None or self._folder is None:
                return
            if self._records[-1]["version"] != self._last_version:  # the final model, evaluated whatever the frequency
                print(self._evaluate(self._last_version, self._last_weights, time.perf_counter()), flush=True)
            state = {k: torch.from_numpy(v) for k, v in self._last_weights.items()}
            final_path = os.path.join(self._folder, FINAL_MODEL_FILE)
            torch.save({"version": self._last_version, "state_dict": state}, final_path)
            self._write()
            first, last = self._records[0], self._records[-1]
            self._recorder.finish(
                {
                    "initial_accuracy": first.get("accuracy"),
                    "final_accuracy": last.get("accuracy"),
                    "final_loss": last["loss"],
                    "final_metrics": last["metrics"],
                    "versions": self._last_version,
                    "rejected_updates": int(self._rejected or 0),
                    "wall_seconds": time.perf_counter() - self._started,
                    "final_model": final_path,
                }
            )


def seeded_initial_weights(settings: dict) -> dict[str, np.ndarray]:
    """Version-0 global weights for ``settings`` (the task, seed), as the Collab jobs build them."""
    task = task_from_settings(settings)
    torch.manual_seed(derive_seed(int(settings.get("seed", 0)), "model-init"))
    model = task.build_model()
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


class SeededModelPersistor(ModelPersistor):
    """Initial global model built on the server from the run seed (NVFlare's ``PTModel`` re-initialises
    the model unseeded when the server instantiates it, so two runs would start from different weights).

    The edge job keeps its own results (``EdgeGlobalEvaluator`` writes ``final_model.pt``), so saving
    is a no-op.
    """

    def __init__(self, settings: dict | None = None):
        ModelPersistor.__init__(self)
        self.settings = dict(settings or {})

    def load_model(self, fl_ctx: FLContext) -> ModelLearnable:
        return make_model_learnable(seeded_initial_weights(self.settings), {})

    def save_model(self, model: ModelLearnable, fl_ctx: FLContext) -> None:
        """Nothing to save: see the class docstring."""


class NumpyBuffModelManager(BuffModelManager):
    """NVFlare's ``BuffModelManager`` keeping the global model as float32 NumPy arrays.

    The stock manager turns every new global model into nested Python lists (for JSON devices), which
    the leaves then receive and each simulated device converts back. With in-process simulated
    devices nothing needs JSON, so this manager builds the same model (mean of the buffered updates,
    optional staleness weight ``1 / (1 + sqrt(staleness))``, times ``global_lr``, added to the current
    global weights) and keeps it as arrays. Real devices behind NVFlare's web API need lists: use the
    stock manager (``numpy_payloads=False``) for them.

    ``server_optimizer`` other than ``sgd`` (with ``server_momentum``, ``server_beta2``, ``server_tau``; ``global_lr``
    is its ``eta``): the float64 mean of the (staleness-weighted) buffered updates goes through that optimizer
    (:mod:`devsim.aggregation.server_optimizers`: FedAvgM, FedAdagrad, FedAdam, FedYogi) instead of the plain step.
    """

    def __init__(
        self,
        num_updates_for_model: int,
        max_model_history: int | None = None,
        global_lr: float = 1.0,
        staleness_weight: bool = False,
        server_optimizer: str = "sgd",
        server_momentum: float = BETA1,
        server_beta2: float = BETA2,
        server_tau: float = TAU,
    ):
        super().__init__(num_updates_for_model, max_model_history, global_lr, staleness_weight)
        # NVFlare's job export reads each constructor argument back from the attribute of the same name
        self.server_optimizer, self.server_momentum = server_optimizer, server_momentum
        self.server_beta2, self.server_tau = server_beta2, server_tau
        self.optimizer = server_optimizer_for(self)
        """The server optimizer's state (None: the plain step)."""
        self.rejected_updates = 0
        """Device updates the leaves' screens left out so far (:mod:`devsim_flare.edge.screen`)."""

    def initialize_model(self, model: DXO, fl_ctx: FLContext) -> None:
        self.current_model = model
        self.updates[self.current_model_version] = _ModelState(ScreenedUpdateAggregator())

    def generate_new_model(self, fl_ctx: FLContext) -> None:
        self.current_model_version += 1
        version = self.current_model_version
        current = {k: np.asarray(v) for k, v in self.current_model.data.items()}
        num_updates = 0
        if version > 1:
            summed: dict[str, np.ndarray] = {}
            for base_version, state in self.updates.items():
                aggregator = state.aggregator
                self.rejected_updates += aggregator.rejected
                if aggregator.count > 0:
                    scale = 1.0 / (1.0 + (version - base_version) ** 0.5) if self.staleness_weight else 1.0
                    for key, value in aggregator.dict.items():
                        scaled = np.asarray(value, dtype=np.float64) * scale
                        summed[key] = summed[key] + scaled if key in summed else scaled
                    num_updates += aggregator.count
                aggregator.reset(fl_ctx)
            for key in [k for k in summed if k not in current]:
                self.log_error(fl_ctx, f"update key {key} is not in the global model; ignored")
                del summed[key]
            if num_updates and self.optimizer is not None:
                mean = {key: value.astype(np.float64) / num_updates for key, value in summed.items()}
                current.update(self.optimizer.apply({key: current[key] for key in mean}, mean))
            elif num_updates:
                factor = self.global_lr / num_updates
                for key, value in summed.items():
                    current[key] = (current[key] + value * factor).astype(np.float32)
        if version == 1 and self.optimizer is not None:
            self.log_info(fl_ctx, self.optimizer.describe())
        self.updates[version] = _ModelState(ScreenedUpdateAggregator())
        self.log_info(fl_ctx, f"generated new model version {version} with {num_updates} updates")
        self.current_model = DXO(data_kind=DataKind.WEIGHTS, data=current)
        self.num_updates_counter = 0
        fl_ctx.set_prop(AppConstants.GLOBAL_MODEL, make_model_learnable(current, {}), private=True, sticky=True)
        fl_ctx.set_prop(AppConstants.CURRENT_ROUND, version, private=True, sticky=True)
        fl_ctx.set_prop(REJECTED_UPDATES_PROP, self.rejected_updates, private=True, sticky=True)
        self.fire_event(AppEventType.GLOBAL_WEIGHTS_UPDATED, fl_ctx)


class DevsimEdgeRecipe(Recipe):
    """An NVFlare 2.9 edge job (FedAvg or FedBuff) whose simulated devices run this project's processor.

    Args:
        settings: processor settings (see ``TaskDeviceProcessor``).
        num_leaf_nodes: leaf sites expected (all must report devices before the first selection).
        devices_per_leaf: simulated devices per leaf.
        num_versions: trained global model versions (version 1 is the initial model; the job stops at
            version ``num_versions + 1``).
        device_selection_size: devices training at a time (FedAvg: per round); default all devices.
        mode: ``fedavg`` (synchronous) or ``fedbuff`` (new version every ``buffer_size`` updates,
            refill as soon as one slot is free).
        buffer_size, global_lr, staleness_weight, max_model_history: FedBuff settings.
        max_update_norm, update_norm_factor: the leaves' screen of each device update
            (:class:`~devsim_flare.edge.screen.ScreenedUpdateAggrFactory`; None switches a limit off).
        server_optimizer, server_momentum, server_beta2, server_tau: how a version's mean update moves the model
            (``global_lr`` is the optimizer's eta; anything but ``sgd`` needs ``numpy_payloads``).
        num_workers: device-training threads per leaf (each owns one model); None sizes them from the
            cores / free VRAM (fast runner) or uses NVFlare's stock count of 4 (stock runner).
        runner: ``fast`` (:class:`~devsim_flare.edge.runner.FastEdgeRunner`: immediate dispatch, one shared
            processor) or ``stock`` (NVFlare's ``TPORunner``: 0.5 s pause per dispatched device, processor
            copied per device).
        numpy_payloads: global models travel as float32 arrays (:class:`NumpyBuffModelManager`); False
            keeps NVFlare's nested lists (needed by real devices behind NVFlare's web API).
        processor: the leaves' device task processor; default this project's
            :class:`~processors.edge_task_processor.EdgeTaskProcessor` built from ``settings``.
        leaves_on_host: leaf processes sharing one host's cores (for the fast runner's worker sizing).
        update_interval: seconds between a leaf's status reports to the server.
        update_timeout: seconds a leaf waits for the server's answer to a report (NVFlare's default
            of 5 s ends a leaf's participation after one slow answer).
        device_wait_timeout: seconds to wait for enough devices before stopping the job.
        output_dir: where the evaluator writes; None for the server's run folder.
        ship_packages: copy this project's packages into the job's ``custom/`` folders (self-contained export).
    """

    def __init__(
        self,
        *,
        settings: dict,
        num_leaf_nodes: int,
        devices_per_leaf: int,
        num_versions: int,
        device_selection_size: int | None = None,
        mode: str = "fedavg",
        buffer_size: int | None = None,
        global_lr: float = 1.0,
        staleness_weight: bool = False,
        server_optimizer: str = "sgd",
        server_momentum: float = BETA1,
        server_beta2: float = BETA2,
        server_tau: float = TAU,
        max_model_history: int | None = 10,
        max_update_norm: float | None = None,
        update_norm_factor: float | None = 20.0,
        num_workers: int | None = None,
        runner: str = "fast",
        numpy_payloads: bool = True,
        processor: Any = None,
        leaves_on_host: int = 1,
        update_interval: float = 1.0,
        update_timeout: float = 60.0,
        device_wait_timeout: float | None = 300.0,
        eval_frequency: int = 1,
        output_dir: str | None = None,
        job_name: str = "devsim_edge",
        ship_packages: bool = True,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if runner not in RUNNERS:
            raise ValueError(f"runner must be one of {RUNNERS}, got {runner!r}")
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 (or None for automatic), got {num_workers}")
        for name, value in (
            ("num_leaf_nodes", num_leaf_nodes),
            ("devices_per_leaf", devices_per_leaf),
            ("num_versions", num_versions),
        ):
            if value < 1:
                raise ValueError(f"{name} (--{name.replace('_', '-')}) must be >= 1, got {value}")
        total = num_leaf_nodes * devices_per_leaf
        selection = device_selection_size or total
        if not 1 <= selection <= total:
            raise ValueError(f"device_selection_size must be in 1..{total} (all devices), got {selection}")
        if mode == "fedavg":
            buffer, min_hole = selection, selection
        else:
            buffer, min_hole = buffer_size or 1, 1
            if not 1 <= buffer <= selection:
                raise ValueError(f"buffer_size must be in 1..{selection} (device_selection_size), got {buffer}")
        if max_update_norm is not None and not (math.isfinite(max_update_norm) and max_update_norm > 0):
            raise ValueError(f"--max-update-norm must be a finite number > 0 or none, got {max_update_norm}")
        if update_norm_factor is not None and not (math.isfinite(update_norm_factor) and update_norm_factor > 1):
            raise ValueError(f"--update-norm-factor must be a finite number > 1 or none, got {update_norm_factor}")
        if server_optimizer != "sgd" and not numpy_payloads:
            raise ValueError(
                f"--server-optimizer: {server_optimizer} needs --payloads numpy (NVFlare's list manager only takes sgd)"
            )
        self.settings = dict(settings)
        self.mode = mode

        job = EdgeJob(name=job_name, edge_method=EDGE_METHOD, min_clients=num_leaf_nodes)

        persistor_id = job.to_server(SeededModelPersistor(settings=self.settings), id="persistor")
        job.to_server(
            EdgeGlobalEvaluator(
                settings=self.settings,
                eval_frequency=eval_frequency,
                output_dir=output_dir,
                job=dict(
                    mode=mode,
                    num_leaf_nodes=num_leaf_nodes,
                    devices_per_leaf=devices_per_leaf,
                    num_versions=num_versions,
                    device_selection_size=selection,
                    buffer_size=buffer,
                    global_lr=global_lr,
                    server_optimizer=server_optimizer,
                ),
            ),
            id="evaluator",
        )
        manager_args = dict(
            num_updates_for_model=buffer,
            max_model_history=max_model_history,
            global_lr=global_lr,
            staleness_weight=staleness_weight,
        )
        if numpy_payloads:
            manager_args.update(
                server_optimizer=server_optimizer,
                server_momentum=server_momentum,
                server_beta2=server_beta2,
                server_tau=server_tau,
            )
        manager_cls = NumpyBuffModelManager if numpy_payloads else BuffModelManager
        model_manager_id = job.to_server(manager_cls(**manager_args), id="model_manager")
        device_manager_id = job.to_server(
            SeededDeviceManager(
                device_selection_size=selection,
                initial_min_client_num=num_leaf_nodes,
                min_hole_to_fill=min_hole,
                device_reuse=True,
                seed=int(self.settings.get("seed", 0)),
            ),
            id="device_manager",
        )
        assessor = ModelUpdateAssessor(
            persistor_id=persistor_id,
            model_manager_id=model_manager_id,
            device_manager_id=device_manager_id,
            max_model_version=num_versions + 1,
            device_wait_timeout=device_wait_timeout,
        )
        job.configure_server(assessor=assessor, update_interval=update_interval)
        job.configure_client(
            aggregator_factory=ScreenedUpdateAggrFactory(
                self.settings, max_update_norm=max_update_norm, update_norm_factor=update_norm_factor
            ),
            max_model_versions=max_model_history,
            update_timeout=update_timeout,
        )
        if processor is None:
            processor = EdgeTaskProcessor(settings=self.settings, devices_per_leaf=devices_per_leaf)
        tp_id = job.to_clients(processor, id="task_processor")
        if runner == "fast":
            from devsim_flare.edge.runner import FastEdgeRunner

            device_runner = FastEdgeRunner(
                tp_id, num_devices=devices_per_leaf, num_workers=num_workers, leaves_on_host=leaves_on_host
            )
        else:
            workers = STOCK_RUNNER_WORKERS if num_workers is None else num_workers
            device_runner = EdgeLeafRunner(tp_id, job_timeout=60.0, num_devices=devices_per_leaf, num_workers=workers)
        job.to_clients(device_runner, id="device_runner")
        if ship_packages:
            from devsim.tasks import SHIPPED_FOLDER, source_file
            from devsim_flare.recipe import package_sources

            sources = package_sources()
            if self.settings.get("task"):
                sources.append((source_file(self.settings["task"]), SHIPPED_FOLDER))
            for source, dest_dir in sources:
                job.add_file_to_server(source, dest_dir=dest_dir, app_folder_type="custom")
                job.add_file_to_clients(source, dest_dir=dest_dir, app_folder_type="custom")
        Recipe.__init__(self, job)


def find_results(root: str, name: str = RESULTS_FILE) -> str | None:
    """Newest file called ``name`` (default ``edge_results.json``) under ``root``, or None."""
    found = []
    for folder, _, files in os.walk(root):
        if name in files:
            path = os.path.join(folder, name)
            found.append((os.path.getmtime(path), path))
    return max(found)[1] if found else None


def load_results(path: str) -> dict:
    with open(path, encoding="utf-8") as stream:
        return json.load(stream)
