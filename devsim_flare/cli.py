"""What a job does between its settings and its run, shared by the job scripts in ``jobs/`` and the Python API
(:mod:`devsim_flare.api`): the validated configuration (from flags, a preset or ``--resume``), fitted to the task
and the environment, then export or run (:func:`run_job`). The flags themselves: :mod:`devsim_flare.flags`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time

from devsim.config import ConfigError, SimulationConfig
from devsim.data import DatasetUnavailableError, load_dataset
from devsim.data.cifar import download_cifar
from devsim.resources.gpu_placement import leaves_per_gpu, parse_gpu_ids
from devsim.sections import flatten_sections
from devsim.tasks.contract import is_file_spec
from devsim_flare.execution import SIM_SYNC_TIMEOUT, run_recipe
from devsim_flare.flags import build_parser, checked_line
from devsim_flare.run_signals import exit_now, signal_exit_codes

SHARED_HOST_SERVER_THREADS = 1
"""PyTorch threads of a server that shares its machine with the leaves (``--env sim`` and ``poc``, unless
``--server-threads`` says otherwise). With its default (one per core) the server's OpenMP threads spin against the
leaves' training: a FedRevive run (digits, K = 100, B = 2, 60 versions) took 90 s on the 2-core CPU beside one busy
process, and 8 s with one thread."""


def with_server_threads(config: SimulationConfig, env: str) -> SimulationConfig:
    """``config`` with ``--server-threads`` set to :data:`SHARED_HOST_SERVER_THREADS` where the server shares the
    machine with the leaves (``sim``, ``poc``) and the flag is unset; otherwise unchanged."""
    if config.server_threads is None and env in ("sim", "poc"):
        return dataclasses.replace(config, server_threads=SHARED_HOST_SERVER_THREADS)
    return config


def with_shared_memory(config: SimulationConfig, env: str, simulated_here: bool) -> SimulationConfig:
    """``config`` with ``--shared-memory`` resolved to ``on`` or ``off``: ``auto`` is on for a simulation run by
    this command (``--env sim``, not exported) where ``/dev/shm`` is writable. Raises ConfigError for ``on`` where
    the leaves may be on other hosts (``--env prod``) or where this host has no writable ``/dev/shm``."""
    from devsim.shared_arrays import SHARED_MEMORY_ROOT, shared_memory_root

    mode, available = config.shared_memory, shared_memory_root() is not None
    if mode == "on" and env == "prod":
        raise ConfigError("shared_memory", "'on' needs the server and its leaves on one host; with --env prod: off")
    if mode == "on" and not available:
        raise ConfigError("shared_memory", f"'on' needs a writable {SHARED_MEMORY_ROOT}; allowed here: off, auto")
    if mode == "auto":
        mode = "on" if simulated_here and available else "off"
    return dataclasses.replace(config, shared_memory=mode)


def config_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> SimulationConfig:
    """Validated configuration from parsed flags (or, with ``--resume``, from the run folder), except for the
    checks against the population size: a natural partition sets it from the task (:func:`task_config`
    validates the fitted configuration in full).

    Bad values end the program with the flag named.
    """
    config_cls = args.config_cls
    names = {f.name for f in dataclasses.fields(config_cls)}
    if args.resume:
        values = _resumed_values(parser, args.resume)
    else:
        values = {k: v for k, v in vars(args).items() if k in names}
    for path_field in ("data_root", "trace_file"):
        if values.get(path_field):
            values[path_field] = os.path.abspath(values[path_field])
    if values.get("task") and is_file_spec(values["task"]):
        values["task"] = os.path.abspath(values["task"])
    try:
        return config_cls.from_dict(values, population=False)
    except ConfigError as error:
        parser.error(str(error))
        raise


def _resumed_values(parser: argparse.ArgumentParser, run_dir: str) -> dict:
    from devsim.observe.checkpoint import CHECKPOINT_NAME
    from devsim.observe.results import load_results

    run_dir = os.path.abspath(run_dir)
    if not os.path.isfile(os.path.join(run_dir, CHECKPOINT_NAME)):
        parser.error(f"--resume: no {CHECKPOINT_NAME} in {run_dir}")
    results = load_results(run_dir)
    if results.get("summary"):
        parser.error(f"--resume: the run in {run_dir} already finished; start a new run to train further")
    values = dict(results["config"])
    values.update(resume_from=run_dir, output_dir=run_dir, stop_after_round=None)
    if "stop_after_version" in values:
        values["stop_after_version"] = None
    return values


def prepare_data(parser: argparse.ArgumentParser, config: SimulationConfig) -> None:
    """Download CIFAR once here when asked, then check the test split reads, before any process starts."""
    if config.task or config.dataset == "synthetic":
        return
    try:
        if config.download:
            download_cifar(config.data_root, config.dataset)
        load_dataset(config.dataset, config.data_root, train=False)
    except DatasetUnavailableError as error:
        parser.error(str(error))


def task_config(parser: argparse.ArgumentParser, config: SimulationConfig) -> SimulationConfig:
    """Load and check the run's task here, before any process starts, and fit the configuration to it
    (:func:`devsim.tasks.fit.fit_config`); a bad task or a flag it cannot honour ends the program with one line
    naming the task file or the flag."""
    from devsim.tasks import TaskError, load_task
    from devsim.tasks.fit import fit_config

    try:
        task = load_task(config.to_dict())
        config, notes = fit_config(config, task)
    except (TaskError, ConfigError) as error:
        parser.error(str(error))
        raise
    print(task.describe(), flush=True)
    for note in notes:
        print(note, flush=True)
    return config


def with_privacy(parser: argparse.ArgumentParser, config: SimulationConfig, resumed: bool = False) -> SimulationConfig:
    """``config`` with its DP noise multiplier resolved (solved from ``--dp-epsilon`` for the run's rounds) and the
    mechanism checked; a target it cannot reach, or both flags given, ends the program with one line."""
    if config.dp == "off":
        return config
    from devsim.privacy.plan import PrivacyPlan, resolve_noise_multiplier

    if config.dp_epsilon is not None and config.dp_noise_multiplier is not None and not resumed:
        parser.error("--dp-epsilon: give it or --dp-noise-multiplier, not both")
    rounds, unit = config.num_rounds, "rounds"
    if hasattr(config, "buffer_size"):  # asynchronous: one mechanism per applied version
        rounds, unit = config.max_versions, "versions"
        if rounds is None and config.dp_noise_multiplier is None:
            parser.error(
                "--dp-epsilon: needs --max-versions (the versions the target covers), or give --dp-noise-multiplier"
            )
    try:
        z = resolve_noise_multiplier(config, rounds)
    except ValueError as error:
        parser.error(f"--dp-epsilon: {error}")
    if config.dp_noise_multiplier is None:
        print(f"--dp-epsilon {config.dp_epsilon:g}: noise multiplier {z:.4f} for {rounds} {unit}", flush=True)
    config = dataclasses.replace(config, dp_noise_multiplier=z)
    try:
        _ = PrivacyPlan.from_settings(config).sum_noise_multiplier  # adaptive clipping: the count leaves some
    except ValueError as error:
        parser.error(f"--dp-count-noise: {error}")
    return config


def checked_settings(parser: argparse.ArgumentParser, config: SimulationConfig, method: str) -> str:
    """``--check``'s line: the run's settings (after fitting to the task and solving DP) that differ from the job's
    defaults, as flags; run folders and the like left out."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return checked_line(parser, values, method, skip=("output_dir", "data_root"))


def default_output_dir(workspace: str, method: str) -> str:
    """A fresh, absolute run folder under ``<workspace>/runs``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.abspath(os.path.join(workspace, "runs", f"{method}-{stamp}-{os.getpid()}"))


def export_requested() -> bool:
    """Whether NVFlare's recipe module consumed ``--export`` from the command line at import."""
    from nvflare.recipe import spec

    return bool(spec._peek_recipe_args()[0])


def gpu_ids_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[int, ...]:
    """The GPU ids of ``--gpus`` (empty when not given); a bad value ends the program naming the flag.

    The ids are the host's (``nvidia-smi``) ids, which NVFlare's simulator puts in each leaf process's
    ``CUDA_VISIBLE_DEVICES``. On a host without NVIDIA GPUs the placement is kept (the leaves then
    train on the CPU) and a warning says so.
    """
    if args.gpus is None:
        return ()
    if args.env != "sim":
        parser.error(
            f"--gpus: places leaves only with --env sim, not {args.env}; in poc and prod each site's "
            "CUDA_VISIBLE_DEVICES chooses its GPU"
        )
    try:
        ids = parse_gpu_ids(args.gpus)
    except ConfigError as error:
        parser.error(str(error))
    from nvflare.fuel.utils.gpu_utils import get_host_gpu_ids

    host = [int(i) for i in get_host_gpu_ids() or []]
    missing = sorted(set(ids) - set(host))
    if host and missing:
        parser.error(f"--gpus: GPU {', '.join(map(str, missing))} not on this host; its GPU ids are {host}")
    if not host:
        print("warning: --gpus: no NVIDIA GPU on this host; the leaves train on the CPU", file=sys.stderr)
    return ids


def job_main(description: str, server_cls: type, defaults: SimulationConfig, argv: list[str] | None = None) -> int:
    """The whole of a job script: flags -> validated config -> data check -> recipe -> export or run."""
    from devsim.observe.startup import stamp_command, stamp_command_start
    from devsim.resources.collection import resume_after_imports

    stamp_command_start()
    stamp_command("command_imports_done")
    resume_after_imports()  # the job script paused garbage collection for its imports
    parser = build_parser(description, defaults)
    args = parser.parse_args(argv)
    if args.preset:
        parser.set_defaults(**load_preset(parser, args.preset, type(defaults)))
        args = parser.parse_args(argv)
    code = run_job(parser, args, server_cls, fork_server=True)
    if code in signal_exit_codes():
        exit_now(code)  # every process the run started is stopped; skip the interpreter's teardown
    return code


def run_job(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    server_cls: type,
    fork_server: bool = False,
    check_fork: bool = False,
) -> int:
    """Everything a job does after its flags are parsed: environment checks, the validated and task-fitted
    configuration, then export or run. ``parser.error`` reports bad input (the command line ends the program;
    :mod:`devsim_flare.api` raises instead). Sets ``args.results_dir`` to the run folder this command writes or
    downloads (None when exporting). Returns the exit code.

    With ``fork_server`` (the job command, a fresh single-threaded process that has run no PyTorch computation yet),
    a simulation run here starts NVFlare's simulator processes from a fork server holding PyTorch and NVFlare
    (:mod:`devsim_flare.launch.fork_server`), forked before the checks below; with ``check_fork`` as well (a process
    that may have run PyTorch: the Python API) only after a forked child has shown that it can still compute."""
    from devsim_flare.launch.early_fork import take_early
    from devsim_flare.launch.fork_server import start_fork_server

    check_env_args(parser, args)
    exporting = export_requested() or bool(getattr(args, "export_to", None))
    download_dir = None
    if args.env == "prod" and not exporting:
        # the server writes into its job folder; the command downloads that run folder here when the job ends
        download_dir = os.path.abspath(args.output_dir or default_output_dir(args.workspace, server_cls.method))
        args.output_dir = None
    elif args.output_dir is None and args.env != "prod" and not exporting and not args.resume:
        args.output_dir = default_output_dir(args.workspace, server_cls.method)
    elif args.output_dir and args.env != "prod":
        args.output_dir = os.path.abspath(args.output_dir)
    config = config_from_args(parser, args)
    config = with_server_threads(config, args.env)
    gpu_ids = gpu_ids_from_args(parser, args)
    simulated_here = args.env == "sim" and not exporting
    forking = fork_server and simulated_here and not getattr(args, "check", False)
    early = take_early()  # forked by the job script right after PyTorch's import
    if early is not None and not forking:
        early.close()
        early = None
    leaves = config.num_leaf_nodes
    server = start_fork_server(leaves=leaves, check_children=check_fork, forked=early) if forking else None
    if server is not None:
        from devsim.observe.startup import stamp_command

        stamp_command("command_forked")  # the checks after it (data, task, privacy) split from the flags and fork
    try:
        return _checked_run(parser, args, server_cls, config, gpu_ids, exporting, download_dir)
    finally:
        if server is not None:
            server.close()


def _checked_run(parser, args, server_cls: type, config: SimulationConfig, gpu_ids, exporting: bool, download_dir):
    """:func:`run_job` from the shared-memory check on: data, task, privacy, then export or run."""
    from devsim.observe.startup import stamp_command
    from devsim_flare.launch.warm_parent import note_job_accepted
    from devsim_flare.recipe import build_recipe

    simulated_here = args.env == "sim" and not exporting
    try:
        config = with_shared_memory(config, args.env, simulated_here)
    except ConfigError as error:
        parser.error(str(error))
    if simulated_here:
        share_digits(config, args.workspace)  # first, so this process too reads the shared file, not scikit-learn
    prepare_data(parser, config)
    config = task_config(parser, config)
    config = with_privacy(parser, config, resumed=bool(args.resume))
    note_job_accepted()  # a warm parent starts at the end of a cold command only once its flags have passed
    stamp_command("command_checked")
    if getattr(args, "check", False):
        print(checked_settings(parser, config, server_cls.method), flush=True)
        return 0
    args.results_dir = None if exporting else (download_dir or config.output_dir)
    leaves_on_host = args.leaves_per_host or (config.num_leaf_nodes if args.env in ("sim", "poc") else 1)
    leaves_on_gpu = leaves_per_gpu(gpu_ids, config.num_leaf_nodes) if gpu_ids else leaves_on_host

    def make_recipe(run_config: SimulationConfig = config):
        return build_recipe(
            run_config,
            server_cls,
            job_name=f"devsim_{server_cls.method}",
            leaves_on_host=leaves_on_host,
            leaves_on_gpu=leaves_on_gpu,
            sync_timeout=SIM_SYNC_TIMEOUT if simulated_here else None,
        )

    if getattr(args, "export_to", None):
        make_recipe().export(job_dir=os.path.abspath(args.export_to))
        return 0
    if download_dir is not None:
        from devsim_flare.deployment.prod_run import run_on_deployment

        return run_on_deployment(make_recipe, args, config, download_dir)
    return run_recipe(make_recipe, args, config, gpu_ids)


def check_env_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, in one line and before anything starts, an environment that cannot run: ``--env prod`` without an
    admin startup kit, or ``--resume`` there (the checkpoint lives in the server's job folder)."""
    if args.leaves_per_host is not None and args.leaves_per_host < 1:
        parser.error(f"--leaves-per-host: must be >= 1, got {args.leaves_per_host}")
    if args.env == "prod" and not export_requested():
        from devsim_flare.deployment.prod_job import read_admin_kit

        if not args.startup_kit:
            parser.error("--startup-kit: --env prod needs --startup-kit (the admin's startup kit folder)")
        try:
            read_admin_kit(args.startup_kit)
        except ValueError as error:
            parser.error(f"--startup-kit: {error}")
        if args.resume:
            parser.error("--resume: not available with --env prod (the checkpoint stays in the server's job folder)")


def share_digits(config: SimulationConfig, workspace: str) -> None:
    """For a simulated run of the built-in digits: write them once into this user's cache folder
    (``digits-<scikit-learn version>.npz``; with the cache off, the workspace's ``cache/digits.npz``) and name the
    file in ``DEVSIM_DIGITS_FILE`` for this process and the server and leaf processes it starts, so they read 50 KB
    instead of each importing scikit-learn (~1 s a process; only the first run that writes the file imports it, not
    the first run of every workspace). Kept when the variable is already set."""
    from importlib.metadata import PackageNotFoundError, version

    from devsim.cache_dir import cache_root
    from devsim.data import digits

    if config.task or config.dataset != "digits" or os.environ.get(digits.FILE_ENV) or not digits.sklearn_available():
        return
    path = os.path.join(os.path.abspath(workspace), "cache", "digits.npz")
    with contextlib.suppress(PackageNotFoundError):
        root = cache_root()
        path = path if root is None else os.path.join(root, f"digits-{version('scikit-learn')}.npz")
    if not os.path.isfile(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}.npz"
        digits.export_digits(partial)
        os.replace(partial, path)
    os.environ[digits.FILE_ENV] = path


PRESETS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "app_configs", "presets")


def load_preset(parser: argparse.ArgumentParser, name: str, config_cls: type) -> dict:
    """Configuration values of preset ``name`` (a file in app_configs/presets, or a JSON path) as a flat mapping.

    A preset is written by section (``{"training": {"lr": 0.0003}, ...}``, :data:`devsim.sections.SECTIONS`); a
    flat one (``{"lr": 0.0003}``, the older form) loads too. A setting under the wrong section, or one this job does
    not have, ends the program in one line naming it (and, when misplaced, its section)."""
    import json

    path = name if name.endswith(".json") or os.sep in name else os.path.join(PRESETS_DIR, f"{name}.json")
    if not os.path.isfile(path):
        available = sorted(f[:-5] for f in os.listdir(PRESETS_DIR) if f.endswith(".json"))
        parser.error(f"--preset: no preset {name!r}; available: {', '.join(available)}")
    with open(path, encoding="utf-8") as stream:
        values = json.load(stream)
    if not isinstance(values, dict):
        parser.error(f"--preset {name}: expected a JSON object of sections, got {type(values).__name__}")
    values.pop("description", None)
    try:
        values = flatten_sections(values, config_cls)
    except ConfigError as error:
        parser.error(f"--preset {name}: {error}")
    allowed = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(values) - allowed)
    if unknown:
        parser.error(f"--preset {name}: unknown settings {unknown} for this job")
    return values
