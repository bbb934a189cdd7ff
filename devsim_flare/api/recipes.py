"""One recipe per job: its configuration and defaults, its server, and running or exporting it."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from typing import Any, ClassVar

from devsim.config import AsyncConfig, ClusterConfig, ConfigError, FedReviveConfig, SimulationConfig
from devsim.sections import flatten_sections
from devsim_flare import cli
from devsim_flare.api.environments import Environment, SimEnv
from devsim_flare.api.errors import RaisingParser, RecipeError, check_setting_names
from devsim_flare.api.results import Run
from devsim_flare.api.task_objects import task_spec


def recipe_settings(config_cls: type[SimulationConfig]) -> set[str]:
    """The settings a job takes: the fields of its configuration that the command line has a flag for
    (asynchronous jobs leave out the fields only synchronous rounds use)."""
    asynchronous = issubclass(config_cls, AsyncConfig)
    return {
        f.name
        for f in dataclasses.fields(config_cls)
        if not f.metadata.get("internal") and not (asynchronous and f.metadata.get("sync_only"))
    }


class JobRecipe:
    """One job's recipe: its configuration class and defaults, its server, and how to run it.

    ``settings`` are fields of :attr:`defaults`' configuration class by name (``lr=0.01``), or whole sections by
    their key in :data:`devsim.sections.SECTIONS` (``training={"lr": 0.01}``), or both; the command line's flags are
    the same names with ``-``. ``preset`` names a file of app_configs/presets (or a JSON path) applied first."""

    method: ClassVar[str]
    server: ClassVar[str]
    """The job's server program as ``module:class`` under ``devsim_flare.servers``, imported when the job runs (a
    job script imports its own server only)."""
    defaults: ClassVar[SimulationConfig]

    def __init__(self, task: Any = None, *, preset: str | None = None, **settings: Any):
        try:
            settings = flatten_sections(settings, type(self.defaults))
        except ConfigError as error:
            raise RecipeError(f"{type(self).__name__}: {error}") from None
        check_setting_names(type(self).__name__, self.method, settings, recipe_settings(type(self.defaults)))
        self.task = task
        self.preset = preset
        self.settings = dict(settings)

    @classmethod
    def description(cls) -> str:
        """The job's one-line description (the first line of the recipe's docstring; the command line's --help)."""
        return (cls.__doc__ or cls.method).strip().splitlines()[0]

    @classmethod
    def server_cls(cls) -> type:
        """The job's server program class (imports its module)."""
        module, name = cls.server.split(":")
        return getattr(importlib.import_module(f"devsim_flare.servers.{module}"), name)

    @classmethod
    def command_line(cls, argv: list[str] | None = None) -> int:
        """The job script: this recipe's flags parsed from ``argv`` (default: ``sys.argv``), run; the exit code."""
        return cli.job_main(cls.description(), cls.server_cls(), cls.defaults, argv)

    def _args(self, env: Environment, export_to: str | None = None):
        parser = cli.build_parser(self.description(), self.defaults)
        args = parser.parse_args([])
        raiser = RaisingParser()
        values: dict[str, Any] = {}
        if self.preset:
            values.update(cli.load_preset(raiser, self.preset, type(self.defaults)))
        values.update(self.settings)
        workspace = os.path.abspath(env.workspace)
        spec = task_spec(self.task, workspace)
        if spec is not None:
            values["task"] = spec
        for name, value in values.items():
            setattr(args, name, value)
        args.env = env.name
        args.workspace = workspace
        args.log_level = env.log_level
        args.gpus = getattr(env, "gpus", None)
        args.leaves_per_host = getattr(env, "leaves_per_host", None)
        args.job_timeout = getattr(env, "job_timeout", args.job_timeout)
        args.startup_kit = getattr(env, "startup_kit", None)
        args.leave_job_running = getattr(env, "leave_job_running", False)
        args.export_to = export_to
        return raiser, args

    def execute(self, env: Environment | None = None) -> Run:
        """Run the job in ``env`` (default: :class:`SimEnv`) and wait for it to end; progress prints as on the
        command line. Raises RecipeError for bad settings before anything starts. Its start-up is timed from this
        call. In the simulator its processes are forked from fork servers, as the job command's, when this process runs
        no other Python thread (a script, not a notebook) and a forked child of it can still run PyTorch's parallel
        code (:func:`devsim_flare.launch.fork_server.forked_children_compute`); otherwise they start as new
        interpreters."""
        from devsim.observe.startup import command_starts_now

        with command_starts_now():
            parser, args = self._args(env or SimEnv())
            code = cli.run_job(parser, args, self.server_cls(), fork_server=True, check_fork=True)
        return Run(code, args.results_dir)

    def export(self, job_dir: str, env: Environment | None = None) -> str:
        """Write the job folder into ``job_dir`` (for ``nvflare simulator``, POC or production) and return the
        job's own folder inside it."""
        parser, args = self._args(env or SimEnv(), export_to=job_dir)
        cli.run_job(parser, args, self.server_cls())
        return os.path.join(os.path.abspath(job_dir), f"devsim_{self.method}")

    def config(self) -> dict[str, Any]:
        """The settings this recipe runs with: its defaults, the preset, then the keyword settings (before the
        task fits them: a natural partition, for example, sets the population from the task)."""
        values = self.defaults.to_dict()
        if self.preset:
            values.update(cli.load_preset(RaisingParser(), self.preset, type(self.defaults)))
        values.update(self.settings)
        return json.loads(json.dumps(values))


class FedAvgRecipe(JobRecipe):
    """Synchronous hierarchical FedAvg: a server, leaf nodes under it, many simulated devices per leaf."""

    method = "fedavg"
    server = "sync_server:FedAvgServer"
    defaults = SimulationConfig()


class FedBuffRecipe(JobRecipe):
    """Asynchronous buffered FedBuff on a seeded virtual clock: K jobs in flight, a version every B updates.

    B=10 with server lr 1.0 (each version the plain mean of 10 updates, staleness about K/B = 2 versions) was
    chosen on a validation split of the digits (DEVSIM_DIGITS_HOLDOUT=0.2): 0.99 at version 100, against 0.96
    after 400 versions, with swings of 5-7 points, for the paper's B=2 at server lr 0.3 (lr 1.0 diverged at B=2)."""

    method = "fedbuff"
    server = "async_server:FedBuffServer"
    defaults = AsyncConfig(
        concurrency=20, buffer_size=10, min_open_slots=1, max_versions=100, eval_frequency=10, global_lr=1.0
    )


class FedReviveRecipe(JobRecipe):
    """FedRevive: asynchronous FedBuff-style aggregation revived by server-side data-free knowledge distillation.

    The defaults are sized for a CPU, not the paper's rates (FedReviveConfig's own defaults and the
    fedrevive_paper_cifar10* presets keep those: a width-128 generator synthesising every version, KD on every
    eligible arrival, 25 local Adam steps at lr 3e-4 with crop-and-flip augmentation, server lr 0.1). Here: the
    DFKD schedule of the fedrevive_small_cpu preset (synthesis every 5 versions, KD distilled on every 5th eligible
    arrival and reused between, width 32, 4 teachers), no augmentation (flips do not suit digits), 20 local Adam
    steps at lr 1e-3 and server lr 0.3, chosen on a validation split of the digits (DEVSIM_DIGITS_HOLDOUT=0.2;
    server lr 0.1 was still at 0.87 by version 170, 0.5 was unstable). Synthesis and KD run on a background thread
    (``distill_lag=1``): each reads version v and lands at v + 1, one synthesis and one distillation every 5 versions,
    off the arrivals' path. Landing later costs accuracy on digits (final accuracy, seeds 0 / 1: inline 0.9528 /
    0.9389, lag 1 0.9556 / -, lag 2 0.9389 / 0.9278, lag 5 0.9167 / 0.9111); a larger lag blocks the arrivals less
    where versions come fast (docs/concepts.md, FedRevive)."""

    method = "fedrevive"
    server = "fedrevive_server:FedReviveServer"
    defaults = FedReviveConfig(
        concurrency=20,
        buffer_size=1,
        min_open_slots=1,
        max_versions=150,
        eval_frequency=10,
        global_lr=0.3,
        optimizer="adam",
        lr=1e-3,
        local_iterations=20,
        batch_size=32,
        augment=False,
        freeze_version=10,
        warmup_version=20,
        generation_interval=5,
        teacher_capacity=4,
        generator_width=32,
        synth_batch_size=32,
        kd_iterations=5,
        pool_capacity=2000,
        kd_interval=5,
        distill_lag=1,
    )


class ClusterRecipe(JobRecipe):
    """Cluster aggregation across leaf nodes: leaves whose models point the same way share a model."""

    method = "cluster"
    server = "cluster_server:ClusterServer"
    defaults = ClusterConfig(num_leaf_nodes=6, devices_per_leaf=20, device_selection_size=60, hidden_groups=2)


RECIPES: dict[str, type[JobRecipe]] = {
    recipe.method: recipe for recipe in (FedAvgRecipe, FedBuffRecipe, FedReviveRecipe, ClusterRecipe)
}
"""The recipe of each job by its method name."""
