"""Command line of the edge job (`jobs/pt_job_edge.py`): its flags, the recipe they build, and running it
in the simulator (`sim`) or submitting it to a running deployment (`prod`).

Importing this module imports NVFlare's recipe module, which strips ``--export`` / ``--export-dir`` from
``sys.argv`` (NVFlare's convention).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from devsim.config import DATASETS, PARTITIONS, ConfigError, SimulationConfig
from devsim.observe.progress import format_metrics
from devsim.resources.collection import resume_after_imports
from devsim_flare.edge.job import MODES, RUNNERS, DevsimEdgeRecipe, find_results, load_results
from devsim_flare.flags import SHORT_USAGE, JobArgumentParser, add_check_flag, add_config_flags, checked_line
from devsim_flare.launch.warm_parent import note_job_accepted
from devsim_flare.run_signals import exit_now, signal_exit_codes

SERVER_OPTIMIZER_FLAGS = ("server_optimizer", "server_momentum", "server_beta2", "server_tau")
"""The Collab jobs' server optimizer flags, which the edge job's model manager takes."""
SCREEN_FLAGS = ("max_update_norm", "update_norm_factor")
"""The Collab jobs' update screen flags, which the edge job's leaves apply to each device update."""
DESCRIPTION = "This project's device processor in NVFlare 2.9's own edge hierarchy (EdgeJob and its device simulation)."


def build_parser() -> argparse.ArgumentParser:
    p = JobArgumentParser(
        description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter, usage=SHORT_USAGE
    )
    p.add_argument("--num-leaf-nodes", type=int, default=2)
    p.add_argument("--devices-per-leaf", type=int, default=16)
    p.add_argument(
        "--num-versions",
        "--num-rounds",
        dest="num_versions",
        type=int,
        default=20,
        help="trained global model versions (FedAvg: rounds); 20 reach about 0.95 test accuracy on --dataset digits",
    )
    p.add_argument("--device-selection-size", type=int, default=None, help="default: every device")
    p.add_argument("--mode", choices=MODES, default="fedavg")
    p.add_argument("--buffer-size", type=int, default=None, help="fedbuff: updates per new version")
    p.add_argument("--global-lr", type=float, default=1.0)
    add_config_flags(p, SERVER_OPTIMIZER_FLAGS)
    p.add_argument("--staleness-weight", action="store_true")
    p.add_argument(
        "--num-workers",
        type=int,
        default=None,
        help="device-training threads per leaf (default: sized from cores / free VRAM; stock runner: 4)",
    )
    p.add_argument(
        "--runner",
        choices=RUNNERS,
        default="fast",
        help="device runner on each leaf: fast (this project's) or stock (NVFlare's TPORunner)",
    )
    p.add_argument(
        "--payloads",
        choices=("numpy", "lists"),
        default="numpy",
        help="global model format sent to the leaves (lists: NVFlare's default, needed by real web devices)",
    )
    add_config_flags(p, SCREEN_FLAGS)
    p.add_argument("--update-interval", type=float, default=1.0, help="seconds between a leaf's reports")
    p.add_argument("--update-timeout", type=float, default=60.0)
    p.add_argument("--eval-frequency", type=int, default=1)
    # processor settings
    p.add_argument(
        "--task",
        default=None,
        help="your task: a Python file or module defining model() and data() (docs/tasks.md); "
        "unset: the built-in --dataset and --model",
    )
    p.add_argument("--dataset", choices=DATASETS, default="synthetic")
    p.add_argument("--data-root", default=None)
    p.add_argument("--model", default="cnn")
    p.add_argument("--partition", choices=PARTITIONS, default="auto")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--samples-per-device", type=int, default=100)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    add_config_flags(p, ("prox_mu",))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--synthetic-train-size", type=int, default=20000)
    p.add_argument("--synthetic-test-size", type=int, default=2000)
    # run
    p.add_argument(
        "--env",
        choices=("sim", "prod"),
        default="sim",
        help="sim: NVFlare's simulator on this machine; prod: submit to a running deployment (needs --startup-kit)",
    )
    p.add_argument("--startup-kit", default=None, help="prod: the admin's startup kit folder")
    p.add_argument("--username", default=None, help="prod: the admin's name in the project (default: NVFlare's)")
    p.add_argument("--job-timeout", type=float, default=24 * 3600.0, help="prod: seconds before the job is aborted")
    p.add_argument("--workspace", default="workspace/edge", help="NVFlare simulator workspace root")
    p.add_argument(
        "--output-dir",
        default=None,
        help="evaluator output folder, a path on the server (default: the server's run folder)",
    )
    p.add_argument("--log-level", choices=("WARNING", "INFO", "DEBUG"), default="WARNING")
    add_check_flag(p)
    return p


RUN_PLACES = ("env", "startup_kit", "username", "job_timeout", "workspace", "output_dir", "log_level", "check")
"""Flags that say where and how the job runs, not what it computes: ``--check`` leaves them out of its line."""


def checked_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``--check``'s line: the settings (after fitting to the task) that differ from the job's defaults, as flags."""
    return checked_line(parser, vars(args), f"edge {args.mode}", skip=RUN_PLACES)


def settings_from(args: argparse.Namespace) -> dict:
    names = (
        "task",
        "dataset",
        "data_root",
        "model",
        "partition",
        "alpha",
        "samples_per_device",
        "local_epochs",
        "batch_size",
        "lr",
        "prox_mu",
        "seed",
        "synthetic_train_size",
        "synthetic_test_size",
    )
    settings = {n: getattr(args, n) for n in names}
    settings["data_seed"] = args.seed
    return settings


def build_recipe(
    args: argparse.Namespace, output_dir: str | None, leaves_on_host: int | None = None
) -> DevsimEdgeRecipe:
    """The edge recipe for parsed flags; ValueError names the offending setting.

    ``leaves_on_host``: leaf processes sharing one machine's cores (default: all of them, as in `sim`).
    """
    return DevsimEdgeRecipe(
        settings=settings_from(args),
        num_leaf_nodes=args.num_leaf_nodes,
        devices_per_leaf=args.devices_per_leaf,
        num_versions=args.num_versions,
        device_selection_size=args.device_selection_size,
        mode=args.mode,
        buffer_size=args.buffer_size,
        global_lr=args.global_lr,
        staleness_weight=args.staleness_weight,
        **{name: getattr(args, name) for name in (*SERVER_OPTIMIZER_FLAGS, *SCREEN_FLAGS)},
        num_workers=args.num_workers,
        runner=args.runner,
        numpy_payloads=args.payloads == "numpy",
        leaves_on_host=args.num_leaf_nodes if leaves_on_host is None else leaves_on_host,
        update_interval=args.update_interval,
        update_timeout=args.update_timeout,
        eval_frequency=args.eval_frequency,
        output_dir=output_dir,
    )


def check_task_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Load and check the task here, before anything starts, and fit the data flags to it as the Collab jobs
    do (:func:`devsim.tasks.fit.fit_config`: ``--partition auto`` resolved; a natural partition sets
    ``--devices-per-leaf`` and ``--samples-per-device``); a bad task or flag ends the program naming it."""
    from devsim.tasks import TaskError, load_task
    from devsim.tasks.contract import is_file_spec
    from devsim.tasks.fit import fit_config

    if args.task and is_file_spec(args.task):
        args.task = os.path.abspath(args.task)
    names = ("task", "dataset", "data_root", "model", "partition", "alpha", "samples_per_device", "local_epochs")
    names += ("batch_size", "lr", "seed", "synthetic_train_size", "synthetic_test_size", "num_leaf_nodes")
    names += ("prox_mu", "global_lr", *SERVER_OPTIMIZER_FLAGS)
    try:
        config = SimulationConfig(
            **{n: getattr(args, n) for n in names},
            devices_per_leaf=args.devices_per_leaf,
            device_selection_size=1,
            data_seed=args.seed,
        ).validate()
        task = load_task(config.to_dict())
        config, notes = fit_config(config, task)
    except (ConfigError, TaskError) as error:
        parser.error(str(error))
    args.partition, args.devices_per_leaf = config.partition, config.devices_per_leaf
    args.samples_per_device = config.samples_per_device
    print(task.describe(), flush=True)
    for note in notes:
        print(note, flush=True)


def check_prod_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (naming the flag) a `prod` run without a usable startup kit."""
    if not args.startup_kit:
        parser.error("--startup-kit: --env prod needs the admin's startup kit folder")
    if not os.path.isdir(args.startup_kit):
        parser.error(f"--startup-kit: folder {args.startup_kit!r} does not exist")
    if args.job_timeout <= 0:
        parser.error(f"--job-timeout: must be > 0 seconds, got {args.job_timeout}")


def print_outcome(status: str, results_root: str, wall: float) -> int:
    """Print the final evaluation (accuracy, loss, the task's metrics) from the evaluator's newest results under
    ``results_root``."""
    path = find_results(results_root)
    if not path:
        print(f"job status {status}; no results under {results_root}", file=sys.stderr)
        return 1
    records = load_results(path)["records"]
    if not records:
        print(f"job status {status}; no evaluated versions in {path}", file=sys.stderr)
        return 1
    last = records[-1]
    gaps = [r["since_previous_s"] for r in records[1:]]
    per_version = sum(gaps) / len(gaps) if gaps else float("nan")
    first = format_metrics(records[0]["loss"], records[0]["metrics"])
    rejected = last.get("rejected_updates", 0)
    screened = f"; {rejected} device updates rejected by the leaves (see the lines above)" if rejected else ""
    print(
        f"job status {status}; final {format_metrics(last['loss'], last['metrics'])} at version {last['version']} "
        f"(initial {first}){screened}; {per_version:.2f}s per version; {wall:.1f}s wall; results: {path}"
    )
    return 0


def run_sim(recipe: DevsimEdgeRecipe, args: argparse.Namespace, output_dir: str | None) -> int:
    """Run (or, with --export, export) the job in NVFlare's simulator and print its outcome."""
    from nvflare.recipe import SimEnv

    from devsim_flare.recipe import apply_runtime_env_defaults, console_log_config

    apply_runtime_env_defaults()
    workspace = os.path.abspath(args.workspace)
    env = SimEnv(
        num_clients=args.num_leaf_nodes,
        num_threads=args.num_leaf_nodes,  # flat topology: every client a leaf, threads = clients
        workspace_root=workspace,
        log_config=console_log_config(args.log_level, workspace),
    )
    from devsim_flare.run_signals import StopOnSignals, remove_orphan_exchanges

    started = time.perf_counter()
    with StopOnSignals(output_dir, ask_server=False) as signals:
        try:
            run = recipe.execute(env)  # exports and exits instead when --export was given
        except RuntimeError:
            if signals.signum is None:
                raise
            run = None  # the simulator's processes were stopped on the signal
    remove_orphan_exchanges()
    if signals.signum is not None:
        return report_stop(signals, output_dir or workspace, time.perf_counter() - started)
    status = run.get_status() or "finished"  # SimEnv has no status; a failed simulation raised above
    return print_outcome(status, output_dir or workspace, time.perf_counter() - started)


def report_stop(signals, results_root: str, wall: float) -> int:
    """Print how a run stopped by a signal ended (its evaluated versions are in the results); returns 128 + the
    signal's number."""
    from devsim_flare.run_signals import signal_name

    name = signal_name(signals.signum)
    path = find_results(results_root)
    records = load_results(path)["records"] if path else []
    if records:
        last = records[-1]
        print(
            f"{name}: run stopped after {wall:.1f}s wall; {len(records)} evaluated versions, the last {last['version']}"
            f" ({format_metrics(last['loss'], last['metrics'])}); results: {path}",
            flush=True,
        )
    else:
        print(f"{name}: run stopped before its first evaluated version ({wall:.1f}s wall)", flush=True)
    return signals.exit_code


def run_prod(recipe: DevsimEdgeRecipe, args: argparse.Namespace, output_dir: str | None) -> int:
    """Submit the job to a running deployment, wait (bounded by --job-timeout) and print its outcome.

    The results are written on the server: they are printed when ``--output-dir`` is readable here
    (a deployment on this machine), otherwise the server's result folder is named.
    """
    from nvflare.recipe import ProdEnv

    from devsim_flare.execution import wait_for_job
    from devsim_flare.run_signals import StopOnSignals, signal_name

    user = {"username": args.username} if args.username else {}
    env = ProdEnv(startup_kit_location=os.path.abspath(args.startup_kit), login_timeout=30.0, **user)
    started = time.perf_counter()
    try:
        run = recipe.execute(env)
    except RuntimeError as error:
        print(f"error: {error}; is the deployment of --startup-kit {args.startup_kit} running?", file=sys.stderr)
        return 1
    print(f"submitted job {run.get_job_id()}; waiting up to {args.job_timeout:g}s", flush=True)
    with StopOnSignals(None) as signals:  # a signal aborts the job it submitted
        status, result = wait_for_job(run, args.job_timeout, stop_early=lambda: signals.signum is not None)
    wall = time.perf_counter() - started
    print(f"job status: {status}; server result folder: {result}")
    if signals.signum is not None:
        print(f"{signal_name(signals.signum)}: the job was aborted", flush=True)
        return signals.exit_code
    if output_dir and os.path.isdir(output_dir):
        outcome = print_outcome(status, output_dir, wall)
    else:
        outcome = 0
    return outcome if status == "FINISHED:COMPLETED" else 1


def main(argv: list[str] | None = None) -> int:
    resume_after_imports()  # the job script paused garbage collection for its imports
    parser = build_parser()
    args = parser.parse_args(argv)
    check_task_args(parser, args)
    if args.env == "prod":
        check_prod_args(parser, args)
    output_dir = os.path.abspath(args.output_dir) if args.output_dir else None
    try:
        recipe = build_recipe(args, output_dir, leaves_on_host=args.num_leaf_nodes if args.env == "sim" else 1)
    except ValueError as error:
        parser.error(str(error))
    note_job_accepted()  # a warm parent starts at the end of a cold command only once its flags have passed
    if args.check:
        print(checked_settings(parser, args), flush=True)
        return 0
    code = run_prod(recipe, args, output_dir) if args.env == "prod" else run_sim(recipe, args, output_dir)
    if code in signal_exit_codes():
        exit_now(code)  # every process the run started is stopped; skip the interpreter's teardown
    return code
