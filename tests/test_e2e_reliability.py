"""Failures end to end: device dropout in sync and async runs, injected bad updates, bad flags."""

from __future__ import annotations

import numpy as np
import torch

from tests.conftest import SMALL_RUN, find_results, launch_job, run_job
from tests.test_e2e_async import ASYNC_RUN


def test_sync_run_with_20_percent_dropout_completes_and_learns(tmp_path):
    run_job("pt_job_fedavg.py", [*SMALL_RUN, "--device-dropout", "0.2", "--workspace", str(tmp_path / "ws")], tmp_path)
    results = find_results(tmp_path / "ws" / "runs")
    assert sum(r["dropped"] for r in results["rounds"]) > 0
    assert all(r["answered_devices"] < r["devices"] or r["dropped"] == 0 for r in results["rounds"])
    assert results["summary"]["final_accuracy"] > 0.4


def test_async_run_with_20_percent_dropout_redispatches_and_learns(tmp_path):
    run_job("pt_job_fedbuff.py", [*ASYNC_RUN, "--device-dropout", "0.2", "--workspace", str(tmp_path / "ws")], tmp_path)
    results = find_results(tmp_path / "ws" / "runs")
    assert results["summary"]["versions"] == 60
    assert results["rounds"][-1]["failed_dropped"] > 0
    assert results["summary"]["final_accuracy"] > results["rounds"][0]["accuracy"] + 0.2


def test_injected_bad_updates_are_rejected_and_never_aggregated(tmp_path):
    args = [
        *SMALL_RUN,
        "--num-rounds",
        "8",
        "--inject-faults",
        "nan,inf,norm,shape,keys,dtype",
        "--fault-probability",
        "0.2",
        "--min-devices-fraction",
        "0.2",
        "--workspace",
        str(tmp_path / "ws"),
    ]
    proc = run_job("pt_job_fedavg.py", args, tmp_path)
    results = find_results(tmp_path / "ws" / "runs")
    rounds = results["rounds"]
    assert sum(r["rejected_devices"] for r in rounds) > 0
    rejected_leaf_reasons = [reason for r in rounds for reason in r["rejected_leaves"].values()]
    assert rejected_leaf_reasons, "no leaf reply was rejected"
    assert "non-finite values" in proc.stdout and "rejected" in proc.stdout
    final = torch.load(results["summary"]["final_model"])
    assert all(torch.isfinite(v).all() for v in final.values())
    assert all(np.isfinite(r["loss"]) for r in rounds)
    assert results["summary"]["final_accuracy"] > 0.3


def test_a_sync_run_leaving_its_plateau_is_not_stopped_by_the_norm_screen(tmp_path):
    """Digits with one local step a device sits near loss 2.3 for 40 rounds, then its leaf updates grow 25x: the
    screen judges a round's replies together (:meth:`UpdateValidator.check_round`), so the run goes on and learns
    where a median of past updates alone rejected both leaves at round 51 and ended it."""
    args = ["--dataset", "digits", "--num-rounds", "70", "--local-iterations", "1", "--eval-frequency", "70"]
    run_job("pt_job_fedavg.py", [*args, "--workspace", str(tmp_path / "ws")], tmp_path)
    results = find_results(tmp_path / "ws" / "runs")
    assert len(results["rounds"]) == 70 and not any(r["rejected_leaves"] for r in results["rounds"])
    assert results["summary"]["final_accuracy"] > 0.5


def test_a_failed_run_says_why_in_its_last_line_and_in_results_json(tmp_path):
    """Every device update over --max-update-norm: round 1 fails, and the command's last line (exit 1) and
    results.json's ``failed`` give the server's reason, not only NVFlare's "Simulation failed"."""
    out = tmp_path / "run"
    args = [*SMALL_RUN, "--num-rounds", "3", "--max-update-norm", "1e-9", "--output-dir", str(out)]
    proc = launch_job("pt_job_fedavg.py", [*args, "--workspace", str(tmp_path / "ws")], tmp_path, 600)
    reason = "round 1: only 0 of 16 selected devices answered (the leaves rejected 16 device updates: see the lines"
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(f"error: {reason}"), proc.stderr
    assert find_results(out)["failed"]["reason"].startswith(reason)
    # NVFlare's two tracebacks of it stay in the server's log file, out of the console
    assert "Traceback" not in proc.stdout + proc.stderr
    logs = list((tmp_path / "ws").rglob("server/log.txt"))
    assert logs and any("RoundFailedError: " + reason in log.read_text() for log in logs)


def test_an_async_run_whose_every_update_is_rejected_ends_with_a_reason(tmp_path):
    """A learning rate that makes every device's update NaN: no version can ever come. The server prints the first
    rejections of the version, then ends the run after 1,000 arrivals without an accepted update, saying why in the
    command's last line and in results.json (before, it dispatched new jobs from version 0 forever)."""
    out = tmp_path / "run"
    args = [*ASYNC_RUN, "--lr", "1e30", "--output-dir", str(out), "--workspace", str(tmp_path / "ws")]
    proc = launch_job("pt_job_fedbuff.py", args, tmp_path, 600)
    reason = "version 0: none of the last 1000 arriving device updates was accepted (rejected 1000: non-finite 1000)"
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(f"error: {reason}"), proc.stderr
    assert find_results(out)["failed"]["reason"].startswith(reason)
    assert proc.stdout.count("rejected (non_finite)") == 10 and "further rejections at version 0" in proc.stdout
