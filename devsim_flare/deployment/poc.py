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
import os
import re
import shutil
import threading
from collections.abc import Iterator

from devsim_flare.run_signals import TERM_SECONDS, processes_under, stop_processes

STATUS_POLL_SECONDS = 2.0
"""Seconds between two job-status reads through the admin session."""
FAILED_BY_LEAF = re.compile(r"Failing job (\S+) due to reported failure from (\S+): (.*)")
"""The server parent's log line when NVFlare fails a job because a client reported its job process failed."""


class BackgroundStatus:
    """A POC job run (NVFlare's ``Run``) whose :meth:`get_status` answers at once with the status a daemon thread
    last read (every ``poll_seconds``; None before the first read): a status read goes through the admin session
    and took ~2 s on a loaded machine, which held the command's reaction to a signal that long. ``abort`` and
    ``get_result`` go to the run itself; ``get_result`` first reads :attr:`failed_by_leaf` from the server's log
    (NVFlare deletes the POC workspace, its logs included, when it returns)."""

    def __init__(self, run, poll_seconds: float = STATUS_POLL_SECONDS, poc_root: str | None = None):
        self.run = run
        self.poc_root = poc_root
        self.status: str | None = None
        self.failed_by_leaf: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(poll_seconds,), daemon=True, name="job-status")
        self._thread.start()

    def _poll(self, poll_seconds: float) -> None:
        while not self._stop.is_set():
            self.status = self.run.get_status()
            self._stop.wait(poll_seconds)

    def get_status(self) -> str | None:
        return self.status

    def abort(self) -> None:
        self._stop.set()
        self.run.abort()

    def get_result(self, timeout: float = 0.0):
        self._stop.set()
        if self.poc_root:
            self.failed_by_leaf = leaf_failure(self.poc_root, getattr(self.run, "job_id", None))
        return self.run.get_result(timeout=timeout)


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


def stop_services(poc_root: str) -> None:
    """Stop every process of the POC system in ``poc_root`` (SIGTERM, SIGKILL 1 s later). The workspace stays,
    with the services' logs, until the next POC run starts (:func:`clear_stale_workspace`): removing its ~800
    files took 4 s on a loaded machine, most of the time a stop may take."""
    stop_processes(processes_under(poc_root), TERM_SECONDS)


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
