"""A provisioned NVFlare 2.9 edge hierarchy on this machine: server, 2 relays, 4 leaf clients, one admin.

Run with the project's environment (``.venv/bin/python scripts/edge_system.py ...``). Everything lives in
one workspace folder (startup kits, HOME, job storage, logs, results):

    provision --workspace WS [--port-base N]   startup kits from app_configs/edge_hierarchy/project.yml
              [--aggregators]                  (plus an aggregating client on each relay)
    start     --workspace WS                   server, then relays, then clients; waits for every client
    run       --workspace WS [-- JOB FLAGS]    submits jobs/pt_job_edge.py's job, waits, prints the accuracy
    status    --workspace WS                   processes, connected clients, jobs
    stop      --workspace WS                   admin shutdown, then ends whatever is left; checks none remain
    demo      --workspace WS [-- JOB FLAGS]    provision + start + run + stop (stop always runs)

``submit`` is another name for ``run``. JOB FLAGS are jobs/pt_job_edge.py's flags (``--help-job`` lists
them); this script's defaults are small enough for 2 CPU cores. See docs/edge_hierarchy.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from devsim_flare.recipe import apply_runtime_env_defaults  # noqa: E402

DEFAULT_PROJECT = os.path.join(REPO, "app_configs", "edge_hierarchy", "project.yml")
STATE_FILE = "system.json"
SHUTDOWN_FILE = "shutdown.fl"  # NVFlare's site daemon (startup/sub_start.sh) exits when it finds this file

# Small enough for 2 CPU cores (4 leaf processes share them): 4 leaves x 8 devices, 3 versions.
DEFAULT_JOB_FLAGS = {
    "devices_per_leaf": 8,
    "num_versions": 3,
    "partition": "iid",
    "samples_per_device": 100,
    "local_epochs": 3,
    "lr": 0.03,
    "synthetic_train_size": 4000,
    "synthetic_test_size": 1000,
    "update_interval": 0.5,
}


class EdgeSystemError(RuntimeError):
    """A step failed; the message says which and what to look at."""


def log(message: str) -> None:
    print(f"[edge-system] {message}", flush=True)


# ---------------------------------------------------------------------------------------------------
# workspace layout and state


@dataclass
class Layout:
    root: str

    @property
    def project_file(self) -> str:
        return os.path.join(self.root, "project.yml")

    @property
    def home(self) -> str:
        return os.path.join(self.root, "home")

    @property
    def prov(self) -> str:
        return os.path.join(self.root, "prov")

    @property
    def storage(self) -> str:
        return os.path.join(self.root, "storage")

    @property
    def logs(self) -> str:
        return os.path.join(self.root, "logs")

    @property
    def results(self) -> str:
        return os.path.join(self.root, "results")

    @property
    def state_file(self) -> str:
        return os.path.join(self.root, STATE_FILE)


def layout_for(workspace: str) -> Layout:
    return Layout(os.path.abspath(workspace))


def load_state(lay: Layout) -> dict:
    if not os.path.isfile(lay.state_file):
        raise EdgeSystemError(
            f"{lay.root} is not a provisioned workspace (no {STATE_FILE}); run: edge_system.py provision "
            f"--workspace {lay.root}"
        )
    with open(lay.state_file, encoding="utf-8") as stream:
        return json.load(stream)


def kit(state: dict, name: str) -> str:
    return os.path.join(state["kits"], name)


def sites_in_start_order(state: dict) -> list[tuple[str, str]]:
    """(role, name) for every process-running participant: server first, then relays, then clients."""
    return (
        [("server", state["server"])]
        + [("relay", r["name"]) for r in state["relays"]]
        + [("client", c["name"]) for c in state["clients"]]
    )


def leaf_clients(state: dict) -> list[str]:
    """Clients that are no other client's parent (the ones that run simulated devices)."""
    parents = {c.get("parent") for c in state["clients"]}
    return [c["name"] for c in state["clients"] if c["name"] not in parents]


def isolate_home(lay: Layout) -> None:
    """NVFlare keeps its own settings in ~/.nvflare: point HOME into the workspace for us and our children."""
    os.makedirs(lay.home, exist_ok=True)
    os.environ["HOME"] = lay.home


def site_env(lay: Layout) -> dict[str, str]:
    """Environment of the site processes: this venv's python first on PATH (start scripts call python3)."""
    env = dict(os.environ)
    env["HOME"] = lay.home
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONPATH", None)  # the job ships this project's packages in its custom/ folder
    env.pop("NVFL_WORKSPACE", None)  # would move every site's workspace to one folder
    apply_runtime_env_defaults(env)  # NVFlare streaming and allocator settings that keep memory bounded
    return env


# ---------------------------------------------------------------------------------------------------
# processes


def _cmdline(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            return stream.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stream:
            return int(stream.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


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


def _signal_all(processes: list[tuple[int, str]], sig: int) -> None:
    for pid, _ in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_until(predicate, timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------------
# provision


PORT_KEYS = ("fed_learn_port", "admin_port")


def rewrite_ports(project: dict, port_base: int) -> dict[str, int]:
    """Give every port of the project a new number: server fed_learn, admin, then relays in order."""
    ports: dict[str, int] = {}
    next_port = port_base
    for participant in project.get("participants", []):
        if participant.get("type") == "server":
            for key in PORT_KEYS:
                participant[key] = next_port
                ports[f"{participant['name']}.{key}"] = next_port
                next_port += 1
    for participant in project.get("participants", []):
        host = participant.get("listening_host")
        if participant.get("type") == "relay" and isinstance(host, dict):
            host["port"] = next_port
            ports[participant["name"]] = next_port
            next_port += 1
    if port_base < 1024 or next_port - 1 > 65535:
        raise EdgeSystemError(
            f"--port-base {port_base}: the ports {port_base}..{next_port - 1} must lie in 1024..65535"
        )
    return ports


def describe_project(project: dict, kits: str) -> dict[str, Any]:
    """The state file's content: who runs where, with which ports."""
    participants = project.get("participants", [])
    servers = [p for p in participants if p.get("type") == "server"]
    if len(servers) != 1:
        raise EdgeSystemError("the project must define exactly one server")
    server = servers[0]
    admins = [p for p in participants if p.get("type") == "admin" and p.get("role") == "project_admin"]
    if not admins:
        raise EdgeSystemError("the project needs an admin with role project_admin (to start jobs and shut down)")
    relays = [
        {"name": p["name"], "port": int(p["listening_host"]["port"])} for p in participants if p.get("type") == "relay"
    ]
    clients = []
    for p in participants:
        if p.get("type") != "client":
            continue
        connect_to = p.get("connect_to")
        via = connect_to.get("name") if isinstance(connect_to, dict) else None
        clients.append({"name": p["name"], "relay": via, "parent": p.get("parent")})
    fed_port = int(server.get("fed_learn_port", 8002))
    return {
        "project": project["name"],
        "kits": kits,
        "server": server["name"],
        "host": server.get("default_host", server["name"]),
        "fed_learn_port": fed_port,
        "admin_port": int(server.get("admin_port", fed_port)),
        "relays": relays,
        "clients": clients,
        "admin": admins[0]["name"],
    }


def _redirect_server_storage(server_kit: str, storage: str) -> None:
    """The server's job store and snapshots default to /tmp/nvflare: keep them in the workspace."""
    source = os.path.join(server_kit, "local", "resources.json.default")
    with open(source, encoding="utf-8") as stream:
        resources = json.load(stream)
    snapshot = resources.get("snapshot_persistor", {}).get("args", {}).get("storage", {}).get("args")
    if isinstance(snapshot, dict):
        snapshot["root_dir"] = os.path.join(storage, "snapshots")
    for component in resources.get("components", []):
        if component.get("id") == "job_manager":
            component.setdefault("args", {})["uri_root"] = os.path.join(storage, "jobs")
    os.makedirs(storage, exist_ok=True)
    with open(os.path.join(server_kit, "local", "resources.json"), "w", encoding="utf-8") as stream:
        json.dump(resources, stream, indent=2)


def add_aggregators(project: dict) -> list[str]:
    """Attach one aggregating (non-leaf) client to each relay and make it the parent of that relay's clients.

    ``relay-N`` gets ``agg-N``; the server then sends the task to the aggregators only, and each one
    combines its leaves' updates before reporting to the server (NVFlare's client hierarchy).
    """
    participants = project.get("participants", [])
    relays = [p["name"] for p in participants if p.get("type") == "relay"]
    added = []
    for relay in relays:
        name = relay.replace("relay", "agg") if "relay" in relay else f"agg-{relay}"
        for client in participants:
            connect_to = client.get("connect_to")
            if client.get("type") == "client" and isinstance(connect_to, dict) and connect_to.get("name") == relay:
                client["parent"] = name
        at = next(i for i, p in enumerate(participants) if p.get("name") == relay)
        aggregator = {"name": name, "type": "client", "org": participants[at]["org"], "connect_to": {"name": relay}}
        participants.insert(at + 1, aggregator)  # parents start before their leaves
        added.append(name)
    return added


def provision(
    workspace: str,
    project_file: str = DEFAULT_PROJECT,
    port_base: int | None = None,
    force: bool = False,
    aggregators: bool = False,
) -> dict:
    import yaml

    lay = layout_for(workspace)
    if os.path.exists(lay.state_file) or os.path.exists(lay.prov):
        if not force:
            raise EdgeSystemError(f"{lay.root} is already provisioned; use --force to provision it again")
        if os.path.exists(lay.state_file) and system_processes(load_state(lay)):
            raise EdgeSystemError(f"the system in {lay.root} is running; stop it before provisioning again")
        for folder in (lay.prov, lay.storage):
            shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(lay.state_file)
    os.makedirs(lay.root, exist_ok=True)
    isolate_home(lay)
    with open(project_file, encoding="utf-8") as stream:
        project = yaml.safe_load(stream)
    ports = rewrite_ports(project, port_base) if port_base is not None else {}
    if aggregators:
        add_aggregators(project)
    with open(lay.project_file, "w", encoding="utf-8") as stream:
        yaml.safe_dump(project, stream, sort_keys=False)

    nvflare_cli = os.path.join(os.path.dirname(sys.executable), "nvflare")
    command = (
        [nvflare_cli] if os.path.exists(nvflare_cli) else [sys.executable, "-c", "from nvflare.cli import main; main()"]
    )
    command += ["provision", "-p", lay.project_file, "-w", lay.prov, "--force"]
    try:
        proc = subprocess.run(
            command,
            cwd=lay.root,
            env=site_env(lay),
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as error:
        raise EdgeSystemError("nvflare provision did not finish in 180 s") from error
    if proc.returncode != 0:
        raise EdgeSystemError(
            f"nvflare provision exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    project_root = os.path.join(lay.prov, project["name"])
    builds = sorted(d for d in os.listdir(project_root) if d.startswith("prod_"))
    if not builds:
        raise EdgeSystemError(f"nvflare provision wrote no prod_NN folder under {project_root}")
    state = describe_project(project, os.path.join(project_root, builds[-1]))
    for role, name in sites_in_start_order(state) + [("admin", state["admin"])]:
        if not os.path.isdir(os.path.join(kit(state, name), "startup")):
            raise EdgeSystemError(f"no startup kit for {role} {name} in {state['kits']}")
    _redirect_server_storage(kit(state, state["server"]), lay.storage)
    with open(lay.state_file, "w", encoding="utf-8") as stream:
        json.dump(state, stream, indent=1)
    log(f"provisioned {state['project']} into {state['kits']}" + (f" (ports {ports})" if ports else ""))
    print(tree_text(state), flush=True)
    return state


def tree_text(state: dict) -> str:
    lines = [f"{state['server']}  {state['host']}:{state['fed_learn_port']} (admin {state['admin_port']})"]
    for relay in state["relays"]:
        lines.append(f"  {relay['name']}  {state['host']}:{relay['port']}")
        for client in state["clients"]:
            if client["relay"] == relay["name"]:
                parent = f"  (leaf of {client['parent']})" if client.get("parent") else ""
                lines.append(f"    {client['name']}{parent}")
    direct = [c["name"] for c in state["clients"] if not c["relay"]]
    if direct:
        lines.append(f"  (direct to server) {', '.join(direct)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# admin API


def open_session(state: dict, timeout: float = 10.0):
    """An admin session as the project admin; EdgeSystemError when the server cannot be reached in time."""
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    admin_kit = kit(state, state["admin"])
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # "Connecting to FLARE ..." lines
            return new_secure_session(state["admin"], admin_kit, timeout=timeout)
    except Exception as error:  # NoConnection, AuthenticationError, timeouts: all mean "not reachable"
        raise EdgeSystemError(
            f"cannot log in to the server at {state['host']}:{state['admin_port']} as {state['admin']}: {error}"
        ) from error


def connected_clients(session) -> list[str]:
    return sorted(c.name for c in session.get_system_info().client_info)


def _port_open(host: str, port: int) -> bool:
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


def _launch(lay: Layout, state: dict, name: str) -> None:
    """Run the site's startup/start.sh (which backgrounds its sub_start.sh daemon) in a new session."""
    site = kit(state, name)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(site, SHUTDOWN_FILE))
    os.makedirs(lay.logs, exist_ok=True)
    with open(os.path.join(lay.logs, f"{name}.log"), "ab") as out:
        out.write(f"==== edge_system.py start {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        out.flush()
        try:
            subprocess.run(
                ["bash", os.path.join(site, "startup", "start.sh")],
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
            raise EdgeSystemError(f"{name}'s startup/start.sh failed ({error}); see {out.name}") from error


def _site_log_tail(lay: Layout, name: str, lines: int = 15) -> str:
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
        raise EdgeSystemError(f"the system in {lay.root} already runs ({len(running)} processes); stop it first")
    ports = [state["fed_learn_port"], state["admin_port"]] + [r["port"] for r in state["relays"]]
    busy = [p for p in sorted(set(ports)) if not _port_free(p)]
    if busy:
        raise EdgeSystemError(f"ports {busy} are in use; provision again with another --port-base")
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    try:
        log(f"starting server {state['server']}")
        _launch(lay, state, state["server"])
        if not _wait_until(lambda: _port_open(state["host"], state["admin_port"]), deadline - time.monotonic()):
            raise EdgeSystemError(
                f"the server's admin port {state['admin_port']} did not open in {timeout:.0f}s; "
                f"log tail:\n{_site_log_tail(lay, state['server'])}"
            )
        for relay in state["relays"]:
            log(f"starting relay {relay['name']}")
            _launch(lay, state, relay["name"])
        for relay in state["relays"]:
            if not _wait_until(lambda r=relay: _port_open(state["host"], r["port"]), deadline - time.monotonic()):
                raise EdgeSystemError(
                    f"relay {relay['name']} did not open port {relay['port']} in {timeout:.0f}s; "
                    f"log tail:\n{_site_log_tail(lay, relay['name'])}"
                )
        for client in state["clients"]:
            log(f"starting client {client['name']}" + (f" (via {client['relay']})" if client["relay"] else ""))
            _launch(lay, state, client["name"])
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
    tails = "\n".join(f"--- {name}:\n{_site_log_tail(lay, name, 8)}" for name in missing[:2])
    raise EdgeSystemError(
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
        _signal_all(left, signal.SIGTERM)
        _wait_until(lambda: not system_processes(state), grace)
    left = system_processes(state)
    if left:
        _signal_all(left, signal.SIGKILL)
        _wait_until(lambda: not system_processes(state), 10.0)
    return system_processes(state)


def stop(workspace: str, timeout: float = 60.0) -> None:
    lay = layout_for(workspace)
    state = load_state(lay)
    isolate_home(lay)
    if not system_processes(state):
        log("nothing is running")
        return
    started = time.monotonic()
    if _port_open(state["host"], state["admin_port"]):
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
        clients = [kit(state, c["name"]) + os.sep for c in state["clients"]]
        server = kit(state, state["server"]) + os.sep
        _wait_until(
            lambda: not any(p in c for _, c in system_processes(state) for p in clients + [server]),
            max(1.0, timeout / 2),
        )
    # relays have no admin channel; every site daemon (startup/sub_start.sh) exits once it finds shutdown.fl
    for _, name in sites_in_start_order(state):
        with open(os.path.join(kit(state, name), SHUTDOWN_FILE), "a", encoding="utf-8"):
            pass
    _wait_until(lambda: not system_processes(state), max(1.0, timeout - (time.monotonic() - started) - 10.0))
    survivors = kill_all(state, grace=5.0)
    if survivors:
        raise EdgeSystemError("processes survived SIGKILL:\n" + "\n".join(f"{p}: {c}" for p, c in survivors))
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
        mine = [pid for pid, cmdline in processes if site + os.sep in cmdline or site + " " in cmdline + " "]
        route = client_route(state, name) if role == "client" else None
        print(f"  {role:6s} {name:10s} {len(mine)} process(es) {mine}" + (f"  cell {route}" if route else ""))
    if not _port_open(state["host"], state["admin_port"]):
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


# ---------------------------------------------------------------------------------------------------
# run the edge job


def _job_module():
    spec = importlib.util.spec_from_file_location("devsim_pt_job_edge", os.path.join(REPO, "jobs", "pt_job_edge.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job_parser(num_leaves: int):
    parser = _job_module().build_parser()
    parser.prog = "edge_system.py run -- "
    parser.set_defaults(num_leaf_nodes=num_leaves, **DEFAULT_JOB_FLAGS)
    return parser


def _print_new_records(path: str, shown: int) -> int:
    try:
        with open(path, encoding="utf-8") as stream:
            records = json.load(stream)["records"]
    except (OSError, ValueError, KeyError):
        return shown
    for record in records[shown:]:
        log(
            f"version {record['version']}  accuracy {record['accuracy']:.4f}  loss {record['loss']:.4f}  "
            f"elapsed {record['elapsed_s']:.1f}s"
        )
    return len(records)


def copy_server_job_log(lay: Layout, job_id: str, output_dir: str, wait: float = 15.0) -> str | None:
    """Copy the server job's log.txt into ``output_dir``.

    NVFlare deletes the server's job folder when the job ends and keeps it only zipped in the job store
    (``storage/jobs/<job id>/workspace``, written as the job finishes); None when it does not appear in time.
    """
    archive = os.path.join(lay.storage, "jobs", job_id, "workspace")
    destination = os.path.join(output_dir, "server_job_log.txt")
    deadline = time.monotonic() + wait
    while True:
        try:
            with zipfile.ZipFile(archive) as zipped, open(destination, "wb") as out:
                out.write(zipped.read("log.txt"))
            return destination
        except (OSError, KeyError, zipfile.BadZipFile):
            if time.monotonic() >= deadline:
                log(f"no server job log in {archive}")
                return None
            time.sleep(1.0)


def run_job(workspace: str, job_flags: list[str], timeout: float = 900.0) -> dict:
    """Submit the edge job to the running system, wait for it, print the result; returns the summary."""
    lay = layout_for(workspace)
    state = load_state(lay)
    isolate_home(lay)
    module = _job_module()
    leaves = leaf_clients(state)
    parser = job_parser(len(leaves))
    args = parser.parse_args(job_flags)
    if args.num_leaf_nodes != len(leaves):
        raise EdgeSystemError(f"--num-leaf-nodes {args.num_leaf_nodes} but the system has {len(leaves)} leaf clients")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    output_dir = os.path.abspath(args.output_dir) if args.output_dir else os.path.join(lay.results, f"edge-{stamp}")
    os.makedirs(output_dir, exist_ok=True)
    try:
        recipe = module.build_recipe(args, output_dir)
    except ValueError as error:
        parser.error(str(error))

    if not _port_open(state["host"], state["admin_port"]):
        raise EdgeSystemError(
            f"the server's admin port {state['admin_port']} is closed: start the system first "
            f"(edge_system.py start --workspace {lay.root})"
        )
    session = open_session(state)
    try:
        clients = connected_clients(session)
        expected = sorted(c["name"] for c in state["clients"])
        if clients != expected:
            raise EdgeSystemError(f"connected clients {clients}, expected {expected}: is the system started?")
        from nvflare.recipe import ProdEnv

        env = ProdEnv(startup_kit_location=kit(state, state["admin"]), username=state["admin"], login_timeout=30.0)
        started = time.monotonic()
        with contextlib.redirect_stdout(io.StringIO()):  # login and "Submitted job" lines
            job_id = recipe.execute(env).get_job_id()
        log(
            f"submitted job {job_id}: {args.num_leaf_nodes} leaves x {args.devices_per_leaf} devices, "
            f"{args.num_versions} versions, {args.mode}; results in {output_dir}"
        )
        results_path = os.path.join(output_dir, "edge_results.json")
        shown, job_status = 0, None
        deadline = started + timeout
        while time.monotonic() < deadline:
            job_status = session.get_job_meta(job_id).get("status")
            shown = _print_new_records(results_path, shown)
            if job_status and job_status.startswith("FINISHED"):
                break
            time.sleep(2.0)
        else:
            with contextlib.suppress(Exception):
                session.abort_job(job_id)
            raise EdgeSystemError(
                f"job {job_id} still {job_status} after {timeout:.0f}s (aborted); see {lay.logs} and the site logs"
            )
        wall = time.monotonic() - started
    finally:
        session.close()

    _print_new_records(results_path, shown)
    server_log = copy_server_job_log(lay, job_id, output_dir)
    records = []
    if os.path.isfile(results_path):
        with open(results_path, encoding="utf-8") as stream:
            records = json.load(stream)["records"]
    summary = {
        "job_id": job_id,
        "status": job_status,
        "wall_s": round(wall, 1),
        "versions": [r["version"] for r in records],
        "expected_versions": list(range(1, args.num_versions + 2)),
        "results": results_path,
        "server_job_log": server_log,
    }
    with open(os.path.join(output_dir, "job.json"), "w", encoding="utf-8") as stream:
        json.dump(summary, stream, indent=1)
    if not records:
        raise EdgeSystemError(f"job {job_id} ended {job_status} without results in {results_path}")
    first, last = records[0], records[-1]
    print(
        f"job {job_id} {job_status}; final accuracy {last['accuracy']:.4f} at version {last['version']} "
        f"(initial {first['accuracy']:.4f}); {wall:.1f}s; results: {results_path}",
        flush=True,
    )
    if job_status != "FINISHED:COMPLETED" or summary["versions"] != summary["expected_versions"]:
        raise EdgeSystemError(
            f"job {job_id} ended {job_status} with versions {summary['versions']} "
            f"(expected {summary['expected_versions']})"
        )
    return summary


def demo(workspace: str, port_base: int | None, job_flags: list[str], options: argparse.Namespace) -> None:
    lay = layout_for(workspace)
    provision(workspace, port_base=port_base, force=os.path.exists(lay.state_file), aggregators=options.aggregators)
    try:
        start(workspace, timeout=options.start_timeout)
        run_job(workspace, job_flags, timeout=options.job_timeout)
    finally:
        stop(workspace, timeout=options.stop_timeout)


# ---------------------------------------------------------------------------------------------------
# command line


AGGREGATORS_HELP = "add an aggregating client agg-N on each relay-N as parent of its leaves"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Job flags follow '--'; see --help-job."
    )
    parser.add_argument("--help-job", action="store_true", help="list the job flags of 'run' and 'demo' and exit")
    commands = parser.add_subparsers(dest="command")

    def add(name: str, help_text: str, aliases=()):
        sub = commands.add_parser(name, help=help_text, aliases=list(aliases))
        sub.add_argument("--workspace", "-w", required=True, help="folder holding everything of this system")
        return sub

    p = add("provision", "write the startup kits into the workspace")
    p.add_argument("--project", default=DEFAULT_PROJECT, help="NVFlare project file")
    p.add_argument("--port-base", type=int, default=None, help="use ports N..N+3 instead of the project's")
    p.add_argument("--aggregators", action="store_true", help=AGGREGATORS_HELP)
    p.add_argument("--force", action="store_true", help="provision again over an existing (stopped) workspace")
    p = add("start", "start server, relays, clients and wait for every client")
    p.add_argument("--timeout", type=float, default=180.0)
    p = add("run", "submit the edge job and wait for it", aliases=("submit",))
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the job")
    p = add("stop", "shut the system down and end every process of it")
    p.add_argument("--timeout", type=float, default=60.0)
    add("status", "show processes, connected clients and jobs")
    p = add("demo", "provision, start, run, stop (stop always runs)")
    p.add_argument("--port-base", type=int, default=None)
    p.add_argument("--aggregators", action="store_true", help=AGGREGATORS_HELP)
    p.add_argument("--start-timeout", type=float, default=180.0)
    p.add_argument("--job-timeout", type=float, default=900.0)
    p.add_argument("--stop-timeout", type=float, default=60.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    job_flags: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, job_flags = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.help_job:
        job_parser(4).print_help()
        return 0
    if not args.command:
        parser.print_help()
        return 2
    if job_flags and args.command not in ("run", "submit", "demo"):
        parser.error(f"job flags after '--' are for run/demo, not {args.command}")
    import logging

    # the admin API logs every failed connection attempt while the server starts or stops
    logging.getLogger("nvflare").setLevel(logging.CRITICAL)
    try:
        if args.command == "provision":
            provision(args.workspace, args.project, args.port_base, args.force, args.aggregators)
        elif args.command == "start":
            start(args.workspace, args.timeout)
        elif args.command in ("run", "submit"):
            run_job(args.workspace, job_flags, args.timeout)
        elif args.command == "stop":
            stop(args.workspace, args.timeout)
        elif args.command == "status":
            return status(args.workspace)
        elif args.command == "demo":
            demo(args.workspace, args.port_base, job_flags, args)
    except EdgeSystemError as error:
        print(f"edge_system.py {args.command}: error: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
