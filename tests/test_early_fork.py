"""A cold job command forks the simulator's fork servers right after PyTorch's import (devsim_flare.launch.early_fork)
where a host has the cores for it; the run takes them, or closes them when it does not simulate here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from devsim.resources import workers
from devsim_flare.launch import early_fork
from devsim_flare.launch.early_fork import SWITCH_ENV, simulates_here
from tests.conftest import SMALL_RUN, isolated_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], True),
        (["--env", "sim", "--num-rounds", "3"], True),
        (["--env=sim"], True),
        (["--env", "poc"], False),
        (["--env=prod", "--startup-kit", "kit"], False),
        (["--export", "--export-dir", "job"], False),
        (["--check"], False),
        (["-h"], False),
        (["--env"], False),  # refused by the parser anyway
    ],
)
def test_only_command_lines_that_may_simulate_here_fork_early(argv, expected):
    assert simulates_here(argv) is expected


def test_nothing_is_forked_below_the_cores_or_when_switched_off_or_in_a_warm_child(monkeypatch):
    monkeypatch.setattr(early_fork, "fork_servers", lambda: pytest.fail("forked"))
    monkeypatch.setattr(workers, "usable_cpu_cores", lambda: early_fork.MIN_CORES - 1)
    monkeypatch.delenv(SWITCH_ENV, raising=False)
    assert early_fork.fork_early([]) is None
    monkeypatch.setattr(workers, "usable_cpu_cores", lambda: 64)
    monkeypatch.setenv(SWITCH_ENV, "0")
    assert early_fork.fork_early([]) is None
    monkeypatch.setenv(SWITCH_ENV, "1")
    monkeypatch.setenv(early_fork.CHILD_ENV, "1")
    assert early_fork.fork_early([]) is None
    monkeypatch.delenv(early_fork.CHILD_ENV)
    monkeypatch.setenv("DEVSIM_FORK_SERVER", "0")
    assert early_fork.fork_early([]) is None
    assert early_fork.take_early() is None


DRIVER = """
import json, os, sys
sys.path.insert(0, {repo!r})
from devsim.resources import workers
from devsim_flare.launch import early_fork
from devsim_flare.launch.fork_server import start_fork_server
from devsim_flare.launch.forked_process import SOCKET_ENV

import devsim.resources.workers
devsim.resources.workers.usable_cpu_cores = lambda: 64
forked = early_fork.fork_early([])
imported_before = "torch" in sys.modules
taken = early_fork.take_early()
server = start_fork_server(forked=taken) if {route!r} else taken
routed = os.environ.get(SOCKET_ENV) == server.leaves.socket_path
pids = (server.pid, server.leaves.pid)
alive = all(os.path.exists(f"/proc/{{pid}}") for pid in pids)
if {close!r}:
    server.close(wait_seconds=10)
print(json.dumps({{"same": forked is taken is server, "torch": imported_before, "routed": routed, "alive": alive,
                   "again": early_fork.take_early() is None, "pids": pids}}), flush=True)
"""


@pytest.mark.parametrize(("route", "close"), [(True, True), (True, False), (False, True)])
def test_early_fork_servers_are_taken_once_and_end_with_the_command(route, close):
    """Taken by a simulation (routed) and closed with it, left to the command's exit, or closed unused (a run that
    turned out not to simulate here)."""
    script = textwrap.dedent(DRIVER.format(repo=REPO, route=route, close=close))
    env = {k: v for k, v in os.environ.items() if k not in (SWITCH_ENV, early_fork.CHILD_ENV, "DEVSIM_FORK_SERVER")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["same"] and result["torch"] and result["alive"] and result["again"]
    assert result["routed"] is route
    # closed, or left open: the command's exit closes their lifeline and they end
    deadline = time.monotonic() + 15
    while any(os.path.exists(f"/proc/{pid}") for pid in result["pids"]):
        assert time.monotonic() < deadline, "fork servers outlived their command"
        time.sleep(0.1)


def test_a_job_started_with_early_fork_servers_gives_the_same_run(tmp_path):
    def summary(name: str, extra_env: dict[str, str]) -> dict:
        args = [*SMALL_RUN, "--workspace", str(tmp_path / name), "--output-dir", str(tmp_path / name / "out")]
        proc = subprocess.run(
            [sys.executable, os.path.join(REPO, "jobs", "pt_job_fedavg.py"), *args],
            cwd=tmp_path,
            env=isolated_env(tmp_path) | {"DEVSIM_WARM": "0"} | extra_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        with open(tmp_path / name / "out" / "results.json", encoding="utf-8") as stream:
            found = json.load(stream)["summary"]
        return {key: found[key] for key in ("final_loss", "final_metrics")}

    assert summary("early", {SWITCH_ENV: "1"}) == summary("usual", {SWITCH_ENV: "0"})


def test_without_a_leaf_count_the_leaves_fork_server_stops_importing_once_a_leaf_runs(monkeypatch, tmp_path):
    from devsim_flare.launch import fork_server

    calls = []

    def record(folder, name, imports, leaves=None, requests=None, beside_children=True):
        calls.append((name, requests, beside_children))
        return fork_server.ForkServer(0, str(tmp_path), "", -1, leaves)

    monkeypatch.setattr(fork_server, "_fork_one", record)
    monkeypatch.setattr(fork_server.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    fork_server.fork_servers(leaves=None)  # the early fork: the leaf count is not known yet
    fork_server.fork_servers(leaves=3)
    assert calls == [("leaves", None, False), ("server", 1, True), ("leaves", 3, True), ("server", 1, True)]
