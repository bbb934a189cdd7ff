"""The fork server runs a module as ``python -m`` would; only the simulator's own commands are routed to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from devsim_flare.launch.forked_child import interpreter_path, process_name
from devsim_flare.launch.forked_process import (
    SIMULATOR_MODULE,
    WORKER_MODULE,
    ForkingSubprocess,
    fork_server_enabled,
    forkable,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE_MODULE = """
import gc, json, os, sys, time
if sys.argv[1] == "sleep":
    time.sleep(60)
print(json.dumps({
    "argv": sys.argv[1:], "cwd": os.getcwd(), "path": sys.path[:2], "marker": os.environ.get("PROBE_MARKER"),
    "project_loaded": sorted(n for n in sys.modules if n.split(".")[0] in ("devsim", "devsim_flare")),
    "own_session": os.getsid(0) == os.getpid(), "main": __name__, "name": open("/proc/self/comm").read().strip(),
    "frozen": gc.get_freeze_count() > 0, "collecting": gc.isenabled(),
}), flush=True)
sys.exit(3)
"""

DRIVER = """
import json, os, sys
sys.path.insert(0, {repo!r})
from devsim_flare.launch.fork_server import start_fork_server
from devsim_flare.launch.forked_process import ForkedProcess, SOCKET_ENV

server = start_fork_server(server_imports=(), leaf_imports=())
assert server is not None and server.leaves is not None and os.environ[SOCKET_ENV] == server.leaves.socket_path
env = dict(os.environ, PYTHONPATH={folder!r}, PROBE_MARKER="from-the-request")
os.chdir({folder!r})
done = ForkedProcess(server.socket_path, [sys.executable, "-m", "probe_module", "a", "b"], env, setsid=True)
code = done.wait(timeout=60)
sleeper = ForkedProcess(server.leaves.socket_path, [sys.executable, "-m", "probe_module", "sleep"], env, setsid=False)
first_poll = sleeper.poll()
sleeper.terminate()
stopped = sleeper.wait(timeout=30)
server.close(wait_seconds=10)
left = os.path.exists(server.folder)
alive = any(os.path.exists(f"/proc/{{pid}}") for pid in (server.pid, server.leaves.pid))
summary = {{"code": code, "first_poll": first_poll, "stopped": stopped, "folder_left": left, "server_alive": alive}}
print(json.dumps(summary))
"""


def test_a_forked_module_runs_as_python_dash_m_would_and_reports_its_exit(tmp_path):
    (tmp_path / "probe_module.py").write_text(PROBE_MODULE)
    driver = DRIVER.format(repo=REPO, folder=str(tmp_path))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DEVSIM_FORK_SERVER")}
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    child, summary = lines[0], lines[-1]
    # the child wrote to the requester's stdout (passed over the socket), with its own argv, folder, path and env
    assert child["argv"] == ["a", "b"] and child["main"] == "__main__"
    assert child["cwd"] == str(tmp_path) and child["path"] == [str(tmp_path), str(tmp_path)]
    assert (
        child["marker"] == "from-the-request" and child["own_session"] and child["name"] == "sim-probe_modul"
    )  # 15 bytes at most
    assert child["project_loaded"] == []  # the job's copies of the project are imported afresh
    assert child["frozen"]  # what the fork server imported stays out of the child's garbage collections
    assert child["collecting"]  # the fork server imports without automatic collection; its children collect
    assert summary == {"code": 3, "first_poll": None, "stopped": -15, "folder_left": False, "server_alive": False}


def test_only_the_simulator_modules_of_this_interpreter_are_routed(tmp_path):
    assert forkable([sys.executable, "-m", SIMULATOR_MODULE, "job", "-w", "ws"])
    assert forkable([sys.executable, "-m", WORKER_MODULE, "-o", "ws"])
    assert not forkable([sys.executable, "-m", "nvflare.private.fed.app.server.server_train"])
    assert not forkable(["/other/python", "-m", WORKER_MODULE])
    assert not forkable(f"{sys.executable} -m {WORKER_MODULE}")
    routed = ForkingSubprocess(str(tmp_path / "no-such.sock"))
    plain = routed.Popen([sys.executable, "-c", "pass"])  # not a simulator module: the real Popen
    assert isinstance(plain, subprocess.Popen) and plain.wait(timeout=60) == 0
    assert routed.PIPE is subprocess.PIPE  # everything else is the subprocess module's


def test_an_unreachable_fork_server_falls_back_to_a_new_process(tmp_path, capsys):
    routed = ForkingSubprocess(str(tmp_path / "no-such.sock"))
    args = [sys.executable, "-m", SIMULATOR_MODULE, "--help"]
    process = routed.Popen(args, env={**os.environ, "PYTHONPATH": ""}, preexec_fn=os.setsid)
    process.terminate()
    process.wait(timeout=60)
    assert isinstance(process, subprocess.Popen)
    assert "fork server unavailable" in capsys.readouterr().out


def test_the_child_path_is_a_fresh_interpreters():
    base = [os.path.join(sys.base_prefix, "lib", "python311.zip"), os.path.join(sys.prefix, "lib", "site-packages")]
    current = ["/repo", "/repo/jobs", "/old/pythonpath", *base]
    assert interpreter_path("/ws/site-1", "/job/custom:/more", current) == ["/ws/site-1", "/job/custom", "/more", *base]
    assert interpreter_path("/ws", "", current) == ["/ws", *base]


def test_the_switch_turns_it_off():
    assert fork_server_enabled({}) and fork_server_enabled({"DEVSIM_FORK_SERVER": "1"})
    assert not fork_server_enabled({"DEVSIM_FORK_SERVER": "0"})


def test_the_job_command_routes_the_simulator_start_only_while_the_fork_server_runs():
    from nvflare.job_config import fed_job_config

    from devsim_flare.launch.forked_process import JOB_CONFIG_MODULE, route_popen, unroute_popen

    assert route_popen(JOB_CONFIG_MODULE, "/tmp/x.sock")
    assert isinstance(fed_job_config.subprocess, ForkingSubprocess)
    unroute_popen(JOB_CONFIG_MODULE)
    assert fed_job_config.subprocess is subprocess
    assert not route_popen("not.a.loaded.module", "/tmp/x.sock")


def test_a_fork_server_is_not_started_beside_other_threads():
    script = textwrap.dedent(
        f"""
        import sys, threading, time
        sys.path.insert(0, {REPO!r})
        from devsim_flare.launch.fork_server import start_fork_server
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
        print(start_fork_server(server_imports=(), leaf_imports=()))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "None", done.stderr


def test_a_process_that_ran_parallel_pytorch_starts_no_fork_server_and_does_not_hang():
    """GNU OpenMP's pool belongs to the process that ran a parallel computation: a forked child's next parallel region
    never returns. A process that may have run PyTorch (the Python API) checks a forked child first: clean, the
    child computes; after a parallel computation, it is killed at the check's limit and nothing is started."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: no thread pool for a child to inherit")
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {REPO!r})
        import torch
        from devsim_flare.launch.fork_server import forked_children_compute, start_fork_server
        print("clean", forked_children_compute())
        torch.set_num_threads(2)
        torch.ones(1 << 22).sum()
        started = time.monotonic()
        print("after", forked_children_compute(timeout=1.0), round(time.monotonic() - started))
        print("server", start_fork_server(server_imports=(), leaf_imports=(), check_children=True))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[:3] == ["clean True", "after False 1", "server None"], done.stdout + done.stderr
    assert "start as new interpreters" in done.stderr


def test_a_forked_leaf_is_named_after_its_site():
    assert process_name(WORKER_MODULE, ["-o", "ws/site-2", "--client", "site-2", "--token", "t"]) == "sim-site-2"
    assert process_name(SIMULATOR_MODULE, ["job", "-w", "ws"]) == "sim-simulator"
    assert len(process_name(WORKER_MODULE, ["--client", "a-very-long-site-name"])) == 15


def test_a_fork_server_whose_command_died_ends_and_removes_its_socket():
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {REPO!r})
        from devsim_flare.launch.fork_server import start_fork_server
        server = start_fork_server(server_imports=(), leaf_imports=())
        print(server.folder, server.pid, server.leaves.pid, flush=True)
        os._exit(0)  # no close(): the fork server sees its pipe from the command close
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    folder, *pids = done.stdout.split()
    left = [folder, *(f"/proc/{pid}" for pid in pids)]
    deadline = time.monotonic() + 20
    while any(os.path.exists(path) for path in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(path) for path in left)


def test_the_warm_comm_drivers_are_the_modules_nvflare_loads():
    """NVFlare's driver manager imports every module of its drivers package (the fork server imports them ahead);
    a renamed or added driver module in a newer NVFlare shows here."""
    import nvflare.fuel.f3.drivers as drivers

    from devsim_flare.launch.fork_server import COMM_DRIVER_MODULES, LEAF_IMPORTS, SERVER_IMPORTS

    folder = os.path.dirname(drivers.__file__)
    with_driver = {
        f"{drivers.__name__}.{name[:-3]}"
        for name in os.listdir(folder)
        if name.endswith("_driver.py") and name != "base_driver.py"
    }
    assert set(COMM_DRIVER_MODULES) == with_driver
    assert set(COMM_DRIVER_MODULES) <= set(SERVER_IMPORTS) and set(COMM_DRIVER_MODULES) <= set(LEAF_IMPORTS)


def test_a_fork_server_stops_importing_once_it_has_started_its_processes(tmp_path):
    """The leaves' fork server stops its imports after the last leaf: what is left would only compete with the leaves'
    timed set-up. A child forked after that has not got them. A module the fork server imported runs as
    ``python -m`` would run it, without runpy's warning that it was imported already, and with garbage collection on
    (the fork server imports with it off)."""
    (tmp_path / "slow_first.py").write_text("import time\ntime.sleep(1.0)\n")
    (tmp_path / "slow_second.py").write_text("import time\ntime.sleep(1.0)\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "probe.py").write_text(
        "import gc, json, sys\nif __name__ == '__main__':\n"
        "    print(json.dumps([sorted(n for n in sys.modules if n.startswith('slow_')), gc.isenabled()]), flush=True)\n"
    )
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {REPO!r})
        sys.path.insert(0, {str(tmp_path)!r})
        from devsim_flare.launch.fork_server import start_fork_server
        from devsim_flare.launch.forked_process import ForkedProcess

        server = start_fork_server(server_imports=(), leaf_imports=("pkg.probe", "slow_first", "slow_second"), leaves=1)
        env = dict(os.environ, PYTHONPATH={str(tmp_path)!r})
        os.chdir({str(tmp_path)!r})
        for _ in range(2):  # the first comes while slow_first imports; slow_second is never imported
            ForkedProcess(server.leaves.socket_path, [sys.executable, "-m", "pkg.probe"], env, True).wait(60)
        server.close(wait_seconds=10)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # both children collect garbage, although the first was forked while the fork server imported without
    assert [json.loads(line) for line in done.stdout.splitlines()] == [[["slow_first"], True], [["slow_first"], True]]
    assert "RuntimeWarning" not in done.stderr  # the module the fork server imported runs afresh as __main__


def test_a_request_whose_requester_gave_up_is_not_forked():
    """A command that stopped waiting for the answer (a busy warm parent) runs cold: its request, read later, must
    not start the same run a second time."""
    import socket

    from devsim_flare.launch.fork_server import _start_child
    from devsim_flare.launch.forked_process import send_frame

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for gave_up in (True, False):
        server_end, requester = socket.socketpair()
        request = {"module": "json.tool", "argv": ["--help"], "cwd": "/", "env": dict(os.environ)}
        with open(os.devnull, "wb") as null:
            send_frame(requester, request, (null.fileno(),) * 3)
        if gave_up:
            requester.close()
        children: dict = {}
        _start_child(server_end, listener, None, children)
        if gave_up:
            assert children == {} and server_end.fileno() == -1  # nothing forked; the connection is closed
            continue
        (pid,) = children
        assert os.waitpid(pid, 0)[1] == 0  # the live requester's module ran (json.tool --help exits 0)
        server_end.close()
        requester.close()
    listener.close()
