"""POC mode: real server and leaf processes on this machine (slow; CI runs it)."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from devsim_flare.leaf_liveness import DEAD_JOB_REPORTED, JOB_CELL_GONE
from tests.conftest import SMALL_RUN, end_leftovers, find_results, processes_mentioning, run_job, start_job


@pytest.mark.slow
def test_poc_run_stops_on_ctrl_c_then_resumes_completes_and_learns(tmp_path):
    """Ctrl-C (SIGINT to the command's process group, as a terminal sends it) at round 2: exit 130 within 5 s, the
    server's results and checkpoint written, no process, /dev/shm folder or listening port left; ``--resume``
    then completes the run in POC. First, a Ctrl-C while the POC system starts ends the command as fast."""
    import psutil

    run_dir = tmp_path / "run"
    args = [*SMALL_RUN, "--env", "poc", "--workspace", str(tmp_path / "ws"), "--job-timeout", "600"]
    _ctrl_c_while_the_poc_system_starts(args, tmp_path)
    proc = start_job("pt_job_fedavg.py", [*args, "--output-dir", str(run_dir)], tmp_path)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            if (run_dir / "results.json").exists() and '"round": 2' in (run_dir / "results.json").read_text():
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        server_pids = [int(line.split(":", 1)[0]) for line in processes_mentioning(str(tmp_path / "poc"))]
        os.killpg(proc.pid, signal.SIGINT)
        started = time.monotonic()
        output, _ = proc.communicate(timeout=60)
        seconds = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        leftovers = end_leftovers(str(tmp_path), wait=2)
    print(f"Ctrl-C at round 2: exit {proc.returncode} in {seconds:.2f}s")
    assert proc.returncode == 130 and seconds < 5, (proc.returncode, seconds, output[-3000:])
    assert not leftovers, leftovers
    assert not [n for n in _exchange_folders() if n.split("-")[2] in {str(pid) for pid in server_pids}]
    port = int(re.search(r"fed_learn_port: (\d+)", (tmp_path / "poc" / "project.yml").read_text()).group(1))
    listening = [c for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port]
    assert not listening, listening
    results = find_results(run_dir)
    assert results["stopped"]["reason"] == "SIGINT" and (run_dir / "checkpoint.pt").exists()
    assert "continue with --resume" in output
    try:
        proc = run_job(
            "pt_job_fedavg.py",
            ["--resume", str(run_dir), "--env", "poc", "--workspace", str(tmp_path / "ws"), "--job-timeout", "600"],
            tmp_path,
            timeout=900,
        )
        assert "FINISHED:COMPLETED" in proc.stdout, proc.stdout[-3000:]
        results = find_results(run_dir)
        assert [r["round"] for r in results["rounds"]] == list(range(1, 7)) and "stopped" not in results
        assert results["summary"]["final_accuracy"] > 0.4
    finally:
        leftovers = end_leftovers(str(tmp_path))
    assert not leftovers, leftovers


def _ctrl_c_while_the_poc_system_starts(args: list[str], tmp_path) -> None:
    """Ctrl-C once the POC server's service runs, before any job: the command ends within 5 s with 130 and stops
    every process it started (NVFlare's job submission would otherwise retry the stopped server for ~10 s)."""
    proc = start_job("pt_job_fedavg.py", [*args, "--output-dir", str(tmp_path / "started")], tmp_path)
    try:
        deadline = time.monotonic() + 300
        while not [p for p in processes_mentioning(str(tmp_path / "poc")) if "server_train" in p]:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        started = time.monotonic()
        output, _ = proc.communicate(timeout=60)
        seconds = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        leftovers = end_leftovers(str(tmp_path), wait=2)
    print(f"Ctrl-C while the POC system starts: exit {proc.returncode} in {seconds:.2f}s")
    assert proc.returncode == 130 and seconds < 5, (proc.returncode, seconds, output[-3000:])
    assert "still starting" in output and not leftovers, leftovers


def _exchange_folders() -> list[str]:
    from devsim.shared_arrays import FOLDER_PREFIX, SHARED_MEMORY_ROOT

    try:
        return [name for name in os.listdir(SHARED_MEMORY_ROOT) if name.startswith(FOLDER_PREFIX)]
    except OSError:
        return []


@pytest.mark.slow
def test_poc_runs_a_user_task_from_the_job_folder(tmp_path):
    """The penguins example in real server and leaf processes: the sites load the task file the job carries."""
    import shutil

    from tests.conftest import REPO

    task = tmp_path / "user" / "penguins_task.py"
    task.parent.mkdir()
    shutil.copy(os.path.join(REPO, "examples", "penguins_task.py"), task)
    args = ["--task", str(task), "--device-selection-size", "40", "--local-epochs", "5", "--batch-size", "4"]
    try:
        proc = run_job(
            "pt_job_fedavg.py",
            [*args, "--num-rounds", "10", "--env", "poc", "--workspace", str(tmp_path / "ws"), "--job-timeout", "600"],
            tmp_path,
            timeout=900,
        )
        assert "FINISHED:COMPLETED" in proc.stdout, proc.stdout[-3000:]
        results = find_results(tmp_path / "ws" / "runs")
        summary = results["summary"]
        assert summary["final_accuracy"] > 0.85 and "chinstrap_recall" in summary["final_metrics"]
        loaded = results["task"]["file"]
        assert loaded.endswith("custom/devsim_user_task/penguins_task.py") and str(task) != loaded, loaded
    finally:
        leftovers = end_leftovers(str(tmp_path))
    assert not leftovers, leftovers


@pytest.mark.slow
def test_poc_run_goes_on_past_a_killed_leaf_job_process(tmp_path):
    """SIGKILL of one leaf's NVFlare job process (as the OOM killer sends it) at round 2: NVFlare does not fail the
    job, the server finds the leaf lost within seconds (not after the round timeout, 60 s or more here), and the
    run reaches its last round without it."""
    run_dir = tmp_path / "run"
    args = [
        *SMALL_RUN,
        *("--num-leaf-nodes", "3", "--num-rounds", "8", "--min-leaves", "1", "--min-devices-fraction", "0.3"),
        *("--env", "poc", "--workspace", str(tmp_path / "ws"), "--output-dir", str(run_dir), "--job-timeout", "600"),
    ]
    proc = start_job("pt_job_fedavg.py", args, tmp_path)
    try:
        _wait_for_round(run_dir, 2, proc, timeout=400)
        jobs = [p for p in processes_mentioning(str(tmp_path)) if "worker_process" in p and "site-3" in p]
        assert len(jobs) == 1, jobs
        os.kill(int(jobs[0].split(":", 1)[0]), signal.SIGKILL)
        killed_at = time.monotonic()
        rounds = _wait_for_round(run_dir, 3, proc, timeout=120)
        stall = time.monotonic() - killed_at
        print(f"stall from the kill at round 2 to round 3: {stall:.2f}s")
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, output[-4000:]
        results = find_results(run_dir)
        assert [r["round"] for r in results["rounds"]] == list(range(1, 9)), output[-4000:]
        assert results["rounds"][-1]["dead_leaves"] == ["site-3"], [r["dead_leaves"] for r in results["rounds"]]
        assert results["summary"]["final_accuracy"] > 0.3
        # the leaf and the cause: whichever of NVFlare's signals of the killed job process came first
        causes = (JOB_CELL_GONE, DEAD_JOB_REPORTED)
        assert any(f"leaf site-3 lost ({cause}" in output for cause in causes), output[-4000:]
        assert stall < 10, (stall, rounds)
    finally:
        if proc.poll() is None:
            proc.kill()
        leftovers = end_leftovers(str(tmp_path))
    assert not leftovers, leftovers


def _wait_for_round(run_dir, k: int, proc, timeout: float) -> list[int]:
    """Wait until results.json in ``run_dir`` holds round ``k``; returns the rounds it holds."""
    import json

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        try:
            rounds = [r["round"] for r in json.loads((run_dir / "results.json").read_text()).get("rounds", [])]
        except (OSError, ValueError):
            rounds = []
        if k in rounds:
            return rounds
        time.sleep(0.1)
    raise AssertionError(f"no round {k} within {timeout:g}s")
