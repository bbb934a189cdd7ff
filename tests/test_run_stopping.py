"""Stopping a run: the stop request file, signals to the command, leaf liveness, the round timeout (fast)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from devsim.observe.round_timeout import FIRST_SECONDS, FLOOR_SECONDS, MULTIPLE, RoundTimeout
from devsim_flare.leaf_calls import LeafCalls, LeafLost, LeafOutcome, RunStopped
from devsim_flare.leaf_liveness import CONNECTION_CLOSED, DEAD_JOB_REPORTED, JOB_CELL_GONE, LeafLiveness
from devsim_flare.run_signals import StartInterrupted, StopOnSignals, stop_processes
from devsim_flare.stop_request import STOP_FILE, StopRequest, clear_stop, request_stop


def test_round_timeout_explicit_wins_and_auto_follows_the_slowest_reply():
    assert RoundTimeout(20.0).seconds == 20.0
    timeout = RoundTimeout()
    assert timeout.seconds == FIRST_SECONDS
    timeout.observe(0.3)
    assert timeout.seconds == FLOOR_SECONDS
    timeout.observe(30.0)
    timeout.observe(2.0)  # only the slowest counts
    assert timeout.seconds == MULTIPLE * 30.0
    assert "auto" in timeout.describe() and "20s" in RoundTimeout(20.0).describe()
    with pytest.raises(ValueError):
        RoundTimeout(0.0)


def test_round_timeout_flag_unset_by_default_and_checked():
    from devsim.config import ConfigError, SimulationConfig

    assert SimulationConfig().round_timeout is None
    with pytest.raises(ConfigError, match="--round-timeout"):
        SimulationConfig(round_timeout=-1.0).validate()


def test_stop_request_round_trip(tmp_path):
    stop = StopRequest(str(tmp_path), min_interval=0.0)
    assert stop() is None
    request_stop(str(tmp_path), "SIGINT")
    assert stop() == "SIGINT"
    clear_stop(str(tmp_path))
    assert not (tmp_path / STOP_FILE).exists()
    assert stop() == "SIGINT"  # a stop once seen stays seen


class _Cell:
    def __init__(self, agents):
        self.agents = dict.fromkeys(agents)


def test_liveness_reports_a_closed_connection_once_and_never_a_leaf_not_seen():
    cells = [_Cell(["site-1.job", "site-2.job"])]
    liveness = LeafLiveness({"site-1": "site-1.job", "site-2": "site-2.job", "site-3": "site-3.job"}, lambda: cells)
    assert liveness.check() == {}
    cells[0] = _Cell(["site-1.job"])
    assert liveness.check() == {"site-2": CONNECTION_CLOSED}
    assert liveness.check() == {}  # each loss is reported once
    assert "site-3" not in liveness.lost  # never connected straight to this process (POC): no verdict


def test_liveness_reads_dead_job_reports():
    reports: set[str] = set()
    liveness = LeafLiveness({"site-1": "site-1.job"}, lambda: [], lambda: reports)
    assert liveness.check() == {}
    reports.add("site-1")
    assert liveness.check() == {"site-1": DEAD_JOB_REPORTED}


def test_liveness_probe_loses_a_leaf_whose_job_cell_left_its_client_twice_in_a_row():
    answers: dict[str, bool | None] = {"site-1": True, "site-2": True, "site-3": None}
    asked: list[dict] = []

    def probe(job_cells):
        asked.append(dict(job_cells))
        return {leaf: answers[leaf] for leaf in job_cells}

    cells = {leaf: f"{leaf}.job" for leaf in answers}
    liveness = LeafLiveness(cells, lambda: [], probe=probe, probe_seconds=0.0)

    def probed() -> dict[str, str]:  # one check, then its probe (a thread) answered
        count = len(asked)
        found = liveness.check()
        deadline = time.monotonic() + 5
        while (len(asked) == count or liveness._probing) and time.monotonic() < deadline:
            time.sleep(0.001)
        return found

    probed()
    assert asked[0] == cells and liveness._reached == {"site-1", "site-2"}  # site-3 never answered: no verdict
    answers.update({"site-1": False, "site-2": False, "site-3": False})
    assert probed() == {}
    answers["site-1"] = True  # back (a client that reconnected): the count starts again
    assert probed() == {}
    assert probed() == {"site-2": JOB_CELL_GONE}  # two answers without its job cell, in a row
    assert "site-1" not in liveness.lost and "site-3" not in liveness.lost  # never seen: never lost
    assert "site-2" not in asked[-1]  # a lost leaf is no longer asked about


def test_lost_leaf_calls_are_released_as_nvflare_ends_a_failed_request():
    """The server job's requests to a lost leaf's job cell end at once with a communication error (NVFlare's own
    waiter objects); requests to other cells, or whose reply is arriving, are left alone."""
    from nvflare.fuel.f3.cellnet.cell import SimpleWaiter
    from nvflare.fuel.f3.cellnet.defs import MessageHeaderKey, ReturnCode

    from devsim_flare.leaf_liveness import release_calls

    class Cell:
        requests_dict = {
            "a": SimpleWaiter("a", "site-2.job", None),
            "b": SimpleWaiter("b", "site-1.job", None),
            "c": SimpleWaiter("c", "site-2.job", None),
        }

    Cell.requests_dict["c"].in_receiving.set()  # its reply is being received
    assert release_calls(Cell(), "site-2.job", "leaf lost") == 1
    released = Cell.requests_dict["a"]
    assert released.in_receiving.is_set() and released.stream_error == "leaf lost"
    assert released.result.get_header(MessageHeaderKey.RETURN_CODE) == ReturnCode.COMM_ERROR
    assert not Cell.requests_dict["b"].in_receiving.is_set() and Cell.requests_dict["c"].stream_error is None
    assert release_calls(None, "site-2.job", "leaf lost") == 0


def test_liveness_releases_each_lost_leaf_once():
    released = []
    reports = {"site-2"}
    liveness = LeafLiveness(
        {"site-1": "site-1.job", "site-2": "site-2.job"},
        lambda: [],
        lambda: reports,
        release=lambda cell, cause: released.append((cell, cause)),
    )
    liveness.check()
    liveness.check()
    assert released == [("site-2.job", DEAD_JOB_REPORTED)]


def test_liveness_probe_failure_is_no_verdict():
    def probe(job_cells):
        raise RuntimeError("no cell")

    liveness = LeafLiveness({"site-1": "site-1.job"}, lambda: [], probe=probe, probe_seconds=0.0)
    for _ in range(5):
        assert liveness.check() == {}
        time.sleep(0.01)
    assert liveness.lost == {}


_JOB_PROCESS = """
import os, signal, sys
from nvflare.fuel.f3.mpm import MainProcessMonitor as mpm
from devsim_flare.leaf_liveness import mark_lost_if_killed

def main(mode):
    mark_lost_if_killed(sys.argv[2])
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "raise":
        raise RuntimeError("a real failure of the job process")
    return 0

sys.exit(mpm.run(main_func=main, run_dir=sys.argv[2], shutdown_grace_time=0, cleanup_grace_time=1, mode=sys.argv[1]))
"""


@pytest.mark.parametrize(("mode", "reported"), [("kill", 137), ("raise", 101), ("return", 0)])
def test_killed_leaf_job_process_reads_as_lost_not_failed_and_real_failures_still_count(tmp_path, mode, reported):
    """NVFlare's job-process entry (``mpm.run``) with the leaf's mark: the client parent's reading of the exit code
    (NVFlare's ``get_return_code``) gives 137 for a killed process, which the server does not fail the job for,
    and the process's own code for an orderly exit, an exception included."""
    import logging

    from nvflare.apis.job_launcher_spec import JobReturnCode
    from nvflare.app_common.job_launcher.process_launcher import JOB_RETURN_CODE_MAPPING
    from nvflare.private.fed.client.client_executor import REPORTABLE_JOB_FAILURES
    from nvflare.private.fed.utils.fed_utils import get_return_code

    from tests.conftest import REPO

    run_dir = tmp_path / "job-1"
    run_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": REPO}
    child = subprocess.run([sys.executable, "-c", _JOB_PROCESS, mode, str(run_dir)], env=env, timeout=60)

    class Handle:  # what NVFlare's ProcessHandle.poll gives for this exit
        def poll(self):
            return JOB_RETURN_CODE_MAPPING.get(child.returncode, JobReturnCode.EXECUTION_ERROR)

    code = get_return_code(Handle(), "job-1", str(tmp_path), logging.getLogger("test"))
    if mode == "raise":  # the launcher's code (1) is then read as the job's exception (101) while it ran
        assert child.returncode == reported and code == JobReturnCode.EXECUTION_ERROR
    else:
        assert code == reported, (child.returncode, code)
    assert (reported in REPORTABLE_JOB_FAILURES) == (mode == "raise")
    assert not (run_dir / "_process_rc.txt").exists()  # read and removed by the parent, or never left


class _FakeCalls(LeafCalls):
    """LeafCalls whose submit only records the pending call (no NVFlare)."""

    def submit(self, leaf, method, tag, **kwargs):
        self._outstanding[tag] = leaf


def test_pending_call_to_a_lost_leaf_ends_at_once():
    lost = {"site-2": "gone"}

    class Liveness:
        def __init__(self):
            self.lost = {}

        def check(self):
            self.lost = dict(lost)

    calls = _FakeCalls(call_timeout=600.0, liveness=Liveness())
    calls.submit("site-1", "train_round", tag=(0, "site-1"))
    calls.submit("site-2", "train_round", tag=(0, "site-2"))
    started = time.monotonic()
    outcome = calls.next()
    assert time.monotonic() - started < 1.0
    assert outcome.leaf == "site-2" and isinstance(outcome.error, LeafLost) and "gone" in str(outcome.error)
    assert calls.pending == 1
    calls._outcomes.put(LeafOutcome("site-1", (0, "site-1"), result={"ok": 1}))
    assert calls.next().result == {"ok": 1}


def test_a_failed_call_is_explained_by_a_loss_seen_just_after_it():
    """A killed leaf's call can fail with NVFlare's bare communication error before NVFlare drops its cell: the
    outcome names the loss's cause once the liveness check sees it, and a live leaf's failure stays as it was."""
    checks = []

    class Liveness:
        lost: dict = {}

        def check(self):
            checks.append(1)
            if len(checks) > 3:  # the loss shows a few polls after the failed call
                self.lost = {"site-2": CONNECTION_CLOSED}

    calls = _FakeCalls(call_timeout=600.0, liveness=Liveness())
    calls.submit("site-2", "train_round", tag=(0, "site-2"))
    calls._outcomes.put(LeafOutcome("site-2", (0, "site-2"), error=RuntimeError("")))
    outcome = calls.next()
    assert isinstance(outcome.error, LeafLost)
    assert CONNECTION_CLOSED in str(outcome.error) and "RuntimeError" in str(outcome.error)

    calls = _FakeCalls(call_timeout=600.0, liveness=type("Alive", (), {"lost": {}, "check": lambda self: None})())
    calls.submit("site-1", "train_round", tag=1)
    calls._outcomes.put(LeafOutcome("site-1", 1, error=ValueError("bad reply")))
    outcome = calls.next()
    assert isinstance(outcome.error, ValueError) and str(outcome.error) == "bad reply"


def test_stop_callback_ends_the_wait():
    calls = _FakeCalls(call_timeout=600.0, stop=lambda: "SIGTERM")
    calls.submit("site-1", "train_round", tag=1)
    started = time.monotonic()
    with pytest.raises(RunStopped, match="SIGTERM"):
        calls.next()
    assert time.monotonic() - started < 1.0


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_first_signal_requests_a_stop_second_forces(tmp_path):
    forced = []
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in a background job, as a shell sets it
    with StopOnSignals(str(tmp_path), force=forced.append, grace_seconds=30.0) as signals:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert signals.signum == signal.SIGINT and signals.exit_code == 130
        assert (tmp_path / STOP_FILE).read_text().strip() == "SIGINT"
        assert forced == []
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert forced == [0.0] and signals.forced.is_set()
    assert signal.getsignal(signal.SIGINT) is before  # restored
    assert not (tmp_path / STOP_FILE).exists()  # cleared for a later --resume


def test_signal_while_starting_ends_the_start_at_once(tmp_path):
    """A signal while the environment starts raises StartInterrupted in the main thread, through code that retries
    on Exception (as NVFlare's job submission does), and no stop request is left for a server that never ran."""
    retries = []
    with StopOnSignals(str(tmp_path), force=lambda seconds: None, grace_seconds=30.0) as signals:
        started = time.monotonic()
        with pytest.raises(StartInterrupted):
            with signals.starting():
                threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
                while time.monotonic() - started < 10:
                    try:
                        time.sleep(0.05)
                    except Exception:  # noqa: BLE001 - a retry loop of the kind StartInterrupted must pass through
                        retries.append(1)
        assert time.monotonic() - started < 2 and not retries
        assert signals.exit_code == 130 and not (tmp_path / STOP_FILE).exists()
        with pytest.raises(StartInterrupted):  # a start begun after the signal ends at once too
            with signals.starting():
                pass


def test_grace_period_forces_the_stop(tmp_path):
    child = _sleeper()
    try:
        with StopOnSignals(str(tmp_path), grace_seconds=0.2) as signals:
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 5
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        assert signals.exit_code == 143 and signals.forced.is_set()
        assert child.poll() is not None
    finally:
        child.kill()
        child.wait()


def test_stop_processes_kills_what_ignores_sigterm():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
    code += "time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    import psutil

    assert child.stdout.readline().strip() == "ready"  # SIGTERM is ignored from here on, however slow the start
    started = time.monotonic()
    stop_processes([psutil.Process(child.pid)], term_seconds=0.3)
    assert child.wait(timeout=5) == -signal.SIGKILL
    assert time.monotonic() - started < 3


class _FakeRun:
    """A job that stays RUNNING until aborted."""

    def __init__(self):
        self.aborted = False

    def get_status(self):
        return "FINISHED:ABORTED" if self.aborted else "RUNNING"

    def abort(self):
        self.aborted = True

    def get_result(self, timeout=0.0):
        return "/result" if self.aborted else None


def test_wait_for_job_aborts_on_stop_and_leaves_the_job_on_detach():
    from devsim_flare.execution import wait_for_job

    run = _FakeRun()
    assert wait_for_job(run, 30.0, poll_seconds=0.01, stop_early=lambda: True) == ("FINISHED:ABORTED", "/result")
    assert run.aborted
    run = _FakeRun()
    assert wait_for_job(run, 30.0, poll_seconds=0.01, detach=lambda: True) == ("RUNNING", None)
    assert not run.aborted


def test_prod_flag_to_leave_the_job_running_is_listed():
    from devsim_flare.cli import build_parser

    assert build_parser("").parse_args(["--leave-job-running"]).leave_job_running


def test_exchange_folder_of_a_stopped_server_is_removed_while_its_zombie_waits():
    import psutil

    from devsim.shared_arrays import FOLDER_PREFIX, shared_memory_root
    from devsim_flare.run_signals import remove_orphan_exchanges

    root = shared_memory_root()
    if root is None:
        pytest.skip("no writable /dev/shm")
    child = _sleeper()
    folder = os.path.join(root, f"{FOLDER_PREFIX}{child.pid}-test")
    os.makedirs(folder)
    try:
        stop_processes([psutil.Process(child.pid)], term_seconds=0.0)
        deadline = time.monotonic() + 5
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.02)
        assert folder in remove_orphan_exchanges()  # not reaped yet: a zombie, still counted as stopped
        assert not os.path.exists(folder)
    finally:
        child.wait()
        if os.path.isdir(folder):
            os.rmdir(folder)


def test_processes_under_finds_what_names_the_folder_and_its_children(tmp_path):
    """POC's services name their workspace on the command line and are not this process's descendants."""
    from devsim_flare.run_signals import processes_under

    folder = tmp_path / "poc"
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    named = subprocess.Popen([sys.executable, "-c", code + "time.sleep(60)", str(folder / "site-1")])
    other = _sleeper()
    try:
        deadline = time.monotonic() + 10
        found = []
        while len(found) < 2 and time.monotonic() < deadline:
            found = processes_under(str(folder))
            time.sleep(0.05)
        pids = {process.pid for process in found}
        assert named.pid in pids and len(pids) == 2 and other.pid not in pids and os.getpid() not in pids
        assert processes_under(str(tmp_path / "po")) == []  # a prefix of the name is another folder
        stop_processes(found, term_seconds=1.0)
        assert named.wait(timeout=5) is not None and processes_under(str(folder)) == []
    finally:
        for process in (named, other):
            process.kill()
            process.wait()


def test_wait_for_job_ends_at_once_when_stopped_without_aborting():
    from devsim_flare.deployment.poc import BackgroundStatus
    from devsim_flare.execution import wait_for_job

    run = _FakeRun()
    started = time.monotonic()
    flag = []
    stopper = threading.Timer(0.2, flag.append, args=(1,))
    stopper.start()
    status, result = wait_for_job(BackgroundStatus(run, 0.05), 30.0, poll_seconds=10.0, stopped=lambda: bool(flag))
    assert (status, result) == ("RUNNING", None) and not run.aborted
    assert time.monotonic() - started < 1.0  # the 10 s status poll does not hold the stop


def test_without_asking_the_server_the_first_signal_stops_the_processes(tmp_path):
    child = _sleeper()
    try:
        with StopOnSignals(str(tmp_path), ask_server=False) as signals:
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 5
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        assert signals.exit_code == 130 and child.poll() is not None
        assert not (tmp_path / STOP_FILE).exists()
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("recorded", [False, True])
def test_before_the_first_round_the_first_signal_stops_at_once(tmp_path, recorded):
    """``ask_server`` as a callable: before the server has recorded a round there is nothing to save, and the
    first signal stops the processes without the grace period; after one, it asks the server."""
    forced = []
    with StopOnSignals(str(tmp_path), force=forced.append, grace_seconds=30.0, ask_server=lambda: recorded) as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not forced and not recorded and time.monotonic() < deadline:
            time.sleep(0.01)
        assert signals.exit_code == 143
        assert forced == ([] if recorded else [1.0])
        assert (tmp_path / STOP_FILE).exists() == recorded


def test_leaf_losses_are_printed_once_each_from_the_server_records(tmp_path, capsys):
    import json

    from devsim_flare.deployment.poc import LeafLosses

    losses = LeafLosses(str(tmp_path))
    assert losses.report() == []  # no results yet
    records = [{"round": 1}, {"round": 2, "leaves_lost": {"site-3": JOB_CELL_GONE}}]
    (tmp_path / "results.json").write_text(json.dumps({"rounds": records}))
    assert losses.report() == [f"[server] round 2: leaf site-3 lost ({JOB_CELL_GONE}); the run goes on without it"]
    records.append({"version": 7, "leaves_lost": {"site-1": "stopped answering (x)", "site-3": "again"}})
    (tmp_path / "results.json").write_text(json.dumps({"rounds": records}))
    os.utime(tmp_path / "results.json", (time.time() + 5, time.time() + 5))  # a later rewrite
    lost = losses.report()
    assert lost == ["[server] version 7: leaf site-1 lost (stopped answering (x)); the run goes on without it"]
    assert losses.report() == [] and "site-3 lost" in capsys.readouterr().out


def test_leaf_failure_names_the_leaf_and_why_nvflare_ended_the_job(tmp_path):
    from devsim_flare.deployment.poc import leaf_failure

    log = tmp_path / "example_project" / "prod_00" / "server" / "log.txt"
    log.parent.mkdir(parents=True)
    log.write_text(
        "2026-11-26 10:00:00 - FederatedServer - INFO - Failing job abc-1 due to reported failure from site-2: "
        "exception\n"
    )
    line = leaf_failure(str(tmp_path), "abc-1")
    assert "leaf site-2" in line and "(exception)" in line and "fails the whole job" in line and "\n" not in line
    assert leaf_failure(str(tmp_path), "other-job") is None
    assert leaf_failure(str(tmp_path / "nothing")) is None


def test_a_poc_start_that_fails_leaves_no_service_running(tmp_path):
    """A POC start that raises (e.g. the admin could not connect to the server) still stops the services it
    started: here a process naming the POC workspace on its command line, as NVFlare's services do."""
    from devsim_flare.deployment.poc import services_stopped_at_exit

    poc_root = tmp_path / "poc"
    (poc_root / "server" / "startup").mkdir(parents=True)
    service = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", str(poc_root / "server" / "startup" / "sub_start.sh")]
    )
    try:
        with pytest.raises(RuntimeError, match="cannot connect"):
            with services_stopped_at_exit(str(poc_root)):
                raise RuntimeError("cannot connect to server for 10 s")
        assert service.wait(timeout=10) is not None
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
