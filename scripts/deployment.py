"""A provisioned NVFlare 2.9 deployment for the Collab jobs (FedAvg, FedBuff, FedRevive, cluster) on this machine:
one server and N leaf clients with mutual TLS, and an admin user.

Run with the project's environment (``.venv/bin/python scripts/deployment.py ...``). Everything lives in one
workspace folder (startup kits, HOME, job storage, logs, downloaded results):

    provision --workspace WS [--leaves N] [--port-base P] [--netns]
                                               startup kits from app_configs/deployment/project.yml;
                                               --netns: each site on a host of its own (a network namespace)
    start     --workspace WS                   server, then every leaf client; waits until all are connected
    run       --workspace WS JOB [-- FLAGS]    runs jobs/pt_job_JOB.py --env prod on it (JOB: fedavg, fedbuff,
                                               fedrevive, cluster); results land in WS/results/<job>-<stamp>
    status    --workspace WS                   processes, connected clients, jobs
    kill-site --workspace WS SITE              SIGKILL every process of one leaf (a host that dies)
    start-site --workspace WS SITE             start that leaf again; waits until the server hears from it
    stop      --workspace WS                   admin shutdown, then ends whatever is left; checks none remain
    demo      --workspace WS [JOB] [-- FLAGS]  provision + start + run + stop (stop always runs)

The same project file, with real host names, provisions a deployment over several machines; see
docs/environments.md, "A provisioned deployment".
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from devsim_flare.deployment import netns  # noqa: E402
from devsim_flare.deployment.processes import start, status, stop  # noqa: E402
from devsim_flare.deployment.provision import provision  # noqa: E402
from devsim_flare.deployment.sites import kill_site, start_site  # noqa: E402
from devsim_flare.deployment.workspace import (  # noqa: E402
    COLLAB_PROJECT,
    DeploymentError,
    isolate_home,
    kit,
    layout_for,
    leaf_clients,
    load_state,
    log,
    quiet_admin_api,
    split_job_flags,
)

JOBS = ("fedavg", "fedbuff", "fedrevive", "cluster")
NETNS_HELP = (
    "run the server, each leaf and the admin in network namespaces of their own (own address and host name, "
    "joined by a bridge), as on separate machines; needs root and ip netns"
)
IN_ADMIN_HOST = "DEVSIM_DEPLOYMENT_ADMIN_NETNS"
"""Set when this script runs inside the admin's namespace (it re-executes itself there)."""
ADMIN_COMMANDS = ("start", "run", "status", "start-site", "stop")


def with_leaves(project_file: str, leaves: int, workspace: str) -> str:
    """A copy of ``project_file`` (in ``workspace``) whose clients are ``site-1`` .. ``site-<leaves>``."""
    import yaml

    if leaves < 1:
        raise DeploymentError(f"--leaves must be >= 1, got {leaves}")
    with open(project_file, encoding="utf-8") as stream:
        project = yaml.safe_load(stream)
    participants = project["participants"]
    template = next(p for p in participants if p.get("type") == "client")
    others = [p for p in participants if p.get("type") != "client"]
    clients = [{**template, "name": f"site-{i}"} for i in range(1, leaves + 1)]
    at = next(i for i, p in enumerate(others) if p.get("type") == "admin")
    project["participants"] = others[:at] + clients + others[at:]
    os.makedirs(workspace, exist_ok=True)
    path = os.path.join(workspace, f"project-{leaves}-leaves.yml")
    with open(path, "w", encoding="utf-8") as stream:
        yaml.safe_dump(project, stream, sort_keys=False)
    return path


def job_command(workspace: str, job: str, flags: list[str]) -> tuple[list[str], str]:
    """The command line that runs ``jobs/pt_job_<job>.py`` on the deployment, and its results folder."""
    if job not in JOBS:
        raise DeploymentError(f"no job {job!r}; the jobs: {', '.join(JOBS)}")
    lay = layout_for(workspace)
    state = load_state(lay)
    leaves = leaf_clients(state)
    output_dir = os.path.join(lay.results, f"{job}-{time.strftime('%Y%m%d-%H%M%S')}")
    command = [sys.executable, os.path.join(REPO, "jobs", f"pt_job_{job}.py")]
    command += ["--env", "prod", "--startup-kit", kit(state, state["admin"]), "--workspace", lay.results]
    command += ["--num-leaf-nodes", str(len(leaves)), "--leaves-per-host", str(len(leaves))]
    command += ["--output-dir", output_dir]
    return command + flags, output_dir  # later flags win: the user's --num-leaf-nodes or --output-dir


def run_job(workspace: str, job: str, flags: list[str], timeout: float) -> str:
    """Run the job on the running deployment (every leaf client on this machine: ``--leaves-per-host`` is the
    leaf count) and return its results folder; DeploymentError when the job command fails."""
    command, output_dir = job_command(workspace, job, flags)
    lay = layout_for(workspace)
    isolate_home(lay)
    log(f"running {job}: {' '.join(command[1:])}")
    try:
        finished = subprocess.run(command, cwd=REPO, stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        raise DeploymentError(f"the {job} job command did not end within {timeout:.0f}s") from error
    if finished.returncode != 0:
        raise DeploymentError(f"the {job} job command exited {finished.returncode}")
    return output_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Job flags follow '--' (see jobs/pt_job_JOB.py --help)."
    )
    commands = parser.add_subparsers(dest="command")

    def add(name: str, help_text: str):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--workspace", "-w", required=True, help="folder holding everything of this deployment")
        return sub

    p = add("provision", "write the startup kits into the workspace")
    p.add_argument("--project", default=COLLAB_PROJECT, help="NVFlare project file")
    p.add_argument("--leaves", type=int, default=None, help="number of leaf clients (default: the project's)")
    p.add_argument("--port-base", type=int, default=None, help="use ports N and N+1 instead of the project's")
    p.add_argument("--force", action="store_true", help="provision again over an existing (stopped) workspace")
    p.add_argument("--netns", action="store_true", help=NETNS_HELP)
    p = add("start", "start the server and every leaf client; wait until all are connected")
    p.add_argument("--timeout", type=float, default=180.0)
    p = add("run", "run a job on the running deployment")
    p.add_argument("job", choices=JOBS)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds the job command may take")
    add("status", "show processes, connected clients and jobs")
    p = add("kill-site", "SIGKILL every process of one leaf site")
    p.add_argument("site")
    p = add("start-site", "start one leaf site again and wait until the server hears from it")
    p.add_argument("site")
    p.add_argument("--timeout", type=float, default=120.0)
    p = add("stop", "shut the deployment down and end every process of it")
    p.add_argument("--timeout", type=float, default=60.0)
    p = add("demo", "provision, start, run a job, stop (stop always runs)")
    p.add_argument("job", nargs="?", default="fedavg", choices=JOBS)
    p.add_argument("--leaves", type=int, default=None)
    p.add_argument("--port-base", type=int, default=None)
    p.add_argument("--netns", action="store_true", help=NETNS_HELP)
    p.add_argument("--start-timeout", type=float, default=180.0)
    p.add_argument("--job-timeout", type=float, default=3600.0)
    p.add_argument("--stop-timeout", type=float, default=60.0)
    return parser


def provision_with(args: argparse.Namespace, force: bool) -> None:
    project = getattr(args, "project", COLLAB_PROJECT)
    if args.leaves is not None:
        project = with_leaves(project, args.leaves, os.path.abspath(args.workspace))
    if args.netns:
        reason = netns.available()
        if reason:
            raise DeploymentError(f"--netns: network namespaces cannot be made here ({reason})")
    provision(args.workspace, project, args.port_base, force, own_hosts=args.netns)


def as_admin_host(workspace: str, argv: list[str]) -> int | None:
    """For a deployment whose sites have hosts of their own: make the namespaces (``start``), run this command
    again inside the admin's namespace, where the server's name resolves, and remove the namespaces once
    ``stop`` has ended every process (or ``start`` failed). None: run the command here."""
    if os.environ.get(IN_ADMIN_HOST):
        return None
    lay = layout_for(workspace)
    if not os.path.isfile(lay.state_file):
        return None
    layout = load_state(lay).get("netns")
    if not layout:
        return None
    command = argv[0]
    if command == "start" and not netns.exists(layout):
        netns.create(layout)
        log(f"network namespaces made: server {layout['server_name']} at {layout['server_address']}")
    if not netns.exists(layout):
        raise DeploymentError("the deployment's network namespaces do not exist: start it first")
    inner = netns.in_namespace(layout, "admin", [sys.executable, os.path.abspath(__file__), *argv])
    code = subprocess.run(inner, env={**os.environ, IN_ADMIN_HOST: "1"}, check=False).returncode
    if command == "stop" or (command == "start" and code != 0):
        netns.remove(layout)
        left = netns.leftovers(layout)
        if left:
            raise DeploymentError(f"network namespace parts survived: {left}")
        log("network namespaces removed")
    return code


def main(argv: list[str] | None = None) -> int:
    argv, job_flags = split_job_flags(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    if job_flags and args.command not in ("run", "demo"):
        parser.error(f"job flags after '--' are for run/demo, not {args.command}")
    quiet_admin_api()
    try:
        if args.command in ADMIN_COMMANDS:
            code = as_admin_host(args.workspace, argv + (["--", *job_flags] if job_flags else []))
            if code is not None:
                return code
        if args.command == "provision":
            provision_with(args, args.force)
        elif args.command == "start":
            start(args.workspace, args.timeout)
        elif args.command == "run":
            run_job(args.workspace, args.job, job_flags, args.timeout)
        elif args.command == "status":
            return status(args.workspace)
        elif args.command == "kill-site":
            kill_site(args.workspace, args.site)
        elif args.command == "start-site":
            start_site(args.workspace, args.site, args.timeout)
        elif args.command == "stop":
            stop(args.workspace, args.timeout)
        elif args.command == "demo":
            provision_with(args, force=os.path.exists(layout_for(args.workspace).state_file))
            steps = [
                ["start", "--timeout", str(args.start_timeout)],
                ["run", args.job, "--timeout", str(args.job_timeout)],
            ]
            try:
                for step in steps:
                    flags = ["--", *job_flags] if step[0] == "run" and job_flags else []
                    if main([step[0], "--workspace", args.workspace, *step[1:], *flags]) != 0:
                        return 1
            finally:
                main(["stop", "--workspace", args.workspace, "--timeout", str(args.stop_timeout)])
    except DeploymentError as error:
        print(f"deployment.py {args.command}: error: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
