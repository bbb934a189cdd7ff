"""Cluster aggregation end to end in the simulator: 6 leaves in 2 hidden label-permutation groups."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import find_results, run_job

CLUSTER_RUN = [
    *("--num-leaf-nodes", "6", "--devices-per-leaf", "10", "--device-selection-size", "60"),
    *("--samples-per-device", "100", "--partition", "iid", "--local-epochs", "3", "--num-rounds", "6"),
    *("--synthetic-train-size", "6000", "--synthetic-test-size", "1000", "--seed", "3"),
]
GROUPS = [*CLUSTER_RUN, "--hidden-groups", "2"]


def _run(script: str, args: list[str], tmp) -> dict:
    run_job(script, [*args, "--workspace", str(tmp / "ws")], tmp, timeout=900)
    return find_results(tmp / "ws" / "runs")


@pytest.fixture(scope="module")
def grouped_runs(tmp_path_factory):
    cluster = _run("pt_job_cluster.py", GROUPS, tmp_path_factory.mktemp("cluster"))
    fedavg = _run("pt_job_fedavg.py", GROUPS, tmp_path_factory.mktemp("fedavg"))
    return cluster, fedavg


def test_hidden_groups_are_recovered_exactly(grouped_runs):
    cluster, _ = grouped_runs
    truth = {f"site-{i + 1}": i % 2 for i in range(6)}
    recovered_at = None
    for record in cluster["rounds"]:
        labels = record["cluster_labels"]
        same = all((labels[a] == labels[b]) == (truth[a] == truth[b]) for a in truth for b in truth)
        if same and recovered_at is None:
            recovered_at = record["round"]
        if recovered_at is not None:
            assert same, f"clusters changed after being recovered at round {recovered_at}: {labels}"
    assert recovered_at is not None and recovered_at <= 3, [r["cluster_labels"] for r in cluster["rounds"]]
    assert cluster["rounds"][-1]["churn"] == 0


def test_cluster_beats_fedavg_on_mean_leaf_accuracy(grouped_runs):
    cluster, fedavg = grouped_runs
    cluster_acc = cluster["summary"]["final_mean_leaf_accuracy"]
    fedavg_acc = fedavg["summary"]["final_mean_leaf_accuracy"]
    print(f"mean per-leaf accuracy after 6 rounds: cluster {cluster_acc:.4f}, fedavg {fedavg_acc:.4f}")
    assert cluster_acc > fedavg_acc + 0.2


def test_all_leaves_alike_keeps_one_cluster_and_matches_fedavg(tmp_path):
    alike = [*CLUSTER_RUN, "--num-rounds", "3", "--hidden-groups", "1"]
    cluster = _run("pt_job_cluster.py", alike, tmp_path / "c")
    fedavg = _run("pt_job_fedavg.py", alike, tmp_path / "f")
    assert all(r["num_clusters"] == 1 for r in cluster["rounds"][1:])
    first = torch.load(cluster["summary"]["final_model"])
    second = torch.load(fedavg["summary"]["final_model"])
    for key in first:
        torch.testing.assert_close(first[key], second[key], rtol=1e-5, atol=1e-6)
