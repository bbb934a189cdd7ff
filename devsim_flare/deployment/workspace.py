"""One deployment's workspace folder on this machine: its layout (startup kits, HOME, job storage, logs,
results), its saved state (system.json), and the environment its site processes start with."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from devsim_flare.recipe import apply_runtime_env_defaults

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # devsim_flare/deployment/ -> root
EDGE_PROJECT = os.path.join(REPO, "app_configs", "edge_hierarchy", "project.yml")
COLLAB_PROJECT = os.path.join(REPO, "app_configs", "deployment", "project.yml")
STATE_FILE = "system.json"
SHUTDOWN_FILE = "shutdown.fl"  # NVFlare's site daemon (startup/sub_start.sh) exits when it finds this file


class DeploymentError(RuntimeError):
    """A step failed; the message says which and what to look at."""


def log(message: str) -> None:
    print(f"[deployment] {message}", flush=True)


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
        raise DeploymentError(
            f"{lay.root} is not a provisioned workspace (no {STATE_FILE}); provision it first "
            f"(scripts/deployment.py or scripts/edge_system.py provision --workspace {lay.root})"
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


def split_job_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """A deployment script's own arguments and the job flags after ``--`` (empty without one)."""
    if "--" not in argv:
        return list(argv), []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def quiet_admin_api() -> None:
    """The admin API logs every failed connection attempt while the server starts or stops: keep them off the
    console of the deployment scripts."""
    import logging

    logging.getLogger("nvflare").setLevel(logging.CRITICAL)
