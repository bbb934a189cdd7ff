"""``--check``: a job command checks its flags, task and data as a run would, says what the run would use, and runs
nothing."""

from __future__ import annotations

import os

from tests.conftest import REPO, launch_job, refused_job


def test_check_prints_the_fitted_settings_and_starts_nothing(tmp_path):
    task = os.path.join(REPO, "examples", "penguins_task.py")
    args = ["--check", "--task", task, "--server-optimizer", "adam", "--global-lr", "0.01", "--workspace", "ws"]
    proc = launch_job("pt_job_fedavg.py", args, tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("check: the flags, the task and the data pass; fedavg would run with ")
    for setting in ("--server-optimizer adam", "--global-lr 0.01", "--partition natural", "--devices-per-leaf 69"):
        assert setting in line, line  # the flags given, and those fitted to the task's 138 owners
    assert not (tmp_path / "ws" / "runs").exists()  # no run folder, no process: nothing ran
    stderr = refused_job("pt_job_fedbuff.py", ["--check", "--buffer-size", "0", "--workspace", "ws"], tmp_path)
    assert "--buffer-size" in stderr and "Traceback" not in stderr


def test_the_edge_job_checks_too(tmp_path):
    task = os.path.join(REPO, "examples", "penguins_task.py")
    args = ["--check", "--task", task, "--mode", "fedbuff", "--buffer-size", "4", "--workspace", "ws"]
    proc = launch_job("pt_job_edge.py", args, tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("check: the flags, the task and the data pass; edge fedbuff would run with ")
    for setting in ("--buffer-size 4", "--partition natural", "--devices-per-leaf 69"):
        assert setting in line, line
    assert "--workspace" not in line and not (tmp_path / "ws").exists()
    stderr = refused_job("pt_job_edge.py", ["--check", "--num-versions", "0", "--workspace", "ws"], tmp_path)
    assert "num_versions (--num-versions) must be >= 1, got 0" in stderr and "Traceback" not in stderr
