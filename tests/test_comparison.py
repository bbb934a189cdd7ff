"""Comparing arms over seeds: the arms and seeds as given, the table's figures, the plot, and
``jobs/compare_runs.py`` end to end (runs, keeps, resumes after Ctrl-C, refuses bad input in one line)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from devsim.experiments.comparison import (
    Arm,
    ArmSummary,
    ComparisonError,
    first_reaching,
    lower_is_better,
    markdown_table,
    pair_with_first,
    parse_arm,
    parse_seeds,
)
from devsim.observe.plots import plot_comparison
from devsim.observe.results import final_metric
from tests.conftest import REPO, SMALL_RUN, end_leftovers, isolated_env


def test_arms_name_their_job_and_flags_and_bad_ones_are_refused():
    assert parse_arm("FedAvg=") == Arm("FedAvg", "fedavg", ())
    assert parse_arm("FedAdam=--server-optimizer adam --global-lr 0.01").flags == (
        "--server-optimizer",
        "adam",
        "--global-lr",
        "0.01",
    )
    assert parse_arm("B10=fedbuff: --buffer-size 10") == Arm("B10", "fedbuff", ("--buffer-size", "10"))
    assert parse_arm("stock=edge: --mode fedbuff") == Arm("stock", "edge", ("--mode", "fedbuff"))
    assert parse_arm("gpus=--gpus 0:1").job == "fedavg"  # a colon inside the flags names no job
    for text, words in (
        ("no equals sign", "expected NAME=[JOB:] FLAGS"),
        ("a/b=--lr 0.1", "expected NAME=[JOB:] FLAGS"),
        ("x=fedsgd: --lr 1", "job 'fedsgd' is not one of fedavg, fedbuff, fedrevive, cluster"),
        ("x=--seed 3", "--seed is set by the comparison itself"),
        ("x=--output-dir=o", "--output-dir is set by the comparison itself"),
        ("x=--task 'unclosed", "cannot split its flags"),
    ):
        with pytest.raises(ComparisonError) as error:
            parse_arm(text)
        assert words in str(error.value)


def test_seeds_as_lists_and_ranges():
    assert parse_seeds("0,1,2") == [0, 1, 2]
    assert parse_seeds("3-5,1,4") == [3, 4, 5, 1]
    for bad in ("", "a", "-1", "2-x"):
        with pytest.raises(ComparisonError, match="--seeds"):
            parse_seeds(bad)


def test_the_table_gives_mean_spread_seeds_and_paired_differences():
    first = ArmSummary(parse_arm("A="), final={0: 0.90, 1: 0.94, 2: 0.92}, loss={0: 0.3, 1: 0.2, 2: 0.25})
    second = ArmSummary(parse_arm("B=--lr 0.1"), final={0: 0.93, 1: 0.93}, failed=[2])
    empty = ArmSummary(parse_arm("C=fedbuff:"))
    summaries = [first, second, empty]
    pair_with_first(summaries)
    assert first.mean == pytest.approx(0.92) and first.std == pytest.approx(0.02)
    assert second.paired == pytest.approx({0: 0.03, 1: -0.01})
    assert math.isnan(empty.mean) and empty.to_dict()["mean"] is None
    rows = markdown_table(summaries).splitlines()
    assert rows[2].startswith("| A | fedavg | 0.9200 ± 0.0200 (3) | 0.9000 / 0.9400 / 0.9200 | (first) | 0.2500 |")
    assert (
        "| B | fedavg | 0.9300 ± 0.0000 (2) | 0.9300 / 0.9300 (failed: seeds 2) | +1.0 points, better in 1/2 |"
        in rows[3]
    )
    assert rows[4] == "| C | fedbuff | — | — | — | — | — |"


def test_a_lower_is_better_metric_counts_the_other_way():
    assert lower_is_better("loss") and lower_is_better("val_mae") and lower_is_better("perplexity")
    assert not lower_is_better("accuracy") and not lower_is_better("top5_accuracy")
    first = ArmSummary(parse_arm("A="), final={0: 0.30, 1: 0.20})
    second = ArmSummary(parse_arm("B="), final={0: 0.25, 1: 0.22})
    pair_with_first([first, second])
    header, _, _, row = markdown_table([first, second], metric="mae").splitlines()
    assert "| final mae (lower is better), mean ± std (n) |" in header
    assert "| -0.015, better in 1/2 |" in row
    header, _, _, row = markdown_table([first, second], metric="wer", lower=True).splitlines()  # named otherwise
    assert "| final wer (lower is better)," in header and "| -0.015, better in 1/2 |" in row
    header, _, _, row = markdown_table([first, second], metric="mae", lower=False).splitlines()
    assert "(lower is better)" not in header and "| -0.015, better in 1/2 |" in row  # seed 1 (+0.02) now
    records = [{"round": 1, "loss": 2.0, "metrics": {"mae": 0.5}}, {"round": 2, "loss": 1.0, "metrics": {"mae": 0.2}}]
    assert first_reaching(records, 0.3, "mae") == (2.0, None) and first_reaching(records, 2.0, "loss") == (1.0, None)
    assert first_reaching(records, 0.4, "mae", lower=False) == (1.0, None)
    summary = {"final_loss": 1.0, "final_accuracy": None, "final_metrics": {"mae": 0.2}}
    assert [final_metric(summary, name) for name in ("mae", "loss", "accuracy")] == [0.2, 1.0, None]


def test_time_to_a_target_accuracy():
    sync = [
        {"round": 1, "accuracy": 0.5, "simulated_time": 10.0},
        {"round": 2, "accuracy": 0.8, "simulated_time": 21.0},
    ]
    assert first_reaching(sync, 0.8) == (2.0, 21.0) and first_reaching(sync, 0.9) is None
    assert first_reaching([{"version": 7, "accuracy": 0.9}], 0.85) == (7.0, None)
    summary = ArmSummary(
        parse_arm("A="), final={0: 0.8, 1: 0.9, 2: 0.7}, reached={0: (4.0, 40.0), 1: (2.0, 20.0), 2: None}
    )
    header, _, row = markdown_table([summary], target=0.8).splitlines()
    assert header.endswith("| reached 0.8: seeds, mean round/version, mean simulated s |")
    assert row.endswith("| 2/3, 3.0, 30.0 s |")


def _fake_run(folder, accuracies: list[float], key: str = "round") -> str:
    os.makedirs(folder)
    records = [{key: i + 1, "accuracy": a, "round_seconds": 0.1} for i, a in enumerate(accuracies)]
    summary = {"final_accuracy": accuracies[-1], "final_loss": 1.0 - accuracies[-1]}
    with open(os.path.join(folder, "results.json"), "w", encoding="utf-8") as stream:
        json.dump({"method": "fedavg", "config": {}, "rounds": records, "summary": summary}, stream)
    return str(folder)


def test_the_plot_shows_each_arm_over_its_seeds(tmp_path):
    arms = {
        "A": [_fake_run(tmp_path / "a0", [0.1, 0.5, 0.7]), _fake_run(tmp_path / "a1", [0.2, 0.4, 0.8])],
        "B": [_fake_run(tmp_path / "b0", [0.3, 0.6], key="version")],
    }
    path = plot_comparison(arms, str(tmp_path / "out" / "cmp.png"))
    with open(path, "rb") as stream:
        assert stream.read(8) == b"\x89PNG\r\n\x1a\n"


TINY = [*SMALL_RUN[:-4], "--num-rounds", "3", "--batch-size", "10"]  # SMALL_RUN without its rounds and seed


def _compare(tmp_path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, os.path.join(REPO, "jobs", "compare_runs.py"), "--out", str(tmp_path / "cmp"), *args]
    return subprocess.run(
        cmd, cwd=tmp_path, env=isolated_env(tmp_path), capture_output=True, text=True, timeout=timeout
    )


def test_compare_runs_arms_over_seeds_keeps_what_it_finished_and_refuses_bad_input(tmp_path):
    arms = ["--arm", "FedAvg=", "--arm", "FedAdam=--server-optimizer adam --global-lr 0.03"]
    proc = _compare(tmp_path, "--seeds", "0,1", *arms, "--", *TINY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert [arm["name"] for arm in document["arms"]] == ["FedAvg", "FedAdam"]
    for arm in document["arms"]:
        assert set(arm["final"]) == {"0", "1"} and arm["failed_seeds"] == []
        for seed in (0, 1):
            results = json.loads((tmp_path / "cmp" / arm["name"] / f"seed-{seed}" / "results.json").read_text())
            assert results["config"]["seed"] == seed
            assert arm["final"][str(seed)] == results["summary"]["final_accuracy"]
    assert results["config"]["server_optimizer"] == "adam"
    assert "| FedAdam | fedavg |" in (tmp_path / "cmp" / "comparison.md").read_text()
    assert (tmp_path / "cmp" / "comparison.png").is_file()

    again = _compare(tmp_path, "--seeds", "0,1", "--target", "0.05", *arms, "--", *TINY)  # nothing runs again
    assert again.returncode == 0 and again.stdout.count("(kept: finished earlier with the same command)") == 4
    kept = json.loads((tmp_path / "cmp" / "comparison.json").read_text())["arms"]
    for arm, before in zip(kept, document["arms"], strict=True):
        hits = arm.pop("reached_target")  # a target below chance: reached at the first evaluation, on the clock
        assert set(hits) == {"0", "1"} and all(step == 1.0 and seconds > 0 for step, seconds in hits.values()), hits
        assert before.pop("reached_target") == {}  # the first command named no target
        assert arm == before
    unknown = _compare(tmp_path, "--seeds", "0", "--metric", "mae", *arms, "--", *TINY)
    assert unknown.returncode == 1 and "has no final 'mae' (--metric; it has loss, accuracy)" in unknown.stdout

    refused = _compare(tmp_path, "--seeds", "0", *arms, "--arm", "Bad=--num-rounds -2", "--", *TINY)
    assert refused.returncode == 2 and "--arm Bad: pt_job_fedavg.py: error: --num-rounds" in refused.stderr
    assert not (tmp_path / "cmp" / "Bad").exists()  # refused by the job's --check before anything ran
    for bad, words in (
        (["--arm", "x=--seed 1"], "--seed is set by the comparison"),
        (["--arm", "a=", "--arm", "a="], "its own name"),
    ):
        proc = _compare(tmp_path, *bad)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_ctrl_c_stops_the_running_jobs_and_the_same_command_resumes_them(tmp_path):
    """Two runs side by side (``--parallel 2``, each in its own workspace); Ctrl-C stops both, the same command
    resumes both, and one at a time it keeps them: the parallel runs' commands are the sequential ones."""
    arms = ["--arm", "Long=", "--arm", "Other=--lr 0.02"]
    args = ["--seeds", "0", *arms, "--", *TINY, "--num-rounds", "40"]
    cmd = [sys.executable, os.path.join(REPO, "jobs", "compare_runs.py"), "--out", str(tmp_path / "cmp"), *args]
    cmd.insert(2, "--parallel=2")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=isolated_env(tmp_path), stdout=subprocess.PIPE, text=True)
    logs = [tmp_path / "cmp" / name / "seed-0.log" for name in ("Long", "Other")]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not all(log.is_file() and "round 2/40" in log.read_text() for log in logs):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert "the same command continues the comparison" in output
    assert (tmp_path / "cmp" / "workspace").is_dir() and (tmp_path / "cmp" / "workspace-1").is_dir()
    assert end_leftovers(str(tmp_path / "cmp")) == []
    resumed = _compare(tmp_path, "--parallel", "2", *args, timeout=400)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Long seed 0: resuming fedavg" in resumed.stdout and "Other seed 0: resuming fedavg" in resumed.stdout
    for name in ("Long", "Other"):
        results = json.loads((tmp_path / "cmp" / name / "seed-0" / "results.json").read_text())
        assert [r["round"] for r in results["rounds"]] == list(range(1, 41))
    kept = _compare(tmp_path, *args)
    assert kept.returncode == 0 and kept.stdout.count("(kept: finished earlier with the same command)") == 2
    assert _compare(tmp_path, "--parallel", "0", *args).returncode == 2


MISS_TASK = """
import numpy as np
from torch import nn

LOWER_IS_BETTER = ("miss",)


def model():
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4))
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
    return {"x_train": x[:400], "y_train": y[:400], "x_test": x[400:], "y_test": y[400:]}


def metrics(outputs, targets):
    miss = float((outputs.argmax(1) != targets).float().mean())
    return {"accuracy": 1.0 - miss, "miss": miss}
"""


def test_a_task_that_says_lower_is_better_is_ranked_that_way(tmp_path):
    """``miss`` is no name the comparison knows; the task's LOWER_IS_BETTER, recorded in results.json, says it."""
    task = tmp_path / "miss_task.py"
    task.write_text(MISS_TASK)
    flags = ["--task", str(task), "--num-rounds", "3", "--devices-per-leaf", "10", "--samples-per-device", "20"]
    proc = _compare(tmp_path, "--seeds", "0", "--metric", "miss", "--arm", "A=", "--arm", "B=--lr 0.2", "--", *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert document["lower_is_better"] is True and "final miss (lower is better)" in proc.stdout
    first, second = (arm["final"]["0"] for arm in document["arms"])
    assert f"better in {int(second < first)}/1" in proc.stdout, proc.stdout
