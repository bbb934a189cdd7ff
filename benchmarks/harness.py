"""The benchmark harness: launch a job, read its results, record the machine and load, write figures JSON.

Every benchmark script holds only its measurement and goes through this module for the rest: ``run_job`` (a job of
``jobs/`` in its own process group, its ``results.json`` with wall and first-round seconds), ``run_isolated`` (the
same for any command: every process it started is gone when it returns; NVFlare's simulator starts its leaves in
new sessions, so they are tracked by pid and creation time), ``run_command`` and ``run_child`` (a command to its
end), ``arguments``/``items``/``baseline`` (a script's flags), ``alternate`` (settings side by side, in turn),
``print_table``, and ``Session`` (the date, load and command line of one invocation; ``figure`` and ``write``
produce ``benchmarks/results/<benchmark>-<date>.json``, from which ``scripts/benchmark_table.py`` builds the README
table; ``DEVSIM_BENCHMARK_RESULTS=DIR``: under DIR instead, for a trial run that publishes nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

K = TypeVar("K")
T = TypeVar("T")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.environ.get("DEVSIM_BENCHMARK_RESULTS") or os.path.join(REPO, "benchmarks", "results")
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # a job's processes on one thread each
FIRST_PROGRESS = re.compile(r"^(?:\[[^\]]*\] )?(round|version) 1[/ ]")
WORKERS_LINE = re.compile(r"^\[(site-\d+)\] workers=\d+ |^\[server\] FedAvg's arithmetic in ")  # plans at start
WARM_PARENT_MODULE = "devsim_flare.launch.warm_parent"  # in the command line of a warm parent (python -m ...)


def load() -> str:
    """The 1, 5 and 15 minute load averages now ("n/a" where /proc/loadavg cannot be read)."""
    try:
        with open("/proc/loadavg", encoding="utf-8") as stream:
            return " ".join(stream.read().split()[:3])
    except OSError:
        return "n/a"


def machine(start: str | None = None) -> str:
    """This machine in a few words: cores and the load average now (after ``start``, the load read at the
    run's start, when given)."""
    now = load()
    return f"{os.cpu_count()} cores, load {now if start is None else f'{start} -> {now}'}"


def invocation(
    env: tuple[str, ...] = ("OMP_NUM_THREADS",), script: str | None = None, argv: list[str] | None = None
) -> str:
    """The command line that runs this script, as a figure's command: those of ``env`` that are set, then
    ``.venv/bin/python``, the script's path from the repository root and its arguments, shell-quoted (``script``
    and ``argv``: a ``main(argv)`` called from Python; default ``sys.argv``)."""
    script = os.path.relpath(os.path.abspath(script or sys.argv[0]), REPO)
    prefix = [f"{name}={shlex.quote(os.environ[name])}" for name in env if name in os.environ]
    return " ".join([*prefix, ".venv/bin/python", shlex.join([script, *(sys.argv[1:] if argv is None else argv)])])


def _line_buffered() -> None:
    """This process's output line-buffered from here on: a benchmark's progress shows as it happens, also through a
    pipe (a stream without ``reconfigure``, e.g. a test's capture, is left as it is)."""
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)


def print_table(columns: list[str], rows: list[list[Any]]) -> None:
    """Print a Markdown table: ``columns`` as its header, then one line per row (cells as ``str`` gives them)."""
    for cells in (columns, ["---"] * len(columns), *rows):
        print_row(cells)


def print_row(cells: list[Any]) -> None:
    """Print one row of a Markdown table (a table's rows printed as they come, after ``print_table(columns, [])``)."""
    print("| " + " | ".join(map(str, cells)) + " |", flush=True)


def arguments(
    doc: str, json_help: str = "write the figures under benchmarks/results/", json_path: str = ""
) -> argparse.ArgumentParser:
    """A benchmark's argument parser: ``doc`` (its module docstring) as the help text, and its ``--json`` flag (with
    ``json_path``, a metavar: ``--json [PATH]``, "" without PATH, None without the flag); from here on this process's
    output is line-buffered (progress shows as it happens, also through a pipe)."""
    _line_buffered()
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if json_path:
        parser.add_argument("--json", nargs="?", const="", metavar=json_path, help=json_help)
    else:
        parser.add_argument("--json", action="store_true", help=json_help)
    return parser


def items(parser: argparse.ArgumentParser, flag: str, text: str, kind: Callable[[str], T] = str, allowed=()) -> list:
    """The values of a comma-list flag, each ``kind(value)``; a one-line parser error naming ``flag`` (and the
    ``allowed`` values, when given) for an empty list or a value that is not one of them."""
    try:
        values = [kind(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        parser.error(f"{flag}: {text!r} is not a comma list{'' if kind is str else f' of {kind.__name__} values'}")
    if bad := [v for v in values if allowed and v not in allowed]:
        parser.error(f"{flag}: {', '.join(map(str, bad))} not allowed; allowed: {', '.join(map(str, allowed))}")
    return values


def best_accuracy(results: dict[str, Any]) -> float:
    """The best accuracy of a job's evaluated rounds (its results.json)."""
    return max(r["accuracy"] for r in results["rounds"] if "accuracy" in r)


def short_commit(tree: str = REPO) -> str:
    """The short commit checked out in ``tree`` (default this checkout); "" when git cannot say."""
    try:
        proc = subprocess.run(
            ["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip()


def alternate(
    arms: dict[K, Callable[[], T]], rounds: int, done: Callable[[int, K, T], None] | None = None
) -> dict[K, list[T]]:
    """Side by side: each arm once per round, the arms in turn (A B A B ...), so that every arm sees the same load
    on a shared machine; arm -> its results in round order. ``done(round, arm, result)`` after each run."""
    runs: dict[K, list[T]] = {name: [] for name in arms}
    for index in range(rounds):
        for name, measure in arms.items():
            runs[name].append(measure())
            if done is not None:
                done(index, name, runs[name][-1])
    return runs


def commit_of(rev: str) -> str | None:
    """The short commit ``rev`` names in this repository, or None when it names none."""
    proc = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--short", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return proc.stdout.strip() or None


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[str]:
    """A temporary git worktree of ``rev`` (a baseline checkout to measure side by side with this one), removed
    when the block ends."""
    folder = tempfile.mkdtemp(prefix="devsim-baseline-")
    git = ["git", "-C", REPO, "worktree"]
    subprocess.run([*git, "add", "--detach", folder, rev], check=True, capture_output=True, timeout=300)
    try:
        yield folder
    finally:
        subprocess.run([*git, "remove", "--force", folder], capture_output=True, timeout=300)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def baseline(parser: argparse.ArgumentParser, rev: str | None) -> Iterator[tuple[str | None, str | None]]:
    """``--baseline-commit rev`` for a block: (its short commit, a temporary worktree of it), (None, None) without
    ``rev``; a one-line parser error when ``rev`` names no commit of this repository."""
    if not rev:
        yield None, None
        return
    commit = commit_of(rev)
    if commit is None:
        parser.error(f"--baseline-commit: {rev!r} names no commit of this repository")
    with worktree(commit) as folder:
        yield commit, folder


class Session:
    """One benchmark invocation: ``date``, ``load_start`` and ``command`` (this script's command line, with those of
    ``env`` that are set in front) are read when it is made; ``figure`` stamps a figure with them and the load now,
    ``write`` writes the results JSON."""

    def __init__(
        self,
        benchmark: str,
        script: str | None = None,
        argv: list[str] | None = None,
        env: tuple[str, ...] = ("OMP_NUM_THREADS",),
    ):
        _line_buffered()
        self.benchmark = benchmark
        self.date = time.strftime("%Y-%m-%d")
        self.load_start = load()
        self.command = invocation(env, script, argv)
        self.started = time.perf_counter()

    def where(self) -> str:
        """Cores and the load at the start and now."""
        return machine(self.load_start)

    def figure(self, name: str, value: str, target: str, command: str | None = None) -> dict[str, str]:
        """One published figure of this invocation (every field a short string; its command unless ``command``)."""
        return {
            "figure": name,
            "value": value,
            "target": target,
            "command": command or self.command,
            "date": self.date,
            "machine": self.where(),
        }

    def write(self, payload: dict[str, Any], figures: list[dict[str, str]], path: str = "") -> str:
        """Write ``payload`` with ``load_start``, the ``figures``, the date, time written, machine and commit to
        ``path`` (default ``benchmarks/results/<benchmark>-<date>.json``, or ``...-<date>-N.json`` when an earlier
        run of the day has that name: it is kept, and the table takes the newest) and print where; returns the path."""
        if not path:
            os.makedirs(RESULTS, exist_ok=True)
            path, n = os.path.join(RESULTS, f"{self.benchmark}-{self.date}.json"), 1
            while os.path.exists(path):
                n += 1
                path = os.path.join(RESULTS, f"{self.benchmark}-{self.date}-{n}.json")
        document = {"date": self.date, "written": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine()}
        document.update(commit=short_commit(), load_start=self.load_start)
        with open(path, "w", encoding="utf-8") as stream:
            json.dump({**document, **payload, "figures": figures}, stream, indent=1)
        print(f"wrote {path}", flush=True)
        return path


def run_command(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None, cwd: str = REPO, name: str = ""
) -> tuple[float, str]:
    """Run ``cmd`` (environment ``env``, default this one's) to its end: (wall seconds, its stdout). RuntimeError
    naming it (``name``, default the command line) with the tail of its output when it exits non-zero."""
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        output = f"{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        raise RuntimeError(f"{name or shlex.join(cmd)} exited {proc.returncode}:\n{output}")
    return time.perf_counter() - started, proc.stdout


def run_child(
    script: str, args: list[str], timeout: float = 1800.0, env: dict[str, str] | None = None, cwd: str = REPO
) -> Any:
    """Run ``script`` (a path) with ``args`` in a fresh Python process (:func:`run_command`) and return the JSON its
    last line of output holds: a measurement kept apart from this process's imports and memory."""
    name = f"{os.path.basename(script)} {shlex.join(args)}"
    _, stdout = run_command([sys.executable, script, *args], timeout, env, cwd, name)
    return json.loads(stdout.strip().splitlines()[-1])


def read_results(folder: str, name: str = "results.json") -> dict[str, Any] | None:
    """``folder/name``, else the first file called ``name`` (in path order) anywhere under ``folder``, parsed; None
    when there is none."""
    top = os.path.join(folder, name)
    found = [top] if os.path.isfile(top) else sorted(glob.glob(os.path.join(folder, "**", name), recursive=True))
    if not found:
        return None
    with open(found[0], encoding="utf-8") as stream:
        return json.load(stream)


def _descendants(pid: int) -> dict[int, Any]:
    """pid -> ``psutil.Process`` of every live descendant of ``pid`` (psutil never signals a recycled pid)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        return {child.pid: child for child in psutil.Process(pid).children(recursive=True)}
    return {}


def _kill_tracked(tracked: dict[int, Any], spare_warm_parents: bool = False) -> None:
    """SIGKILL each tracked process that still runs and wait for it; with ``spare_warm_parents`` not the warm
    parents a job command started (their caller stops them)."""
    import psutil

    from devsim_flare.run_signals import stop_processes

    doomed = []
    for process in tracked.values():
        with contextlib.suppress(psutil.Error):
            if not (spare_warm_parents and WARM_PARENT_MODULE in process.cmdline()):
                doomed.append(process)
    stop_processes(doomed, term_seconds=0)


def _freeze_group(pgid: int, sig: int) -> None:
    """Send ``sig`` (SIGSTOP or SIGCONT) to process group ``pgid``, if it is still there."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, then SIGKILL it when it has not exited within 10 s."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_isolated(
    cmd: list[str],
    workdir: str,
    timeout: float,
    log_name: str = "job.log",
    env: dict[str, str] | None = None,
    cwd: str = REPO,
    watch: Callable[[str, float], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    own_home: bool = True,
) -> tuple[int | None, float, str]:
    """Run ``cmd`` in its own process group with HOME inside ``workdir`` unless ``env`` names one (``env`` added to
    this environment), its output (stdout and stderr) to ``workdir/log_name``. Without a ``DEVSIM_CACHE_DIR`` in
    ``env`` the command also gets ``DEVSIM_WARM=0`` (its cache folder would lie in the throwaway HOME, so a warm
    parent started there would serve no later run); with one, a warm parent the command starts is left to the
    caller (``devsim_flare.launch.warm_parent.stop_parents``). ``own_home=False``: neither, the command keeps this
    environment's HOME and DEVSIM_WARM. ``watch(line, seconds since launch)`` sees each output line as it comes,
    ``on_start(pid)`` the command's process id once it runs. Returns (exit code, negative for a signal, None on
    timeout; wall seconds; the output's last 4,000 characters). Every process it started is gone when this
    returns."""
    home = {"HOME": os.path.join(workdir, "home")} if own_home else {}
    for folder in home.values():
        os.makedirs(folder, exist_ok=True)
    full_env = {**os.environ, **home, "PYTHONUNBUFFERED": "1", **(env or {})}
    caller_keeps_warm_parents = "DEVSIM_CACHE_DIR" in (env or {})
    if own_home and not caller_keeps_warm_parents:
        full_env.setdefault("DEVSIM_WARM", "0")
    started = time.perf_counter()
    tracked: dict[int, Any] = {}
    tail: deque[str] = deque(maxlen=200)
    with open(os.path.join(workdir, log_name), "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            cmd,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
            cwd=cwd,
        )

        def pump() -> None:
            for line in proc.stdout:
                tail.append(line)
                if log.closed:  # a process that outlived the wait still writes: keep only the tail
                    continue
                log.write(line)
                if watch is not None:
                    watch(line.rstrip("\n"), time.perf_counter() - started)

        if on_start is not None:
            on_start(proc.pid)
        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        rc = None
        try:
            while time.perf_counter() - started < timeout:
                tracked.update(_descendants(proc.pid))
                try:
                    rc = proc.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    continue
        finally:
            if rc is None:
                _freeze_group(proc.pid, signal.SIGSTOP)  # a stopped group starts nothing between the scan and the kill
                tracked.update(_descendants(proc.pid))
                _freeze_group(proc.pid, signal.SIGCONT)
                _stop_group(proc)
            _kill_tracked(tracked, spare_warm_parents=caller_keeps_warm_parents)
            reader.join(timeout=10)
    return rc, time.perf_counter() - started, "".join(tail)[-4000:]


def run_job(
    script: str,
    flags: list[str],
    workdir: str = "",
    name: str = "run",
    timeout: float = 3600.0,
    env: dict[str, str] | None = None,
    tree: str = REPO,
    watch: Callable[[str, float], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run ``jobs/<script>`` of ``tree`` with ``flags`` (workspace and output folder under ``workdir/name``; default
    a temporary folder, removed after; ``watch`` and ``on_start`` as for ``run_isolated``) and return its
    ``results.json`` plus ``wall`` (seconds, launch to exit), ``first_round`` (seconds to the first ``round 1`` or
    ``version 1`` progress line, None when none was printed) and ``worker_lines`` (each leaf's ``[site-N]
    workers=...`` plan line, sorted); RuntimeError with the output's tail when it fails or times out."""
    if not workdir:
        with tempfile.TemporaryDirectory(prefix="devsim-bench-") as scratch:
            return run_job(script, flags, scratch, name, timeout, env, tree, watch, on_start)
    folder = os.path.join(workdir, name)
    out = os.path.join(folder, "out")
    cmd = [sys.executable, os.path.join(tree, "jobs", script), *flags]
    cmd += ["--workspace", os.path.join(folder, "ws"), "--output-dir", out]
    first: list[float] = []
    workers: list[str] = []

    def seen(line: str, seconds: float) -> None:
        if not first and FIRST_PROGRESS.match(line):
            first.append(seconds)
        if WORKERS_LINE.match(line):
            workers.append(line)
        if watch is not None:
            watch(line, seconds)

    os.makedirs(folder, exist_ok=True)
    rc, wall, tail = run_isolated(cmd, folder, timeout, env=env, cwd=tree, watch=seen, on_start=on_start)
    results = read_results(out) if rc == 0 else None
    if results is None:
        status = "timed out" if rc is None else f"exited {rc}"
        raise RuntimeError(f"{script} {shlex.join(flags)} {status} after {wall:.0f} s:\n{tail}")
    results["wall"] = wall
    results["first_round"] = first[0] if first else None
    results["worker_lines"] = sorted(workers)
    return results


def run_jobs(
    jobs: dict[str, tuple[str, list[str]]],
    timeout: float = 3600.0,
    env: dict[str, str] | None = None,
    workdir: str = "",
) -> dict[str, dict[str, Any]]:
    """Each named ``(script, flags)`` job through :func:`run_job`, in turn, under ``workdir`` (default a temporary
    folder per job, removed after it): name -> its results; one line printed as each ends (wall seconds, final
    accuracy)."""
    done = {}
    for name, (script, flags) in jobs.items():
        results = done[name] = run_job(script, flags, workdir, re.sub(r"\W+", "-", name), timeout, env)
        accuracy = (results.get("summary") or {}).get("final_accuracy")
        print(f"  {name}: {results['wall']:.0f} s wall, final accuracy {accuracy}", flush=True)
    return done
