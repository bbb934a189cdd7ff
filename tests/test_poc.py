"""POC mode: real server and leaf processes on this machine (slow; CI runs it)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.conftest import SMALL_RUN, find_results, processes_mentioning, run_job


@pytest.mark.slow
def test_poc_run_completes_learns_and_leaves_no_process(tmp_path):
    try:
        proc = run_job(
            "pt_job_fedavg.py",
            [*SMALL_RUN, "--env", "poc", "--workspace", str(tmp_path / "ws"), "--job-timeout", "600"],
            tmp_path,
            timeout=900,
        )
        assert "FINISHED:COMPLETED" in proc.stdout, proc.stdout[-3000:]
        results = find_results(tmp_path / "ws" / "runs")
        assert results["summary"]["final_accuracy"] > 0.4
    finally:
        deadline = time.monotonic() + 30
        while processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(1)
        leftovers = processes_mentioning(str(tmp_path))
        for line in leftovers:
            pid = int(line.split(":", 1)[0])
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not leftovers, leftovers
