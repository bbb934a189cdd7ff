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
    with pytest.raises(ValueError, match="not a known codec"):
        job.codec_flags("zip")


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
