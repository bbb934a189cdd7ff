"""The processes of a provisioned deployment: launching its sites, waiting for its clients, the admin
session, status, and shutting everything down so that no process is left."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import socket
import subprocess
import time

from devsim_flare.deployment.netns import in_namespace
from devsim_flare.deployment.workspace import (
    SHUTDOWN_FILE,
    DeploymentError,
    Layout,
    isolate_home,
    kit,
    layout_for,
    load_state,
    log,
    site_env,
    sites_in_start_order,
    tree_text,
)


def _cmdline(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            return stream.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, parent pid, ...); None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stream:
            return stream.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _parent_of(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def _self_and_ancestors() -> set[int]:
    chain, pid = set(), os.getpid()
    while pid and pid not in chain:
        chain.add(pid)
        pid = _parent_of(pid)
    return chain


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """(pid, command line) of live processes, other than this one and its ancestors, that contain ``text``."""
    skip = _self_and_ancestors()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        cmdline = _cmdline(int(entry))
        if cmdline and text in cmdline:
            found.append((int(entry), cmdline))
    return found


def system_processes(state: dict) -> list[tuple[int, str]]:
    """Every process of this system: each one names its startup kit folder on its command line."""
    return processes_mentioning(state["kits"] + os.sep)


def signal_all(processes: list[tuple[int, str]], sig: int) -> None:
    for pid, _ in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_until(predicate, timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------------
# admin API


def open_admin_session(username: str, admin_kit: str, address: str, timeout: float = 10.0):
    """An admin session as ``username`` with the startup kit in folder ``admin_kit`` (``address``: the server's
    ``host:port`` the kit names, for the message); DeploymentError when the server cannot be reached in time."""
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # "Connecting to FLARE ..." lines
            return new_secure_session(username, admin_kit, timeout=timeout)
    except Exception as error:  # NoConnection, AuthenticationError, timeouts: all mean "not reachable"
        raise DeploymentError(f"cannot log in to the server at {address} as {username}: {error}") from error


def open_session(state: dict, timeout: float = 10.0):
    """An admin session as the project admin of the deployment described by ``state``."""
    address = f"{state['host']}:{state['admin_port']}"
    return open_admin_session(state["admin"], kit(state, state["admin"]), address, timeout)


def connected_clients(session) -> list[str]:
    return sorted(c.name for c in session.get_system_info().client_info)


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# ---------------------------------------------------------------------------------------------------
# start / stop / status


def launch_site(lay: Layout, state: dict, name: str) -> None:
    """Run the site's startup/start.sh (which backgrounds its sub_start.sh daemon) in a new session."""
    site = kit(state, name)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(site, SHUTDOWN_FILE))
    os.makedirs(lay.logs, exist_ok=True)
    with open(os.path.join(lay.logs, f"{name}.log"), "ab") as out:
        out.write(f"==== deployment start {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        out.flush()
        try:
            subprocess.run(
                in_namespace(state.get("netns"), name, ["bash", os.path.join(site, "startup", "start.sh")]),
                cwd=site,
                env=site_env(lay),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                check=True,
                timeout=30,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
            raise DeploymentError(f"{name}'s startup/start.sh failed ({error}); see {out.name}") from error


def site_log_tail(lay: Layout, name: str, lines: int = 15) -> str:
    path = os.path.join(lay.logs, f"{name}.log")
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            return "".join(stream.readlines()[-lines:])
    except OSError:
        return "(no log)"


def start(workspace: str, timeout: float = 180.0) -> None:
    lay = layout_for(workspace)
    state = load_state(lay)
    isolate_home(lay)
    running = system_processes(state)
    if running:
        raise DeploymentError(f"the system in {lay.root} already runs ({len(running)} processes); stop it first")
    ports = [state["fed_learn_port"], state["admin_port"]] + [r["port"] for r in state["relays"]]
    busy = [p for p in sorted(set(ports)) if not _port_free(p)]
    if busy:
        raise DeploymentError(f"ports {busy} are in use; provision again with another --port-base")
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    try:
        log(f"starting server {state['server']}")
        launch_site(lay, state, state["server"])
        if not wait_until(lambda: port_open(state["host"], state["admin_port"]), deadline - time.monotonic()):
            raise DeploymentError(
                f"the server's admin port {state['admin_port']} did not open in {timeout:.0f}s; "
                f"log tail:\n{site_log_tail(lay, state['server'])}"
            )
        for relay in state["relays"]:
            log(f"starting relay {relay['name']}")
            launch_site(lay, state, relay["name"])
        for relay in state["relays"]:
            if not wait_until(lambda r=relay: port_open(state["host"], r["port"]), deadline - time.monotonic()):
                raise DeploymentError(
                    f"relay {relay['name']} did not open port {relay['port']} in {timeout:.0f}s; "
                    f"log tail:\n{site_log_tail(lay, relay['name'])}"
                )
        for client in state["clients"]:
            log(f"starting client {client['name']}" + (f" (via {client['relay']})" if client["relay"] else ""))
            launch_site(lay, state, client["name"])
        wait_for_clients(lay, state, deadline)
    except BaseException:
        log("start failed: ending the processes it started")
        with contextlib.suppress(Exception):
            kill_all(state, grace=5.0)
        raise
    log(f"all {len(state['clients'])} clients connected after {time.monotonic() - started:.1f}s")


def wait_for_clients(lay: Layout, state: dict, deadline: float) -> None:
    expected = sorted(c["name"] for c in state["clients"])
    seen: list[str] = []
    last_error = None
    session = None
    try:
        while time.monotonic() < deadline:
            try:
                if session is None:
                    session = open_session(state, timeout=min(10.0, max(1.0, deadline - time.monotonic())))
                seen = connected_clients(session)
                if seen == expected:
                    return
            except Exception as error:  # the server may still be starting its admin service
                last_error = error
                if session is not None:
                    with contextlib.suppress(Exception):
                        session.close()
                    session = None
            time.sleep(1.0)
    finally:
        if session is not None:
            with contextlib.suppress(Exception):
                session.close()
    missing = sorted(set(expected) - set(seen))
    tails = "\n".join(f"--- {name}:\n{site_log_tail(lay, name, 8)}" for name in missing[:2])
    raise DeploymentError(
        f"clients {missing} did not connect in time (connected: {seen}; last admin error: {last_error})\n{tails}"
    )


def kill_all(state: dict, grace: float) -> list[tuple[int, str]]:
    """Ask every site daemon to exit, SIGTERM what is left, then SIGKILL; returns survivors (should be [])."""
    for _, name in sites_in_start_order(state):
        site = kit(state, name)
        if os.path.isdir(site):
            with open(os.path.join(site, SHUTDOWN_FILE), "a", encoding="utf-8"):
                pass
    left = system_processes(state)
    if left:
        signal_all(left, signal.SIGTERM)
        wait_until(lambda: not system_processes(state), grace)
    left = system_processes(state)
    if left:
        signal_all(left, signal.SIGKILL)
        wait_until(lambda: not system_processes(state), 10.0)
    return system_processes(state)


def stop(workspace: str, timeout: float = 60.0) -> None:
    lay = layout_for(workspace)
    state = load_state(lay)
    isolate_home(lay)
    if not system_processes(state):
        log("nothing is running")
        return
    started = time.monotonic()
    if port_open(state["host"], state["admin_port"]):
        try:
            session = open_session(state, timeout=10.0)
            log("admin: shutdown all (server and clients)")
            # wait=False: NVFlare's own wait for the server going down does not notice it here and runs
            # into its timeout; the processes are watched below instead
            with contextlib.redirect_stdout(io.StringIO()):
                session.shutdown("all", wait=False)
            with contextlib.suppress(Exception):
                session.close()
        except Exception as error:  # a broken server must not keep the processes alive
            log(f"admin shutdown failed ({error}); ending the processes directly")
        sites = [kit(state, c["name"]) for c in state["clients"]] + [kit(state, state["server"])]
        wait_until(
            lambda: not any(names_folder(c, site) for _, c in system_processes(state) for site in sites),
            max(1.0, timeout / 2),
        )
    # relays have no admin channel; every site daemon (startup/sub_start.sh) exits once it finds shutdown.fl
    for _, name in sites_in_start_order(state):
        with open(os.path.join(kit(state, name), SHUTDOWN_FILE), "a", encoding="utf-8"):
            pass
    wait_until(lambda: not system_processes(state), max(1.0, timeout - (time.monotonic() - started) - 10.0))
    survivors = kill_all(state, grace=5.0)
    if survivors:
        raise DeploymentError("processes survived SIGKILL:\n" + "\n".join(f"{p}: {c}" for p, c in survivors))
    strays = processes_mentioning(lay.root)
    if strays:
        log("other processes still mention the workspace (not started by this script, left alone):")
        for pid, cmdline in strays:
            log(f"  {pid}: {cmdline[:200]}")
    log(f"stopped; no process of {state['kits']} remains ({time.monotonic() - started:.1f}s)")


ROUTE = re.compile(r" - (\S+): created backbone internal connector to (\S+) on parent")


def client_route(state: dict, name: str) -> str | None:
    """The client's cell name and the address it connected to, from its log (e.g. ``relay-1.site-1 -> ...``)."""
    try:
        with open(os.path.join(kit(state, name), "log.txt"), encoding="utf-8", errors="replace") as stream:
            found = [m.groups() for m in map(ROUTE.search, stream) if m]
    except OSError:
        return None
    return f"{found[-1][0]} -> {found[-1][1]}" if found else None


def status(workspace: str) -> int:
    lay = layout_for(workspace)
    state = load_state(lay)
    isolate_home(lay)
    print(tree_text(state))
    processes = system_processes(state)
    print(f"processes: {len(processes)}")
    for role, name in sites_in_start_order(state):
        site = kit(state, name)
        mine = [pid for pid, cmdline in processes if names_folder(cmdline, site)]
        route = client_route(state, name) if role == "client" else None
        print(f"  {role:6s} {name:10s} {len(mine)} process(es) {mine}" + (f"  cell {route}" if route else ""))
    if not port_open(state["host"], state["admin_port"]):
        print("server admin port closed: the system is not running")
        return 1 if processes else 0
    session = open_session(state)
    try:
        clients = connected_clients(session)
        print(f"connected clients: {clients}")
        for job in session.list_jobs() or []:
            print(f"  job {job.get('job_id')} {job.get('job_name', job.get('name'))} {job.get('status')}")
    finally:
        session.close()
    return 0


def names_folder(cmdline: str, folder: str) -> bool:
    """Whether a command line names ``folder`` (followed by a separator, a space or the end)."""
    return folder + os.sep in cmdline or folder + " " in cmdline + " "
