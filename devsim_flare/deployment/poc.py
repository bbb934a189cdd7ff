"""``--env poc``: the job's status read in the background, the POC services stopped by the command itself on a
signal, a POC workspace such a stop left behind, and the reason NVFlare gives when it fails a job because a
leaf's job process died.

NVFlare starts each POC service through a shell script that the init process adopts, and each job process in a
session of its own: none is a descendant of the command, and its own shutdown of the POC system takes ~30 s.
The command finds them by the POC workspace on their command lines
(:func:`devsim_flare.run_signals.processes_under`) and stops them itself (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import threading
from collections.abc import Iterator

from devsim_flare.run_signals import TERM_SECONDS, processes_under, stop_processes

STOP_PASSES = 3
"""Looks for POC processes left, at most, when the command stops the POC system (see :func:`stop_services`)."""
STATUS_POLL_SECONDS = 2.0
"""Seconds between two job-status reads through the admin session."""
FAILED_BY_LEAF = re.compile(r"Failing job (\S+) due to reported failure from (\S+): (.*)")
"""The server parent's log line when NVFlare fails a job because a client reported its job process failed."""


class BackgroundStatus:
    """A POC job run (NVFlare's ``Run``) whose :meth:`get_status` answers at once with the status a daemon thread
    last read (every ``poll_seconds``; None before the first read): a status read goes through the admin session
    and took ~2 s on a loaded machine, which held the command's reaction to a signal that long. The thread also
    prints each leaf the server lost, once (:class:`LeafLosses`, from ``output_dir``). ``abort`` and
    ``get_result`` go to the run itself; ``get_result`` first reads :attr:`failed_by_leaf` from the server's log
    (NVFlare deletes the POC workspace, its logs included, when it returns)."""

    def __init__(
        self, run, poll_seconds: float = STATUS_POLL_SECONDS, poc_root: str | None = None, output_dir: str | None = None
    ):
        self.run = run
        self.poc_root = poc_root
        self.status: str | None = None
        self.failed_by_leaf: str | None = None
        self.losses = LeafLosses(output_dir)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(poll_seconds,), daemon=True, name="job-status")
        self._thread.start()

    def _poll(self, poll_seconds: float) -> None:
        while not self._stop.is_set():
            self.status = self.run.get_status()
            self.losses.report()
            self._stop.wait(poll_seconds)

    def get_status(self) -> str | None:
        return self.status

    def abort(self) -> None:
        self._stop.set()
        self.run.abort()

    def get_result(self, timeout: float = 0.0):
        self._stop.set()
        self.losses.report()
        if self.poc_root:
            self.failed_by_leaf = leaf_failure(self.poc_root, getattr(self.run, "job_id", None))
        return self.run.get_result(timeout=timeout)


class LeafLosses:
    """Prints, once each, the leaves the server lost and why, from the ``leaves_lost`` of its records in
    ``output_dir``'s results.json (POC: the server's console is not the command's). Reads the file only when it
    changed (the server rewrites it once a round)."""

    def __init__(self, output_dir: str | None):
        self.path = os.path.join(output_dir, "results.json") if output_dir else None
        self.reported: set[str] = set()
        self._seen: float | None = None

    def report(self) -> list[str]:
        """Print (and return) one line for each leaf lost since the last call."""
        try:
            changed = os.path.getmtime(self.path) if self.path else None
            if changed is None or changed == self._seen:
                return []
            with open(self.path, encoding="utf-8") as stream:
                records = json.load(stream).get("rounds", [])
        except (OSError, ValueError):
            return []
        self._seen = changed
        lines = []
        for record in records:
            for leaf, why in (record.get("leaves_lost") or {}).items():
                if leaf not in self.reported:
                    self.reported.add(leaf)
                    at = f"round {record['round']}" if "round" in record else f"version {record.get('version')}"
                    lines.append(f"[server] {at}: leaf {leaf} lost ({why}); the run goes on without it")
        for line in lines:
            print(line, flush=True)
        return lines


def leaf_failure(poc_root: str, job_id: str | None = None) -> str | None:
    """One line saying which leaf's job process ended and why NVFlare ended the job, from the POC server's log
    (None when NVFlare did not fail the job for a leaf's report)."""
    for path in glob.glob(os.path.join(poc_root, "*", "prod_*", "*", "log.txt")):
        try:
            with open(path, encoding="utf-8", errors="replace") as stream:
                text = stream.read()
        except OSError:
            continue
        for job, leaf, reason in FAILED_BY_LEAF.findall(text):
            if job_id is None or job == job_id:
                return (
                    f"the job process of leaf {leaf} ended ({reason.strip()}), and NVFlare 2.9's server fails the "
                    "whole job when a client reports its job process failed, whatever the job's min_sites or "
                    "required_sites (FederatedServer.process_job_failure)"
                )
    return None


def stop_services(poc_root: str, passes: int = STOP_PASSES) -> None:
    """Stop every process of the POC system in ``poc_root`` (SIGTERM, SIGKILL 1 s later), looking again after each
    pass (at most ``passes``): a start script stopped while it was launching its service may have started one
    after the last look. The workspace stays, with the services' logs, until the next POC run starts
    (:func:`clear_stale_workspace`): removing its ~800 files took 4 s on a loaded machine, most of the time a stop
    may take."""
    for _ in range(passes):
        found = processes_under(poc_root)
        if not found:
            return
        stop_processes(found, TERM_SECONDS)


def clear_stale_workspace(poc_root: str | None) -> None:
    """Remove a POC workspace no process runs in (one a stopped run left): NVFlare would otherwise provision a
    second system beside it."""
    if poc_root and os.path.isdir(poc_root) and not processes_under(poc_root):
        shutil.rmtree(poc_root, ignore_errors=True)


@contextlib.contextmanager
def services_stopped_at_exit(poc_root: str | None) -> Iterator[None]:
    """A POC run's services (``poc_root``: the POC workspace; None outside POC): a stale workspace is cleared at the
    start, and whatever still runs in it at the end is stopped, however the run ended (finished, a signal, a start
    that failed to connect, an exception): the command leaves no service behind."""
    clear_stale_workspace(poc_root)
    try:
        yield
    finally:
        if poc_root:
            stop_services(poc_root)
