"""Asynchronous runs end to end in NVFlare's simulator: learning and seed-reproducibility."""

from __future__ import annotations

import csv
import json
import os

import pytest
import torch

from tests.conftest import find_results, refused_job, run_job

ASYNC_RUN = [
    *("--num-leaf-nodes", "2", "--devices-per-leaf", "20", "--samples-per-device", "100"),
    *("--synthetic-train-size", "4000", "--synthetic-test-size", "1000", "--partition", "iid"),
    *("--concurrency", "8", "--buffer-size", "2", "--min-open-slots", "1", "--delay-schedule", "paper_shifted"),
    *("--max-versions", "60", "--eval-frequency", "20", "--global-lr", "0.3", "--seed", "5"),
]


def _arrivals(run_dir) -> list[tuple]:
    with open(next(run_dir.rglob("arrivals.csv")), encoding="utf-8") as stream:
        return [(r["device_id"], r["base_version"], r["arrival_time"]) for r in csv.DictReader(stream)]


def _exchange_folders() -> list[str]:
    """Names of the /dev/shm exchange folders there now (other tests' live runs included)."""
    from devsim.shared_arrays import FOLDER_PREFIX, SHARED_MEMORY_ROOT

    if not os.path.isdir(SHARED_MEMORY_ROOT):
        return []
    return [name for name in os.listdir(SHARED_MEMORY_ROOT) if name.startswith(FOLDER_PREFIX)]


def _alive(folder: str) -> bool:
    """Whether the server process that named the exchange folder ``folder`` still runs (a run in progress)."""
    from devsim.shared_arrays import FOLDER_PREFIX

    try:
        os.kill(int(folder[len(FOLDER_PREFIX) :].split("-")[0]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


@pytest.fixture(scope="module")
def fedbuff_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fedbuff")
    (tmp / "exchange_folders_before.json").write_text(json.dumps(_exchange_folders()))
    run_job("pt_job_fedbuff.py", [*ASYNC_RUN, "--workspace", str(tmp / "ws")], tmp)
    return tmp


def test_fedbuff_learns_with_staleness(fedbuff_run):
    results = find_results(fedbuff_run / "ws" / "runs")
    records = results["rounds"]
    assert records[0]["version"] == 0 and records[-1]["version"] == 60
    assert results["summary"]["final_accuracy"] > records[0]["accuracy"] + 0.25
    assert max(r.get("staleness_max", 0) for r in records) >= 1
    times = [float(t) for _, _, t in _arrivals(fedbuff_run)]
    assert times == sorted(times), "updates must be applied in simulated-arrival order"


def test_same_seed_gives_same_arrivals_and_weights(fedbuff_run, tmp_path):
    run_job("pt_job_fedbuff.py", [*ASYNC_RUN, "--workspace", str(tmp_path / "ws")], tmp_path)
    assert _arrivals(fedbuff_run) == _arrivals(tmp_path)
    first = torch.load(find_results(fedbuff_run / "ws" / "runs")["summary"]["final_model"])
    second = torch.load(find_results(tmp_path / "ws" / "runs")["summary"]["final_model"])
    for key in first:
        assert torch.equal(first[key], second[key]), key


def test_arrays_through_shared_memory_or_messages_give_the_same_run(fedbuff_run, tmp_path):
    """The default in the simulator (model arrays through /dev/shm files) against NVFlare's messages: the same
    arrivals and bit for bit the same final model; no exchange folder is left behind."""
    from devsim.shared_arrays import shared_memory_root

    before = set(json.loads((fedbuff_run / "exchange_folders_before.json").read_text()))
    default = find_results(fedbuff_run / "ws" / "runs")
    assert default["config"]["shared_memory"] == ("on" if shared_memory_root() else "off")
    run_job("pt_job_fedbuff.py", [*ASYNC_RUN, "--shared-memory", "off", "--workspace", str(tmp_path / "ws")], tmp_path)
    messages = find_results(tmp_path / "ws" / "runs")
    assert messages["config"]["shared_memory"] == "off"
    assert _arrivals(tmp_path) == _arrivals(fedbuff_run)
    first, second = torch.load(default["summary"]["final_model"]), torch.load(messages["summary"]["final_model"])
    assert all(torch.equal(first[key], second[key]) for key in first)
    if shared_memory_root():
        assert [name for name in _exchange_folders() if name not in before and not _alive(name)] == []


def test_fedrevive_run_completes_with_kd_engaged(tmp_path):
    args = [
        *("--preset", "fedrevive_small_cpu", "--devices-per-leaf", "20", "--synthetic-train-size", "4000"),
        *("--synthetic-test-size", "500", "--concurrency", "8", "--max-versions", "30", "--eval-frequency", "10"),
        *("--freeze-version", "4", "--warmup-version", "8", "--generation-interval", "4"),
        *("--workspace", str(tmp_path / "ws")),
    ]
    proc = run_job("pt_job_fedrevive.py", args, tmp_path)
    summary = find_results(tmp_path / "ws" / "runs")["summary"]
    assert summary["versions"] == 30
    assert summary["kd_updates"] > 0, proc.stdout[-2000:]
    assert summary["synth_steps"] > 0 and 0 < summary["kd_runs"] <= summary["kd_updates"]
    assert summary["revive_seconds_per_arrival"] > 0
    assert 0 < summary["revive_cpu_seconds_per_arrival"] <= summary["revive_seconds_per_arrival"] + 1e-3


def test_paper_preset_is_refused_without_cifar(tmp_path):
    stderr = refused_job("pt_job_fedrevive.py", ["--preset", "fedrevive_paper_cifar10"], tmp_path)
    assert "--data-root" in stderr and "--dataset synthetic" in stderr


def test_async_stop_and_resume_gives_the_same_run(fedbuff_run, tmp_path):
    """Same arrivals and versions; weights equal to float rounding: the relaunched in-flight jobs train in other
    batched groups than in the uninterrupted run (a grouped convolution rounds differently with the group count)."""
    run_dir = tmp_path / "run"
    common = [*ASYNC_RUN, "--workspace", str(tmp_path / "ws")]
    stopped = run_job(
        "pt_job_fedbuff.py", [*common, "--output-dir", str(run_dir), "--stop-after-version", "20"], tmp_path
    )
    assert "continue with --resume" in stopped.stdout
    assert not (run_dir / "final_model.pt").exists()
    run_job("pt_job_fedbuff.py", ["--resume", str(run_dir), "--workspace", str(tmp_path / "ws")], tmp_path)
    assert _arrivals(run_dir) == _arrivals(fedbuff_run)
    uninterrupted = torch.load(find_results(fedbuff_run / "ws" / "runs")["summary"]["final_model"])
    resumed = torch.load(run_dir / "final_model.pt")
    for key in uninterrupted:
        assert torch.allclose(uninterrupted[key], resumed[key], rtol=1e-3, atol=1e-5), (
            key,
            float((uninterrupted[key] - resumed[key]).abs().max()),
        )
    before = find_results(fedbuff_run / "ws" / "runs")["summary"]["final_accuracy"]
    after = json.loads((run_dir / "results.json").read_text())["summary"]["final_accuracy"]
    assert abs(before - after) <= 0.01, (before, after)


def test_gathered_and_guessed_dispatch_keeps_the_run(fedbuff_run, tmp_path):
    """Jobs gathered into few calls and guessed ahead (the default) against every dispatch sent at once (as
    before): the same arrivals, versions and staleness; accuracy equal to float rounding (jobs train in other
    batched groups)."""
    args = [*ASYNC_RUN, "--dispatch-batch", "1", "--no-dispatch-lookahead", "--workspace", str(tmp_path / "ws")]
    run_job("pt_job_fedbuff.py", args, tmp_path)
    assert _arrivals(tmp_path) == _arrivals(fedbuff_run)
    gathered = find_results(fedbuff_run / "ws" / "runs")
    at_once = find_results(tmp_path / "ws" / "runs")
    keys = ("version", "simulated_time", "accepted_updates", "staleness_mean", "staleness_max")
    assert [[r.get(k) for k in keys] for r in gathered["rounds"]] == [
        [r.get(k) for k in keys] for r in at_once["rounds"]
    ]
    for a, b in zip(gathered["rounds"], at_once["rounds"], strict=True):
        assert abs(a["accuracy"] - b["accuracy"]) <= 0.02, (a["version"], a["accuracy"], b["accuracy"])
    calls = [r["timing"]["info"]["calls"] for r in gathered["rounds"] if "timing" in r]
    calls_at_once = [r["timing"]["info"]["calls"] for r in at_once["rounds"] if "timing" in r]
    assert sum(calls) < sum(calls_at_once) / 2, (calls, calls_at_once)
    later = [r["timing"]["info"] for r in gathered["rounds"] if "timing" in r][1:]
    assert sum(info["leaf_cpu_seconds"] for info in later) > 0, later
    assert all(info["server_cpu_seconds"] > 0 for info in later), later
    trained = sum(info["leaf_train_cpu_seconds"] for info in later)
    assert 0 < trained < sum(info["leaf_cpu_seconds"] for info in later), later
    assert sum(info["leaf_training_groups"] for info in later) > 0, later


def test_a_leaf_lost_at_a_version_gives_the_same_run_on_any_timing(fedbuff_run, tmp_path):
    """--lose-leaf site-2@20: the loss is a simulated event, so two runs whose calls interleave differently on the
    wall clock (gathered and guessed vs every dispatch sent at once) keep the same arrivals; no job of site-2
    dispatched from version 20 on is applied."""
    common = [*ASYNC_RUN, "--lose-leaf", "site-2@20"]
    run_job("pt_job_fedbuff.py", [*common, "--workspace", str(tmp_path / "a")], tmp_path)
    one_by_one = ["--dispatch-batch", "1", "--no-dispatch-lookahead", "--workspace", str(tmp_path / "b")]
    proc = run_job("pt_job_fedbuff.py", [*common, *one_by_one], tmp_path)
    assert "version 20: leaf site-2 --lose-leaf site-2@20; continuing with 1 leaves" in proc.stdout
    first, second = _arrivals(tmp_path / "a"), _arrivals(tmp_path / "b")
    assert first == second and first != _arrivals(fedbuff_run)
    assert not [d for d, base, _ in first if int(base) >= 20 and int(d) >= 20], "site-2 owns devices 20..39"
    results = find_results(tmp_path / "a" / "runs")
    assert results["rounds"][-1]["dead_leaves"] == ["site-2"] and results["rounds"][-1]["failed_leaf_lost"] > 0


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("site-3@5", "no leaf site-3"),
        ("site-1", "not SITE@VERSION"),
        ("site-1@0", "not SITE@VERSION"),
        ("site-1@5,site-2@9", "loses every leaf"),
    ],
)
def test_bad_leaf_losses_are_refused_naming_the_flag(value, needle, tmp_path):
    stderr = refused_job("pt_job_fedbuff.py", [*ASYNC_RUN, "--lose-leaf", value], tmp_path)
    assert "--lose-leaf" in stderr and needle in stderr and "Traceback" not in stderr, stderr
