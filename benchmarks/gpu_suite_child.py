"""Each GPU suite section in its own Python process (``benchmarks/gpu_suite.py``), so that a crash, a Python error
or the time limit of one section cannot lose the others' figures (torch._dynamo state left behind, a segfault).

``run_section`` runs ``gpu_suite.py --section-child NAME --part FILE`` through ``harness.run_isolated`` (a new
process, never a fork: the parent may have initialised CUDA), echoes its output to the suite's own (the log is read
by a person), stops it at its time limit (SIGTERM first, so its job runs clean up) and returns the figures it wrote
or why there are none. ``child_main`` is the child's side: it runs the section under ``VramMonitor`` and writes the
part file.

Test hook: ``DEVSIM_SUITE_CRASH=<section>`` makes that section's child call ``os.abort()`` (SIGABRT) before it
starts, as a crash in native code would end it; the dry-run test uses it to check the next sections still run.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

from benchmarks.harness import run_isolated

OUTPUT_TAIL = 3000
"""Characters of a crashed or timed-out child's output kept in the report."""
CRASH_HOOK = "DEVSIM_SUITE_CRASH"
JOB_MARGIN = 5.0
"""Seconds of its time limit a child keeps after its last job run's timeout (to stop the job and write its part)."""


def section_limits(budget: float, left: float, unlimited: bool, job_timeout: float | None) -> tuple[float, float]:
    """(Seconds a job run of a section may take, seconds the section's child may run), for a section of ``budget`` s
    with ``left`` s of the suite's budget left. A job run: twice the budget, at most what is left, at least 30 s. The
    child: twice what is left of its budget (``min(budget, left)``), at least 30 s. Without a suite budget
    (``unlimited``: dry run or ``--budget 0``) 900 s and 1800 s. A fixed ``--timeout`` (``job_timeout``) is every job
    run's and raises the child's to three job runs."""
    limit = 1800.0 if unlimited else max(30.0, 2.0 * min(budget, left))
    if job_timeout is not None:
        return job_timeout, max(limit, 3.0 * job_timeout)
    return (900.0 if unlimited else max(30.0, min(2.0 * budget, left))), limit


class ChildArgs(argparse.Namespace):
    """A section's arguments in its child: ``timeout`` (seconds a job run may take, read when a job starts) never
    reaches past the child's own time limit (``limit`` s from now, less ``JOB_MARGIN``). A job that would outlast the
    child then fails alone (``fedavg_e2e`` keeps the CNN's figures when the ResNet-18 job fails) instead of the
    parent stopping the child and losing the section."""

    def __init__(self, args: argparse.Namespace, limit: float | None):
        super().__init__(**{key: value for key, value in vars(args).items() if key != "timeout"})
        self._job_timeout = args.timeout if args.timeout is not None else float("inf")
        self._ends = time.monotonic() + (limit if limit is not None else float("inf")) - JOB_MARGIN

    @property
    def timeout(self) -> float:
        """Seconds the next job run may take: ``--timeout``, at most what is left of the child's limit (>= 1 s)."""
        return max(1.0, min(self._job_timeout, self._ends - time.monotonic()))


def _echo(line: str, seconds: float) -> None:
    """Print one line of a section child's output (stdout and stderr) to the suite's stdout; a closed stdout is
    ignored (the child must never block on a full pipe)."""
    try:
        print(line, flush=True)
    except (OSError, ValueError):
        pass


def run_section(name: str, command: list[str], timeout: float) -> tuple[dict | None, str | None]:
    """Run one section's child (``command`` plus ``--part FILE``) for at most ``timeout`` s.

    Returns (the part it wrote: ``{"figures": ..., "peak_gpu_memory_mib": ...}`` or None, the error or None). The
    error is the child's traceback when the section raised, else the output's tail followed by a last line with the
    exit status or signal name when it crashed, or with the time limit when it was stopped."""
    with tempfile.TemporaryDirectory(prefix=f"gpu_suite_{name}_") as folder:
        part_path = os.path.join(folder, "part.json")
        code, seconds, tail = run_isolated(
            [*command, "--part", part_path], folder, timeout, "child.log", cwd=os.getcwd(), watch=_echo, own_home=False
        )
        part = None
        if os.path.exists(part_path):
            with open(part_path, encoding="utf-8") as stream:
                part = json.load(stream)
    tail = tail[-OUTPUT_TAIL:]
    if part is not None and part.get("error"):
        return None, part["error"]
    if code is None:
        return part, f"{tail}\ntimed out: the section's child was stopped after {seconds:.0f} s"
    if part is None or code != 0:
        return part, f"{tail}\ncrashed: the section's child {_exit_status(code)} after {seconds:.0f} s"
    return part, None


def _exit_status(code: int) -> str:
    """``killed by SIGSEGV`` for a negative return code, else ``exited with status N``."""
    if code >= 0:
        return f"exited with status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _term_as_exit(signum: int, frame) -> None:
    raise SystemExit(f"stopped by signal {signum} (the section's time limit)")


def child_main(name: str, runner: Callable[[], dict], device: str, part_path: str) -> int:
    """The child's side: run one section (``runner()``) and write ``{"figures", "peak_gpu_memory_mib"}`` or
    ``{"error": traceback}`` to ``part_path``. A segfault prints Python's stacks to stderr (faulthandler)."""
    from benchmarks.gpu_suite_jobs import VramMonitor

    faulthandler.enable()
    signal.signal(signal.SIGTERM, _term_as_exit)
    if os.environ.get(CRASH_HOOK) == name:
        print(f"[gpu_suite] {CRASH_HOOK}={name}: aborting this section's child", file=sys.stderr, flush=True)
        os.abort()
    try:
        with VramMonitor(device) as monitor:
            part: dict = {"figures": runner()}
        part["peak_gpu_memory_mib"] = monitor.peak_mib
    except Exception:  # noqa: BLE001 - the parent records it and goes on
        part = {"error": traceback.format_exc()[-4000:]}
        print(part["error"], file=sys.stderr, flush=True)
    with open(part_path, "w", encoding="utf-8") as stream:
        json.dump(part, stream, default=str)
    return 1 if "error" in part else 0
