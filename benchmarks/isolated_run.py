"""Run a benchmark's job command in isolation and make sure every process it started is gone.

Shared by the benchmarks that launch job scripts: the command runs in its own process group with
HOME inside its work folder (NVFlare writes ``~/.nvflare``), output goes to a log file, and on a
timeout the group and every descendant seen while it ran are killed. NVFlare's simulator starts its
leaf processes in new sessions, so they are tracked by pid and creation time (never a recycled pid).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _descendants(pid: int) -> dict[int, float]:
    """pid -> create time of every live descendant of ``pid`` (NVFlare's simulator puts its leaf
    processes in new sessions, so the process group alone does not reach them)."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    found = {}
    for child in children:
        try:
            found[child.pid] = child.create_time()
        except psutil.Error:
            pass
    return found


def _kill_tracked(tracked: dict[int, float]) -> None:
    """Kill each tracked process that still runs (same pid and create time: never a recycled pid)."""
    import psutil

    for pid, created in tracked.items():
        try:
            process = psutil.Process(pid)
            if process.create_time() == created:
                process.kill()
        except psutil.Error:
            pass


def run_isolated(
    cmd: list[str], workdir: str, timeout: float, log_name: str = "job.log"
) -> tuple[int | None, float, str]:
    """Run ``cmd`` in its own process group with HOME inside ``workdir``; returns (rc or None on timeout,
    wall seconds, log tail). Every process it started is gone when this returns."""
    home = os.path.join(workdir, "home")
    os.makedirs(home, exist_ok=True)
    log_path = os.path.join(workdir, log_name)
    env = dict(os.environ, HOME=home, PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    tracked: dict[int, float] = {}
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
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
                tracked.update(_descendants(proc.pid))
                for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                    try:
                        os.killpg(proc.pid, sig)
                    except ProcessLookupError:
                        break
                    try:
                        proc.wait(timeout=grace)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            _kill_tracked(tracked)
    wall = time.perf_counter() - started
    with open(log_path, encoding="utf-8", errors="replace") as stream:
        tail = stream.read()[-4000:]
    return rc, wall, tail


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, for printing next to timings (``n/a`` off Linux)."""
    try:
        with open("/proc/loadavg", encoding="utf-8") as stream:
            return " ".join(stream.read().split()[:3])
    except OSError:
        return "n/a"
