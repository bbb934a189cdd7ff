"""SIGINT and SIGTERM to the job command: stop the run in a known state, then every process the command started.

NVFlare starts its simulator (and each leaf worker under it) in a session of its own, so a terminal's Ctrl-C
reaches only the command's process, and a SIGTERM to the command left the simulator running, orphaned. While the
command runs a job, :class:`StopOnSignals` takes both signals:

1. The first asks the server to stop (:func:`devsim_flare.stop_request.request_stop`): the server abandons or
   finishes the round in flight, writes its checkpoint and ``results.json`` (marked ``stopped``), and the command
   then stops the processes (sim: :class:`devsim_flare.execution.SimExitWatcher`; POC: the job's wait loop, which
   stops the POC services itself rather than through NVFlare's shutdown, which takes ~30 s). When the server has
   not done so :data:`STOP_GRACE_SECONDS` later (still starting, or deep in a long step), the processes are stopped
   anyway; the run's last periodic checkpoint and every round already in ``results.json`` remain.
2. A second signal stops every process at once (SIGKILL).

While the run's environment is still starting (POC: provisioning and starting the POC services and submitting the
job, inside NVFlare's ``execute``; see :meth:`StopOnSignals.starting`), no server runs the job yet and there is
nothing to save: the first signal ends the start at once with :class:`StartInterrupted`, raised in the main thread,
and the caller stops what the start had launched (NVFlare's job submission would otherwise retry the stopped
server for about 10 s).

The command then exits with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a shell reports it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from devsim_flare.stop_request import clear_stop, request_stop

STOP_GRACE_SECONDS = 3.0
"""Seconds the server gets after the first signal to stop at a safe point before its processes are stopped."""
TERM_SECONDS = 1.0
"""Seconds processes get after SIGTERM before SIGKILL, when the command stops them."""
KILL_WAIT_SECONDS = 1.0
"""Seconds :func:`stop_processes` waits, at most, for processes to be gone after SIGKILL."""
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StartInterrupted(BaseException):
    """A signal arrived while the run's environment was still starting (see :meth:`StopOnSignals.starting`).

    A ``BaseException``, like ``KeyboardInterrupt``: NVFlare's start-up code retries on ``Exception``, which would
    swallow it."""


def stop_quietly_until_the_run() -> None:
    """From a job command's first lines until :class:`StopOnSignals` takes over (and again after it): SIGINT or
    SIGTERM ends the command at once with one line and 128 + the signal's number. Nothing started by then needs
    stopping (a fork server ends when its command does). Without it, Ctrl-C in the first seconds printed a
    ``KeyboardInterrupt`` traceback from inside an import or the data preparation, or was lost in PyTorch's import
    (the interpreter raised it inside a call that swallows exceptions, and the run went on)."""

    def stop(signum: int, _frame) -> None:
        print(f"\n{signal_name(signum)}: command stopped (no run in progress)", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(128 + signum)

    for signum in SIGNALS:
        signal.signal(signum, stop)


def signal_name(signum: int) -> str:
    """``SIGINT``, ``SIGTERM``, ... for a signal number."""
    return signal.Signals(signum).name


def signal_exit_codes() -> tuple[int, ...]:
    """The exit codes of a run stopped by one of :data:`SIGNALS` (130, 143)."""
    return tuple(128 + signum for signum in SIGNALS)


def exit_now(code: int) -> None:
    """Flush the console and end this process with ``code`` at once: the interpreter's own teardown (PyTorch,
    NVFlare) takes 1-2 s more that a stopped run need not wait for; every child process is already stopped."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def descendants() -> list:
    """``psutil.Process`` objects of every process below this one (taken as one snapshot: a process whose parent
    is stopped first would otherwise be re-parented out of reach)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        return psutil.Process().children(recursive=True)
    return []


_STOPPED_PIDS: set[int] = set()
"""Ids of the processes :func:`stop_processes` stopped in this command (for :func:`remove_orphan_exchanges`)."""


def processes_under(folder: str) -> list:
    """``psutil.Process`` objects of this user's processes whose command line names ``folder`` or a path in it,
    with every process below them (one snapshot; this process and its ancestors excluded).

    POC: NVFlare starts each service through a shell script whose process the init process adopts, and each job
    process in a session of its own, so neither is a descendant of the command; all of them name the POC
    workspace on their command line (``.../prod_00/<site>/startup/sub_start.sh``, ``-m .../prod_00/<site>``).
    The command lines are read from ``/proc`` directly (psutil took ~0.2 s for 120 processes).
    """
    import psutil

    folder = os.path.abspath(folder).encode()
    inside = folder + os.sep.encode()
    own = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        own.update(parent.pid for parent in psutil.Process().parents())
    found: dict[int, object] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in own:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != os.getuid():
                continue
            with open(f"/proc/{name}/cmdline", "rb") as stream:
                args = stream.read().split(b"\0")
            if any(arg == folder or arg.startswith(inside) for arg in args):
                process = psutil.Process(int(name))
                found[process.pid] = process
                found.update((child.pid, child) for child in process.children(recursive=True))
        except (OSError, psutil.Error):
            continue
    return [process for pid, process in found.items() if pid not in own]


def stop_processes(processes: list, term_seconds: float = TERM_SECONDS, poll_seconds: float = 0.05) -> None:
    """SIGTERM ``processes``; SIGKILL those still running ``term_seconds`` later (0: SIGKILL at once); returns once
    they are gone, or :data:`KILL_WAIT_SECONDS` after the SIGKILL."""
    import psutil

    _STOPPED_PIDS.update(process.pid for process in processes)
    if term_seconds > 0:
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        deadline = time.monotonic() + term_seconds
        alive = still_running(processes)
        while alive and time.monotonic() < deadline:
            time.sleep(poll_seconds)
            alive = still_running(alive)
    else:
        alive = processes
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    while alive and time.monotonic() < deadline:  # SIGKILL is not instant: a process frees its memory first
        time.sleep(poll_seconds)
        alive = still_running(alive)


def still_running(processes: list) -> list:
    """The ``psutil.Process`` objects of ``processes`` that have not exited: zombies count as exited.

    The simulator's server and leaf processes are grandchildren of the command; once the simulator process exits
    they belong to PID 1, and where PID 1 reaps late (a container's init, this project's sandbox: 1-2 s) a
    ``psutil.wait_procs`` on them waited for the reaping, which held the command's exit that long after the run.
    """
    import psutil

    running = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
    return running


def remove_orphan_exchanges() -> list[str]:
    """Remove ``/dev/shm`` exchange folders whose server process is gone (a server stopped by a signal cannot):
    those of processes this command stopped, even while their zombies wait to be reaped (a re-parented process is
    reaped by PID 1, late in some containers), and any other whose process no longer exists."""
    import shutil

    import psutil

    from devsim.shared_arrays import FOLDER_PREFIX, remove_orphans, shared_memory_root

    root = shared_memory_root()
    if not root:
        return []
    removed = []
    stopped = {p for p in _STOPPED_PIDS if not still_running([_process(p)] if _process(p) else [])}
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            pid = name[len(FOLDER_PREFIX) :].split("-", 1)[0] if name.startswith(FOLDER_PREFIX) else ""
            if pid.isdigit() and int(pid) in stopped:
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                removed.append(os.path.join(root, name))
    with contextlib.suppress(psutil.Error):
        removed += remove_orphans(root)
    return removed


def _process(pid: int):
    """``psutil.Process(pid)``, or None when no such process exists."""
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


class StopOnSignals:
    """While active (a ``with`` block in the main thread), SIGINT and SIGTERM stop the run as the module says.

    ``server_stopped()`` says whether the server has honoured the request (for the console line only).
    ``output_dir`` is the run folder the server writes to (where the stop request goes; None where the server is
    on another host: then only :attr:`signum` is set, for the caller's wait loop to act on). ``processes()`` lists
    the processes the command started (default: every descendant of this process; POC: :func:`processes_under`
    its workspace); ``force`` stops them (default: :func:`stop_processes`), given the seconds between SIGTERM
    and SIGKILL. ``ask_server=False`` (a server that cannot honour a stop request: the edge job): the first signal
    stops the processes at once (SIGTERM, SIGKILL :data:`TERM_SECONDS` later); what the server wrote is kept.
    ``ask_server`` may be a callable, asked at the first signal (sim, POC: whether the server has recorded a round
    yet; before that it has nothing to save, and the grace period would only delay the stop).
    :attr:`signum` is the first signal received (None when none), :attr:`exit_code` 128 + its number.
    """

    def __init__(
        self,
        output_dir: str | None,
        force=None,
        grace_seconds: float = STOP_GRACE_SECONDS,
        server_stopped=None,
        processes=None,
        ask_server: bool | Callable[[], bool] = True,
    ):
        self.output_dir = output_dir
        self.ask_server = ask_server
        self._server_stopped = server_stopped or (lambda: False)
        self.grace_seconds = grace_seconds
        self._processes = processes or descendants
        self._force = force or (lambda term_seconds: stop_processes(self._processes(), term_seconds))
        self.signum: int | None = None
        self.forced = threading.Event()
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None
        self._starting = False

    @property
    def exit_code(self) -> int | None:
        return None if self.signum is None else 128 + self.signum

    def __enter__(self) -> StopOnSignals:
        if self.ask_server:
            clear_stop(self.output_dir)
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self._timer is not None:
            self._timer.cancel()
        if self.ask_server:
            clear_stop(self.output_dir)

    @contextlib.contextmanager
    def starting(self):
        """While this ``with`` block runs (in the main thread), the first signal raises :class:`StartInterrupted`
        there, and so does entering it after a signal came."""
        if self.signum is not None:
            raise StartInterrupted(signal_name(self.signum))
        self._starting = True
        try:
            yield
        finally:
            self._starting = False

    def _handle(self, signum: int, frame) -> None:
        name = signal_name(signum)
        if self.signum is None and callable(self.ask_server) and not self.ask_server():
            self.ask_server = False  # nothing to save yet: stop the processes at once
        if self.signum is None and self._starting:
            self.signum = signum
            self._starting = False
            print(f"\n{name}: the run was still starting; stopping what it started", file=sys.stderr, flush=True)
            raise StartInterrupted(name)
        if self.signum is None and not self.ask_server:
            self.signum = signum
            print(
                f"\n{name}: stopping the run's processes (the results written so far are kept); Ctrl-C again to "
                "stop at once",
                file=sys.stderr,
                flush=True,
            )
            self._timer = threading.Timer(0.0, self.stop_now)  # not in the handler: the main thread may hold locks
            self._timer.daemon = True
            self._timer.start()
            return
        if self.signum is None:
            self.signum = signum
            if self.output_dir:
                request_stop(self.output_dir, name)
            what = (
                "stopping the run at its next safe point (checkpoint and results are kept)"
                if self.output_dir
                else "stopping"
            )
            print(f"\n{name}: {what}; Ctrl-C again to stop at once", file=sys.stderr, flush=True)
            if self.output_dir:  # a stop was requested: the server gets the grace period to honour it
                self._timer = threading.Timer(self.grace_seconds, self._stop_late)
                self._timer.daemon = True
                self._timer.start()
            return
        print(f"{name} again: stopping every process now", file=sys.stderr, flush=True)
        if self._timer is not None:
            self._timer.cancel()
        self.forced.set()
        self._force(0.0)

    def stop_now(self, term_seconds: float = TERM_SECONDS) -> None:
        """Stop the processes now (the server has stopped at a checkpoint): SIGTERM, SIGKILL ``term_seconds`` later."""
        if self._timer is not None:
            self._timer.cancel()
        self.forced.set()
        self._force(term_seconds)

    def _stop_late(self) -> None:
        """The server did not stop within the grace period: stop the processes."""
        if self._processes():
            if self._server_stopped():
                print("the server stopped at a checkpoint; stopping the processes", file=sys.stderr, flush=True)
            else:
                print(
                    f"the server did not stop within {self.grace_seconds:g}s; stopping its processes (rounds in "
                    "results.json and the last periodic checkpoint are kept)",
                    file=sys.stderr,
                    flush=True,
                )
            self.forced.set()
            self._force(TERM_SECONDS)
