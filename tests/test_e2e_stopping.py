"""End to end in NVFlare's simulator: Ctrl-C and SIGTERM stop a run in a known state; a killed leaf is dropped
at once."""

from __future__ import annotations

import os
import re
import signal
import time

import torch

from devsim_flare.leaf_liveness import CONNECTION_CLOSED, DEAD_JOB_REPORTED
from tests.conftest import SMALL_RUN, end_leftovers, find_results, run_job, start_job

RUN = [*SMALL_RUN, "--num-rounds", "30", "--device-batch", "off"]
"""One device at a time: with ``auto`` each leaf chooses batched training or not from a timing probe, so two runs
on a loaded machine may choose differently and round differently (the resume test compares weights bit for bit)."""

LOSS_CAUSES = (CONNECTION_CLOSED, DEAD_JOB_REPORTED)
"""NVFlare's two signals of a lost leaf; which one the server reads first depends on timing."""


class _Job:
    """A job command in its own session (as a terminal runs it), its output read line by line."""

    def __init__(self, args: list[str], tmp_path, script: str = "pt_job_fedavg.py"):
        self.proc = start_job(script, args, tmp_path)
        self.lines: list[str] = []
        self.round_seen: dict[int, float] = {}

    def until_round(self, k: int, timeout: float = 400) -> None:
        """Read output until the line of round (or model version) ``k`` (fails after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:
            self.lines.append(line)
            match = re.match(r"(?:round|version) (\d+)/", line)
            if match:
                self.round_seen[int(match.group(1))] = time.monotonic()
                if int(match.group(1)) >= k:
                    return
            assert time.monotonic() < deadline, "".join(self.lines[-40:])
        tail = "".join(self.lines[-40:])
        raise AssertionError(f"the job ended before round {k}:\n{tail}")

    def finish(self, timeout: float = 400) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        self.lines.append(out)
        return self.proc.returncode, "".join(self.lines)


def _exit_seconds(job: _Job, timeout: float = 30) -> float:
    """Seconds until the command's process exits (it may leave its output pipe to children: checked apart)."""
    started = time.monotonic()
    job.proc.wait(timeout=timeout)
    return time.monotonic() - started


def _signal_at(job: _Job, k: int, tmp_path, signum: int = signal.SIGINT) -> tuple[float, int, str, list]:
    """At round (version) ``k``: SIGINT to the job's process group, as a terminal's Ctrl-C sends it, or another
    signal to the command alone, as timeout, SLURM and systemd send SIGTERM. Seconds until the command exited, its
    exit code, its output, and the processes left after a 2 s grace."""
    try:
        job.until_round(k)
        if signum == signal.SIGINT:
            os.killpg(job.proc.pid, signum)
        else:
            job.proc.send_signal(signum)
        seconds = _exit_seconds(job)
        code, output = job.finish()
        leftovers = end_leftovers(str(tmp_path), wait=2)
    finally:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
    return seconds, code, output, leftovers


def _exchange_folders(tmp_path) -> list[str]:
    """The run's /dev/shm exchange folders still there (named after a server process under ``tmp_path``)."""
    from devsim.shared_arrays import FOLDER_PREFIX, SHARED_MEMORY_ROOT

    try:
        names = os.listdir(SHARED_MEMORY_ROOT)
    except OSError:
        return []
    mine = {p.split(":", 1)[0] for p in _processes(tmp_path)}
    return [n for n in names if n.startswith(FOLDER_PREFIX) and n[len(FOLDER_PREFIX) :].split("-")[0] in mine]


def _processes(tmp_path) -> list[str]:
    from tests.conftest import processes_mentioning

    return processes_mentioning(str(tmp_path))


def test_ctrl_c_stops_within_5s_and_resume_gives_the_uninterrupted_run(tmp_path):
    run_dir = tmp_path / "run"
    job = _Job([*RUN, "--workspace", str(tmp_path / "ws"), "--output-dir", str(run_dir)], tmp_path)
    seconds, code, output, leftovers = _signal_at(job, 4, tmp_path)
    assert code == 130, output[-3000:]
    assert seconds < 5, (seconds, output[-3000:])
    assert not leftovers, leftovers
    assert "continue with --resume" in output
    results = find_results(run_dir)
    done = [r["round"] for r in results["rounds"]]
    assert done == list(range(1, len(done) + 1)) and 4 <= len(done) <= 5, done
    assert results["stopped"]["reason"] == "SIGINT" and not results["summary"]

    run_job("pt_job_fedavg.py", ["--resume", str(run_dir), "--workspace", str(tmp_path / "ws")], tmp_path)
    resumed = find_results(run_dir)
    assert [r["round"] for r in resumed["rounds"]] == list(range(1, 31)) and "stopped" not in resumed
    whole = tmp_path / "whole"
    run_job("pt_job_fedavg.py", [*RUN, "--workspace", str(tmp_path / "ws"), "--output-dir", str(whole)], tmp_path)
    uninterrupted = torch.load(whole / "final_model.pt")
    resumed_weights = torch.load(run_dir / "final_model.pt")
    for key in uninterrupted:
        assert torch.equal(uninterrupted[key], resumed_weights[key]), key
    assert resumed["summary"]["final_accuracy"] == find_results(whole)["summary"]["final_accuracy"]
    assert not _exchange_folders(tmp_path)


def test_sigterm_stops_the_run_and_every_process(tmp_path):
    run_dir = tmp_path / "run"
    job = _Job([*RUN, "--workspace", str(tmp_path / "ws"), "--output-dir", str(run_dir)], tmp_path)
    seconds, code, output, leftovers = _signal_at(job, 3, tmp_path, signal.SIGTERM)
    assert code == 143 and seconds < 5, (code, seconds, output[-3000:])
    assert not leftovers, leftovers
    results = find_results(run_dir)
    assert results["stopped"]["reason"] == "SIGTERM" and (run_dir / "checkpoint.pt").exists()
    assert 3 <= len(results["rounds"]) <= 4


def _kill_leaf_worker(job: _Job, leaf: str) -> None:
    """SIGKILL the simulator worker process of ``leaf``, as the OOM killer does."""
    import psutil

    def is_worker(process) -> bool:  # a new interpreter names its module; a forked one is named sim-<leaf>
        if "simulator_worker" in " ".join(process.cmdline()) and leaf in process.cmdline():
            return True
        return process.name() == f"sim-{leaf}"

    workers = [p for p in psutil.Process(job.proc.pid).children(recursive=True) if is_worker(p)]
    assert len(workers) == 1, workers
    workers[0].kill()


def _run_past_a_killed_leaf(job: _Job, k: int, tmp_path) -> tuple[float, int, str]:
    """Kill site-2's worker at round (version) ``k``; returns the wait for the next line, exit code, output."""
    try:
        job.until_round(k)
        _kill_leaf_worker(job, "site-2")
        killed_at = time.monotonic()
        job.until_round(k + 1)
        stall = time.monotonic() - killed_at
        code, output = job.finish()
    finally:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
        leftovers = end_leftovers(str(tmp_path), wait=10)
    assert not leftovers, leftovers
    return stall, code, output


def test_killed_leaf_is_dropped_at_once_and_the_run_finishes(tmp_path):
    run_dir = tmp_path / "run"
    job = _Job([*RUN, "--workspace", str(tmp_path / "ws"), "--output-dir", str(run_dir)], tmp_path)
    stall, code, output = _run_past_a_killed_leaf(job, 3, tmp_path)
    assert code == 0, output[-3000:]
    assert stall < 10, stall
    assert "site-2" in output and any(cause in output for cause in LOSS_CAUSES), output[-3000:]
    results = find_results(run_dir)
    assert [r["round"] for r in results["rounds"]] == list(range(1, 31))
    assert results["rounds"][-1]["dead_leaves"] == ["site-2"]
    assert results["summary"]["final_accuracy"] > 0.4


def test_async_run_drops_a_killed_leaf_at_once(tmp_path):
    from tests.test_e2e_async import ASYNC_RUN

    run_dir = tmp_path / "run"
    args = [*ASYNC_RUN, "--eval-frequency", "5", "--workspace", str(tmp_path / "ws"), "--output-dir", str(run_dir)]
    job = _Job(args, tmp_path, script="pt_job_fedbuff.py")
    stall, code, output = _run_past_a_killed_leaf(job, 10, tmp_path)
    assert code == 0, output[-3000:]
    assert stall < 10, stall
    assert "leaf site-2" in output and any(cause in output for cause in LOSS_CAUSES), output[-3000:]
    results = find_results(run_dir)
    assert results["summary"]["versions"] == 60
    assert results["rounds"][-1]["dead_leaves"] == ["site-2"] and results["rounds"][-1]["failed_leaf_lost"] > 0


def test_ctrl_c_on_an_async_run_prints_nothing_from_leaves_still_answering(tmp_path):
    """Ctrl-C from a terminal reaches the whole process group. Leaves still answering calls of the stopped run
    find its exchange folder removed: that is the run's end, and must not print a traceback or a warning."""
    run_dir = tmp_path / "run"
    args = ["--dataset", "digits", "--max-versions", "3000", "--workspace", str(tmp_path / "ws")]
    job = _Job([*args, "--output-dir", str(run_dir)], tmp_path, script="pt_job_fedbuff.py")
    _, code, output, leftovers = _signal_at(job, 20, tmp_path)
    assert code == 130, output[-3000:]
    assert not leftovers, leftovers
    after = output[output.index("SIGINT:") :]
    for noise in ("Traceback", "[shared memory]", " - ERROR - "):
        assert noise not in after, after[-3000:]
    assert find_results(run_dir)["stopped"]["reason"] == "SIGINT"


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (``SigCgt`` in /proc)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as stream:
        caught = next(line for line in stream if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) >> (signum - 1) & 1)


def test_a_signal_while_the_command_starts_ends_it_in_one_line(tmp_path):
    """Ctrl-C or SIGTERM while a job command imports PyTorch and NVFlare (before its run takes signals): one line,
    exit 128 + the signal, no ``KeyboardInterrupt`` traceback, nothing left running. Sent as soon as the command
    handles SIGTERM, which Python leaves alone until the job script takes both signals."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        workspace = tmp_path / signal.Signals(signum).name
        proc = start_job("pt_job_fedavg.py", [*SMALL_RUN, "--workspace", str(workspace)], tmp_path)
        deadline = time.monotonic() + 30
        while not _catches(proc.pid, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.005)
        os.killpg(proc.pid, signum)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signum, output
        assert output.strip() == f"{signal.Signals(signum).name}: command stopped (no run in progress)", output
        assert end_leftovers(str(workspace)) == []
