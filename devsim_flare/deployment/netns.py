"""Hosts of their own on this machine: one Linux network namespace per site (server, each leaf) and one for the
admin, joined by a bridge, each with its own address and a hosts file that names the server, so a deployment's
connections cross real interfaces and name resolution as on separate machines. Needs root and ``ip netns``.

Layout for deployment number ``n`` (from its ports, so two deployments do not collide): bridge ``dvs<n>-br`` with
``10.213.<n mod 250>.1/24``; the server at ``.2`` named :data:`SERVER_NAME`, the admin at ``.3``, leaf ``k`` at
``.(10 + k)``. ``ip netns exec NS`` mounts ``/etc/netns/NS/hosts`` over ``/etc/hosts`` for what it runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from devsim_flare.deployment.workspace import DeploymentError

SERVER_NAME = "devsim-server"
NETNS_ETC = "/etc/netns"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def available() -> str | None:
    """None when namespaces can be made here; otherwise why not (one line)."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "no ip command"
    probe = "dvs-probe"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired) as error:
        return f"ip netns add failed: {getattr(error, 'stderr', '') or error}".strip()
    return None


def plan(number: int, server: str, leaves: list[str]) -> dict:
    """Names and addresses of deployment ``number``'s namespaces: the bridge, the subnet, the server's address and
    name, and ``hosts``: ``{participant: {"netns", "address", "veth"}}`` for the server, the admin and each leaf."""
    subnet = f"10.213.{number % 250}"
    addresses = {server: f"{subnet}.2", "admin": f"{subnet}.3"}
    addresses.update({leaf: f"{subnet}.{10 + k}" for k, leaf in enumerate(leaves)})
    hosts = {
        name: {"netns": f"dvs{number}-{k}", "address": address, "veth": f"dvs{number}v{k}"}
        for k, (name, address) in enumerate(addresses.items())
    }
    return {
        "bridge": f"dvs{number}-br",
        "subnet": subnet,
        "server_address": addresses[server],
        "server_name": SERVER_NAME,
        "hosts": hosts,
    }


def exists(layout: dict) -> bool:
    return layout["bridge"] in leftovers(layout)


def create(layout: dict) -> None:
    """Make the bridge, one namespace per host with its veth pair and address, and each namespace's hosts file;
    undoes what it made when a step fails."""
    try:
        _ip("link", "add", layout["bridge"], "type", "bridge")
        _ip("addr", "add", f"{layout['subnet']}.1/24", "dev", layout["bridge"])
        _ip("link", "set", layout["bridge"], "up")
        for host in layout["hosts"].values():
            ns, veth = host["netns"], host["veth"]
            _ip("netns", "add", ns)
            _ip("link", "add", f"{veth}h", "type", "veth", "peer", "name", f"{veth}n")
            _ip("link", "set", f"{veth}n", "netns", ns)
            _ip("link", "set", f"{veth}h", "master", layout["bridge"])
            _ip("link", "set", f"{veth}h", "up")
            _ip("-n", ns, "addr", "add", f"{host['address']}/24", "dev", f"{veth}n")
            _ip("-n", ns, "link", "set", f"{veth}n", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
            with open(os.path.join(NETNS_ETC, ns, "hosts"), "w", encoding="utf-8") as stream:
                stream.write(f"127.0.0.1 localhost\n{layout['server_address']} {layout['server_name']}\n")
    except (subprocess.CalledProcessError, OSError) as error:
        remove(layout)
        reason = getattr(error, "stderr", "") or error
        raise DeploymentError(f"could not make the network namespaces: {reason}") from error


def remove(layout: dict) -> None:
    """Delete the namespaces, their veth pairs, the bridge and the hosts files (what exists of them)."""
    for host in layout["hosts"].values():
        _ip("netns", "del", host["netns"], check=False)
        _ip("link", "del", f"{host['veth']}h", check=False)
        shutil.rmtree(os.path.join(NETNS_ETC, host["netns"]), ignore_errors=True)
    _ip("link", "del", layout["bridge"], check=False)


def leftovers(layout: dict) -> list[str]:
    """The namespaces and links of ``layout`` that still exist (should be [] after :func:`remove`)."""
    namespaces = _ip("netns", "list", check=False).stdout
    links = _ip("link", "show", check=False).stdout
    found = [h["netns"] for h in layout["hosts"].values() if h["netns"] + " " in namespaces + " "]
    names = [layout["bridge"]] + [h["veth"] + "h" for h in layout["hosts"].values()]
    found += [name for name in names if f" {name}:" in links or f" {name}@" in links]
    return found


def in_namespace(layout: dict | None, site: str, command: list[str]) -> list[str]:
    """``command`` run in ``site``'s namespace (unchanged without a layout)."""
    if not layout:
        return command
    return ["ip", "netns", "exec", layout["hosts"][site]["netns"], *command]
