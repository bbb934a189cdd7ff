"""Which leaves NVFlare already knows are gone, so the server need not wait out a call's timeout; and, in a leaf's
own NVFlare job process, what makes its death read as a lost leaf rather than a failed job.

A Collab call is one cell request with a timeout: when the leaf's process dies mid-call, NVFlare never fails the
request, and the server waited ``--round-timeout`` (600 s) although NVFlare had seen the leaf go at once. Three of
NVFlare's own signals are read here, each where it exists:

- **Connection closed** (the simulator): each leaf's job cell (``<leaf>.<job id>``) connects straight to the
  server's cell in the server's process; when the leaf's process ends, the connection closes and NVFlare drops the
  cell's agent within milliseconds. A leaf seen connected and then gone is lost.
- **Job cell gone** (POC and production): the leaf's job cell connects to its client parent process, not to
  the server job's process. Every :data:`PROBE_SECONDS` a background thread asks each leaf's client parent for the
  cells connected to it (NVFlare's net agent, ``_net_manager/peers``, which every client process answers); the job
  cell drops out of that list the moment the job process's connection closes. A leaf whose job cell was listed
  once and then is missing in :data:`MISSING_PROBES` answers in a row is lost (one answer without it could be
  a job process reconnecting). No answer (a client parent busy or gone) is no verdict. A probe of the job cell
  itself would not do: NVFlare's server parent drops the "unreachable" answer the client parent sends back for a
  dead job cell (it carries no client name), so such a probe only times out, as it would for a busy leaf.
- **Dead-job report** (POC and production): a leaf's client parent process reports that the job's process on its
  site is gone (its heartbeat, every 10 s, no longer lists the job, or the client itself stopped answering);
  NVFlare hands the report to the running workflow's controller, here the Collab controller, which keeps a watch
  list of such clients.

:meth:`LeafLiveness.check` reads them without waiting (the probe runs in its own thread), so the server can poll
it while it waits for replies (:class:`devsim_flare.leaf_calls.LeafCalls`). Once a leaf is lost, the server job's
calls still waiting for it are ended (:func:`release_calls`).

The leaf's side (:func:`mark_lost_if_killed`): NVFlare 2.9's client parent reads its job process's exit code, and
one killed by a signal (the OOM killer's SIGKILL) reads as an execution error, which it reports to the server, and
the server fails the whole job for it, whatever the job's ``min_sites``. The job process's code is taken from the
file ``_process_rc.txt`` in the job's run folder when there is one; NVFlare's job process removes that file when
it starts and writes it, if at all, only on its way out. A leaf's job process therefore writes
:data:`LOST_EXIT_CODE` there while it runs and removes it on every orderly exit (NVFlare's own clean-up callbacks,
the interpreter's exit, the Collab object's final call): only a process that died without running any of them
leaves it, and the client parent then reports a code the server does not treat as a job failure; the server's
job finds the leaf lost by the signals above and goes on under ``--min-leaves``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping

CONNECTION_CLOSED = "its connection to the server closed (the leaf's process ended)"
DEAD_JOB_REPORTED = "NVFlare reported its job process dead"
JOB_CELL_GONE = "its job process's connection to its NVFlare client closed (the process ended)"
PROBE_SECONDS = 1.0
"""Seconds between two probes of the leaves' client parents (POC, production)."""
PROBE_TIMEOUT = 2.0
"""Seconds a probe waits for the answers; a client that answers later gives no verdict either way."""
MISSING_PROBES = 2
"""Probes in a row that must find a leaf's job cell gone before the leaf is lost."""
PEERS_CHANNEL, PEERS_TOPIC = "_net_manager", "peers"
"""NVFlare's request for the cells connected to a cell, answered by the net agent of every client process."""
LOST_EXIT_CODE = 137
"""The exit code a leaf's job process reports when it died without an orderly exit: 128 + SIGKILL, as a shell
reports a killed process; NVFlare 2.9's server fails a job only for codes 9 and 101-104."""
JOB_PROCESS_MODULE = "nvflare.private.fed.app.client.worker_process"
"""The module NVFlare's client job process runs as ``__main__`` (POC, production)."""
RC_FILE = "_process_rc.txt"
"""NVFlare's file for a job process's exit code, in the job's run folder (``FLMetaKey.PROCESS_RC_FILE``)."""


def process_cells() -> list:
    """NVFlare's cells in this process (the server's cell, and in the simulator its per-site relay cells)."""
    try:
        from nvflare.fuel.f3.cellnet.core_cell import CoreCell
    except ImportError:  # pragma: no cover - NVFlare is a dependency of this package
        return []
    return list(CoreCell.ALL_CELLS.values())


def dead_job_reports(fl_ctx) -> set[str]:
    """Names of the clients NVFlare reported dead to the running workflow's controller (empty where none or where
    this NVFlare keeps no such list)."""
    if fl_ctx is None:
        return set()
    with contextlib.suppress(Exception):  # a private structure of NVFlare: absent or changed means no reports
        from nvflare.apis.fl_constant import FLContextKey

        runner = fl_ctx.get_prop(FLContextKey.RUNNER)
        workflow = getattr(runner, "current_wf", None)
        communicator = getattr(getattr(workflow, "controller", None), "communicator", None)
        return set(getattr(communicator, "_dead_clients", {}) or {})
    return set()


def peers_probe(job_fqcn: str) -> Callable[[Mapping[str, str]], dict[str, bool | None]]:
    """A probe for :class:`LeafLiveness`: asks each leaf's client parent cell (named as the leaf), from this
    process's cell ``job_fqcn`` (the server job's cell, ``server.<job id>``), for its connected cells (NVFlare's net
    agent, ``_net_manager/peers``). Takes leaf -> the leaf's job cell; returns, per leaf, True (the job cell is
    connected to its client parent), False (the client parent answered without it) or None (no verdict: no answer
    in time, no such sending cell, another error)."""

    def probe(job_cells: Mapping[str, str]) -> dict[str, bool | None]:
        cell = next((c for c in process_cells() if c.get_fqcn() == job_fqcn), None)
        if cell is None or not job_cells:
            return dict.fromkeys(job_cells)
        from nvflare.fuel.f3.cellnet.defs import MessageHeaderKey, ReturnCode
        from nvflare.fuel.f3.message import Message

        replies = cell.broadcast_request(
            PEERS_CHANNEL, PEERS_TOPIC, list(job_cells), Message(), timeout=PROBE_TIMEOUT, optional=True
        )
        found: dict[str, bool | None] = {}
        for leaf, job_cell in job_cells.items():
            reply = replies.get(leaf)
            ok = reply is not None and reply.get_header(MessageHeaderKey.RETURN_CODE, ReturnCode.OK) == ReturnCode.OK
            peers = reply.payload if ok else None
            found[leaf] = (job_cell in peers) if isinstance(peers, list) else None
        return found

    return probe


def release_calls(cell, job_cell: str, cause: str) -> int:
    """End the requests that ``cell`` (an NVFlare ``Cell``: the server job's) still waits on to ``job_cell`` (a lost
    leaf's job cell) as NVFlare ends a request whose destination rejected its stream: a communication error with
    ``cause``. Returns how many. Without it such a call, never answered, held the end of the job until its own
    timeout (the round timeout, 60 s or more), however fast the leaf was found lost: NVFlare's Collab controller
    waits for its calls in flight before the job ends. A request whose reply is already being received is left."""
    from nvflare.fuel.f3.cellnet.defs import ReturnCode
    from nvflare.fuel.f3.cellnet.utils import make_reply

    released = 0
    for waiter in list((getattr(cell, "requests_dict", None) or {}).values()):
        received = getattr(waiter, "in_receiving", None)
        if getattr(waiter, "target", None) == job_cell and received is not None and not received.is_set():
            waiter.stream_error = cause
            waiter.result = make_reply(ReturnCode.COMM_ERROR, error=cause)
            received.set()
            released += 1
    return released


def engine_cell(fl_ctx):
    """The NVFlare ``Cell`` of the engine in ``fl_ctx`` (None where there is none)."""
    with contextlib.suppress(Exception):
        return fl_ctx.get_engine().get_cell()
    return None


class LeafLiveness:
    """Polls NVFlare's view of the leaves; :meth:`check` returns each newly lost leaf once, with its cause.

    ``job_cells`` maps leaf name -> the FQCN of its job cell (``<leaf>.<job id>``). ``cells()`` lists the cells of
    this process whose connected agents are looked at; ``reports()`` the client names reported dead; ``probe``
    (None: no probing) takes the job cells of the leaves not connected to this process and returns, per cell,
    True (job cell there), False (gone) or None (no verdict); it runs in a daemon thread, at most one at a time,
    every ``probe_seconds``. ``release(job_cell, cause)`` (None: nothing) is called once for each lost leaf, to end
    the calls still waiting for it (:func:`release_calls`).
    """

    def __init__(
        self,
        job_cells: Mapping[str, str],
        cells: Callable[[], Iterable] = process_cells,
        reports: Callable[[], set[str]] = set,
        probe: Callable[[list[str]], dict[str, bool | None]] | None = None,
        probe_seconds: float = PROBE_SECONDS,
        release: Callable[[str, str], object] | None = None,
    ):
        self.job_cells = dict(job_cells)
        self._cells = cells
        self._reports = reports
        self._probe = probe
        self.probe_seconds = probe_seconds
        self._release = release
        self._connected: set[str] = set()
        self._reached: set[str] = set()  # leaves whose job cell a probe found
        self._missing: dict[str, int] = {}  # leaf -> probe answers without its job cell, in a row
        self._probe_lock = threading.Lock()
        self._probing = False
        self._probed_at = float("-inf")
        self.lost: dict[str, str] = {}

    @classmethod
    def for_job(cls, leaves: Iterable[str], job_id: str, fl_ctx=None) -> LeafLiveness:
        """Liveness of ``leaves`` in the job ``job_id`` (``fl_ctx``: the server's context, for dead-job reports)."""
        return cls(
            {leaf: f"{leaf}.{job_id}" for leaf in leaves},
            reports=lambda: dead_job_reports(fl_ctx),
            probe=peers_probe(f"server.{job_id}"),
            release=lambda job_cell, cause: release_calls(engine_cell(fl_ctx), job_cell, f"leaf lost: {cause}"),
        )

    def check(self) -> dict[str, str]:
        """Leaves found lost since the last call -> cause (one line naming NVFlare's signal)."""
        found: dict[str, str] = {}
        agents: set[str] = set()
        for cell in self._cells():
            agents.update(getattr(cell, "agents", {}) or {})
        for leaf, fqcn in self.job_cells.items():
            if leaf in self.lost:
                continue
            if fqcn in agents:
                self._connected.add(leaf)
            elif leaf in self._connected:
                found[leaf] = CONNECTION_CLOSED
        with self._probe_lock:
            for leaf, count in self._missing.items():
                if count >= MISSING_PROBES and leaf not in self.lost and leaf not in found:
                    found[leaf] = JOB_CELL_GONE
        for leaf in self._reports() & set(self.job_cells):
            if leaf not in self.lost and leaf not in found:
                found[leaf] = DEAD_JOB_REPORTED
        self.lost.update(found)
        if self._release is not None:
            for leaf, cause in found.items():
                with contextlib.suppress(Exception):  # a private structure of NVFlare: the call then times out
                    self._release(self.job_cells[leaf], cause)
        self._start_probe()
        return found

    def _start_probe(self) -> None:
        """Start a probe of the leaves neither lost nor connected to this process, when one is due."""
        if self._probe is None or time.monotonic() - self._probed_at < self.probe_seconds:
            return
        targets = {
            leaf: fqcn for leaf, fqcn in self.job_cells.items() if leaf not in self.lost and leaf not in self._connected
        }
        with self._probe_lock:
            if self._probing or not targets:
                return
            self._probing = True
        self._probed_at = time.monotonic()
        threading.Thread(target=self._run_probe, args=(targets,), daemon=True, name="leaf-probe").start()

    def _run_probe(self, targets: dict[str, str]) -> None:
        try:
            answers = self._probe(targets)
        except Exception:  # noqa: BLE001 - a failed probe is no verdict; the other signals still count
            answers = {}
        with self._probe_lock:
            for leaf, answer in answers.items():
                if leaf not in self.job_cells or answer is None:
                    continue
                if answer:
                    self._reached.add(leaf)
                    self._missing.pop(leaf, None)
                elif leaf in self._reached:
                    self._missing[leaf] = self._missing.get(leaf, 0) + 1
            self._probing = False


def in_job_process() -> bool:
    """Whether this process is NVFlare's client job process (POC, production; not the simulator)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == JOB_PROCESS_MODULE


def mark_lost_if_killed(run_dir: str) -> str:
    """Write :data:`LOST_EXIT_CODE` into the job process's exit-code file in ``run_dir`` (the job's run folder,
    ``<site workspace>/<job id>``) and arrange for its removal on every orderly exit; returns the file's path."""
    path = os.path.join(run_dir, RC_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as stream:
        stream.write(str(LOST_EXIT_CODE))
    os.replace(tmp, path)
    atexit.register(unmark_lost, path)
    with contextlib.suppress(Exception):  # an NVFlare without this hook: the other removals remain
        from nvflare.fuel.f3.mpm import MainProcessMonitor

        MainProcessMonitor.add_cleanup_cb(unmark_lost, path)
    return path


def unmark_lost(path: str) -> None:
    """Remove the file :func:`mark_lost_if_killed` wrote, unless NVFlare has written its own code there since."""
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8") as stream:
            mine = stream.read().strip() == str(LOST_EXIT_CODE)
        if mine:
            os.remove(path)
