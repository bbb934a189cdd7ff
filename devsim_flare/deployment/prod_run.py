"""``--env prod``: submit a job to a running deployment, follow it, download its results, and take back a leaf
that comes back during a synchronous run by resubmitting the run from its last checkpoint."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from devsim.config import SimulationConfig
from devsim.observe.checkpoint import CARRIED_RUN_FOLDER, CHECKPOINT_NAME, records_counted
from devsim_flare.deployment.prod_job import (
    LOGIN_TIMEOUT_SECONDS,
    ProdJob,
    check_deployment,
    copy_run_folder,
    read_admin_kit,
)
from devsim_flare.deployment.workspace import DeploymentError
from devsim_flare.execution import report_results, wait_for_job
from devsim_flare.run_signals import StopOnSignals

PROD_POLL_SECONDS = 1.0
"""prod: one job-status and one results.json read through the admin session a second."""
MAX_RESUBMISSIONS = 5
"""How many times one command resubmits its run to take back leaves that came back (a bound on a flapping leaf)."""


def run_on_deployment(
    make_recipe: Callable[..., Any], args: argparse.Namespace, config: SimulationConfig, download_dir: str
) -> int:
    """Check the deployment answers with ``--num-leaf-nodes`` leaves (seconds), submit the job built by
    ``make_recipe(config)`` as the startup kit's admin, print the server's rounds as they come, wait up to
    ``--job-timeout``, and download the server's run folder into ``download_dir``.

    A synchronous run that lost a leaf goes on without it. When that leaf's client connects again (its host was
    restarted), NVFlare cannot start the running job there, so the job is aborted and submitted again to
    continue from its last checkpoint (carried in the new job) with every leaf; rounds after the checkpoint are
    trained again. Ctrl-C or SIGTERM aborts the job (``--leave-job-running``: leaves it running), downloads
    what the server wrote and returns 128 + the signal's number; otherwise returns the exit code.
    """
    from nvflare.recipe import ProdEnv

    kit = read_admin_kit(args.startup_kit)
    try:
        leaves = check_deployment(kit, config.num_leaf_nodes)
    except DeploymentError as error:
        print(f"error: --env prod: {error}", file=sys.stderr)
        return 1
    env = ProdEnv(startup_kit_location=kit.folder, username=kit.username, login_timeout=LOGIN_TIMEOUT_SECONDS)
    with StopOnSignals(None) as signals:
        code = _submit_and_follow(make_recipe, args, config, download_dir, kit, leaves, env, signals)
    if signals.signum is None:
        return code
    from devsim_flare.run_signals import signal_name

    name = signal_name(signals.signum)
    if getattr(args, "leave_job_running", False):
        print(f"{name}: stopped following the job; it goes on running on the deployment", flush=True)
    else:
        print(f"{name}: the job was aborted; what the server had written is in {download_dir}", flush=True)
    return signals.exit_code


def _submit_and_follow(make_recipe, args, config, download_dir: str, kit, leaves, env, signals) -> int:
    """Submit the run (again, to take back leaves that came back), follow it, download it; see
    :func:`run_on_deployment`. A signal (``signals.signum``) aborts the job, or with ``--leave-job-running``
    leaves it running, and ends the loop."""
    leave_running = bool(getattr(args, "leave_job_running", False))
    started = time.perf_counter()
    deadline = time.monotonic() + args.job_timeout
    run_config, checkpoint, resumed_rounds = config, None, 0
    for attempt in range(MAX_RESUBMISSIONS + 1):
        recipe = make_recipe(run_config)
        recipe.carried_checkpoint = checkpoint
        with contextlib.redirect_stdout(io.StringIO()):  # NVFlare's "Connecting to FLARE", "Submitted job" lines
            job_id = recipe.execute(env).get_job_id()
        print(
            f"submitted job {job_id} to {kit.host}:{kit.port} as {kit.username} ({len(leaves)} leaves: "
            f"{', '.join(leaves)}); results will be downloaded into {download_dir}",
            flush=True,
        )
        job = ProdJob(kit, job_id, printer=lambda line: print(line, flush=True))
        job.shown = resumed_rounds  # a resubmitted run starts with the checkpoint's records: shown already
        returned: list[str] = []

        def leaves_came_back(job=job, returned=returned, may_resubmit=attempt < MAX_RESUBMISSIONS) -> bool:
            if signals.signum is not None:
                return not leave_running  # abort the job on a signal
            if may_resubmit and job.synchronous:
                returned[:] = job.returned_leaves()
            return bool(returned)

        try:
            status, result = wait_for_job(
                job,
                max(1.0, deadline - time.monotonic()),
                job.poll,
                poll_seconds=PROD_POLL_SECONDS,
                stop_early=leaves_came_back,
                detach=lambda: leave_running and signals.signum is not None,
            )
            job.poll()
        finally:
            job.close()
        print(f"job {job_id} status: {status}", flush=True)
        if signals.signum is not None:
            if result is not None:
                copy_run_folder(result, download_dir)
            return 1
        if not copy_run_folder(result, download_dir):
            if not returned:
                print(
                    f"error: the result of job {job_id} ({result}) holds no run folder with results.json",
                    file=sys.stderr,
                )
                return 1
        if not returned:
            break
        saved = os.path.join(download_dir, CHECKPOINT_NAME)
        checkpoint = saved if os.path.isfile(saved) else None
        run_config = dataclasses.replace(config, resume_from=CARRIED_RUN_FOLDER) if checkpoint else config
        resumed_rounds = records_in(checkpoint)
        restart = f"from its checkpoint after round {resumed_rounds}" if checkpoint else "from the start"
        print(
            f"{', '.join(returned)} answers again after the run dropped it; NVFlare cannot start a running job on a "
            f"client that comes back, so job {job_id} was aborted and the run goes on {restart} in a new job with "
            "every leaf",
            flush=True,
        )
    return report_results(config, download_dir, started, False, args.workspace)


def records_in(checkpoint: str | None) -> int:
    """How many round records a synchronous run's checkpoint counts (0 without one)."""
    return 0 if checkpoint is None else records_counted(checkpoint)
