"""Which leaves NVFlare already knows are gone, so the server need not wait out a call's timeout.

A Collab call is one cell request with a timeout: when the leaf's process dies mid-call, NVFlare never fails the
request, and the server waited ``--round-timeout`` (600 s) although NVFlare had seen the leaf go at once. Two of
NVFlare's own signals are read here, each where it exists:

- **Connection closed** (the simulator): each leaf's job cell (``<leaf>.<job id>``) connects straight to the
  server's cell in the server's process; when the leaf's process ends, the connection closes and NVFlare drops the
  cell's agent within milliseconds. A leaf seen connected and then gone is lost.
- **Dead-job report** (POC and production): a leaf's client parent process reports that the job's process on its
  site is gone (its heartbeat no longer lists the job, or the client itself stopped answering); NVFlare hands the
  report to the running workflow's controller, here the Collab controller, which keeps a watch list of such clients.

Both are read without a call, so :meth:`LeafLiveness.check` costs microseconds and the server can poll it while
it waits for replies (:class:`devsim_flare.leaf_calls.LeafCalls`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping

CONNECTION_CLOSED = "its connection to the server closed (the leaf's process ended)"
DEAD_JOB_REPORTED = "NVFlare reported its job process dead"


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


class LeafLiveness:
    """Polls NVFlare's view of the leaves; :meth:`check` returns each newly lost leaf once, with its cause.

    ``job_cells`` maps leaf name -> the FQCN of its job cell (``<leaf>.<job id>``). ``cells()`` lists the cells of
    this process whose connected agents are looked at; ``reports()`` the client names reported dead.
    """

    def __init__(
        self,
        job_cells: Mapping[str, str],
        cells: Callable[[], Iterable] = process_cells,
        reports: Callable[[], set[str]] = set,
    ):
        self.job_cells = dict(job_cells)
        self._cells = cells
        self._reports = reports
        self._connected: set[str] = set()
        self.lost: dict[str, str] = {}

    @classmethod
    def for_job(cls, leaves: Iterable[str], job_id: str, fl_ctx=None) -> LeafLiveness:
        """Liveness of ``leaves`` in the job ``job_id`` (``fl_ctx``: the server's context, for dead-job reports)."""
        return cls({leaf: f"{leaf}.{job_id}" for leaf in leaves}, reports=lambda: dead_job_reports(fl_ctx))

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
        for leaf in self._reports() & set(self.job_cells):
            if leaf not in self.lost and leaf not in found:
                found[leaf] = DEAD_JOB_REPORTED
        self.lost.update(found)
        return found
