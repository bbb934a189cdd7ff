"""Provisioning a deployment from an NVFlare project file (app_configs/deployment or edge_hierarchy):
ports, optional aggregating clients, startup kits, and the state file the other steps read."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from typing import Any

from devsim_flare.deployment.processes import system_processes
from devsim_flare.deployment.workspace import (
    DeploymentError,
    isolate_home,
    kit,
    layout_for,
    load_state,
    log,
    site_env,
    sites_in_start_order,
    tree_text,
)

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
        raise DeploymentError(
            f"--port-base {port_base}: the ports {port_base}..{next_port - 1} must lie in 1024..65535"
        )
    return ports


def describe_project(project: dict, kits: str) -> dict[str, Any]:
    """The state file's content: who runs where, with which ports."""
    participants = project.get("participants", [])
    servers = [p for p in participants if p.get("type") == "server"]
    if len(servers) != 1:
        raise DeploymentError("the project must define exactly one server")
    server = servers[0]
    admins = [p for p in participants if p.get("type") == "admin" and p.get("role") == "project_admin"]
    if not admins:
        raise DeploymentError("the project needs an admin with role project_admin (to start jobs and shut down)")
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
    project_file: str,
    port_base: int | None = None,
    force: bool = False,
    aggregators: bool = False,
    own_hosts: bool = False,
) -> dict:
    """Write the startup kits of ``project_file`` into ``workspace`` and the state file the other steps read.
    ``own_hosts``: every site runs in a network namespace of its own (:mod:`devsim_flare.deployment.netns`), and
    the server is provisioned under the name and address it has there."""
    import yaml

    lay = layout_for(workspace)
    if os.path.exists(lay.state_file) or os.path.exists(lay.prov):
        if not force:
            raise DeploymentError(f"{lay.root} is already provisioned; use --force to provision it again")
        if os.path.exists(lay.state_file) and system_processes(load_state(lay)):
            raise DeploymentError(f"the system in {lay.root} is running; stop it before provisioning again")
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
    layout = _own_hosts(project) if own_hosts else None
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
        raise DeploymentError("nvflare provision did not finish in 180 s") from error
    if proc.returncode != 0:
        raise DeploymentError(
            f"nvflare provision exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    project_root = os.path.join(lay.prov, project["name"])
    builds = sorted(d for d in os.listdir(project_root) if d.startswith("prod_"))
    if not builds:
        raise DeploymentError(f"nvflare provision wrote no prod_NN folder under {project_root}")
    state = describe_project(project, os.path.join(project_root, builds[-1]))
    for role, name in sites_in_start_order(state) + [("admin", state["admin"])]:
        if not os.path.isdir(os.path.join(kit(state, name), "startup")):
            raise DeploymentError(f"no startup kit for {role} {name} in {state['kits']}")
    _redirect_server_storage(kit(state, state["server"]), lay.storage)
    if layout:
        state["netns"] = layout
    with open(lay.state_file, "w", encoding="utf-8") as stream:
        json.dump(state, stream, indent=1)
    log(f"provisioned {state['project']} into {state['kits']}" + (f" (ports {ports})" if ports else ""))
    print(tree_text(state), flush=True)
    return state


def _own_hosts(project: dict) -> dict:
    """Plan a namespace per participant and give the server the name and address it will have there (its TLS
    certificate names both)."""
    from devsim_flare.deployment import netns

    participants = project.get("participants", [])
    server = next(p for p in participants if p.get("type") == "server")
    leaves = [p["name"] for p in participants if p.get("type") == "client"]
    layout = netns.plan(int(server.get("fed_learn_port", 8002)), server["name"], leaves)
    server["default_host"] = layout["server_name"]
    server["host_names"] = [layout["server_name"], layout["server_address"]]
    return layout
