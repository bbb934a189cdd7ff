"""One site of a running deployment: kill it as a host that dies would, and start it again (fault tests and
recovery, ``scripts/deployment.py kill-site`` / ``start-site``)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from devsim_flare.deployment.processes import (
    launch_site,
    names_folder,
    open_session,
    signal_all,
    site_log_tail,
    stat_fields,
    system_processes,
    wait_until,
)
from devsim_flare.deployment.workspace import (
    DeploymentError,
    isolate_home,
    kit,
    layout_for,
    load_state,
    log,
    sites_in_start_order,
)


def _site_processes(state: dict, name: str) -> list[tuple[int, str]]:
    """The processes of site ``name``: its daemon (``startup/sub_start.sh``), its client process (``-m <kit>``)
    and its job processes."""
    site = kit(state, name)
    return [(pid, cmdline) for pid, cmdline in system_processes(state) if names_folder(cmdline, site)]


def kill_site(workspace: str, name: str) -> list[int]:
    """SIGKILL every process of site ``name`` (its daemon, its client process and its job processes) at once, as
    a host that loses power would; returns the pids killed. The other sites keep running."""
    state = load_state(layout_for(workspace))
    names = [n for _, n in sites_in_start_order(state)]
    if name not in names or name == state["server"]:
        raise DeploymentError(f"no leaf site {name!r} in this deployment; its sites: {', '.join(names[1:])}")
    victims = _site_processes(state, name)
    # freeze them all first: a client whose job process died first would report the job failed, and NVFlare
    # then fails the whole job (a crashed job process behaves so; a host that dies does not)
    signal_all(victims, signal.SIGSTOP)
    signal_all(victims, signal.SIGKILL)
    if not wait_until(lambda: not _site_processes(state, name), 10.0, interval=0.1):
        raise DeploymentError(f"processes of {name} survived SIGKILL: {_site_processes(state, name)}")
    log(f"killed {name}: {len(victims)} process(es) {[pid for pid, _ in victims]}")
    return [pid for pid, _ in victims]


def start_site(workspace: str, name: str, timeout: float = 120.0) -> float:
    """Start site ``name`` again (after :func:`kill_site` or a crash) and wait until the server has heard from
    it since (its ``last_connect_time`` is later than the launch: the server keeps listing a killed client
    until its heartbeat times out); returns the seconds that took."""
    lay = layout_for(workspace)
    state = load_state(lay)
    isolate_home(lay)
    if _site_processes(state, name):
        raise DeploymentError(f"{name} is running; kill or stop it first")
    _clear_stale_pid_files(kit(state, name))
    launched = time.time()
    launch_site(lay, state, name)
    session = open_session(state, timeout=10.0)
    try:

        def heard_from_it() -> bool:
            times = {c.name: c.last_connect_time for c in session.get_system_info().client_info}
            return times.get(name, 0.0) > launched

        if not wait_until(heard_from_it, timeout):
            raise DeploymentError(
                f"{name} did not connect within {timeout:.0f}s of starting again; log tail:\n{site_log_tail(lay, name)}"
            )
    finally:
        with contextlib.suppress(Exception):
            session.close()
    seconds = time.time() - launched
    log(f"{name} started again and connected after {seconds:.1f}s")
    return seconds


def _clear_stale_pid_files(site: str) -> None:
    """Remove the site daemon's pid files when the process they name is gone. A killed daemon leaves
    ``daemon_pid.fl`` behind, and its start script refuses to start while ``kill -0`` finds that pid, which a
    zombie not yet reaped (by an init that reaps late) still passes."""
    for name in ("daemon_pid.fl", "pid.fl"):
        path = os.path.join(site, name)
        try:
            with open(path, encoding="utf-8") as stream:
                pid = int(stream.read().strip())
        except (OSError, ValueError):
            continue
        if not _running(pid):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie waiting to be reaped)."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X")
