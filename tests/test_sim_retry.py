"""The simulator's leaf-port race: a job whose leaf process lost its port is run once more, nothing else is."""

from __future__ import annotations

import argparse
import json
import os
import time

from devsim.config import SimulationConfig
from devsim_flare import execution as cli


class FlakyRecipe:
    """Fails its first ``failures`` runs, writing ``error`` into site-2's error_log.txt as NVFlare would."""

    def __init__(self, root: str, error: str, failures: int):
        self.root, self.error, self.failures, self.calls = root, error, failures, 0

    def execute(self, env):
        self.calls += 1
        if self.calls <= self.failures:
            site = os.path.join(self.root, "nvflare", "devsim_fedavg", "site-2")
            os.makedirs(site, exist_ok=True)
            with open(os.path.join(site, "error_log.txt"), "a", encoding="utf-8") as stream:
                stream.write(f"ERROR - Execute exception: OSError: [Errno 98] {self.error}\n")
            raise RuntimeError("Simulation failed with return code 2")
        return object()


def _run(tmp_path, error: str, failures: int, env: str = "sim") -> tuple[int, FlakyRecipe]:
    recipe = FlakyRecipe(str(tmp_path), error, failures)
    args = argparse.Namespace(workspace=str(tmp_path), env=env, startup_kit=None, log_level="WARNING")
    return cli.run_recipe(lambda: recipe, args, SimulationConfig()), recipe


def test_a_leaf_that_lost_its_port_gets_the_job_run_once_more(tmp_path, capsys):
    code, recipe = _run(tmp_path, "Address already in use", failures=1)
    assert recipe.calls == 2 and "running the job again" in capsys.readouterr().err
    assert code == 1  # the fake run writes no results.json; a real one would report its accuracy


def test_other_failures_and_a_second_port_race_are_not_retried(tmp_path, capsys):
    code, recipe = _run(tmp_path / "other", "Connection refused", failures=1)
    assert (code, recipe.calls) == (1, 1)
    code, recipe = _run(tmp_path / "twice", "Address already in use", failures=2)
    assert (code, recipe.calls) == (1, 2) and "error: the job failed" in capsys.readouterr().err


def test_only_logs_written_during_the_run_count(tmp_path):
    site = tmp_path / "devsim_fedavg" / "site-1"
    site.mkdir(parents=True)
    log = site / "error_log.txt"
    log.write_text("OSError: [Errno 98] Address already in use\n")
    assert cli.leaf_lost_its_port(str(tmp_path), within_s=60)
    old = time.time() - 3600
    os.utime(log, (old, old))  # left over from an earlier run in the same workspace
    assert not cli.leaf_lost_its_port(str(tmp_path), within_s=60)


def test_a_downloaded_run_that_failed_is_reported_with_its_reason(tmp_path, capsys):
    """``--env prod`` and POC report a run from its results.json: a failed one exits 1 naming the server's reason."""
    results = {"method": "fedavg", "config": {}, "rounds": [], "summary": {}, "failed": {"reason": "round 3: why"}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    code = cli.report_results(SimulationConfig(), str(tmp_path), time.perf_counter(), False, str(tmp_path))
    assert code == 1 and capsys.readouterr().err.startswith("error: round 3: why; run did not finish")
