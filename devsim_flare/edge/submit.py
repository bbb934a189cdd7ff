"""Submitting the edge job (devsim_flare.edge.cli) to a running deployment: wait with a timeout, follow
its results, copy the server's job log, and check every version arrived; plus the one-shot demo."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import time
import zipfile

from devsim.observe.progress import format_metrics
from devsim_flare.deployment.processes import connected_clients, open_session, port_open, start, stop
from devsim_flare.deployment.provision import provision
from devsim_flare.deployment.workspace import (
    EDGE_PROJECT,
    DeploymentError,
    Layout,
    isolate_home,
    kit,
    layout_for,
    leaf_clients,
    load_state,
    log,
)
from devsim_flare.edge import cli as edge_cli

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

# ---------------------------------------------------------------------------------------------------
# run the edge job


def job_parser(num_leaves: int):
    parser = edge_cli.build_parser()
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
            f"version {record['version']}  {format_metrics(record['loss'], record['metrics'])}  "
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
    leaves = leaf_clients(state)
    parser = job_parser(len(leaves))
    args = parser.parse_args(job_flags)
    edge_cli.check_task_args(parser, args)
    if args.num_leaf_nodes != len(leaves):
        raise DeploymentError(f"--num-leaf-nodes {args.num_leaf_nodes} but the system has {len(leaves)} leaf clients")
    if args.check:  # the job's own checks passed (task, data, flags): say what would run, submit nothing
        try:
            edge_cli.build_recipe(args, None)
        except ValueError as error:
            parser.error(str(error))
        log(edge_cli.checked_settings(parser, args))
        return {}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    output_dir = os.path.abspath(args.output_dir) if args.output_dir else os.path.join(lay.results, f"edge-{stamp}")
    os.makedirs(output_dir, exist_ok=True)
    try:
        recipe = edge_cli.build_recipe(args, output_dir)
    except ValueError as error:
        parser.error(str(error))

    if not port_open(state["host"], state["admin_port"]):
        raise DeploymentError(
            f"the server's admin port {state['admin_port']} is closed: start the system first "
            f"(edge_system.py start --workspace {lay.root})"
        )
    session = open_session(state)
    try:
        clients = connected_clients(session)
        expected = sorted(c["name"] for c in state["clients"])
        if clients != expected:
            raise DeploymentError(f"connected clients {clients}, expected {expected}: is the system started?")
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
            raise DeploymentError(
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
        raise DeploymentError(f"job {job_id} ended {job_status} without results in {results_path}")
    first, last = records[0], records[-1]
    print(
        f"job {job_id} {job_status}; final accuracy {last['accuracy']:.4f} at version {last['version']} "
        f"(initial {first['accuracy']:.4f}); {wall:.1f}s; results: {results_path}",
        flush=True,
    )
    if job_status != "FINISHED:COMPLETED" or summary["versions"] != summary["expected_versions"]:
        raise DeploymentError(
            f"job {job_id} ended {job_status} with versions {summary['versions']} "
            f"(expected {summary['expected_versions']})"
        )
    return summary


def demo(workspace: str, port_base: int | None, job_flags: list[str], options: argparse.Namespace) -> None:
    lay = layout_for(workspace)
    provision(
        workspace,
        EDGE_PROJECT,
        port_base=port_base,
        force=os.path.exists(lay.state_file),
        aggregators=options.aggregators,
    )
    try:
        start(workspace, timeout=options.start_timeout)
        run_job(workspace, job_flags, timeout=options.job_timeout)
    finally:
        stop(workspace, timeout=options.stop_timeout)
