"""The edge job's recipe: this project's device processor inside NVFlare's own edge stack (``EdgeJob``), with the
flags of ``jobs/pt_job_edge.py`` as settings (docs/edge_hierarchy.md)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from devsim_flare import cli
from devsim_flare.api.environments import Environment, ProdEnv, SimEnv
from devsim_flare.api.errors import RaisingParser, RecipeError, check_setting_names
from devsim_flare.api.results import Run
from devsim_flare.api.task_objects import task_spec
from devsim_flare.edge import cli as edge_cli

RUN_FLAGS = ("env", "startup_kit", "workspace", "job_timeout", "log_level", "username")
"""The edge command line's flags that the environment sets, not the recipe."""


class EdgeRecipe:
    """This project's device processor in NVFlare 2.9's own edge hierarchy (EdgeJob and its device simulation).

    ``settings`` are the flags of ``jobs/pt_job_edge.py`` with ``_`` for ``-`` (``num_versions``, ``mode``,
    ``runner``, ...); runs in :class:`SimEnv` (flat: every client a leaf) or :class:`ProdEnv`. Its run folder holds
    ``results.json`` (the Collab jobs' layout, one record per evaluated version), ``edge_results.json`` (the same
    records) and ``final_model.pt``."""

    method: ClassVar[str] = "edge"

    def __init__(self, task: Any = None, **settings: Any):
        allowed = (
            action.dest
            for action in edge_cli.build_parser()._actions
            if action.dest not in ("help", *RUN_FLAGS) and action.option_strings
        )
        check_setting_names("EdgeRecipe", self.method, settings, allowed)
        self.task = task
        self.settings = dict(settings)
        args = edge_cli.build_parser().parse_args([])
        for name, value in self.settings.items():
            setattr(args, name, value)
        # the recipe's own checks of the values now, as the Collab recipes do; those against the population wait for
        # execute, where the task may set it (a natural partition: devices per leaf from the task's owners)
        args.device_selection_size = args.buffer_size = None
        try:
            edge_cli.build_recipe(args, None)
        except (ValueError, TypeError) as error:
            raise RecipeError(str(error)) from error

    def execute(self, env: Environment | None = None) -> Run:
        """Run the edge job in ``env`` (default :class:`SimEnv`) and wait for it; RecipeError for a bad task or
        environment (bad values were refused when the recipe was built)."""
        env = env or SimEnv(workspace=os.path.join("workspace", "edge"))
        if not isinstance(env, SimEnv | ProdEnv):
            raise RecipeError(f"--env: the edge job runs in SimEnv or ProdEnv, not {type(env).__name__}")
        parser = RaisingParser()
        args = edge_cli.build_parser().parse_args([])
        workspace = os.path.abspath(env.workspace)
        for name, value in self.settings.items():
            setattr(args, name, value)
        spec = task_spec(self.task, workspace)
        if spec is not None:
            args.task = spec
        args.env, args.workspace, args.log_level = env.name, workspace, env.log_level
        if isinstance(env, ProdEnv):
            args.startup_kit, args.job_timeout = env.startup_kit, env.job_timeout
        args.output_dir = os.path.abspath(args.output_dir or cli.default_output_dir(workspace, self.method))
        edge_cli.check_task_args(parser, args)
        if args.env == "prod":
            edge_cli.check_prod_args(parser, args)
        try:
            recipe = edge_cli.build_recipe(args, args.output_dir, args.num_leaf_nodes if args.env == "sim" else 1)
        except ValueError as error:
            raise RecipeError(str(error)) from error
        run = edge_cli.run_prod if args.env == "prod" else edge_cli.run_sim
        return Run(run(recipe, args, args.output_dir), args.output_dir)
