"""Compressed uplinks and the network model end to end in NVFlare's simulator (one sync, one async run)."""

from __future__ import annotations

import csv

import pytest
import torch

from tests.conftest import find_results, refused_job, run_job

SYNC_RUN = [
    *("--num-leaf-nodes", "2", "--devices-per-leaf", "10", "--device-selection-size", "8"),
    *("--samples-per-device", "40", "--partition", "iid", "--num-rounds", "3", "--seed", "4"),
    *("--synthetic-train-size", "1000", "--synthetic-test-size", "200"),
]
NETWORK = ["--uplink-mbps", "1", "--downlink-mbps", "10", "--latency-ms", "50", "--bandwidth-spread", "0.5"]


@pytest.mark.slow
def test_sync_topk_run_records_bytes_residuals_and_simulated_time(tmp_path):
    args = [*SYNC_RUN, *NETWORK, "--update-codec", "topk", "--topk-fraction", "0.01", "--residual-capacity", "3"]
    run_job("pt_job_fedavg.py", [*args, "--workspace", str(tmp_path / "ws")], tmp_path)
    results = find_results(tmp_path / "ws" / "runs")
    assert results["config"]["update_codec"] == "topk"
    for record in results["rounds"]:
        hops = record["bytes"]
        assert hops["device_to_leaf_float32"] / hops["device_to_leaf"] > 30
        assert hops["leaf_to_device"] == hops["device_to_leaf_float32"]
        assert record["simulated_round_seconds"] > record["simulated_transfer_seconds"] > 0
        assert record["residuals_held"] <= 2 * 3
        assert record["timing"]["info"]["codec_seconds"] > 0
    assert results["rounds"][-1]["residual_evictions"] > 0
    assert results["summary"]["simulated_time"] == pytest.approx(results["rounds"][-1]["simulated_time"])


@pytest.mark.slow
def test_sync_topk_warmup_and_int8_values_reach_the_leaves_and_the_clock(tmp_path):
    """--topk-values and --topk-warmup-rounds travel to the leaves (bytes per round) and the server's clock;
    --topk-momentum reaches the run's config and adds no bytes."""
    args = [*SYNC_RUN, *NETWORK, "--update-codec", "topk", "--topk-fraction", "0.01"]
    args += ["--topk-values", "int8", "--topk-warmup-rounds", "2", "--topk-momentum", "0.3"]
    run_job("pt_job_fedavg.py", [*args, "--workspace", str(tmp_path / "ws")], tmp_path)
    results = find_results(tmp_path / "ws" / "runs")
    assert results["config"]["topk_values"] == "int8" and results["config"]["topk_warmup_rounds"] == 2
    assert results["config"]["topk_momentum"] == 0.3
    sent = [r["bytes"]["device_to_leaf"] / r["bytes"]["device_to_leaf_float32"] for r in results["rounds"]]
    assert sent[0] > sent[1] > sent[2]  # 10%, then 2.2% of the elements, then 1%; 3 bytes each (+ a scale)
    assert 1 / sent[2] > 120


@pytest.mark.slow
def test_async_compression_changes_arrivals_on_the_virtual_clock(tmp_path):
    """The codec's bytes set the upload delays; the leaves forward each encoded update to the server unchanged."""
    base = [
        *("--num-leaf-nodes", "2", "--devices-per-leaf", "10", "--samples-per-device", "40"),
        *("--synthetic-train-size", "1000", "--synthetic-test-size", "200", "--concurrency", "6"),
        *("--max-versions", "8", "--eval-frequency", "4", "--seed", "4", *NETWORK),
    ]
    arrivals = {}
    for codec in ("none", "int8"):
        out = tmp_path / codec
        run_job("pt_job_fedbuff.py", [*base, "--update-codec", codec, "--workspace", str(out / "ws")], out)
        results = find_results(out / "ws" / "runs")
        totals = results["summary"]["bytes_total"]
        ratio = totals["device_to_leaf_float32"] / totals["device_to_leaf"]
        assert ratio == 1.0 if codec == "none" else ratio > 3.9
        assert totals["leaf_to_server"] == totals["device_to_leaf"]  # the leaves forward the updates as they came
        assert results["rounds"][-1]["failed_rejected"] == 0
        decoding = sum(r["timing"]["info"]["server_decode_seconds"] for r in results["rounds"] if "timing" in r)
        assert decoding == 0.0 if codec == "none" else decoding > 0.0
        with open(next((out / "ws" / "runs").rglob("arrivals.csv")), encoding="utf-8") as stream:
            arrivals[codec] = [(r["job_id"], r["arrival_time"]) for r in csv.DictReader(stream)]
    assert arrivals["none"] != arrivals["int8"]


def test_bad_codec_flags_are_refused_naming_the_flag(tmp_path):
    for flags, name in (
        (["--update-codec", "zip"], "--update-codec"),
        (["--topk-fraction", "0"], "--topk-fraction"),
        (["--uplink-mbps", "0"], "--uplink-mbps"),
        (["--topk-values", "int4"], "--topk-values"),
        (["--update-codec", "topk", "--topk-momentum", "1"], "--topk-momentum"),
        (["--topk-momentum", "0.5"], "--topk-momentum"),
    ):
        stderr = refused_job("pt_job_fedavg.py", [*flags, "--workspace", str(tmp_path / "ws")], tmp_path)
        assert name in stderr


@pytest.mark.slow
def test_sync_topk_stop_and_resume_keeps_residuals_and_momentum(tmp_path):
    """The leaves' error-feedback residuals and top-k momentum are part of the checkpoint: a top-k run stopped
    after round 2 and resumed ends with the same final weights as the uninterrupted run, bit for bit."""
    args = [*SYNC_RUN, "--num-rounds", "4", "--update-codec", "topk", "--topk-fraction", "0.05"]
    args += ["--topk-momentum", "0.3", "--device-batch", "8"]
    run_job("pt_job_fedavg.py", [*args, "--workspace", str(tmp_path / "a")], tmp_path)
    uninterrupted = torch.load(find_results(tmp_path / "a" / "runs")["summary"]["final_model"])
    run_dir = tmp_path / "run"
    common = ["--workspace", str(tmp_path / "b")]
    run_job("pt_job_fedavg.py", [*args, *common, "--output-dir", str(run_dir), "--stop-after-round", "2"], tmp_path)
    resumed = run_job("pt_job_fedavg.py", ["--resume", str(run_dir), *common], tmp_path)
    assert "leaf state of 2 leaves restored" in resumed.stdout, resumed.stdout[-2000:]
    weights = torch.load(run_dir / "final_model.pt")
    for key in uninterrupted:
        assert torch.equal(uninterrupted[key], weights[key]), (
            key,
            float((uninterrupted[key] - weights[key]).abs().max()),
        )
