"""The Python API (devsim_flare.api): recipes check their settings before anything starts, tasks given as
functions travel as a file, and a notebook-sized snippet runs a job in the simulator with the same results as the
job script's command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from devsim.tasks.contract import load_hooks
from devsim_flare.api import (
    RECIPES,
    EdgeRecipe,
    FedAvgRecipe,
    FedBuffRecipe,
    PocEnv,
    RecipeError,
    RunResult,
    SimEnv,
    TaskFunctions,
    task_spec,
)
from tests.conftest import REPO, isolated_env, run_job


def _model():
    from torch import nn

    return nn.Linear(4, 2)


def _data():
    x = np.linspace(-1, 1, 80, dtype=np.float32).reshape(20, 4)
    y = (x[:, 0] > 0).astype(np.int64)
    return {"x_train": x, "y_train": y, "x_test": x, "y_test": y}


def test_an_unknown_setting_is_refused_with_the_close_names() -> None:
    with pytest.raises(RecipeError, match=r"no setting 'num_round' for the fedavg job; did you mean num_rounds"):
        FedAvgRecipe(num_round=3)
    with pytest.raises(RecipeError, match="no setting 'num_rounds' for the fedbuff job"):
        FedBuffRecipe(num_rounds=3)  # asynchronous jobs count versions (max_versions)


def test_a_bad_value_raises_naming_the_flag_before_anything_starts(tmp_path) -> None:
    with pytest.raises(RecipeError, match="--num-rounds"):
        FedAvgRecipe(num_rounds=0).execute(SimEnv(workspace=str(tmp_path)))
    assert not (tmp_path / "nvflare").exists()


def test_a_bad_task_object_is_refused(tmp_path) -> None:
    with pytest.raises(RecipeError, match="--task: a file path, a module name"):
        task_spec(42, str(tmp_path))


def test_task_functions_become_one_stable_file_that_loads_as_a_task(tmp_path) -> None:
    functions = TaskFunctions(model=_model, data=_data)
    path = functions.write(str(tmp_path))
    assert functions.write(str(tmp_path)) == path and path.endswith(".py")
    hooks = load_hooks(path)
    assert hooks.loss is None and hooks.model().in_features == 4
    np.testing.assert_array_equal(hooks.data()["y_train"], _data()["y_train"])


def test_every_job_has_a_recipe_whose_settings_start_from_its_defaults() -> None:
    assert set(RECIPES) == {"fedavg", "fedbuff", "fedrevive", "cluster"}
    config = RECIPES["fedbuff"](preset=None, buffer_size=4).config()
    assert config["buffer_size"] == 4 and config["concurrency"] == RECIPES["fedbuff"].defaults.concurrency


SETTINGS = dict(
    num_leaf_nodes=2,
    device_selection_size=30,
    local_epochs=3,
    batch_size=4,
    lr=0.05,
    num_rounds=4,
    seed=3,
)


def _run_python(code: str, tmp_path) -> subprocess.CompletedProcess:
    """``python -c code`` in ``tmp_path`` with an isolated HOME and this checkout importable; it must succeed."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**isolated_env(tmp_path), "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_a_ten_line_snippet_runs_fedavg_on_a_user_task_as_the_command_line_does(tmp_path) -> None:
    task = os.path.join(REPO, "examples", "penguins_task.py")
    snippet = textwrap.dedent(
        f"""
        from devsim_flare.api import FedAvgRecipe, SimEnv
        recipe = FedAvgRecipe(task={task!r}, **{SETTINGS!r})
        result = recipe.execute(SimEnv(workspace="api-ws")).get_result()
        print("api accuracy", result.final_accuracy, "rounds", len(result.rounds))
        print("folder", result.folder)
        """
    )
    assert len(snippet.strip().splitlines()) <= 10
    proc = _run_python(snippet, tmp_path)
    lines = proc.stdout.splitlines()
    accuracy = float(next(line for line in lines if line.startswith("api accuracy")).split()[2])
    folder = next(line for line in lines if line.startswith("folder")).split(maxsplit=1)[1]
    assert accuracy > 0.6, proc.stdout[-2000:]

    flags = [f"--{name.replace('_', '-')}={value}" for name, value in SETTINGS.items()]
    run_job("pt_job_fedavg.py", ["--task", task, *flags, "--output-dir", str(tmp_path / "cli")], tmp_path)

    def accuracies(path) -> list[float]:
        with open(os.path.join(path, "results.json"), encoding="utf-8") as stream:
            return [record["accuracy"] for record in json.load(stream)["rounds"]]

    assert accuracies(folder) == accuracies(tmp_path / "cli")
    assert accuracies(folder)[-1] == accuracy


def test_each_run_of_a_script_is_timed_from_its_own_execute_and_forks_its_processes(tmp_path) -> None:
    """Two runs in one script: each run's start-up counts from its own ``execute()`` (not from the script's start),
    and both fork their simulator processes as the job command does (a script has no other thread and has run no
    parallel PyTorch computation, so the fork check passes)."""
    task = os.path.join(REPO, "examples", "penguins_task.py")
    script = textwrap.dedent(
        f"""
        import time
        from devsim_flare.api import FedAvgRecipe, SimEnv
        for run in range(2):
            print("before", run, time.time(), flush=True)
            result = FedAvgRecipe(task={task!r}, **{{**{SETTINGS!r}, "num_rounds": 2}}).execute(SimEnv(workspace="ws"))
            print("folder", run, result.get_result().folder, flush=True)
        """
    )
    proc = _run_python(script, tmp_path)
    assert "start as new interpreters" not in proc.stderr, proc.stderr[-2000:]
    before = [float(line.split()[2]) for line in proc.stdout.splitlines() if line.startswith("before")]
    folders = [line.split(maxsplit=2)[2] for line in proc.stdout.splitlines() if line.startswith("folder")]
    stamps = []
    for folder in folders:
        with open(os.path.join(folder, "results.json"), encoding="utf-8") as stream:
            stamps.append(json.load(stream)["startup"]["stamps"])
    assert before[0] <= stamps[0]["command_started"] <= stamps[0]["server_process_started"]
    assert stamps[0]["command_exit"] <= before[1] <= stamps[1]["command_started"] <= stamps[1]["first_round_started"]


def test_a_recipe_exports_a_job_folder_that_nvflare_reads(tmp_path) -> None:
    job = FedAvgRecipe(num_rounds=2, num_leaf_nodes=2).export(str(tmp_path / "job"), SimEnv(workspace=str(tmp_path)))
    meta = json.loads((tmp_path / "job" / "devsim_fedavg" / "meta.json").read_text())
    assert job == str(tmp_path / "job" / "devsim_fedavg") and meta["name"] == "devsim_fedavg"
    assert not (tmp_path / "runs").exists()


def test_the_edge_recipe_checks_its_settings_and_environment(tmp_path) -> None:
    with pytest.raises(RecipeError, match="did you mean num_versions"):
        EdgeRecipe(num_version=3)
    with pytest.raises(RecipeError, match="--update-norm-factor must be a finite number > 1"):  # at construction
        EdgeRecipe(update_norm_factor=0.5)
    with pytest.raises(RecipeError, match=r"num_versions \(--num-versions\) must be >= 1"):
        EdgeRecipe(num_versions=0)
    EdgeRecipe(device_selection_size=500)  # checked against the population when it executes (the task may set it)
    with pytest.raises(RecipeError, match="--env: the edge job runs in SimEnv or ProdEnv, not PocEnv"):
        EdgeRecipe(num_versions=2).execute(PocEnv(workspace=str(tmp_path)))


def test_an_edge_run_folder_reads_as_a_result(tmp_path) -> None:
    records = [
        {"version": 1, "loss": 2.3, "metrics": {"accuracy": 0.1}, "accuracy": 0.1},
        {"version": 3, "loss": 1.2, "metrics": {"accuracy": 0.6}, "accuracy": 0.6},
    ]
    (tmp_path / "edge_results.json").write_text(json.dumps({"settings": {"dataset": "synthetic"}, "records": records}))
    result = RunResult.load(str(tmp_path))
    assert result.method == "edge" and result.final_accuracy == 0.6 and result.metric("accuracy")[0] == (1, 0.1)
    assert result.summary == {"versions": 3, "final_loss": 1.2, "final_metrics": {"accuracy": 0.6}}
    with pytest.raises(RecipeError, match="no results.json or edge_results.json"):
        RunResult.load(str(tmp_path / "nothing"))


def test_a_failed_run_says_why_in_its_status_and_result(tmp_path) -> None:
    """The server's reason (results.json's ``failed``) reaches ``Run.get_status()`` and ``RunResult.failure``, as the
    command's last line gives it."""
    from devsim_flare.api.results import Run

    reason = "version 0: none of the last 1000 arriving device updates was accepted (rejected 1000: non-finite 1000)"
    results = {"method": "fedbuff", "config": {}, "rounds": [], "summary": {}, "failed": {"reason": reason}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert Run(1, str(tmp_path)).get_status() == f"FAILED (exit code 1): {reason}"
    result = Run(1, str(tmp_path)).get_result()
    assert result.failure == reason and not result.finished
    assert Run(1, str(tmp_path / "missing")).get_status() == "FAILED (exit code 1)"
    assert Run(0, str(tmp_path)).get_status() == "FINISHED:COMPLETED"
