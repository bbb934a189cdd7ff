"""Each GPU suite section in its own Python process (``benchmarks/gpu_suite.py``), so one section cannot lose the
others' figures.

A section run in the suite's own process once left torch._dynamo state behind (after a CUDA-graphs leaf run the
next model's construction raised a TypeError inside ``nn.Linear``) and another segfaulted the whole suite, losing
every later section. ``run_section`` starts ``gpu_suite.py --section-child NAME --part FILE`` with
``subprocess.Popen`` (never fork: the parent may have initialised CUDA), passes its output through to the suite's
own (the log is read by a person) and keeps the last ``STDERR_TAIL`` characters of its stderr, kills it (its whole
process group, after a SIGTERM that lets its job runs clean up) at its time limit, and returns the figures it wrote
or why there are none: a Python error (its traceback), a crash (the signal's name and the stderr tail) or the time
limit. ``child_main`` is the child's side: it runs the section under ``VramMonitor`` and writes the part file.

Test hook: ``DEVSIM_SUITE_CRASH=<section>`` makes that section's child call ``os.abort()`` (SIGABRT) before it
starts, as a crash in native code would end it; the dry-run test uses it to check the next sections still run.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable

STDERR_TAIL = 3000
"""Characters of a crashed or timed-out child's stderr kept in the report."""
CRASH_HOOK = "DEVSIM_SUITE_CRASH"
TERM_GRACE = 15.0
"""Seconds a child has after SIGTERM (its job runs stop their process groups) before its group gets SIGKILL."""
JOB_MARGIN = 5.0
"""Seconds of its time limit a child keeps after its last job run's timeout (to stop the job and write its part)."""


def child_timeout(budget: float, left: float, unlimited: bool, job_timeout: float | None) -> float:
    """Seconds a section's child may run: twice what is left of its budget (``min(budget, left)``), at least 30 s;
    without a suite budget (``unlimited``: dry run or ``--budget 0``) 1800 s. A fixed ``--timeout`` per job run
    raises it to three job runs."""
    limit = 1800.0 if unlimited else max(30.0, 2.0 * min(budget, left))
    return max(limit, 3.0 * job_timeout) if job_timeout is not None else limit


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


def _pump(stream, tail: collections.deque) -> None:
    """Copy ``stream`` (bytes) to this process's stderr chunk by chunk, keeping the last chunks in ``tail``."""
    for chunk in iter(lambda: stream.read1(4096), b""):
        tail.append(chunk)
        try:
            if hasattr(sys.stderr, "buffer"):
                sys.stderr.buffer.write(chunk)
            else:  # a text-only stream (a test's capture)
                sys.stderr.write(chunk.decode("utf-8", "replace"))
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed: keep reading, so the child never blocks on a full pipe
            pass


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the child (its job runs' clean-up), then SIGKILL to its process group after ``TERM_GRACE`` s."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=TERM_GRACE)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=30)


def run_section(name: str, command: list[str], timeout: float) -> tuple[dict | None, str | None]:
    """Run one section's child (``command`` plus ``--part FILE``) for at most ``timeout`` s.

    Returns (the part it wrote: ``{"figures": ..., "peak_gpu_memory_mib": ...}`` or None, the error or None). The
    error is the child's traceback when the section raised, else the stderr tail followed by a last line with the
    exit status or signal name when it crashed, or with the time limit when it was stopped."""
    with tempfile.TemporaryDirectory(prefix=f"gpu_suite_{name}_") as folder:
        part_path = os.path.join(folder, "part.json")
        started = time.monotonic()
        proc = subprocess.Popen([*command, "--part", part_path], stderr=subprocess.PIPE, start_new_session=True)
        tail: collections.deque[bytes] = collections.deque(maxlen=STDERR_TAIL // 64 + 8)
        reader = threading.Thread(target=_pump, args=(proc.stderr, tail), daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None:  # timed out, or the parent was interrupted
                _stop(proc)
        reader.join(timeout=5)  # a process the child left behind may still hold the pipe
        stderr_tail = b"".join(tail).decode("utf-8", "replace")[-STDERR_TAIL:]
        part = None
        if os.path.exists(part_path):
            with open(part_path, encoding="utf-8") as stream:
                part = json.load(stream)
    seconds = time.monotonic() - started
    if part is not None and part.get("error"):
        return None, part["error"]
    if timed_out:
        return part, f"{stderr_tail}\ntimed out: the section's child was stopped after {seconds:.0f} s"
    if part is None or proc.returncode != 0:
        return (
            part,
            f"{stderr_tail}\ncrashed: the section's child {_exit_status(proc.returncode)} after {seconds:.0f} s",
        )
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
