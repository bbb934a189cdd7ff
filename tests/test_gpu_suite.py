"""The GPU suite's CPU dry run (``benchmarks/gpu_suite.py --device cpu --tiny``), so the script cannot rot.

One tiny dry run takes every section at the smallest shapes (one process: torch, the data and the compiled step are
loaded once) and the tests below read its report. Figures are checked for shape and sanity (positive rates, ratios
that are the ratio of the printed rates), never for speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from benchmarks.gpu_suite_child import CRASH_HOOK, JOB_MARGIN, ChildArgs, run_section

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(REPO, "benchmarks", "gpu_suite.py")


def run_suite(tmp_path, sections: str, timeout: float, crash: str | None = None) -> dict:
    """Run the dry run of ``sections`` into ``tmp_path/gpu_suite.json``; its report (no section failed, or only
    ``crash``, whose child aborts through the suite's test hook)."""
    out = tmp_path / "gpu_suite.json"
    env = dict(os.environ, HOME=str(tmp_path / "home"), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    env.pop(CRASH_HOOK, None)
    if crash:
        env[CRASH_HOOK] = crash
    # compiled_step's kernels and inductor's precompiled headers (under the temp dir whatever the cache dir) stay here
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), TMPDIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, SUITE, "--device", "cpu", "--tiny", "--sections", sections, "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == (1 if crash else 0), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["errors"]) == ({crash} if crash else set()), report["errors"]
    assert report["machine"]["device"] == "cpu" and report["machine"]["torch"]
    return report


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[dict, str]:
    """Every section's tiny dry run, once for this module: (the report, the path of its JSON)."""
    folder = tmp_path_factory.mktemp("gpu_suite")
    from benchmarks.gpu_suite import SECTIONS

    return run_suite(folder, ",".join(SECTIONS), timeout=1800), str(folder / "gpu_suite.json")


@pytest.mark.slow
def test_in_process_sections_write_consistent_figures(dry_run):
    report, path = dry_run
    cnn = report["sections"]["throughput"]["cnn"]
    for key in ("centralized_batch10", "centralized_batch256", "pool", "batched_1_worker", "auto"):
        assert cnn[key] > 0, key
    assert cnn["pool_vs_limit"] == pytest.approx(cnn["pool"] / cnn["centralized_batch256"])
    assert cnn["auto_vs_limit"] == pytest.approx(cnn["auto"] / cnn["centralized_batch256"])
    assert cnn["batched_vs_pool"] == pytest.approx(cnn["batched_1_worker"] / cnn["pool"])
    assert cnn["auto_plan"].startswith("workers=") and "pool first on the cpu" in cnn["auto_plan"]
    sweep = report["sections"]["worker_sweep"]
    assert set(sweep["samples_per_s"]) == {"pool 1", "pool 2", "groups 1x4"}
    assert 0 < sweep["auto_vs_best"] <= 1.0
    assert sweep["auto_plan"].startswith(f"workers={sweep['auto_workers']} ")
    tf32 = report["sections"]["tf32"]["cnn"]
    assert tf32["leaf_gain"] == pytest.approx(tf32["leaf_on"] / tf32["leaf_off"])
    assert tf32["max_relative_difference"] < 1e-5  # no TF32 on the CPU: the same float32 run twice
    search = report["sections"]["cudnn_benchmark"]["cnn"]  # no cuDNN on the CPU either: the same run twice
    assert search["max_relative_difference"] < 1e-5 and search["leaf_first_round_seconds_on"] > 0
    assert search["profile_on"]["round_ms"] > 0 and search["profile_on"]["top_self_cuda"] is None  # no CUDA here
    from benchmarks.gpu_suite import SECTIONS

    assert list(report["section_seconds"]) == list(SECTIONS) and report["suite_seconds"] > 0
    check = subprocess.run([sys.executable, SUITE, "check", path], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert "one leaf, 64 devices, CNN" in check.stdout and "launch to the first finished round" in check.stdout
    assert "profile cnn with cuDNN's search" in check.stdout


@pytest.mark.slow
def test_job_sections_dry_run(dry_run):
    sections = dry_run[0]["sections"]
    for run in (sections["fedavg_e2e"]["cnn_default"], sections["fedavg_e2e"]["resnet18_1000_devices"]):
        assert run["first_round_seconds"] is not None and 0 < run["first_round_seconds"] < run["wall_seconds"]
        assert run["device_samples_per_s"] > 0 and "leaf_compute" in run["timing_mean_parts"]
        assert len(run["worker_plans"]) == 2 and all("workers=" in line for line in run["worker_plans"])
    assert sections["fedrevive"]["revive_seconds_per_arrival"] is not None


@pytest.mark.slow
def test_async_and_compiled_step_sections_dry_run(dry_run):
    """Ratios that are the ratio of the printed rates (FedRevive's command against FedBuff's too), compiled deltas
    equal to eager's up to float rounding (the compiled step compiles here with inductor on the CPU: about 15 s)."""
    sections = dry_run[0]["sections"]
    rates = sections["async_throughput"]["settings"]
    assert set(rates) == {"fedavg", "fedbuff B=2"} and sections["async_throughput"]["tight_loop_ms_per_update"] > 0
    fedbuff = rates["fedbuff B=2"]
    assert fedbuff["updates"] > 0 and fedbuff["ratio_to_fedavg"] == pytest.approx(
        fedbuff["updates_per_s"] / rates["fedavg"]["updates_per_s"]
    )
    revive = sections["async_revive"]
    (pair,) = revive["pairs"]  # one pair in the dry run
    assert set(pair) == {"fedbuff paper", "fedrevive paper"} and pair["fedrevive paper"]["updates"] > 0
    assert revive["command_ratio"] == pytest.approx(
        pair["fedrevive paper"]["command_wall"] / pair["fedbuff paper"]["command_wall"]
    )
    step = sections["compiled_step"]["group_2"]
    assert set(step) == {"eager", "graphs", "compiled"} and step["eager"]["ms_per_device"] > 0
    assert step["compiled"]["speedup"] > 0 and step["compiled"]["max_delta_difference"] < 1e-4
    assert step["graphs"]["max_delta_difference"] == 0.0  # the CPU has no graphs: the same step on static copies


@pytest.mark.slow
def test_a_crashed_section_is_reported_and_the_next_sections_still_run(tmp_path):
    """worker_sweep's child aborts (the suite's test hook): its error says so, the sections around it have figures,
    and ``profile`` (CPU: no CUDA figures) saw the leaf's worker thread train."""
    report = run_suite(tmp_path, "throughput,profile,worker_sweep,tf32", timeout=600, crash="worker_sweep")
    error = report["errors"]["worker_sweep"]
    assert error.strip().splitlines()[-1].startswith("crashed: the section's child killed by SIGABRT")
    assert "worker_sweep" not in report["sections"] and "worker_sweep" in report["section_seconds"]
    assert report["sections"]["throughput"]["cnn"]["auto"] > 0 and report["sections"]["tf32"]["cnn"]["leaf_on"] > 0
    for name, devices in (("default", 4), ("resnet18", 2)):
        run = report["sections"]["profile"][name]
        assert run["round_ms"] > 0 and run["devices"] == devices and run["gpu_busy"] is None
        assert run["top_self_cuda"] is None and run["launches_per_round"] is None
        assert any("convolution" in row["name"] for row in run["top_self_cpu"]), run["top_self_cpu"]
    check = subprocess.run(
        [sys.executable, SUITE, "check", str(tmp_path / "gpu_suite.json")], capture_output=True, text=True, timeout=60
    )
    assert "profile default (compile=auto" in check.stdout and "round " in check.stdout, check.stdout
    assert "missing (failed: crashed: the section's child killed by SIGABRT" in check.stdout


def test_run_section_reports_a_crash_a_timeout_and_an_error(tmp_path):
    """The parent's side alone, on stand-in children: a signal, the time limit, and a Python error written to the
    part file."""
    part, error = run_section(
        "x", [sys.executable, "-c", "import os, sys; print('gone', file=sys.stderr); os.abort()"], 60
    )
    assert part is None and error.endswith("s") and "killed by SIGABRT" in error and "gone" in error
    part, error = run_section("x", [sys.executable, "-c", "import time; time.sleep(60)"], 1)
    assert part is None and "timed out: the section's child was stopped after 1 s" in error
    writes = "import json, sys; json.dump({'error': 'Traceback: boom'}, open(sys.argv[2], 'w'))"
    assert run_section("x", [sys.executable, "-c", writes], 60) == (None, "Traceback: boom")
    writes = "import json, sys; json.dump({'figures': {'a': 1}, 'peak_gpu_memory_mib': None}, open(sys.argv[2], 'w'))"
    assert run_section("x", [sys.executable, "-c", writes], 60) == (
        {"figures": {"a": 1}, "peak_gpu_memory_mib": None},
        None,
    )


def test_unknown_section_is_one_clear_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, SUITE, "--device", "cpu", "--sections", "throughput,warp"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--sections: unknown warp" in proc.stderr and "Traceback" not in proc.stderr


def test_check_puts_each_target_beside_its_figure():
    sys.path.insert(0, REPO)
    from benchmarks.gpu_suite_check import MET, NOT_MET, rows

    report = {
        "sections": {
            "fedavg_e2e": {"cnn_default": {"vs_limit": 0.45, "first_round_seconds": 12.0}},
            "worker_sweep": {"auto_vs_best": 0.95},
            "async_throughput": {
                "settings": {
                    name: {
                        "updates_per_s": 900.0,
                        "ratio_to_fedavg": 1.0,
                        "updates_per_training_group": 10.0,
                        "updates_per_leaf_call": 10.0,
                    }
                    for name in ("fedavg", "fedbuff B=10", "fedbuff B=2", "fedbuff paper")
                }
            },
        },
        "skipped": {"fedrevive": "20 s left of the suite's --budget; the section's budget is 60 s"},
        "errors": {"throughput": "Traceback ...\nRuntimeError: out of memory"},
        "suite_seconds": 330.0,
    }
    verdicts = {what: (figure, verdict) for what, figure, _, verdict in rows(report)}
    assert verdicts["default FedAvg job (CNN, 2 leaves): device-samples/s against centralized batch 256"] == (
        "0.45",
        MET,
    )
    assert verdicts["launch to the first finished round, default CNN job"] == ("12 s", NOT_MET)
    assert verdicts["async benchmark (digits CNN, 2 x 50 devices): FedAvg device updates/s"] == ("900/s", NOT_MET)
    assert verdicts["automatic leaf plan against the best of the sweep"][1] == MET
    fedrevive = verdicts["FedRevive at the paper's per-arrival size (server on the GPU): wall seconds"]
    assert fedrevive[1].startswith("missing (skipped: 20 s left")
    assert (
        "RuntimeError: out of memory"
        in verdicts["one leaf, 64 devices, CNN, the leaf's own plan, against the same limit"][1]
    )
    assert verdicts["the whole suite in one call"] == ("330 s", MET)


def test_check_prints_one_line_per_profiled_run():
    sys.path.insert(0, REPO)
    from benchmarks.gpu_suite_check import profile_lines

    top = [{"name": "void sgemm_kernel<128>", "calls": 30, "self_cuda_ms": 4.5, "self_cpu_ms": 0.0}]
    run = dict(compile_choice="compile=off: eager batched step", round_ms=12.34, gpu_busy=0.375, top_self_cuda=top)
    run.update(launches_per_round=812.0, top_self_cpu=[{"name": "aten::bmm", "calls": 9, "self_cpu_ms": 2.0}])
    lines = profile_lines({"sections": {"profile": {"eager": run}}})
    assert lines == [
        "profile eager (compile=off: eager batched step): round 12.3 ms, GPU busy 38%, launches/round 812, "
        "top CUDA op void sgemm_kernel<128> 4.5 ms (30 calls)"
    ]
    assert profile_lines({"sections": {}}) == ["profile: missing"]
    transpose = "void cudnn::engines_precompiled::genericTranspose_kernel<float>"
    moves = [{"name": transpose, "calls": 96, "self_cuda_ms": 2.0}]
    searched = dict(run, top_self_cuda=top + moves + [dict(moves[0], calls=4, self_cuda_ms=0.5)])
    lines = profile_lines({"sections": {"cudnn_benchmark": {"resnet18": {"leaf_gain": 1.1, "profile_on": searched}}}})
    assert lines == [
        "profile resnet18 with cuDNN's search (compile=off: eager batched step): round 12.3 ms, GPU busy 38%, "
        "launches/round 812, top CUDA op void sgemm_kernel<128> 4.5 ms (30 calls), layout transposes 2.5 ms (100 calls)"
    ]


def test_a_childs_job_runs_end_before_the_child_is_stopped():
    """In a section's child a job run's timeout is ``--timeout`` at most, and never past the child's own limit."""
    args = argparse.Namespace(timeout=100.0, device="cpu", tiny=True)
    bounded = ChildArgs(args, 30.0)
    assert 30.0 - JOB_MARGIN - 1 < bounded.timeout <= 30.0 - JOB_MARGIN and bounded.device == "cpu" and bounded.tiny
    assert ChildArgs(args, None).timeout == 100.0 and ChildArgs(args, 300.0).timeout == 100.0
    assert ChildArgs(args, 2.0).timeout == 1.0  # never zero or negative: the job still gets a second


def test_check_prints_what_a_graph_replay_costs_and_the_cpu_has_no_figure():
    sys.path.insert(0, REPO)
    from benchmarks.gpu_suite_check import extras
    from benchmarks.gpu_suite_profile import graph_launch_costs

    launches = {"16": {"host_us": 12.3, "wall_us": 40.0}, "1024": {"host_us": 15.0, "wall_us": 900.4}}
    lines = extras({"machine": {"graph_launch": launches}, "sections": {}})
    line = "a CUDA graph's replay, us on the host / until the GPU has run it: 16 kernels 12 / 40, 1024 kernels 15 / 900"
    assert line in lines
    failed = extras({"machine": {"graph_launch": {"error": "RuntimeError: no graphs"}}, "sections": {}})
    assert "a CUDA graph's replay, us on the host / until the GPU has run it: RuntimeError: no graphs" in failed
    assert graph_launch_costs("cpu") is None
