"""DP-FedAvg and DP-FedBuff end to end in NVFlare's simulator: the reported epsilon is dp-accounting's, the noise
repeats bit for bit and a resumed run continues it exactly (the accountant's state is in the checkpoint)."""

from __future__ import annotations

import csv

import dp_accounting
import pytest
import torch

from tests.conftest import SMALL_RUN, find_results, refused_job, run_job

DP_RUN = [*SMALL_RUN, "--dp", "central", "--dp-noise-multiplier", "0.8", "--dp-clip", "0.5", "--dp-noise-at", "leaves"]
DP_FEDBUFF_RUN = [
    *("--num-leaf-nodes", "2", "--devices-per-leaf", "20", "--samples-per-device", "100", "--partition", "iid"),
    *("--synthetic-train-size", "4000", "--synthetic-test-size", "1000", "--delay-schedule", "paper_shifted"),
    *("--concurrency", "8", "--buffer-size", "4", "--max-versions", "20", "--eval-frequency", "10"),
    *("--global-lr", "0.3", "--seed", "5", "--device-batch", "off"),  # one device at a time: resume bit for bit
    *("--dp", "central", "--dp-noise-multiplier", "0.5", "--dp-clip", "0.5", "--dp-noise-at", "leaves"),
]


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp")
    proc = run_job("pt_job_fedavg.py", [*DP_RUN, "--output-dir", str(tmp / "run"), "--workspace", str(tmp / "ws")], tmp)
    return tmp, proc


def test_reported_epsilon_matches_dp_accounting_computed_here(dp_run):
    tmp, proc = dp_run
    results = find_results(tmp / "run")
    population, expected = 40, 16  # SMALL_RUN: 2 leaves x 20 devices, 16 selected per round
    delta = 1.0 / population**1.1
    event = dp_accounting.PoissonSampledDpEvent(expected / population, dp_accounting.GaussianDpEvent(0.8))
    for record in results["rounds"]:
        accountant = dp_accounting.rdp.RdpAccountant()
        accountant.compose(event, record["round"])
        assert f"{record['dp_epsilon']:.3g}" == f"{accountant.get_epsilon(delta):.3g}", record
    assert results["summary"]["dp_epsilon"] == results["rounds"][-1]["dp_epsilon"]
    assert f"epsilon {results['rounds'][-1]['dp_epsilon']:.3f}" in proc.stdout
    assert "noise at the leaves" in proc.stdout
    assert len({r["devices"] for r in results["rounds"]}) > 1  # Poisson sampling: the cohort's size varies


def test_dp_run_resumes_bit_for_bit(dp_run, tmp_path):
    first_tmp, _ = dp_run
    run_dir = tmp_path / "run"
    common = [*DP_RUN, "--workspace", str(tmp_path / "ws")]
    run_job("pt_job_fedavg.py", [*common, "--output-dir", str(run_dir), "--stop-after-round", "3"], tmp_path)
    run_job("pt_job_fedavg.py", ["--resume", str(run_dir), "--workspace", str(tmp_path / "ws")], tmp_path)
    first = find_results(first_tmp / "run")
    resumed = find_results(run_dir)
    assert [r["dp_epsilon"] for r in resumed["rounds"]] == [r["dp_epsilon"] for r in first["rounds"]]
    uninterrupted = torch.load(first_tmp / "run" / "final_model.pt")
    again = torch.load(run_dir / "final_model.pt")
    for key in uninterrupted:
        assert torch.equal(uninterrupted[key], again[key]), key


@pytest.mark.slow
def test_dp_fedadam_says_so_and_resumes_bit_for_bit(tmp_path):
    """DP-FedAdam: the server's line names the optimizer after the mechanism; stopped after round 3 and resumed, the
    run ends with the uninterrupted run's epsilon and weights (the moments and the accountant both travel)."""
    args = [*DP_RUN, "--server-optimizer", "adam", "--global-lr", "0.03", "--workspace", str(tmp_path / "ws")]
    proc = run_job("pt_job_fedavg.py", [*args, "--output-dir", str(tmp_path / "full")], tmp_path)
    assert "then adam" in proc.stdout and "server optimizer adam, eta 0.03" in proc.stdout
    run_dir = tmp_path / "part"
    run_job("pt_job_fedavg.py", [*args, "--output-dir", str(run_dir), "--stop-after-round", "3"], tmp_path)
    run_job("pt_job_fedavg.py", ["--resume", str(run_dir), "--workspace", str(tmp_path / "ws")], tmp_path)
    full, resumed = find_results(tmp_path / "full"), find_results(run_dir)
    assert resumed["config"]["server_optimizer"] == "adam"
    assert [r["dp_epsilon"] for r in resumed["rounds"]] == [r["dp_epsilon"] for r in full["rounds"]]
    uninterrupted, again = torch.load(tmp_path / "full" / "final_model.pt"), torch.load(run_dir / "final_model.pt")
    for key in uninterrupted:
        assert torch.equal(uninterrupted[key], again[key]), key


def test_dp_budget_stops_the_run_saying_so(tmp_path):
    proc = run_job(
        "pt_job_fedavg.py",
        [*DP_RUN, "--dp-budget", "4", "--output-dir", str(tmp_path / "run"), "--workspace", str(tmp_path / "ws")],
        tmp_path,
    )
    results = find_results(tmp_path / "run")
    assert "would exceed --dp-budget 4" in proc.stdout
    assert 0 < len(results["rounds"]) < 6 and results["rounds"][-1]["dp_epsilon"] <= 4
    assert results["summary"]["dp_stopped"].startswith(f"stopped before round {len(results['rounds']) + 1}")


def test_dp_fedbuff_accounts_each_version_and_resumes_bit_for_bit(tmp_path):
    """One event per applied version (a sample of B = 4 from N - K = 32, replace-one) as dp-accounting computes it
    here; a run stopped at version 10 and resumed has the uninterrupted run's arrivals, epsilon and final weights."""
    full, part = tmp_path / "full", tmp_path / "part"
    ws = ["--workspace", str(tmp_path / "ws")]
    proc = run_job("pt_job_fedbuff.py", [*DP_FEDBUFF_RUN, "--output-dir", str(full), *ws], tmp_path)
    run_job(
        "pt_job_fedbuff.py", [*DP_FEDBUFF_RUN, "--output-dir", str(part), "--stop-after-version", "10", *ws], tmp_path
    )
    run_job("pt_job_fedbuff.py", ["--resume", str(part), *ws], tmp_path)
    results, resumed = find_results(full), find_results(part)
    event = dp_accounting.SampledWithoutReplacementDpEvent(32, 4, dp_accounting.GaussianDpEvent(0.25))
    records = results["rounds"][1:]
    assert [r["version"] for r in records] == [10, 20]
    for record in records:
        library = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        library.compose(event, record["version"])
        assert f"{record['dp_epsilon']:.3g}" == f"{library.get_epsilon(1 / 40**1.1):.3g}", record
    assert "dp_epsilon_one_update" in records[-1] and results["summary"]["dp_rounds_accounted"] == 20
    assert records[-1]["dp_noise_std"] == pytest.approx(0.25)  # z * S on each buffer's sum
    assert (
        "buffers of 4 from 32 idle devices" in proc.stdout and f"epsilon {records[-1]['dp_epsilon']:.3f}" in proc.stdout
    )
    assert [r.get("dp_epsilon") for r in resumed["rounds"]] == [r.get("dp_epsilon") for r in results["rounds"]]

    def arrivals(run_dir):
        with open(run_dir / "arrivals.csv", encoding="utf-8") as stream:
            return list(csv.reader(stream))

    assert arrivals(part) == arrivals(full) and len(arrivals(full)) == 1 + 20 * 4  # header, B updates a version
    uninterrupted, again = torch.load(full / "final_model.pt"), torch.load(part / "final_model.pt")
    for key in uninterrupted:
        assert torch.equal(uninterrupted[key], again[key]), key


@pytest.mark.parametrize(
    "script, args, needle",
    [
        (
            "pt_job_fedbuff.py",
            ["--dp", "central", "--dp-noise-multiplier", "1", "--dp-target-quantile", "0.5"],
            "--dp-target-quantile",
        ),
        ("pt_job_fedrevive.py", ["--dp", "central", "--dp-noise-multiplier", "1"], "--dp: central is not available"),
        ("pt_job_fedavg.py", ["--dp", "central", "--dp-clip", "0"], "--dp-clip"),
        ("pt_job_fedavg.py", ["--dp", "central", "--dp-epsilon", "1", "--dp-noise-multiplier", "1"], "not both"),
    ],
)
def test_bad_dp_flags_are_refused_in_one_line(script, args, needle, tmp_path):
    stderr = refused_job(script, [*args, "--workspace", str(tmp_path / "ws")], tmp_path)
    assert needle in stderr.strip().splitlines()[-1]


def test_local_dp_updates_pass_the_leaf_norm_check_by_their_noise(tmp_path):
    """Under --dp local a leaf sees each device's noised update (norm about z S sqrt(d): 125 for the CNN at z 0.5,
    S 1), which --max-update-ratio's limit (89 here) rejected, every device of round 1; the limit is now at least the
    noised update's bound (:func:`devsim.privacy.noise.noised_norm_bound`)."""
    args = ["--dataset", "digits", "--num-rounds", "2", "--dp", "local", "--dp-noise-multiplier", "0.5"]
    run_job("pt_job_fedavg.py", [*args, "--workspace", str(tmp_path / "ws")], tmp_path)
    rounds = find_results(tmp_path / "ws" / "runs")["rounds"]
    assert len(rounds) == 2 and all(r["rejected_devices"] == 0 for r in rounds), rounds
