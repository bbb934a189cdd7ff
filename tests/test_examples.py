"""The example tasks end to end in NVFlare: each learns well above chance in FedAvg and FedBuff in the simulator,
from an exported job folder run by ``nvflare simulator`` (with the original task file gone), and FedRevive runs
the tabular and image examples; the sequence example is refused by FedRevive with the reason."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from tests.conftest import REPO, find_results, refused_job, run_in_group, run_job

PENGUINS = os.path.join(REPO, "examples", "penguins_task.py")
TEXT = os.path.join(REPO, "examples", "text_task.py")
MNIST = os.path.join(REPO, "examples", "mnist_task.py")

PENGUINS_ARGS = ["--local-epochs", "5", "--batch-size", "4", "--seed", "1"]
TEXT_ARGS = ["--local-iterations", "10", "--batch-size", "32", "--optimizer", "adam", "--lr", "0.003", "--seed", "1"]
MNIST_ARGS = ["--seed", "1"]


def _final(tmp_path) -> dict:
    return find_results(tmp_path / "ws" / "runs")["summary"]


@pytest.mark.parametrize(
    "task, args, rounds, floor",
    [
        (PENGUINS, [*PENGUINS_ARGS, "--device-selection-size", "40"], 15, 0.85),
        (TEXT, [*TEXT_ARGS, "--device-selection-size", "20"], 12, 0.30),
        (MNIST, MNIST_ARGS, 12, 0.85),
    ],
    ids=["penguins", "text", "mnist"],
)
def test_fedavg_learns_each_example(tmp_path, task, args, rounds, floor):
    proc = run_job(
        "pt_job_fedavg.py",
        ["--task", task, *args, "--num-rounds", str(rounds), "--workspace", str(tmp_path / "ws")],
        tmp_path,
    )
    summary = _final(tmp_path)
    assert summary["final_accuracy"] > floor, summary
    assert summary["initial_accuracy"] < floor - 0.2
    if task != MNIST:
        assert "natural partition:" in proc.stdout
    assert set(summary["final_metrics"]) >= {"accuracy"}


@pytest.mark.parametrize(
    "task, args, versions, floor",
    [
        (PENGUINS, [*PENGUINS_ARGS, "--global-lr", "1.0"], 40, 0.85),
        (TEXT, [*TEXT_ARGS, "--global-lr", "1.0"], 60, 0.25),
        (MNIST, [*MNIST_ARGS, "--global-lr", "0.5"], 60, 0.8),
    ],
    ids=["penguins", "text", "mnist"],
)
def test_fedbuff_learns_each_example(tmp_path, task, args, versions, floor):
    common = ["--buffer-size", "5", "--concurrency", "20", "--eval-frequency", "20"]
    run_job(
        "pt_job_fedbuff.py",
        ["--task", task, *args, *common, "--max-versions", str(versions), "--workspace", str(tmp_path / "ws")],
        tmp_path,
    )
    summary = _final(tmp_path)
    assert summary["versions"] == versions and summary["final_accuracy"] > floor, summary


@pytest.mark.parametrize(
    "script, task, args, floor",
    [
        ("pt_job_fedavg.py", PENGUINS, [*PENGUINS_ARGS, "--device-selection-size", "40", "--num-rounds", "12"], 0.85),
        (
            "pt_job_fedbuff.py",
            MNIST,
            [*MNIST_ARGS, "--buffer-size", "5", "--global-lr", "0.5", "--max-versions", "40", "--eval-frequency", "20"],
            0.7,
        ),
    ],
    ids=["fedavg-penguins", "fedbuff-mnist"],
)
def test_an_exported_job_folder_carries_the_task_file(tmp_path, script, task, args, floor):
    """Export with a copy of the task, delete the copy, run the folder with `nvflare simulator`."""
    copy = tmp_path / "user" / os.path.basename(task)
    copy.parent.mkdir()
    shutil.copy(task, copy)
    run_job(script, ["--task", str(copy), *args, "--export", "--export-dir", str(tmp_path / "job")], tmp_path)
    shutil.rmtree(copy.parent)
    job = next((tmp_path / "job").iterdir())
    assert (job / "app" / "custom" / "devsim_user_task" / copy.name).is_file()
    nvflare = os.path.join(os.path.dirname(sys.executable), "nvflare")
    run_in_group(
        [nvflare, "simulator", str(job), "-n", "2", "-t", "2", "-w", str(tmp_path / "sim")], tmp_path, 600, "sim"
    )
    summary = find_results(tmp_path / "sim")["summary"]
    assert summary["final_accuracy"] > floor, summary


@pytest.mark.parametrize(
    "task, args, floor",
    [(PENGUINS, [*PENGUINS_ARGS, "--max-versions", "40"], 0.6), (MNIST, [*MNIST_ARGS, "--max-versions", "60"], 0.3)],
    ids=["penguins", "mnist"],
)
def test_fedrevive_runs_the_tabular_and_image_examples(tmp_path, task, args, floor):
    common = ["--freeze-version", "5", "--warmup-version", "10", "--eval-frequency", "20", "--generation-interval", "2"]
    run_job("pt_job_fedrevive.py", ["--task", task, *args, *common, "--workspace", str(tmp_path / "ws")], tmp_path)
    summary = _final(tmp_path)
    assert summary["final_accuracy"] > floor and summary["kd_updates"] > 0 and summary["synth_steps"] > 0, summary


def test_fedrevive_refuses_token_ids_with_the_reason(tmp_path):
    last = refused_job("pt_job_fedrevive.py", ["--task", TEXT], tmp_path).strip().splitlines()[-1]
    assert "--task: FedRevive with task" in last and "int64 (token ids)" in last and "generator(" in last
