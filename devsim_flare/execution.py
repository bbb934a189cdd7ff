"""Running a built job: export or execute it in its environment, retry the simulator's port race, wait for
POC and production jobs with a timeout, and print where the results are."""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from devsim.config import SimulationConfig
from devsim.observe.progress import format_metrics
from devsim.observe.results import failure_reason
from devsim.resources.gpu_placement import leaf_gpu_groups
from devsim_flare.launch.previous_run import clear_previous_run
from devsim_flare.recipe import build_env
from devsim_flare.run_signals import still_running  # noqa: F401  (imported from here by tests)

JOB_POLL_SECONDS = 2.0
END_GRACE_SECONDS = 60.0
STOP_POLL_SECONDS = 0.1
"""POC: how often (seconds) the job's wait loop looks for the server's ``stopped`` mark after a signal."""


def _summary_written(config: SimulationConfig, since: float = 0.0) -> bool:
    """Whether the server wrote its final summary into a local ``--output-dir`` at or after ``since`` (a
    ``time.time()`` stamp: a results file left there by an earlier run does not count)."""
    return bool(_results_fields(config, since).get("summary"))


def _run_ended(config: SimulationConfig, since: float = 0.0) -> bool:
    """Whether the server's results in a local ``--output-dir`` (written at or after ``since``) say the run is
    over: its summary, or ``stopped`` (a stop request, ``--stop-after-round``)."""
    fields = _results_fields(config, since)
    return bool(fields.get("summary") or fields.get("stopped"))


def _print_failure(config: SimulationConfig, since: float) -> bool:
    """Print why the server said its run failed (results.json's ``failed`` in a local ``--output-dir``, written at or
    after ``since``) with the resume hint; whether there was a reason to print."""
    reason = failure_reason(_results_fields(config, since))
    if reason:
        print(f"error: {reason}{_resume_hint(config.output_dir)}", file=sys.stderr)
    return bool(reason)


def _results_fields(config: SimulationConfig, since: float) -> dict:
    """results.json in a local ``--output-dir`` when written at or after ``since``; else {} (none, older, unread)."""
    path = os.path.join(config.output_dir or "", "results.json")
    try:
        if not config.output_dir or os.path.getmtime(path) < since:
            return {}
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)
    except (OSError, ValueError):
        return {}


def wait_for_job(
    run,
    timeout: float,
    server_done=lambda: False,
    poll_seconds: float = JOB_POLL_SECONDS,
    stop_early=lambda: False,
    detach=lambda: False,
    stopped=lambda: False,
) -> tuple[str | None, str | None]:
    """Wait for a POC/production job; returns (status, server result folder).

    NVFlare ends a job only once every site has ended it, so a job whose leaf died keeps RUNNING after
    the server has finished and written its results. When ``server_done()`` (the results are complete)
    and the job has not ended ``END_GRACE_SECONDS`` later, the job is aborted (the run itself is
    complete). Every wait is bounded by ``timeout`` seconds, after which the job is aborted too. When
    ``stop_early()`` is true before the server is done, the job is aborted at once. When ``detach()`` is true,
    the wait ends and the job is left running: (its status, None). When ``stopped()`` is true (checked every
    :data:`STOP_POLL_SECONDS` between the status polls), the wait ends at once with (last status, None), the job
    neither aborted nor waited for: the caller stops its processes.
    """
    deadline = time.monotonic() + timeout
    finished_at = None
    while time.monotonic() < deadline:
        status = run.get_status() or ""
        if status.startswith("FINISHED"):
            return status, run.get_result(timeout=60.0)
        if finished_at is None and server_done():
            finished_at = time.monotonic()
        if finished_at is None and stop_early():
            break
        if detach() or stopped():
            return status, None
        if finished_at is not None and time.monotonic() - finished_at > END_GRACE_SECONDS:
            print(
                f"the server finished and wrote its results, but the job is still {status} "
                f"{END_GRACE_SECONDS:g}s later (a leaf that died cannot end it); aborting the job"
            )
            break
        if _sleep_unless(poll_seconds, stopped):
            return status, None
    else:
        print(f"the job did not finish within --job-timeout {timeout:g}s; aborting it", file=sys.stderr)
    run.abort()
    result = run.get_result(timeout=60.0)
    return run.get_status(), result


def _sleep_unless(seconds: float, stopped) -> bool:
    """Sleep ``seconds`` in steps of :data:`STOP_POLL_SECONDS`; True (at once) when ``stopped()`` turns true."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if stopped():
            return True
        time.sleep(min(STOP_POLL_SECONDS, left))
    return False


SIM_EXIT_GRACE_SECONDS = 0.25
"""sim: seconds NVFlare's simulator gets to exit on its own once the server wrote its results, before it is
stopped: its processes otherwise sleep 3-5 s on the way out (a fixed shutdown grace in every process and a
2 s sleep at the end of each leaf process), which was most of the 5.6 s from the digits demo's last round to
the command's exit."""


SIM_STOP_SECONDS = 5.0
"""sim: seconds the stopped simulator processes get to exit after SIGTERM before SIGKILL."""


class SimExitWatcher:
    """sim: stops NVFlare's simulator processes (this process's descendants) :data:`SIM_EXIT_GRACE_SECONDS` after the
    server's results summary (or its ``stopped`` mark) appears, if they have not exited by then; SIGTERM, then SIGKILL
    :data:`SIM_STOP_SECONDS` later. A process that has exited counts as gone even while no one has reaped it
    (see :func:`still_running`)."""

    def __init__(self, config: SimulationConfig, poll_seconds: float = 0.1):
        self.config = config
        self.poll_seconds = poll_seconds
        self.started = time.time()
        self.stopped_it = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="sim-exit-watcher")

    def __enter__(self) -> SimExitWatcher:
        if self.config.output_dir:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10.0)

    def _watch(self) -> None:
        path = os.path.join(self.config.output_dir, "results.json")
        seen = None
        while not self._done.wait(self.poll_seconds):
            try:
                changed = os.path.getmtime(path)
            except OSError:
                continue
            if changed != seen:  # parse the file only when the server rewrote it (once a round)
                seen = changed
                if _run_ended(self.config, since=self.started):
                    break
        if self._done.wait(SIM_EXIT_GRACE_SECONDS):
            return
        from devsim_flare.run_signals import descendants, stop_processes

        children = descendants()
        if not children:
            return
        self.stopped_it.set()
        stop_processes(children, SIM_STOP_SECONDS, poll_seconds=self.poll_seconds / 2)


SIM_SYNC_TIMEOUT = 180.0  # sim: seconds the server waits for the leaf processes it started (see leaf_lost_its_port)
PORT_RACE = "Address already in use"


def leaf_lost_its_port(nvflare_root: str, within_s: float) -> bool:
    """Whether a simulated leaf process died at start because its port was taken: NVFlare's simulator picks a
    free port for each leaf worker, closes it and has the new process bind it a second or two later; another
    socket on the host can take it in between (seen once in four full test runs here, with 6 leaves). The
    server then waits ``SIM_SYNC_TIMEOUT`` for the leaf and fails the job; the same job run again succeeds.
    Looks for the error in the sites' ``error_log.txt`` files written in the last ``within_s`` seconds."""
    since = time.time() - within_s
    for path in glob.glob(os.path.join(nvflare_root, "*", "site-*", "error_log.txt")):
        if os.path.getmtime(path) >= since:
            with open(path, encoding="utf-8", errors="replace") as stream:
                if PORT_RACE in stream.read():
                    return True
    return False


def run_recipe(
    make_recipe: Callable[..., Any],
    args: argparse.Namespace,
    config: SimulationConfig,
    gpu_ids: tuple[int, ...] = (),
) -> int:
    """Export or run the recipe ``make_recipe()`` builds in the chosen environment; prints where results are.
    Returns an exit code. A second attempt (see :func:`leaf_lost_its_port`) builds a new recipe: NVFlare's job
    object cannot run twice. ``prod`` runs through :func:`devsim_flare.deployment.prod_run.run_on_deployment`."""
    workspace = os.path.abspath(args.workspace)
    env = build_env(
        args.env,
        config.num_leaf_nodes,
        os.path.join(workspace, "nvflare"),
        log_level=args.log_level,
        gpu_groups=leaf_gpu_groups(gpu_ids, config.num_leaf_nodes) if gpu_ids else None,
    )
    from devsim_flare.deployment.poc import services_stopped_at_exit
    from devsim_flare.run_signals import StopOnSignals, processes_under, remove_orphan_exchanges

    # poc: the services' processes are not descendants of this one (see processes_under); they are stopped here,
    # not through NVFlare's shutdown of the POC system
    poc_root = os.environ.get("NVFLARE_POC_WORKSPACE") if args.env == "poc" else None
    processes = (lambda: processes_under(poc_root)) if poc_root else None
    since = time.time()

    def recorded() -> bool:  # before a round: nothing to save
        return bool(_results_fields(config, since).get("rounds"))

    ended = functools.partial(_run_ended, config, since)
    stopper = StopOnSignals(config.output_dir, server_stopped=ended, processes=processes, ask_server=recorded)
    with services_stopped_at_exit(poc_root), stopper as signals:
        code = _run_attempts(make_recipe, args, config, env, workspace, signals)
    remove_orphan_exchanges()
    if signals.signum is not None:
        return _report_stop(config, signals)
    return code


def _report_stop(config: SimulationConfig, signals) -> int:
    """Print how a run stopped by a signal ended and how to continue it; returns 128 + the signal's number."""
    import signal as signal_module

    from devsim.observe.checkpoint import CHECKPOINT_NAME

    name = signal_module.Signals(signals.signum).name
    folder = config.output_dir or "?"
    try:
        from devsim.observe.results import load_results

        results = load_results(folder)
    except (OSError, ValueError):
        results = {}
    rounds = len(results.get("rounds", []))
    if results.get("summary"):
        print(f"{name}: the run had already finished; results: {os.path.join(folder, 'results.json')}")
    elif os.path.isfile(os.path.join(folder, CHECKPOINT_NAME)):
        print(
            f"{name}: run stopped with {rounds} records in {os.path.join(folder, 'results.json')}; continue with "
            f"--resume {folder}",
            flush=True,
        )
    else:
        print(f"{name}: run stopped before its first checkpoint; nothing to resume in {folder}", flush=True)
    return signals.exit_code


def _run_attempts(make_recipe, args, config: SimulationConfig, env, workspace: str, signals) -> int:
    """Execute the job (twice in sim when a leaf lost its port at start); wait for it outside sim; report."""
    from devsim_flare.run_signals import StartInterrupted

    attempts = 2 if args.env == "sim" else 1
    for attempt in range(1, attempts + 1):
        started, submitted = time.perf_counter(), time.time()
        try:
            if args.env == "sim":
                recipe = make_recipe()
                clear_previous_run(recipe, env, workspace)  # NVFlare would delete it on the way to the first round
                with SimExitWatcher(config) as watcher:
                    try:
                        run = recipe.execute(env)
                    except RuntimeError:
                        if not (watcher.stopped_it.is_set() or signals.forced.is_set()):
                            raise
                        run = None  # stopped on purpose once the results were complete, or on a signal
            else:
                try:
                    with signals.starting():  # poc: a signal ends the start at once (StartInterrupted)
                        run = make_recipe().execute(env)
                except StartInterrupted:
                    return signals.exit_code  # run_recipe stops the services and reports
                except Exception:  # poc: a signal while the system starts (its services were stopped under it)
                    if signals.signum is None:
                        raise
                    return signals.exit_code  # reported by run_recipe
            break
        except RuntimeError as error:
            if signals.signum is not None:
                return 1
            if attempt < attempts and leaf_lost_its_port(os.path.join(workspace, "nvflare"), time.time() - started):
                print(
                    "warning: NVFlare's simulator started a leaf on a port that another process took in the meantime "
                    "(Address already in use, in a site's error_log.txt); running the job again",
                    file=sys.stderr,
                )
                continue
            if not _print_failure(config, submitted):
                print(
                    f"error: the job failed ({error}). The server's reason is in the ERROR lines above; "
                    f"partial results, if any, are in {config.output_dir or workspace}",
                    file=sys.stderr,
                )
            return 1
    if args.env != "sim":

        def stopped() -> bool:  # a signal, and the server stopped at a checkpoint (or its grace period ran out)
            return signals.signum is not None and (signals.forced.is_set() or _run_ended(config, since=submitted))

        from devsim_flare.deployment.poc import BackgroundStatus

        followed = BackgroundStatus(run, poc_root=os.environ.get("NVFLARE_POC_WORKSPACE"), output_dir=config.output_dir)
        status, result = wait_for_job(
            followed, args.job_timeout, lambda: _run_ended(config, since=submitted), stopped=stopped
        )
        if signals.signum is not None:
            signals.stop_now()  # the POC services: NVFlare's own shutdown of them takes ~30 s
            return signals.exit_code  # reported by run_recipe
        print(f"job status: {status}; server result folder: {result}")
        if followed.failed_by_leaf and not _summary_written(config, since=submitted):
            print(f"error: {followed.failed_by_leaf}{_resume_hint(config.output_dir)}", file=sys.stderr)
            return 1
        if result is None and not _summary_written(config, since=submitted):
            _print_failure(config, submitted)
            return 1
    if signals.signum is not None:
        return signals.exit_code  # reported by run_recipe
    return report_results(config, config.output_dir, started, args.env == "sim", workspace)


def _resume_hint(output_dir: str | None) -> str:
    """``; continue with --resume DIR`` where the run left a checkpoint, else where its rounds are."""
    from devsim.observe.checkpoint import CHECKPOINT_NAME

    if output_dir and os.path.isfile(os.path.join(output_dir, CHECKPOINT_NAME)):
        return f"; continue with --resume {output_dir}"
    return f"; the rounds so far are in {output_dir}, no checkpoint yet to resume from" if output_dir else ""


def report_results(
    config: SimulationConfig, results_dir: str | None, started: float, simulated: bool, workspace: str
) -> int:
    """Print the final line of the run whose results are in ``results_dir`` and its start-up summary; returns
    the exit code (1 when the run did not finish)."""
    summary_path = os.path.join(results_dir or "", "results.json")
    if results_dir and os.path.isfile(summary_path):
        from devsim.observe.results import load_results

        results = load_results(results_dir)
        summary = results["summary"]
        startup = _record_exit(summary_path, results)
        stop = config.stop_after_round or getattr(config, "stop_after_version", None)
        if not summary and stop:
            print(f"stopped after {stop}; continue with --resume {results_dir}")
            return 0
        if not summary:
            failed = f"error: {reason}; " if (reason := failure_reason(results)) else ""
            print(f"{failed}run did not finish; partial results in {summary_path}", file=sys.stderr)
            return 1
        progress = (
            f"{summary['rounds']} rounds"
            if "rounds" in summary
            else f"{summary['versions']} versions, simulated time {summary['simulated_time']:.1f}s"
        )
        figures = (
            format_metrics(summary["final_loss"], summary.get("final_metrics") or {})
            if summary.get("final_loss") is not None
            else "(no evaluation)"
        )
        print(f"final {figures} after {progress} ({time.perf_counter() - started:.1f}s wall); results: {summary_path}")
        if startup:
            print(startup)
        return 0
    if simulated:
        print(f"no results file at {summary_path}; see the NVFlare logs under {workspace}", file=sys.stderr)
        return 1
    return 0


def _record_exit(path: str, results: dict) -> str:
    """Add the command's exit to the results' ``startup`` section (see :mod:`devsim.observe.startup`) and return
    a one-line start-up summary ('' when the server wrote no start-up stamps)."""
    from devsim.observe.startup import add_exit, summary_line
    from devsim_flare.launch.warm_parent import CHILD_ENV

    if "startup" not in results or not results.get("summary"):
        return ""
    warm = bool(os.environ.get(CHILD_ENV))  # this command was forked by a warm parent
    results["startup"] = {**add_exit(results["startup"], time.time()), "warm_parent": warm}
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(results, stream, indent=1)
    return summary_line(results["startup"]["seconds"], warm)
