"""Compare arms over seeds: run each arm (a job and its flags) once per seed, then tabulate and plot the results.

python jobs/compare_runs.py --seeds 0,1,2 --out cmp \\
    --arm "FedAvg=" --arm "FedAdam=--server-optimizer adam --global-lr 0.01" --arm "FedProx=--prox-mu 0.01" \\
    -- --dataset digits --alpha 0.1 --num-rounds 20

An arm is ``NAME=[JOB:] FLAGS`` (JOB one of fedavg, fedbuff, fedrevive, cluster, edge; default fedavg); the flags after
``--`` go to every arm first, the arm's own after them (the last value of a flag wins), then ``--seed S`` and the
run's folder ``OUT/NAME/seed-S``. Runs go seed by seed (every arm on seed 0 first), ``--parallel`` at a time (default
1; each of them in its own NVFlare workspace under ``OUT``), each job's output in ``OUT/NAME/seed-S.log``. A finished
run with the same command is kept and a run stopped by a signal is resumed (``--resume``), so the same command
continues a comparison that was stopped, or extends it with more seeds or arms (``--rerun``: run everything again).
Ctrl-C or SIGTERM stops the running job as its own command would (its checkpoint and results are kept; with
``--parallel`` every running job) and ends the comparison. Before any run, each arm that has runs to do goes through
its job's own checks (``--check``): a refused flag ends the comparison at once, naming the arm.

Writes ``OUT/comparison.md`` (the table: mean ± sample std of the final accuracy, each seed's, each arm's paired
difference from the first arm; ``--metric``: accuracy by default, the loss or a task metric; with ``--target VALUE``
when each run first reached it), ``OUT/comparison.json`` and ``OUT/comparison.png``. Exit code 0: every run finished;
1: some failed (the table has the rest); 2: bad input, or a job refused its flags; 130 / 143: stopped by a signal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devsim.experiments.comparison import (  # noqa: E402
    ArmSummary,
    ComparisonError,
    check_flags,
    first_reaching,
    lower_is_better,
    markdown_table,
    pair_with_first,
    parse_arm,
    parse_seeds,
)
from devsim.observe.results import final_metric  # noqa: E402  (the repo root must be importable first)

JOBS_DIR = os.path.dirname(os.path.abspath(__file__))
CHECK_SECONDS = 600.0
"""How long one arm's ``--check`` may take (solving ``--dp-epsilon`` for an asynchronous job takes about 20 s)."""
STOP_WAIT_SECONDS = 60.0
"""How long a stopped job gets to write its results and end after the signal is passed on (then SIGKILL)."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    common = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--arm", action="append", required=True, metavar="NAME=[JOB:] FLAGS", help="an arm (repeat)")
    parser.add_argument("--seeds", default="0,1,2", help="seeds, as 0,1,2 or 0-4")
    parser.add_argument("--out", default="comparison", help="folder for the runs, the table and the plot")
    parser.add_argument("--run-timeout", type=float, default=3600.0, help="seconds a run may take before it is stopped")
    parser.add_argument("--rerun", action="store_true", help="run every arm and seed again, finished or not")
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        metavar="N",
        help="runs at once, each in its own workspace (for cores or a GPU that one run leaves idle)",
    )
    parser.add_argument("--title", default=None, help="the plot's title")
    parser.add_argument(
        "--metric",
        default="accuracy",
        help="what the table compares: accuracy, loss, or a metric of your task's metrics() (lower is better for "
        "names ending in loss, error, mae, mse, rmse or perplexity, unless --lower-is-better says otherwise)",
    )
    parser.add_argument(
        "--lower-is-better",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether a lower --metric is better (default: the task's LOWER_IS_BETTER, else read from its name)",
    )
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        metavar="VALUE",
        help="also tabulate when each run's --metric first reached VALUE: round or version, simulated seconds",
    )
    args = parser.parse_args(own)
    try:
        arms = [parse_arm(text) for text in args.arm]
        seeds = parse_seeds(args.seeds)
        check_flags(common, "the common flags (after --)")
        names = [arm.name for arm in arms]
        if len(set(names)) < len(names):
            raise ComparisonError(f"--arm: each arm needs its own name, got {', '.join(names)}")
        if args.target is not None and not math.isfinite(args.target):
            raise ComparisonError(f"--target: a finite number, got {args.target}")
        if not args.run_timeout > 0:
            raise ComparisonError(f"--run-timeout: must be > 0 seconds, got {args.run_timeout}")
        if args.parallel < 1:
            raise ComparisonError(f"--parallel: at least 1 run at a time, got {args.parallel}")
    except ComparisonError as error:
        parser.error(str(error))
    out = os.path.abspath(args.out)
    summaries = [ArmSummary(arm) for arm in arms]
    planned = [(seed, summary) for seed in seeds for summary in summaries]
    for arm in arms:  # every arm's flags through its job's own checks (--check) before anything runs
        if args.rerun or any(_kept(_command(arm, seed, common, out), arm, seed, out) is None for seed in seeds):
            refused = _refusal(_command(arm, seeds[0], common, out))
            if refused:
                print(f"{parser.prog}: error: --arm {arm.name}: {refused}", file=sys.stderr)
                return 2
    code = _run_all(planned, common, out, args)
    pair_with_first(summaries)
    _write(out, summaries, seeds, common, args)
    if code in (130, 143):
        print(f"stopped; the same command continues the comparison (finished runs are kept in {out})")
    return code


def _run_all(planned: list[tuple[int, ArmSummary]], common: list[str], out: str, args) -> int:
    """Run, resume or keep every planned run, ``args.parallel`` at a time, in order; the comparison's exit code (0;
    1: some run failed; 2: a job refused its flags; 130 / 143: stopped by a signal). After a refusal or a signal no
    further run starts, and the running ones are stopped as by that signal (a refusal: SIGINT), so that the same
    command resumes them."""
    jobs = _Jobs(args.run_timeout, args.parallel)
    code, queue, steps = 0, list(planned), {}
    with jobs.forwarding_signals():
        while queue or jobs.running:
            while queue and not (code in (2, 130, 143) or jobs.signal) and len(jobs.running) < args.parallel:
                seed, summary = queue.pop(0)
                step = f"[{len(planned) - len(queue)}/{len(planned)}]"
                launch, kept = _prepare(summary, seed, common, out, args, step)
                if kept is not None:  # finished earlier with the same command
                    code = code or _record(summary, seed, kept, args, step)
                    continue
                steps[jobs.start(launch, out)] = (summary, seed, step)
            for key, returncode in jobs.finished():
                summary, seed, step = steps.pop(key)
                outcome = _finish(summary, seed, returncode, args, step, out)
                if outcome == 2 and not jobs.signal:
                    jobs.stop_all(signal.SIGINT)
                code = outcome if outcome in (2, 130, 143) and code not in (2, 130, 143) else code or outcome
            time.sleep(0.05)
    return 128 + jobs.signal if jobs.signal and code not in (2, 130, 143) else code


def _run_dir(arm, seed: int, out: str) -> str:
    """The run folder of ``arm`` on ``seed`` (``OUT/NAME/seed-S``)."""
    return os.path.join(out, arm.name, f"seed-{seed}")


def _prepare(summary: ArmSummary, seed: int, common: list[str], out: str, args, step: str):
    """``(launch, None)``: what to launch for ``summary``'s arm on ``seed`` (``command``, ``log``, ``append``), its
    folder made ready and its command recorded; ``(None, results)`` when its finished run is kept."""
    arm = summary.arm
    run_dir = _run_dir(arm, seed, out)
    command = _command(arm, seed, common, out)
    record = run_dir + ".command.json"
    kept = None if args.rerun else _kept(command, arm, seed, out)
    if kept is not None:
        return None, kept
    same = not args.rerun and _read_json(record) == command
    how = "running"
    if same and _stopped_with_checkpoint(run_dir):  # stopped by a signal: the job continues it
        command, how = [*command[:2], "--resume", run_dir, "--workspace", os.path.join(out, "workspace")], "resuming"
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(os.path.dirname(run_dir), exist_ok=True)
        with open(record, "w", encoding="utf-8") as stream:
            json.dump(command, stream)
    log = run_dir + ".log"
    print(f"{step} {arm.name} seed {seed}: {how} {arm.job} (log: {os.path.relpath(log)})", flush=True)
    return {"command": command, "log": log, "append": how == "resuming"}, None


def _finish(summary: ArmSummary, seed: int, returncode: int, args, step: str, out: str) -> int:
    """Record a run that ended with ``returncode``; 0, or why it did not finish (see :func:`_run_all`)."""
    run_dir = _run_dir(summary.arm, seed, out)
    log = run_dir + ".log"
    results = _finished(run_dir) if returncode == 0 else None
    if returncode in (2, 130, 143):
        print(f"{step} {summary.arm.name} seed {seed}: {_last_lines(log)}", file=sys.stderr)
        return returncode
    if results is None:
        summary.failed.append(seed)
        print(f"{step} {summary.arm.name} seed {seed}: failed (exit {returncode}): {_last_lines(log)}")
        return 1
    return _record(summary, seed, results, args, step, kept=False)


def _record(summary: ArmSummary, seed: int, results: dict, args, step: str, kept: bool = True) -> int:
    """Take a finished run's figures into ``summary``; 0, or 1 when it lacks ``--metric``."""
    arm = summary.arm
    final = results["summary"]
    if args.lower_is_better is None and args.metric in (results.get("task") or {}).get("lower_is_better", ()):
        args.lower_is_better = True  # the task says so (LOWER_IS_BETTER), whatever the metric's name
    value = final_metric(final, args.metric)
    if value is None:
        summary.failed.append(seed)
        known = ", ".join(["loss", *sorted(final.get("final_metrics") or {})])
        print(f"{step} {arm.name} seed {seed}: the run has no final {args.metric!r} (--metric; it has {known})")
        return 1
    summary.final[seed] = value
    summary.loss[seed] = float(final.get("final_loss") or math.nan)
    summary.wall[seed] = float(final.get("wall_seconds") or 0.0)
    if args.target is not None:
        records = results.get("rounds") or []
        summary.reached[seed] = first_reaching(records, args.target, args.metric, args.lower_is_better)
    note = " (kept: finished earlier with the same command)" if kept else ""
    loss = f", loss {summary.loss[seed]:.4f}" if args.metric != "loss" else ""
    print(f"{step} {arm.name} seed {seed}: final {args.metric} {value:.4f}{loss}{note}", flush=True)
    return 0


def _command(arm, seed: int, common: list[str], out: str) -> list[str]:
    """The job command of ``arm`` on ``seed``: its job, the common flags, its own, the seed and its folders."""
    command = [sys.executable, os.path.join(JOBS_DIR, f"pt_job_{arm.job}.py"), *common, *arm.flags]
    run_dir = _run_dir(arm, seed, out)
    return [*command, "--seed", str(seed), "--output-dir", run_dir, "--workspace", os.path.join(out, "workspace")]


def _kept(command: list[str], arm, seed: int, out: str) -> dict | None:
    """The results of ``arm``'s run on ``seed`` when it finished earlier with ``command`` (it is kept, not run again),
    else None."""
    run_dir = _run_dir(arm, seed, out)
    if _read_json(run_dir + ".command.json") != command:
        return None
    return _finished(run_dir)


def _refusal(command: list[str]) -> str | None:
    """The job's one-line refusal of ``command``'s flags (``--check``: nothing runs), or None when they pass."""
    try:
        proc = subprocess.run([*command, "--check"], capture_output=True, text=True, timeout=CHECK_SECONDS)
    except subprocess.TimeoutExpired:
        return f"its job's --check did not end within {CHECK_SECONDS:g} s"
    if proc.returncode == 0:
        return None
    lines = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    return lines[-1] if lines else f"the job's check ended with exit code {proc.returncode}"


def _stopped_with_checkpoint(run_dir: str) -> bool:
    """Whether the run in ``run_dir`` was stopped by a signal after writing a checkpoint (``--resume`` continues it)."""
    results = _read_json(os.path.join(run_dir, "results.json")) or {}
    return bool(results.get("stopped")) and os.path.isfile(os.path.join(run_dir, "checkpoint.pt"))


class _Jobs:
    """Job commands running side by side, each in its own session and with its output in its own log.

    Slot ``k`` (the lowest free one when a job starts) runs in NVFlare workspace ``OUT/workspace`` (slot 0) or
    ``OUT/workspace-k``: two simulator runs of one job must not share a workspace. While :meth:`forwarding_signals`
    holds, SIGINT and SIGTERM are passed on to every running job (each stops its run as on a terminal) and the jobs
    end with 128 + the signal's number. After ``timeout`` seconds a job gets SIGTERM and ends with 1. A job still
    there :data:`STOP_WAIT_SECONDS` after either gets the signal again (its command then stops every process at
    once), and SIGKILL 10 s later."""

    def __init__(self, timeout: float, slots: int):
        self.timeout = timeout
        self.free = list(range(slots))
        self.running: dict[int, dict] = {}
        self.signal = 0
        self._keys = 0

    def start(self, launch: dict, out: str) -> int:
        """Start ``launch`` (see :func:`_prepare`) in a free slot; the key :meth:`finished` gives back with its code."""
        slot = self.free.pop(0)
        command = list(launch["command"])
        if slot:
            command[command.index("--workspace") + 1] = os.path.join(out, f"workspace-{slot}")
        log = open(launch["log"], "a" if launch["append"] else "w", encoding="utf-8")  # noqa: SIM115 - closed on end
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._keys += 1
        deadline = time.monotonic() + self.timeout
        self.running[self._keys] = dict(proc=proc, log=log, slot=slot, deadline=deadline, timed_out=False, again=False)
        return self._keys

    def stop_all(self, signum: int) -> None:
        """Pass ``signum`` on to every running job, which then has :data:`STOP_WAIT_SECONDS` to end."""
        for job in self.running.values():
            job["deadline"] = min(job["deadline"], time.monotonic() + STOP_WAIT_SECONDS)
            job["signal"] = signum
            if job["proc"].poll() is None:
                job["proc"].send_signal(signum)

    def finished(self) -> list[tuple[int, int]]:
        """The jobs that ended since the last call, with their codes; the overdue ones stopped on the way."""
        ended = []
        for key, job in list(self.running.items()):
            proc = job["proc"]
            if proc.poll() is None:
                if time.monotonic() > job["deadline"]:
                    self._overdue(job)
                continue
            job["log"].close()
            self.free = sorted([*self.free, job["slot"]])
            del self.running[key]
            stopped = job.get("signal", 0)
            ended.append((key, 128 + stopped if stopped else 1 if job["timed_out"] else proc.returncode))
        return ended

    def _overdue(self, job: dict) -> None:
        proc = job["proc"]
        if not (job.get("signal") or job["timed_out"]):
            print(f"\nrun timed out after {self.timeout:g} s (--run-timeout); stopping it", file=job["log"], flush=True)
            proc.send_signal(signal.SIGTERM)
            job.update(timed_out=True, deadline=time.monotonic() + STOP_WAIT_SECONDS)
        elif not job["again"]:
            proc.send_signal(job.get("signal") or signal.SIGTERM)
            job.update(again=True, deadline=time.monotonic() + 10.0)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    @contextlib.contextmanager
    def forwarding_signals(self):
        """SIGINT and SIGTERM stop every running job (:meth:`stop_all`) instead of this process."""

        def forward(signum: int, _frame) -> None:
            self.signal = self.signal or signum
            self.stop_all(signum)

        previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _finished(run_dir: str) -> dict | None:
    """The run's results when it finished (its summary written, not stopped by a signal), else None."""
    results = _read_json(os.path.join(run_dir, "results.json")) or {}
    return results if results.get("summary") and not results.get("stopped") else None


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)
    except (OSError, ValueError):
        return None


def _last_lines(log_path: str, count: int = 3) -> str:
    try:
        with open(log_path, encoding="utf-8", errors="replace") as stream:
            lines = [line.strip() for line in stream if line.strip()]
    except OSError:
        return "(no output)"
    return " | ".join(lines[-count:]) or "(no output)"


def _write(out: str, summaries: list[ArmSummary], seeds: list[int], common: list[str], args) -> None:
    """The table (printed and ``comparison.md``), ``comparison.json`` and, with finished runs, ``comparison.png``."""
    from devsim.observe.plots import PlotError, plot_comparison

    table = markdown_table(summaries, args.target, args.metric, args.lower_is_better)
    print(table)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "comparison.md"), "w", encoding="utf-8") as stream:
        stream.write(table + "\n")
    with open(os.path.join(out, "comparison.json"), "w", encoding="utf-8") as stream:
        document = {"seeds": seeds, "common_flags": common, "metric": args.metric, "target": args.target}
        document["lower_is_better"] = (
            lower_is_better(args.metric) if args.lower_is_better is None else args.lower_is_better
        )
        document["arms"] = [s.to_dict() for s in summaries]
        json.dump(document, stream, indent=1)
    finished = {s.arm.name: [_run_dir(s.arm, seed, out) for seed in sorted(s.final)] for s in summaries}
    try:
        print(f"wrote {plot_comparison(finished, os.path.join(out, 'comparison.png'), args.title, args.metric)}")
    except PlotError as error:
        print(f"no plot: {error}")
    except ImportError:
        print("no plot: matplotlib is not installed")


if __name__ == "__main__":
    sys.exit(main())
