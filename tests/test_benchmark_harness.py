"""benchmarks/harness.py: a job run in its own process group returns its results.json with the wall time, the
first progress line's time and the leaves' plan lines; a failed or stuck job is one error with its output's tail,
and nothing it started outlives the call (fake job scripts: a few seconds in all)."""

from __future__ import annotations

import json
import os
import textwrap

import psutil
import pytest

from benchmarks import harness

FAKE_JOB = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    args = sys.argv[1:]
    out = args[args.index("--output-dir") + 1]
    if "--hang" in args:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        print(f"child {child.pid}", flush=True)
        time.sleep(60)
    print("[site-2] workers=1 device_batch=off", flush=True)
    print("[site-1] workers=2 device_batch=auto", flush=True)
    print("round 1/2 accuracy 0.5", flush=True)
    if "--fail" in args:
        sys.exit(3)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as stream:
        json.dump({"rounds": [{"round": 1}], "flags": args}, stream)
    """
)


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "fake_job.py").write_text(FAKE_JOB)
    return str(tmp_path)


def test_run_job_reads_results_and_times_the_run(tree, tmp_path):
    seen, pids = [], []
    results = harness.run_job(
        "fake_job.py",
        ["--seed", "1"],
        str(tmp_path / "work"),
        "one",
        timeout=60,
        tree=tree,
        watch=lambda line, seconds: seen.append((line, seconds)),
        on_start=pids.append,
    )
    assert len(pids) == 1 and [line for line, _ in seen][-1] == "round 1/2 accuracy 0.5"
    assert all(0 < seconds <= results["wall"] for _, seconds in seen)
    assert results["rounds"] == [{"round": 1}] and results["flags"][:2] == ["--seed", "1"]
    assert "--workspace" in results["flags"] and str(tmp_path / "work" / "one") in results["flags"][-1]
    assert 0 < results["first_round"] <= results["wall"]
    assert results["worker_lines"] == ["[site-1] workers=2 device_batch=auto", "[site-2] workers=1 device_batch=off"]
    assert os.path.isdir(tmp_path / "work" / "one" / "home")  # HOME inside the run's folder, not ~/.nvflare


def test_a_failed_job_is_one_error_with_its_output(tree, tmp_path):
    with pytest.raises(RuntimeError, match=r"(?s)fake_job.py --fail exited 3 after .*round 1/2"):
        harness.run_job("fake_job.py", ["--fail"], str(tmp_path), timeout=60, tree=tree)


def test_a_stuck_job_is_killed_with_what_it_started(tree, tmp_path):
    with pytest.raises(RuntimeError, match="timed out"):
        harness.run_job("fake_job.py", ["--hang"], str(tmp_path), timeout=3, tree=tree)
    log = (tmp_path / "run" / "job.log").read_text()
    child = int(log.split("child ")[1].split()[0])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_session_stamps_figures_and_writes_the_results_file(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RESULTS", str(tmp_path))
    session = harness.Session("demo", script=os.path.join(harness.REPO, "benchmarks", "demo.py"), argv=["--x", "a b"])
    assert session.command.endswith(".venv/bin/python benchmarks/demo.py --x 'a b'")
    entry = session.figure("a figure", "1.0x", "> 1")
    assert entry["command"] == session.command and entry["machine"].startswith(f"{os.cpu_count()} cores, load ")
    path = session.write({"rows": [1]}, [entry])
    assert os.path.dirname(path) == str(tmp_path) and os.path.basename(path).startswith("demo-")
    written = json.loads(open(path, encoding="utf-8").read())
    assert written["figures"] == [entry] and written["rows"] == [1] and {"date", "commit", "load_start"} <= set(written)
    assert session.write({}, [], str(tmp_path / "x.json")).endswith("x.json")
    again = session.write({"rows": [2]}, [entry])  # a second run of the day keeps the first one's file
    assert again == path.replace(".json", "-2.json") and json.loads(open(path, encoding="utf-8").read())["rows"] == [1]
    assert json.loads(open(again, encoding="utf-8").read())["written"] >= written["written"]


def test_a_baseline_commit_is_a_temporary_worktree():
    head = harness.commit_of("HEAD")
    assert head and harness.commit_of("no-such-revision") is None
    with harness.worktree(head) as folder:
        assert os.path.isfile(os.path.join(folder, "benchmarks", "harness.py")) and harness.short_commit(folder) == head
    assert not os.path.exists(folder)


def test_run_child_returns_the_json_its_last_line_prints(tmp_path):
    script = tmp_path / "child.py"
    script.write_text("import json, sys\nprint('noise')\nprint(json.dumps({'args': sys.argv[1:]}))\n")
    assert harness.run_child(str(script), ["--x", "1"], timeout=60) == {"args": ["--x", "1"]}
    script.write_text("import sys\nsys.exit('broken')\n")
    with pytest.raises(RuntimeError, match="child.py --x 1 exited 1:\nbroken"):
        harness.run_child(str(script), ["--x", "1"], timeout=60)


def test_alternate_runs_the_arms_in_turn():
    order = []
    runs = harness.alternate(
        {"a": lambda: len(order), "b": lambda: -len(order)}, 2, lambda index, name, result: order.append((index, name))
    )
    assert order == [(0, "a"), (0, "b"), (1, "a"), (1, "b")] and runs == {"a": [0, 2], "b": [-1, -3]}


def test_print_table_prints_markdown(capsys):
    harness.print_table(["a", "b"], [[1, "x y"], [2.5, None]])
    assert capsys.readouterr().out == "| a | b |\n| --- | --- |\n| 1 | x y |\n| 2.5 | None |\n"


def test_session_command_names_the_watched_environment_that_is_set(monkeypatch):
    monkeypatch.setenv("DEVSIM_TEST_CHUNK", "1 2")
    monkeypatch.delenv("DEVSIM_TEST_UNSET", raising=False)
    script = os.path.join(harness.REPO, "benchmarks", "demo.py")
    session = harness.Session("demo", script=script, argv=["--json"], env=("DEVSIM_TEST_CHUNK", "DEVSIM_TEST_UNSET"))
    assert session.command == "DEVSIM_TEST_CHUNK='1 2' .venv/bin/python benchmarks/demo.py --json"


def test_items_reads_a_comma_list_and_names_the_flag_on_bad_input(capsys):
    parser = harness.arguments("demo")
    assert harness.items(parser, "--seeds", "0, 1,2,", int) == [0, 1, 2]
    assert harness.items(parser, "--arms", "a,b", allowed=("a", "b", "c")) == ["a", "b"]
    for text, kind, allowed, message in (
        ("0,x", int, (), "--seeds: '0,x' is not a comma list of int values"),
        (" , ", str, (), "--seeds: ' , ' is not a comma list"),
        ("a,z", str, ("a", "b"), "--seeds: z not allowed; allowed: a, b"),
    ):
        with pytest.raises(SystemExit):
            harness.items(parser, "--seeds", text, kind, allowed)
        assert message in capsys.readouterr().err


def test_baseline_without_a_commit_is_none_and_an_unknown_one_is_one_error(capsys):
    parser = harness.arguments("demo")
    with harness.baseline(parser, None) as (commit, folder):
        assert (commit, folder) == (None, None)
    with pytest.raises(SystemExit), harness.baseline(parser, "no-such-rev-47"):
        pass
    assert "--baseline-commit: 'no-such-rev-47' names no commit of this repository" in capsys.readouterr().err


def test_best_accuracy_skips_rounds_without_one():
    assert harness.best_accuracy({"rounds": [{"accuracy": 0.5}, {"round": 2}, {"accuracy": 0.75}]}) == 0.75
