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
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devsim_flare.deployment.processes import start, status, stop  # noqa: E402
from devsim_flare.deployment.provision import provision  # noqa: E402
from devsim_flare.deployment.workspace import (  # noqa: E402
    EDGE_PROJECT,
    DeploymentError,
    quiet_admin_api,
    split_job_flags,
)
from devsim_flare.edge.submit import demo, job_parser, run_job  # noqa: E402

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
    p.add_argument("--project", default=EDGE_PROJECT, help="NVFlare project file")
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
    argv, job_flags = split_job_flags(list(sys.argv[1:] if argv is None else argv))
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
    quiet_admin_api()
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
    except DeploymentError as error:
        print(f"edge_system.py {args.command}: error: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
