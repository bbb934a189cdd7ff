"""POC mode: real server and leaf processes on this machine (slow; CI runs it)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.conftest import SMALL_RUN, end_leftovers, find_results, processes_mentioning, run_job


@pytest.mark.slow
def test_poc_run_completes_learns_and_leaves_no_process(tmp_path):
    try:
        proc = run_job(
            "pt_job_fedavg.py",
            [*SMALL_RUN, "--env", "poc", "--workspace", str(tmp_path / "ws"), "--job-timeout", "600"],
            tmp_path,
            timeout=900,
        )
        assert "FINISHED:COMPLETED" in proc.stdout, proc.stdout[-3000:]
        results = find_results(tmp_path / "ws" / "runs")
        assert results["summary"]["final_accuracy"] > 0.4
    finally:
        leftovers = end_leftovers(str(tmp_path))
    assert not leftovers, leftovers


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
def test_poc_run_survives_a_killed_leaf(tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO, isolated_env

    run_dir = tmp_path / "run"
    args = [
        *SMALL_RUN,
        "--num-leaf-nodes",
        "3",
        "--num-rounds",
        "8",
        "--round-timeout",
        "20",
        "--min-leaves",
        "1",
        "--min-devices-fraction",
        "0.3",
        "--env",
        "poc",
        "--workspace",
        str(tmp_path / "ws"),
        "--output-dir",
        str(run_dir),
        "--job-timeout",
        "600",
    ]
    proc = subprocess.Popen(
        [sys.executable, f"{REPO}/jobs/pt_job_fedavg.py", *args],
        cwd=tmp_path,
        env=isolated_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    killed = []
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and not killed:
            results = run_dir / "results.json"
            if results.exists() and '"round": 2' in results.read_text():
                for line in processes_mentioning(str(tmp_path)):
                    pid, cmdline = line.split(":", 1)
                    if "site-3" in cmdline:
                        os.kill(int(pid), signal.SIGKILL)
                        killed.append(cmdline)
            time.sleep(0.5)
        assert killed, "the job never reached round 2"
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, output[-4000:]
        assert "aborting the job" in output or "FINISHED" in output
        results = find_results(run_dir)
        assert results["rounds"][-1]["dead_leaves"] == ["site-3"], [r["dead_leaves"] for r in results["rounds"]]
        assert [r["round"] for r in results["rounds"]] == list(range(1, 9))
        assert results["summary"]["final_accuracy"] > 0.3
    finally:
        if proc.poll() is None:
            proc.kill()
        end_leftovers(str(tmp_path))
