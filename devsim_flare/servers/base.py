"""What every server (sync or async) does the same way: load the task, check the leaves, pick the output
folder, build the model and the central evaluator, record why a run failed."""

from __future__ import annotations

import logging
import os

import torch
from nvflare.collab import collab

from devsim.config import SimulationConfig
from devsim.observe.results import RunRecorder
from devsim.population.devices import natural_sort
from devsim.seeding import derive_seed
from devsim.tasks import Task, task_from_settings
from devsim.tasks.shards import grouped_task
from devsim.training.evaluation import Evaluator
from devsim_flare.leaf_calls import quiet_per_call_logs


def start_run(server, model_args: dict | None = None) -> tuple[str, torch.device]:
    """Shared start of every server's run: validated config, connected leaves, initial model and weights.

    Sets ``server.config``, ``server.task``, ``server.leaves``, ``server.model`` and ``server.weights``; returns the
    output folder and the compute device. Sets PyTorch's threads (``--server-threads``).
    """
    from devsim.codec import model_to_numpy
    from devsim.resources.precision import apply_cudnn_benchmark, apply_tf32
    from processors.task_processor import default_torch_device

    server.config = server.config_cls.from_dict(server.settings)
    quiet_per_call_logs()
    if server.config.server_threads:
        torch.set_num_threads(server.config.server_threads)
    apply_tf32(server.config.tf32)
    apply_cudnn_benchmark(server.config.cudnn_benchmark)
    server.task = task_from_settings(server.settings)
    server.leaves = connected_leaves(server.config)
    device = default_torch_device()
    server.model = initial_model(server.task, server.config, device, **(model_args or {}))
    server.weights = model_to_numpy(server.model)
    return output_dir_for(server.config), device


def connected_leaves(config: SimulationConfig) -> list[str]:
    """Leaf site names in natural order; refuses a run whose site count is not ``--num-leaf-nodes``."""
    leaves = natural_sort([client.name for client in collab.clients])
    if len(leaves) != config.num_leaf_nodes:
        raise RuntimeError(
            f"{len(leaves)} leaf sites are connected ({', '.join(leaves)}) but --num-leaf-nodes is "
            f"{config.num_leaf_nodes}"
        )
    return leaves


def output_dir_for(config: SimulationConfig) -> str:
    """``--output-dir`` when absolute; otherwise a folder inside this job's run folder on the server."""
    run_dir = collab.workspace.get_run_dir(collab.fl_ctx.get_job_id())
    if config.output_dir:
        return config.output_dir if os.path.isabs(config.output_dir) else os.path.join(run_dir, config.output_dir)
    return os.path.join(run_dir, "devsim")


def initial_model(task: Task, config: SimulationConfig, device: torch.device, **model_args) -> torch.nn.Module:
    """The global model at version 0: the task's model, initialised after seeding torch from the run seed."""
    torch.manual_seed(derive_seed(config.seed, "model-init"))
    return task.build_model(**model_args).to(device)


def central_evaluator(task: Task, config: SimulationConfig, device: torch.device) -> Evaluator:
    """Evaluator over the test split of the run's task."""
    return group_evaluators(task, config, device, groups=1)[0]


def group_evaluators(
    task: Task, config: SimulationConfig, device: torch.device, groups: int | None = None
) -> dict[int, Evaluator]:
    """One evaluator per hidden group: the test split as that group's leaves see it (group 0: as is)."""
    count = config.hidden_groups if groups is None else groups
    return {
        g: Evaluator.for_task(
            grouped_task(task, g, config.group_kind, config.data_seed), device, config.eval_batch_size
        )
        for g in range(count)
    }


def announce_privacy(privacy, weights: dict) -> None:
    """Print the DP mechanism and how loud its noise is for a model of these ``weights`` (name -> array); nothing
    without DP (``privacy`` None)."""
    if privacy is not None:
        print(f"[server] {privacy.describe()}", flush=True)
        print(f"[server] {privacy.noise_note(sum(int(v.size) for v in weights.values()))}", flush=True)


def reraise_checkpoint_failure(recorder: RunRecorder, error: BaseException | None) -> None:
    """Record and raise a background checkpoint write's ``error`` that no later checkpoint waited for
    (:meth:`~devsim.observe.checkpoint.CheckpointWriter.close`); nothing when it is None."""
    if error is not None:
        record_failure(recorder, error)
        raise error


def record_failure(recorder: RunRecorder, error: BaseException) -> None:
    """Write why the run failed into results.json (``failed: {"reason": ...}``), for the command's last line: the
    message alone for this project's own errors (a round that failed, leaves lost), else the error's type too.

    For this project's own errors the console also leaves out NVFlare's tracebacks of ``error`` (it logs one twice
    as the job ends): their message is the whole story, and the command prints it last. Log files keep them."""
    own = type(error).__module__.split(".")[0] in ("devsim", "devsim_flare")
    recorder.mark_failed(str(error) if own else f"{type(error).__name__}: {error}")
    if own:
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.addFilter(_TracebackOf(str(error)))


class _TracebackOf(logging.Filter):
    """Drops the error records that are a traceback ending in ``message`` (a console handler's filter)."""

    def __init__(self, message: str):
        super().__init__()
        self.message = message

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        text = record.getMessage()
        return not ("Traceback (most recent call last)" in text and self.message in text)
