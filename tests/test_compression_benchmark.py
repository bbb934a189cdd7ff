"""``benchmarks/compression_job.py``: each codec's job flags, the figures read from a job's results, the summary over
seeds and horizons against ``none`` of the same seed and group, and bad flags as one clear error (no job runs: the
job runner is replaced, so the checks take milliseconds)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import import_script


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
    assert job.codec_label("topk 1% warmup 4 momentum 0.3") == "top-k 1% warm-up 4 leaf momentum 0.3"


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
    bases = {name: runs["none"] for name in runs}
    summary = job.horizon_summary(runs, bases, ["none", "topk 1%"], [0, 1], [2, 3])
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


def test_groups_compare_each_codec_with_its_own_none_and_publish_the_figures(tmp_path, monkeypatch):
    """Two ``--codecs`` groups over two seeds in one invocation: each codec is compared with its group's ``none`` of
    the same seed (the groups' ``none`` runs differ here), each horizon's bytes ratio counts a warm-up's denser first
    round, and the figures carry the issue's names with this one command."""
    job = _job_script()
    dense, warm = [400, 400, 400], [100, 6, 6]
    accuracy = {"none": [0.5, 0.8, 0.9], "int8": [0.5, 0.8, 0.9], "topk 1%": [0.3, 0.7, 0.85]}
    accuracy["topk 1% warmup 1"] = [0.5, 0.75, 0.88]
    per_round = {"none": dense, "int8": [100, 100, 100], "topk 1%": [6, 6, 6], "topk 1% warmup 1": warm}
    by_flags = {tuple(job.codec_flags(name)): name for name in accuracy}
    calls = []

    def fake_run_job(script, flags, workdir, name, env=None):
        if name == "warm":  # the untimed first job
            return {}
        codec = by_flags[tuple(flags[flags.index("--update-codec") : flags.index("--seed")])]
        seed, group = int(flags[flags.index("--seed") + 1]), int(name[1])
        calls.append((group, seed, codec))
        drop = 0.0 if codec == "none" else 0.05 * seed
        shift = 0.1 * group if codec == "none" else 0.0  # group 1's none ran 10 points better
        rounds = [
            {"accuracy": a - drop + shift, "bytes": {"device_to_leaf": b}, "timing": {"wall": 1.0, "info": {}}}
            for a, b in zip(accuracy[codec], per_round[codec], strict=True)
        ]
        summary = {"bytes_total": {"device_to_leaf": sum(per_round[codec])}, "final_accuracy": rounds[-1]["accuracy"]}
        return {"rounds": rounds, "summary": summary, "wall": 1.0}

    monkeypatch.setattr(job, "run_job", fake_run_job)
    out = tmp_path / "report.json"
    argv = ["--seeds", "0,1", "--rounds", "3", "--horizons", "2,3", "--json", str(out)]
    argv += ["--codecs", "none,topk 1%,topk 1% warmup 1", "--codecs", "none,int8"]
    assert job.main(argv) == 0
    assert sorted(c for c in calls if c[0] == 1) == [(1, 0, "int8"), (1, 0, "none"), (1, 1, "int8"), (1, 1, "none")]
    report = json.loads(out.read_text())
    assert report["seeds"] == [0, 1] and list(report["codecs"]) == ["none", "topk 1%", "topk 1% warmup 1", "int8"]
    warmup = report["summary"]["topk 1% warmup 1"]["horizons"]
    assert warmup["2"]["fewer_bytes"] == pytest.approx(800 / 106)
    assert warmup["3"]["fewer_bytes"] == pytest.approx(1200 / 112)
    assert warmup["3"]["final_vs_none_points"] == pytest.approx([-2.0, -7.0])
    # int8 against group 1's none (10 points better than group 0's): -10 and -15, not 0 and -5
    assert report["summary"]["int8"]["horizons"]["3"]["final_vs_none_points"] == pytest.approx([-10.0, -15.0])
    figures = {f["figure"]: f for f in report["figures"]}
    topk = figures["top-k 1% uplink (66.7x fewer bytes) vs float32, digits in the job, 2 seeds, 3 rounds"]
    assert topk["value"] == "-7.50 / -10.00 points (mean / worst)" and topk["target"] == "within 3 / worst within 5"
    assert "top-k 1% warm-up 1 uplink (10.7x fewer bytes) vs float32, digits in the job, 2 seeds, 3 rounds" in figures
    assert figures["int8 uplink (4x fewer bytes) vs float32, digits in the job, 2 seeds, 3 rounds"]["value"] == (
        "-12.50 / -15.00 points (mean / worst)"
    )
    assert "--codecs 'none,topk 1%,topk 1% warmup 1' --codecs none,int8" in topk["command"]
    assert "&&" not in topk["command"] and report["command"] == topk["command"]


@pytest.mark.parametrize(
    ("codecs", "message"),
    [
        (["none,int8", "none,int8"], "--codecs: 'int8' is in two groups"),
        (["int8"], "--codecs: 'int8' lacks none"),
        (["none,zip"], "--codecs: 'zip' is not allowed"),
    ],
)
def test_bad_codec_groups_name_the_flag(codecs, message, capsys):
    job = _job_script()
    with pytest.raises(SystemExit) as stop:
        job.main([arg for text in codecs for arg in ("--codecs", text)])
    assert stop.value.code == 2 and message in capsys.readouterr().err
