"""``benchmarks/compression.py`` over several seeds and horizons: the summary agrees with the per-seed figures,
and bad ``--seeds`` / ``--horizons`` are one clear error naming the flag (tiny synthetic runs, a few seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import import_script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "compression.py")
TINY = ["--rounds", "4", "--devices", "8", "--per-round", "4", "--samples", "10"]


def run(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOME=str(tmp_path), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, SCRIPT, *TINY, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def test_summary_over_seeds_matches_each_seed(tmp_path):
    out = tmp_path / "report.json"
    proc = run(tmp_path, "--codecs", "none,topk 10%", "--seeds", "0,3", "--horizons", "2,4", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "over seeds 0,3" in proc.stdout
    report = json.loads(out.read_text())
    assert set(report["per_seed"]) == {"0", "3"}
    assert report["codecs"] == report["per_seed"]["0"]
    topk = report["summary"]["topk 10%"]
    final = topk["horizons"]["4"]["final_vs_none_points"]
    assert final == pytest.approx([report["per_seed"][s]["topk 10%"]["final_vs_none_points"] for s in ("0", "3")])
    assert topk["horizons"]["4"]["final_vs_none_worst"] == pytest.approx(min(final))
    assert set(topk["horizons"]) == {"2", "4"}
    shares = [report["per_seed"][s]["topk 10%"]["codec_share"] for s in ("0", "3")]
    assert (topk["codec_share_min"], topk["codec_share_max"]) == (min(shares), max(shares))
    assert report["summary"]["none"]["horizons"]["2"]["final_vs_none_mean"] == 0


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--horizons", "2,9", "--horizons: 9 is not between 1 and --rounds (4)"),
        ("--horizons", "two", "--horizons: 'two' is not a comma list of non-negative integers"),
        ("--seeds", "1,1", "--seeds: 1,1 repeats a seed"),
    ],
)
def test_bad_seeds_or_horizons_name_the_flag(tmp_path, flag, value, message):
    proc = run(tmp_path, flag, value)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def _job_script():
    return import_script("benchmarks", "compression_job.py")


def test_job_script_passes_each_codec_as_the_jobs_flags():
    job = _job_script()
    assert job.codec_flags("none") == ["--update-codec", "none"]
    assert job.codec_flags("int8") == ["--update-codec", "int8"]
    assert job.codec_flags("topk 4% int8 warmup 2") == [
        "--update-codec",
        "topk",
        "--topk-fraction",
        "0.04",
        "--topk-values",
        "int8",
        "--topk-warmup-rounds",
        "2",
    ]
    assert job.codec_flags("topk 1% momentum 0.3")[-2:] == ["--topk-momentum", "0.3"]
    with pytest.raises(ValueError, match="not a known codec"):
        job.codec_flags("zip")
    with pytest.raises(ValueError, match="momentum 'x' is not a number"):
        job.codec_flags("topk 1% momentum x")
    with pytest.raises(ValueError, match=r"topk_momentum must be in \[0, 1\)"):
        job.codec_flags("topk 1% momentum 1")
    assert job._compression.codec_label("topk 1% warmup 4 momentum 0.3") == "top-k 1% warm-up 4 leaf momentum 0.3"


def test_job_figures_leave_the_warm_rounds_out_of_the_timing():
    job = _job_script()

    def timed(wall: float, codec: float, critical: float, accuracy: float) -> dict:
        info = {"codec_seconds": codec, "critical_leaf_codec_seconds": critical}
        return {"timing": {"wall": wall, "info": info}, "accuracy": accuracy}

    warm = [timed(5.0, 1.0, 1.0, 0.1), timed(3.0, 1.0, 1.0, 0.2)]
    later = [timed(0.2, 0.010, 0.006, 0.5), timed(0.3, 0.014, 0.004, 0.6)]
    results = {
        "rounds": warm + [timed(1.0, 0.0, 0.0, 0.3), timed(1.0, 0.0, 0.0, 0.4)] + later,
        "summary": {"bytes_total": {"device_to_leaf": 1234}, "final_accuracy": 0.9},
        "wall": 21.5,
    }
    figures = job.job_figures(results)
    assert figures["round_wall_mean"] == pytest.approx(2.5 / 4)
    assert figures["codec_share_sum"] == pytest.approx(0.024 / 2.5)
    assert figures["codec_share_critical"] == pytest.approx(0.010 / 2.5)
    assert figures["accuracies"] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert figures["last5_accuracy"] == pytest.approx(0.4)
    assert (figures["uplink_bytes"], figures["final_accuracy"], figures["job_wall"]) == (1234, 0.9, 21.5)


def test_job_summary_compares_each_horizon_with_none_of_the_same_seed():
    job = _job_script()

    def figures(accuracies: list[float], uplink: int, share: float) -> dict:
        return {"accuracies": accuracies, "uplink_bytes": uplink, "codec_share_critical": share}

    runs = {
        "none": {0: figures([0.5, 0.8, 0.9], 400, 0.0), 1: figures([0.4, 0.7, 0.8], 400, 0.0)},
        "topk 1%": {0: figures([0.3, 0.6, 0.88], 6, 0.02), 1: figures([0.4, 0.6, 0.7], 6, 0.03)},
    }
    summary = job.horizon_summary(runs, ["none", "topk 1%"], [0, 1], [2, 3])
    after2, after3 = (summary["topk 1%"]["horizons"][h] for h in ("2", "3"))
    assert after2["final_vs_none_points"] == pytest.approx([-20.0, -10.0])
    assert (after2["final_vs_none_mean"], after2["final_vs_none_worst"]) == pytest.approx((-15.0, -20.0))
    assert after3["final_vs_none_points"] == pytest.approx([-2.0, -10.0])
    assert after3["last5_vs_none_mean"] == pytest.approx(100 * ((1.78 - 2.2) + (1.7 - 1.9)) / 3 / 2)
    assert summary["topk 1%"]["fewer_bytes"] == pytest.approx(400 / 6)
    assert (summary["topk 1%"]["codec_share_min"], summary["topk 1%"]["codec_share_max"]) == (0.02, 0.03)


def test_job_horizons_beyond_the_rounds_name_the_flag(capsys):
    job = _job_script()
    with pytest.raises(SystemExit) as stop:
        job.main(["--rounds", "20", "--horizons", "20,30"])
    assert stop.value.code == 2
    assert "--horizons: 30 is not between 1 and the rounds run (20)" in capsys.readouterr().err


def _fake_run(accuracies: list[float], per_round: list[int], share: float) -> dict:
    """One job's figures as ``job_figures`` gives them (what a ``--json PATH`` report keeps per seed)."""
    return {
        "uplink_bytes": sum(per_round),
        "uplink_bytes_by_round": per_round,
        "final_accuracy": accuracies[-1],
        "last5_accuracy": float(sum(accuracies[-5:]) / len(accuracies[-5:])),
        "accuracies": accuracies,
        "round_wall_mean": 0.2,
        "codec_share_sum": 2 * share,
        "codec_share_critical": share,
        "job_wall": 30.0,
    }


def test_job_merge_summarises_the_seeds_of_several_reports_and_publishes_the_figures(tmp_path):
    """Two one-seed reports merged: the summary is over both seeds, each horizon's bytes ratio counts a warm-up's
    denser first round, and the figures carry the issue's names (bytes ratio over the rounds up to the horizon)."""
    job = _job_script()
    names = ["none", "int8", "topk 1%", "topk 1% warmup 1"]
    dense, warm = [400, 400, 400], [100, 6, 6]
    accuracy = {"none": [0.5, 0.8, 0.9], "int8": [0.5, 0.8, 0.9], "topk 1%": [0.3, 0.7, 0.85]}
    accuracy["topk 1% warmup 1"] = [0.5, 0.75, 0.88]
    per_round = {"none": dense, "int8": [100, 100, 100], "topk 1%": [6, 6, 6], "topk 1% warmup 1": warm}
    paths = []
    for seed, drop in ((0, 0.0), (1, 0.05)):
        runs = {
            n: _fake_run([a - (drop if n != "none" else 0) for a in accuracy[n]], per_round[n], 0.01) for n in names
        }
        report = {"rounds": 3, "load_average": [1.0, 1.5], "command": f"run seed {seed}"}
        report["codecs"] = {n: {"per_seed": {str(seed): runs[n]}} for n in names}
        paths.append(tmp_path / f"seed{seed}.json")
        paths[-1].write_text(json.dumps(report))
    out = tmp_path / "merged.json"
    assert job.main(["--merge", ",".join(map(str, paths)), "--horizons", "2,3", "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["seeds"] == [0, 1]
    warmup = merged["summary"]["topk 1% warmup 1"]["horizons"]
    assert warmup["2"]["fewer_bytes"] == pytest.approx(800 / 106) and warmup["3"]["fewer_bytes"] == pytest.approx(
        1200 / 112
    )
    assert warmup["3"]["final_vs_none_points"] == pytest.approx([-2.0, -7.0])
    figures = {f["figure"]: f for f in merged["figures"]}
    topk = figures["top-k 1% uplink (66.7x fewer bytes) vs float32, digits in the job, 2 seeds, 3 rounds"]
    assert topk["value"] == "-7.50 / -10.00 points (mean / worst)" and topk["target"] == "within 3 / worst within 5"
    assert "top-k 1% warm-up 1 uplink (10.7x fewer bytes) vs float32, digits in the job, 2 seeds, 3 rounds" in figures
    assert figures["int8 uplink (4x fewer bytes) vs float32, digits in the job, 2 seeds, 3 rounds"]["value"] == (
        "-2.50 / -5.00 points (mean / worst)"
    )
    assert topk["command"].startswith("run seed 0 && run seed 1 && ")
    assert job.main(["--merge", f"{paths[0]},{paths[0]}"]) == 0  # the same runs twice: one run
    other = json.loads(paths[1].read_text())
    other["codecs"]["int8"]["per_seed"]["1"]["accuracies"] = [0.1, 0.1, 0.1]
    paths.append(tmp_path / "seed1_other.json")
    paths[-1].write_text(json.dumps(other))
    with pytest.raises(SystemExit):  # one seed's run of a codec with two different outcomes
        job.main(["--merge", f"{paths[1]},{paths[2]}"])
    # another none run of seed 1 (a job's training path can differ under load): int8 is compared with its own report's
    other["codecs"]["int8"]["per_seed"]["1"]["accuracies"] = [0.1, 0.1, 0.1]
    other["codecs"]["none"]["per_seed"]["1"]["accuracies"] = [0.2, 0.2, 0.2]
    for name in ("none", "topk 1%", "topk 1% warmup 1"):  # a report of int8 alone, with its none
        if name != "none":
            del other["codecs"][name]
    paths[-1].write_text(json.dumps(other))
    first = json.loads(paths[1].read_text())
    del first["codecs"]["int8"]
    paths[1].write_text(json.dumps(first))
    assert job.main(["--merge", f"{paths[0]},{paths[1]},{paths[2]}", "--horizons", "3", "--json", str(out)]) == 0
    int8 = json.loads(out.read_text())["summary"]["int8"]["horizons"]["3"]["final_vs_none_points"]
    assert int8 == pytest.approx([0.0, -10.0])  # seed 1: 0.1 against its report's none 0.2, not the other none's 0.9
    del other["codecs"]["int8"]
    other["codecs"] = {n: {"per_seed": {"7": row["per_seed"]["1"]}} for n, row in other["codecs"].items()}
    paths[-1].write_text(json.dumps(other))
    with pytest.raises(SystemExit):  # seed 7 has no int8 run
        job.main(["--merge", f"{paths[0]},{paths[2]}"])


def test_json_without_a_path_writes_through_benchmarks_figures(tmp_path, monkeypatch):
    """``--json`` alone publishes through ``benchmarks/figures.py`` (date, machine, commit and the figures, under its
    results folder); ``--json PATH`` writes the payload and figures to PATH."""
    job = _job_script()
    figures = job._compression._figures_module()
    monkeypatch.setattr(figures, "RESULTS", str(tmp_path / "results"))
    row = figures.figure("top-k 1% uplink (66.6x fewer bytes) vs float32", "-1.00 / -2.00", "t", "c", "d", "m")
    path = job._compression.publish("compression_job", {"rounds": 3}, [row], "")
    written = json.loads(open(path, encoding="utf-8").read())
    assert os.path.dirname(path) == str(tmp_path / "results") and os.path.basename(path).startswith("compression_job-")
    assert written["rounds"] == 3 and written["figures"] == [row] and {"date", "machine", "commit"} <= set(written)
    explicit = job._compression.publish("compression_job", {"rounds": 3}, [row], str(tmp_path / "x.json"))
    assert explicit.endswith("x.json")
    assert json.loads((tmp_path / "x.json").read_text()) == {"rounds": 3, "figures": [row]}
