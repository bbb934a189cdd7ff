"""The warm parent: a later command runs forked from it as the same command would run cold (arguments, folder,
output, exit status, signals, results), and nothing is left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from devsim_flare.launch.warm_parent import (
    CHILD_ENV,
    is_ready,
    parent_key,
    running_parents,
    socket_path,
    start_warm_parent,
    stop_parents,
    warm_enabled,
)
from tests.conftest import REPO, SMALL_RUN

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    sys.path.insert(0, {repo!r})
    from devsim_flare.launch.warm_parent import note_job_accepted, run_in_warm_parent

    if __name__ == "__main__":
        run_in_warm_parent()
        preloaded = "torch" in sys.modules
        import torch  # a cold run that imported PyTorch and was accepted starts a warm parent when it ends
        if sys.argv[1:2] == ["--help"]:
            sys.exit(0)  # as argparse: no warm parent
        note_job_accepted()
        try:  # the test's SIGINT may come as soon as the line is out
            print(json.dumps({{
                "argv": sys.argv[1:], "cwd": os.getcwd(), "warm": os.environ.get({child!r}), "pid": os.getpid(),
                "main": __name__, "torch_preloaded": preloaded,
            }}), flush=True)
            if sys.argv[1:2] == ["sleep"]:
                time.sleep(120)
        except KeyboardInterrupt:
            sys.exit(130)
        sys.exit(5)
    """
)


@pytest.fixture
def warm_env():
    """An environment with warm parents on, kept in a temporary cache folder (a short path: pytest's own under
    xdist is too long for a Unix socket); every warm parent started there is stopped afterwards."""
    cache = tempfile.mkdtemp(prefix="devsim-warm-")
    env = {**os.environ, "DEVSIM_WARM": "1", "DEVSIM_CACHE_DIR": cache, "DEVSIM_WARM_IDLE": "120"}
    env.pop(CHILD_ENV, None)
    yield env
    stop_parents(env)
    assert not running_parents(env)
    shutil.rmtree(cache, ignore_errors=True)


def _wait_for_parent(env: dict[str, str], timeout: float = 30.0, ready: bool = False) -> int:
    """The pid of the warm parent once its socket answers (with ``ready``: once it has taken all its imports too,
    so that a command sent to it does not wait for an import; on a loaded machine one can outlast the command's
    wait for an answer, and the command then runs cold)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = running_parents(env)
        if found and os.path.exists(found[0][1]) and (is_ready(found[0][1]) or not ready):
            return found[0][0]
        time.sleep(0.1)
    raise AssertionError(f"no warm parent {'ready' if ready else 'started'} in {timeout:g} s")


def _run(script, env, cwd, *args) -> tuple[int, dict, str]:
    proc = subprocess.run(
        [sys.executable, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    return proc.returncode, json.loads(proc.stdout.splitlines()[0]), proc.stderr


def test_the_key_is_the_same_in_every_interpreter_and_follows_the_import_time_environment(tmp_path):
    code = f"import sys; sys.path.insert(0, {REPO!r}); from devsim_flare.launch.warm_parent import parent_key; "
    code += "print(parent_key())"

    def key(**extra) -> str:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"} | extra
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip()

    assert len({key() for _ in range(4)}) == 1  # each interpreter hashes strings with its own seed: no set order
    assert key(OMP_NUM_THREADS="3") != key()
    assert parent_key({"OMP_NUM_THREADS": "1"}) != parent_key({"OMP_NUM_THREADS": "2"})
    assert parent_key({"DEVSIM_SEED": "1"}) == parent_key({})  # the project's own settings are read at run time


def test_off_switches():
    assert not warm_enabled({"DEVSIM_WARM": "0", "HOME": "/h"})
    assert not warm_enabled({"DEVSIM_CACHE_DIR": "off"})
    assert warm_enabled({"DEVSIM_CACHE_DIR": "/tmp/c"})
    assert socket_path({"DEVSIM_CACHE_DIR": "/tmp/" + "x" * 120}) is None  # too long for a Unix socket: off
    assert socket_path({"DEVSIM_CACHE_DIR": "/tmp/" + "x" * 70}) is not None


def test_a_later_command_runs_in_the_warm_parent_as_it_would_run_cold(tmp_path, warm_env):
    script = tmp_path / "probe_job.py"
    script.write_text(SCRIPT.format(repo=REPO, child=CHILD_ENV))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    helped = subprocess.run([sys.executable, str(script), "--help"], env=warm_env, capture_output=True, text=True)
    assert helped.returncode == 0 and "warm start:" not in helped.stderr  # not accepted: no warm parent
    assert not running_parents(warm_env)

    code, cold, stderr = _run(script, warm_env, tmp_path, "a")
    assert (code, cold["warm"], cold["torch_preloaded"]) == (5, None, False)
    assert "warm start: a background process" in stderr
    parent = _wait_for_parent(warm_env)

    code, warm, stderr = _run(script, warm_env, elsewhere, "b", "--flag=c")
    assert code == 5 and warm["warm"] == "1" and warm["torch_preloaded"], stderr
    assert warm["argv"] == ["b", "--flag=c"] and warm["cwd"] == str(elsewhere) and warm["main"] == "__main__"
    assert "warm start:" not in stderr  # no second warm parent
    assert [pid for pid, _ in running_parents(warm_env)] == [parent]

    # Ctrl-C reaches the forked command through the waiting one; its status comes back
    assert _wait_for_parent(warm_env, timeout=120, ready=True) == parent
    waiting = subprocess.Popen(
        [sys.executable, str(script), "sleep"], cwd=tmp_path, env=warm_env, stdout=subprocess.PIPE, text=True
    )
    child = json.loads(waiting.stdout.readline())["pid"]
    assert child != waiting.pid
    waiting.send_signal(signal.SIGINT)
    assert waiting.wait(timeout=30) == 130

    # a waiting command that dies takes its forked command with it
    waiting = subprocess.Popen(
        [sys.executable, str(script), "sleep"], cwd=tmp_path, env=warm_env, stdout=subprocess.PIPE, text=True
    )
    child = json.loads(waiting.stdout.readline())["pid"]
    waiting.kill()
    waiting.wait(timeout=10)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}")

    assert stop_parents(warm_env) == [parent]
    assert not running_parents(warm_env)
    assert os.listdir(os.path.join(warm_env["DEVSIM_CACHE_DIR"], "warm")) == []  # socket, module list, empty log


def test_a_job_run_in_the_warm_parent_gives_the_cold_run_s_results(tmp_path, warm_env):
    def job(name: str, *extra: str) -> dict | None:
        out = tmp_path / name
        cmd = [sys.executable, "jobs/pt_job_fedavg.py", *SMALL_RUN, "--workspace", str(tmp_path / "ws"), *extra]
        proc = subprocess.run(
            [*cmd, "--output-dir", str(out)], cwd=REPO, env=warm_env, capture_output=True, text=True, timeout=240
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        if extra:
            return None
        with open(out / "results.json", encoding="utf-8") as stream:
            return json.load(stream)

    refused = subprocess.run(
        [sys.executable, "jobs/pt_job_fedavg.py", "--num-rounds", "-1"],
        cwd=REPO,
        env=warm_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "--num-rounds" in refused.stderr
    assert "warm start:" not in refused.stderr and not running_parents(warm_env)  # a refused command starts none
    cold = job("cold")
    _wait_for_parent(warm_env)
    warm = job("warm")
    assert (cold["startup"]["warm_parent"], warm["startup"]["warm_parent"]) == (False, True)
    assert warm["summary"]["final_metrics"] == cold["summary"]["final_metrics"]
    assert warm["summary"]["final_loss"] == cold["summary"]["final_loss"]
    # NVFlare reads --export from sys.argv when its recipe module is imported, which the warm parent had done
    job("exported", "--export", "--export-dir", str(tmp_path / "job_folder"))
    assert (tmp_path / "job_folder" / "devsim_fedavg" / "meta.json").is_file()
    assert not (tmp_path / "exported").exists()


def test_an_idle_warm_parent_ends_and_removes_its_socket(warm_env):
    env = {**warm_env, "DEVSIM_WARM_IDLE": "1"}
    path = socket_path(env)
    pid = start_warm_parent(path, env, [])
    deadline = time.monotonic() + 60  # its imports (PyTorch, NVFlare) first, then one idle second
    while os.waitpid(pid, os.WNOHANG)[0] == 0 and time.monotonic() < deadline:  # this process is its parent
        time.sleep(0.1)
    assert time.monotonic() < deadline, "the idle warm parent did not end"
    assert not os.path.exists(path)
    assert not running_parents(env)
