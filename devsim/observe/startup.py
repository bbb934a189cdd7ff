"""Where a run's start-up goes: wall-clock stamps from the user's command to the first round, and after the last.

The job command stamps its own process start into the environment (:data:`COMMAND_STARTED_ENV`), which the
processes it starts inherit (the simulator's server and leaves, POC sites started by it), and, under
:data:`COMMAND_STAMPS_ENV`, when its imports were done (``command_imports_done``: the job script's code runs) and
when every pre-run check had passed (``command_checked``: flags, data, task, privacy), so that
``command_to_server_process`` splits into the command's imports, its checks, and the launch of the simulator (a
simulation forked from a fork server also stamps ``command_forked``, once its flags are read and the fork server
started: ``command_flags_and_fork`` is the checks' first part, the data, task and privacy checks the rest). The
server marks its own process start, the start of its run (NVFlare started it, the leaves have connected and set
up: a Collab server's ``main`` runs after every site's ``init``), when the task and model are ready, and the first
and last rounds (sync rounds, or async evaluation windows). The command adds, once the job has ended, the time from the
last round to its exit. Stamps are ``time.time()`` seconds; durations are differences of stamps on one host.

Each leaf times its own set-up in parts (:class:`SetupParts`: importing its code, CUDA initialisation, task and
data, the plan with its batching probe, the other workers, compilation) and sends them once, with its first reply
(``startup`` of the payload); the server records them per leaf under ``leaves``, their slowest leaf under
``leaf_parts_max`` and what the slowest leaf's set-up leaves of ``server_process_to_run`` (NVFlare starting the
sites and connecting them) under ``seconds["nvflare_and_rest"]``. Each leaf also sends when its process started and
when its set-up ended (:data:`LEAF_STAMPS`), which split that rest into NVFlare starting the leaf processes, the leaf
processes before their set-up (their part ``process_to_setup``), and NVFlare starting the run after the last set-up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

COMMAND_STARTED_ENV = "DEVSIM_COMMAND_STARTED"
COMMAND_STAMPS_ENV = "DEVSIM_COMMAND_STAMPS"
"""The command's own later stamps, ``name=seconds`` pairs separated by commas (see :func:`stamp_command`)."""

STAGES = (
    ("command_imports", "command_started", "command_imports_done"),
    ("command_checks", "command_imports_done", "command_checked"),
    ("command_flags_and_fork", "command_imports_done", "command_forked"),
    ("checked_to_server_process", "command_checked", "server_process_started"),
    ("command_to_server_process", "command_started", "server_process_started"),
    ("server_process_to_run", "server_process_started", "server_run_started"),
    ("run_to_ready", "server_run_started", "server_ready"),
    ("ready_to_first_round", "server_ready", "first_round_started"),
    ("first_round", "first_round_started", "first_round_finished"),
    ("command_to_first_round", "command_started", "first_round_started"),
    ("server_cuda_warmup", "cuda_warmup_started", "cuda_warmup_done"),
)


def process_started() -> float:
    """This process's start time (``time.time()`` seconds, to the kernel's clock tick), else now.

    On Linux it is read from ``/proc``: the process's start in ticks since boot (``/proc/self/stat``) placed against
    the seconds since boot now (``/proc/uptime``). ``psutil.Process().create_time()`` adds the start to the boot
    time of ``/proc/stat``, which the kernel gives in whole seconds, so its stamps are up to a second early; that
    second does not cancel against stamps taken with ``time.time()`` (a wrapper script's ``date``, the server's
    marks)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stream:
            start_ticks = int(stream.read().rsplit(")", 1)[1].split()[19])  # field 22, after pid, name and state
        with open("/proc/uptime", encoding="ascii") as stream:
            uptime = float(stream.read().split()[0])
        return time.time() - uptime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - without psutil or /proc the stamp is only less early
        return time.time()


def stamp_command_start() -> None:
    """Record the job command's process start for the processes it starts (kept when already set: a wrapper
    script that sets up an environment and then runs Python with ``exec`` sets it itself, since the process it
    replaced started before the set-up)."""
    os.environ.setdefault(COMMAND_STARTED_ENV, repr(process_started()))


def stamp_command(name: str) -> None:
    """Stamp ``name`` now among the command's stamps for the processes it starts from here on (the first stamp
    of a name since the command started counts; an older one, inherited from another command, is replaced)."""
    stamps = command_stamps()
    if name not in stamps:
        stamps[name] = time.time()
        os.environ[COMMAND_STAMPS_ENV] = ",".join(f"{key}={value!r}" for key, value in stamps.items())


def command_stamps() -> dict[str, float]:
    """The command's stamps from :data:`COMMAND_STAMPS_ENV`, those older than the command's start left out (another
    command's, in an environment this one inherited); malformed pairs are skipped."""
    try:
        started = float(os.environ.get(COMMAND_STARTED_ENV) or "-inf")
    except ValueError:
        started = float("-inf")
    stamps: dict[str, float] = {}
    for pair in os.environ.get(COMMAND_STAMPS_ENV, "").split(","):
        name, _, value = pair.partition("=")
        try:
            stamp = float(value)
        except ValueError:
            continue
        if stamp >= started:
            stamps.setdefault(name, stamp)
    return stamps


@contextmanager
def command_starts_now() -> Iterator[None]:
    """Stamp a run started from Python (``recipe.execute()``) as starting now, for the processes it starts, without
    the command's later stamps (another run's); the process's earlier stamps come back afterwards."""
    earlier = {name: os.environ.get(name) for name in (COMMAND_STARTED_ENV, COMMAND_STAMPS_ENV)}
    os.environ[COMMAND_STARTED_ENV] = repr(time.time())
    os.environ.pop(COMMAND_STAMPS_ENV, None)
    try:
        yield
    finally:
        for name, value in earlier.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


LEAF_STAMPS = ("process_started_at", "setup_done_at")
"""Wall-clock stamps (``time.time()`` seconds) a leaf sends beside its set-up parts: its process start and the end of
its set-up (the time between its process start and its set-up is its part ``process_to_setup``)."""


class SetupParts:
    """Seconds of the named parts of one leaf's set-up, in the order they ran (``total`` is added by
    :meth:`record`: the wall time since the object was made)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def measure(self, name: str) -> Iterator[None]:
        """Add the wall seconds of the ``with`` block to part ``name``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def record(self) -> dict[str, float]:
        """The parts and ``total`` (seconds)."""
        return {**self.seconds, "total": time.perf_counter() - self.started}


class StartupClock:
    """Named stamps of one server process; the first stamp of each name counts."""

    def __init__(self) -> None:
        command = os.environ.get(COMMAND_STARTED_ENV)
        self.stamps: dict[str, float | None] = {
            "command_started": float(command) if command else None,
            **(command_stamps() if command else {}),
            "server_process_started": process_started(),
        }
        self.leaves: dict[str, dict[str, float]] = {}
        self.leaf_stamps: dict[str, dict[str, float]] = {}

    def leaf_reply(self, leaf: str, payload: dict) -> None:
        """Take a leaf's set-up parts out of its reply (sent once, with its first reply); other replies pass.
        Entries named ``*_at`` are the leaf's wall-clock stamps (:data:`LEAF_STAMPS`), kept apart from its parts."""
        parts = payload.pop("startup", None)
        if isinstance(parts, dict) and leaf not in self.leaves:
            self.leaves[leaf] = {str(k): float(v) for k, v in parts.items() if not str(k).endswith("_at")}
            self.leaf_stamps[leaf] = {str(k): float(v) for k, v in parts.items() if str(k).endswith("_at")}

    def mark(self, name: str) -> None:
        """Stamp ``name`` now unless it was stamped before."""
        self.stamps.setdefault(name, time.time())

    def add_stamps(self, stamps: dict[str, float]) -> None:
        """Take stamps made elsewhere in this process (the CUDA warm-up's), unless stamped before."""
        for name, at in stamps.items():
            self.stamps.setdefault(name, at)

    def round_finished(self, at: float) -> None:
        """A round (sync) or evaluation window (async) ended at ``at``: the first one's end and the latest."""
        self.stamps.setdefault("first_round_finished", at)
        self.stamps["last_round_finished"] = at

    def record(self) -> dict[str, Any]:
        """The stamps and the seconds between them (None where a stamp is missing)."""
        seconds: dict[str, float | None] = {}
        for stage, start, end in STAGES:
            first, last = self.stamps.get(start), self.stamps.get(end)
            seconds[stage] = None if first is None or last is None else last - first
        record: dict[str, Any] = {"stamps": dict(self.stamps), "seconds": seconds}
        if self.leaves:
            names = sorted({name for parts in self.leaves.values() for name in parts})
            slowest = {name: max(parts.get(name, 0.0) for parts in self.leaves.values()) for name in names}
            record["leaves"] = dict(self.leaves)
            record["leaf_parts_max"] = slowest
            to_run = seconds.get("server_process_to_run")
            seconds["nvflare_and_rest"] = None if to_run is None else to_run - slowest["total"]
            seconds.update(self._leaf_stamp_stages())
        return record

    def _leaf_stamp_stages(self) -> dict[str, float]:
        """``nvflare_and_rest`` split by the leaves' own stamps, where every leaf sent them: NVFlare starting the
        leaf processes (``server_process_to_leaf_processes``: to the latest leaf process start) and the run once
        every leaf was set up (``leaves_set_up_to_run``: from the latest set-up's end); between them, each leaf
        process's own start (``leaf_parts_max["process_to_setup"]``) and set-up."""
        stamps = [self.leaf_stamps.get(leaf, {}) for leaf in self.leaves]
        if not stamps or any(not set(LEAF_STAMPS) <= set(s) for s in stamps):
            return {}
        out: dict[str, float] = {}
        server_started, run_started = self.stamps.get("server_process_started"), self.stamps.get("server_run_started")
        if server_started is not None:
            out["server_process_to_leaf_processes"] = max(s["process_started_at"] for s in stamps) - server_started
        if run_started is not None:
            out["leaves_set_up_to_run"] = run_started - max(s["setup_done_at"] for s in stamps)
        return out


def add_exit(record: dict[str, Any], exited: float) -> dict[str, Any]:
    """``record`` (a results file's ``startup``) with the command's exit and ``last_round_to_exit`` seconds."""
    stamps = dict(record.get("stamps", {}))
    stamps["command_exit"] = exited
    last = stamps.get("last_round_finished")
    seconds = dict(record.get("seconds", {}))
    seconds["last_round_to_exit"] = None if last is None else exited - last
    return {**record, "stamps": stamps, "seconds": seconds}


def summary_line(seconds: dict[str, float | None], warm: bool = False) -> str:
    """The command's one-line start-up summary of a results file's ``startup["seconds"]`` (``warm``: the command
    was forked by a warm parent)."""

    def show(name: str) -> str:
        return "n/a" if seconds.get(name) is None else f"{seconds[name]:.1f}s"

    inside = (
        f"NVFlare and the leaves' set-up {show('server_process_to_run')}, task, model and first evaluation "
        f"{show('run_to_ready')}"
    )
    exit_part = f"{show('last_round_to_exit')} from the last round to exit"
    if seconds.get("command_to_first_round") is None:  # prod: the server's process started on its own host
        return f"start-up on the server: {inside}; {exit_part}"
    command = f"server process {show('command_to_server_process')}"
    if seconds.get("command_checks") is not None:
        command += (
            f": imports {show('command_imports')}, checks {show('command_checks')}, "
            f"launch {show('checked_to_server_process')}"
        )
    return (
        f"start-up{' (warm parent)' if warm else ''}: {show('command_to_first_round')} from the command to the first "
        f"round ({command}; {inside}); {exit_part}"
    )
