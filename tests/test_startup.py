"""The start-up clock's stamps and stages (no NVFlare)."""

from __future__ import annotations

import os
import time

from devsim.observe.startup import (
    COMMAND_STAMPS_ENV,
    COMMAND_STARTED_ENV,
    StartupClock,
    add_exit,
    command_stamps,
    command_starts_now,
    stamp_command,
    stamp_command_start,
    summary_line,
)


def test_stages_are_differences_of_first_stamps(monkeypatch):
    monkeypatch.setenv(COMMAND_STARTED_ENV, "100.0")
    clock = StartupClock()
    clock.stamps.update(server_process_started=102.0, server_run_started=110.0)
    clock.mark("server_ready")
    clock.stamps["server_ready"] = 111.5
    clock.mark("server_ready")
    clock.stamps.update(first_round_started=111.5, first_round_finished=112.0, last_round_finished=130.0)
    seconds = clock.record()["seconds"]
    assert seconds["command_to_server_process"] == 2.0 and seconds["server_process_to_run"] == 8.0
    assert seconds["run_to_ready"] == 1.5 and seconds["command_to_first_round"] == 11.5
    ended = add_exit(clock.record(), 133.0)
    assert ended["seconds"]["last_round_to_exit"] == 3.0 and ended["stamps"]["command_exit"] == 133.0


def test_without_the_command_stamp_its_stages_are_none(monkeypatch):
    monkeypatch.delenv(COMMAND_STARTED_ENV, raising=False)
    seconds = StartupClock().record()["seconds"]
    assert seconds["command_to_server_process"] is None and seconds["command_to_first_round"] is None


def test_the_command_stamp_is_kept_once_set(monkeypatch):
    monkeypatch.setenv(COMMAND_STARTED_ENV, "5.0")
    stamp_command_start()
    assert StartupClock().stamps["command_started"] == 5.0


def test_the_commands_own_stamps_split_its_time_to_the_server_process(monkeypatch):
    monkeypatch.setenv(COMMAND_STARTED_ENV, "100.0")
    monkeypatch.delenv(COMMAND_STAMPS_ENV, raising=False)
    stamp_command("command_imports_done")
    first = command_stamps()["command_imports_done"]
    stamp_command("command_imports_done")  # the first stamp of a name counts
    monkeypatch.setenv(COMMAND_STAMPS_ENV, f"{os.environ[COMMAND_STAMPS_ENV]},command_checked=104.5,junk,x=y")
    assert command_stamps() == {"command_imports_done": first, "command_checked": 104.5}
    monkeypatch.setenv(COMMAND_STAMPS_ENV, "command_imports_done=50.0,command_checked=104.5")  # 50: before 100
    assert command_stamps() == {"command_checked": 104.5}  # another command's stamp, inherited, does not count
    stamp_command("command_imports_done")
    assert command_stamps()["command_imports_done"] > 100.0
    clock = StartupClock()
    clock.stamps.update(command_imports_done=101.0, server_process_started=105.0)
    seconds = clock.record()["seconds"]
    assert (seconds["command_imports"], seconds["command_checks"], seconds["checked_to_server_process"]) == (
        1.0,
        3.5,
        0.5,
    )
    assert seconds["command_to_server_process"] == 5.0


def test_the_summary_line_names_the_commands_parts_when_it_has_them():
    seconds = dict(command_to_first_round=3.7, command_to_server_process=2.6, server_process_to_run=1.1)
    seconds.update(run_to_ready=0.1, last_round_to_exit=0.4)
    plain = summary_line(seconds)
    assert plain.startswith("start-up: 3.7s from the command to the first round (server process 2.6s; NVFlare")
    seconds.update(command_imports=1.3, command_checks=1.2, checked_to_server_process=0.1)
    assert "(server process 2.6s: imports 1.3s, checks 1.2s, launch 0.1s; NVFlare" in summary_line(seconds, True)
    assert summary_line(seconds, True).startswith("start-up (warm parent): ")
    assert summary_line({"server_process_to_run": 1.0}).startswith("start-up on the server: NVFlare")


def test_a_run_from_python_drops_the_earlier_commands_stamps_while_it_runs(monkeypatch):
    monkeypatch.setenv(COMMAND_STAMPS_ENV, "command_checked=3.0")
    with command_starts_now():
        assert command_stamps() == {}
        stamp_command("command_checked")
    assert os.environ[COMMAND_STAMPS_ENV] == "command_checked=3.0"


def test_sim_exit_watcher_stops_what_is_left_once_the_results_are_complete(tmp_path):
    """Once results.json has its summary, the simulator's processes (this process's children) get a short grace,
    then are stopped; the watcher says it stopped them. Without a summary it leaves them alone."""
    import json
    import subprocess
    import sys
    import time

    from devsim.config import SimulationConfig
    from devsim_flare.execution import SimExitWatcher

    config = SimulationConfig(output_dir=str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with SimExitWatcher(config, poll_seconds=0.05) as watcher:
            time.sleep(0.5)
            assert child.poll() is None and not watcher.stopped_it.is_set()
            (tmp_path / "results.json").write_text(json.dumps({"summary": {"rounds": 1}, "rounds": []}))
            child.wait(timeout=10)
        assert watcher.stopped_it.is_set()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_exited_processes_count_as_gone_before_anyone_reaps_them():
    """The watcher does not wait for PID 1 to reap the simulator's orphans (1-2 s here): a zombie is gone."""
    import subprocess
    import sys
    import time

    import psutil

    from devsim_flare.execution import still_running

    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    sleeping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        zombie = psutil.Process(exited.pid)
        deadline = time.monotonic() + 30
        while zombie.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:  # exited, not reaped
            time.sleep(0.05)
        assert zombie.status() == psutil.STATUS_ZOMBIE
        running = psutil.Process(sleeping.pid)
        assert still_running([zombie, running]) == [running]
    finally:
        sleeping.kill()
        sleeping.wait()
        exited.wait()
    assert still_running([running]) == []


def test_share_digits_writes_the_same_digits_once_for_the_processes_a_run_starts(tmp_path, monkeypatch):
    from importlib.metadata import version

    import numpy as np

    from devsim.cache_dir import CACHE_ENV
    from devsim.config import SimulationConfig
    from devsim.data import digits
    from devsim_flare.cli import share_digits

    monkeypatch.setenv(digits.FILE_ENV, "")  # restored (unset) after the test, whatever share_digits sets
    monkeypatch.delenv(digits.FILE_ENV)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "user-cache"))
    share_digits(SimulationConfig(dataset="synthetic"), str(tmp_path))
    assert digits.FILE_ENV not in os.environ
    share_digits(SimulationConfig(dataset="digits"), str(tmp_path / "workspace-1"))
    path = tmp_path / "user-cache" / f"digits-{version('scikit-learn')}.npz"  # one file for every workspace
    assert os.environ[digits.FILE_ENV] == str(path) and not (tmp_path / "workspace-1").exists()
    for got, want in zip(digits._file_arrays(str(path)), digits._sklearn_arrays(), strict=True):
        np.testing.assert_array_equal(got, want)
    monkeypatch.delenv(digits.FILE_ENV)
    monkeypatch.setenv(CACHE_ENV, "off")  # no user cache: the workspace keeps it
    share_digits(SimulationConfig(dataset="digits"), str(tmp_path))
    assert os.environ[digits.FILE_ENV] == str(tmp_path / "cache" / "digits.npz")


def test_sim_exit_watcher_ignores_the_summary_of_an_earlier_run(tmp_path):
    """A results.json with a summary left in --output-dir by an earlier run does not stop the new run."""
    import json
    import subprocess
    import sys
    import time

    from devsim.config import SimulationConfig
    from devsim_flare.execution import SimExitWatcher

    old = tmp_path / "results.json"
    old.write_text(json.dumps({"summary": {"rounds": 1}, "rounds": []}))
    os.utime(old, (time.time() - 60, time.time() - 60))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with SimExitWatcher(SimulationConfig(output_dir=str(tmp_path)), poll_seconds=0.05) as watcher:
            time.sleep(1.0)
            assert child.poll() is None and not watcher.stopped_it.is_set()
    finally:
        child.kill()
        child.wait()


def test_simulator_polls_are_capped_only_where_the_runner_module_is_loaded(monkeypatch):
    """The runner module of NVFlare's simulator sees a ``time`` whose sleep lasts at most POLL_SECONDS (the rest
    is the real module); without that module loaded, or with the runtime defaults switched off, nothing changes."""
    import sys
    import time
    import types

    from devsim_flare import sim_polling
    from devsim_flare.runtime_defaults import RUNTIME_ENV_DEFAULTS_SWITCH

    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.delitem(sys.modules, sim_polling.RUNNER_MODULE, raising=False)
    assert not sim_polling.shorten_simulator_polls()

    runner = types.ModuleType(sim_polling.RUNNER_MODULE)
    runner.time = time
    monkeypatch.setitem(sys.modules, sim_polling.RUNNER_MODULE, runner)
    monkeypatch.setenv(RUNTIME_ENV_DEFAULTS_SWITCH, "0")
    assert not sim_polling.shorten_simulator_polls_by_default() and runner.time is time

    monkeypatch.delenv(RUNTIME_ENV_DEFAULTS_SWITCH)
    assert sim_polling.shorten_simulator_polls_by_default()
    patched = runner.time
    assert sim_polling.shorten_simulator_polls() and runner.time is patched  # idempotent
    runner.time.sleep(1.0)
    runner.time.sleep(0.01)
    assert slept == [sim_polling.POLL_SECONDS, 0.01]
    assert runner.time.time is time.time and runner.time.monotonic is time.monotonic


def test_the_client_runner_is_capped_only_in_a_simulator_worker(monkeypatch):
    """A leaf's client runner waits 0.5 s before it syncs; its sleeps are capped only where NVFlare's simulator
    worker runs (in POC and production they pace the leaf's task polling for the whole run)."""
    import sys
    import time
    import types

    from devsim_flare import sim_polling

    client_runner = types.ModuleType(sim_polling.CLIENT_RUNNER_MODULE)
    client_runner.time = time
    monkeypatch.setitem(sys.modules, sim_polling.CLIENT_RUNNER_MODULE, client_runner)
    monkeypatch.delitem(sys.modules, sim_polling.RUNNER_MODULE, raising=False)
    monkeypatch.delitem(sys.modules, sim_polling.WORKER_MODULE, raising=False)
    assert not sim_polling.shorten_simulator_polls() and client_runner.time is time
    monkeypatch.setitem(sys.modules, sim_polling.WORKER_MODULE, types.ModuleType(sim_polling.WORKER_MODULE))
    assert sim_polling.shorten_simulator_polls() and client_runner.time is not time


def test_the_simulator_runner_still_polls_with_the_module_time_it_sees():
    """What the cap relies on in NVFlare's simulator runner: it imports ``time`` as a module global and waits with
    one-second sleeps through it (a newer NVFlare that changed this would make the cap a no-op; this says so)."""
    import inspect
    import time

    runner = __import__("nvflare.private.fed.app.simulator.simulator_runner", fromlist=["SimulatorRunner"])
    source = inspect.getsource(runner)
    assert runner.time is time or type(runner.time).__name__ == "_ShortSleepTime"
    assert source.count("time.sleep(1.0)") >= 2 and "time.sleep(interval)" in source
    client_runner = __import__("nvflare.private.fed.client.client_runner", fromlist=["ClientRunner"])
    assert "time.sleep(0.5)" in inspect.getsource(client_runner.ClientRunner.init_run)


def test_a_forked_simulator_process_has_its_polls_capped_before_it_starts(monkeypatch):
    """The fork server caps the runner's sleeps before the simulator's server process runs (its first one-second
    wait starts before the project's package is imported there) and the client runner's before a worker runs; other
    modules, and the switch turned off, change nothing."""
    import sys
    import time
    import types

    from devsim_flare import sim_polling
    from devsim_flare.runtime_defaults import RUNTIME_ENV_DEFAULTS_SWITCH

    loaded = {}
    for name in (sim_polling.RUNNER_MODULE, sim_polling.CLIENT_RUNNER_MODULE):
        loaded[name] = types.ModuleType(name)
        loaded[name].time = time
        monkeypatch.setitem(sys.modules, name, loaded[name])
    runner, client_runner = loaded[sim_polling.RUNNER_MODULE], loaded[sim_polling.CLIENT_RUNNER_MODULE]
    for name in (sim_polling.CONNECTOR_MANAGER_MODULE, sim_polling.COMMUNICATOR_MODULE):  # NVFlare's stay as they are
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setenv(RUNTIME_ENV_DEFAULTS_SWITCH, "0")
    assert not sim_polling.shorten_before_start(sim_polling.SIMULATOR_MODULE) and runner.time is time
    monkeypatch.delenv(RUNTIME_ENV_DEFAULTS_SWITCH)
    assert not sim_polling.shorten_before_start("some.other.module") and runner.time is time
    assert sim_polling.shorten_before_start(sim_polling.WORKER_MODULE)
    assert client_runner.time is not time and runner.time is time
    assert sim_polling.shorten_before_start(sim_polling.SIMULATOR_MODULE) and runner.time is not time


def test_the_worker_main_module_is_capped_in_a_simulator_worker(monkeypatch):
    """NVFlare's worker runs as ``__main__``: its 0.5 s task-fetch retries and its sleeps between tasks are capped
    there, and only where ``__main__`` is that worker."""
    import sys
    import time
    import types

    from devsim_flare import sim_polling

    main = types.ModuleType("__main__")
    main.time = time
    main.__spec__ = types.SimpleNamespace(name="some.script")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.delitem(sys.modules, sim_polling.RUNNER_MODULE, raising=False)
    monkeypatch.delitem(sys.modules, sim_polling.WORKER_MODULE, raising=False)
    assert not sim_polling.shorten_simulator_polls() and main.time is time
    main.__spec__ = types.SimpleNamespace(name=sim_polling.WORKER_MODULE)
    assert sim_polling.shorten_simulator_polls() and main.time is not time


def test_the_simulator_worker_still_waits_through_its_module_time():
    """What the worker's cap relies on: NVFlare's worker retries a task fetch after ``time.sleep(0.5)`` and sleeps
    ``interval`` between tasks through its module's ``time``."""
    import inspect

    from devsim_flare import sim_polling

    worker = __import__(sim_polling.WORKER_MODULE, fromlist=["ClientTaskWorker"])
    assert "time.sleep(0.5)" in inspect.getsource(worker.ClientTaskWorker.do_one_task)
    assert "time.sleep(interval)" in inspect.getsource(worker.ClientTaskWorker.run)


def test_the_listener_wait_ends_when_a_tcp_listener_listens(monkeypatch):
    """After a listener starts, NVFlare's connector manager sleeps 0.5 s; the wait that replaces it ends as soon as
    NVFlare's TCP driver has its server socket, and stays the whole sleep for another driver or an unknown one."""
    import sys
    import threading
    import time
    import types

    from devsim_flare import sim_polling

    class TcpDriver:
        server = None

    class OtherDriver:
        server = None

    class Communicator:
        def __init__(self, driver) -> None:
            connector = types.SimpleNamespace(driver=driver)
            self.conn_manager = types.SimpleNamespace(connectors={"h1": connector})

        def start_listener(self, scheme, resources):
            return "h1", "tcp://localhost:1", {}

    manager = types.ModuleType(sim_polling.CONNECTOR_MANAGER_MODULE)
    manager.time = time
    for name, module in (
        (sim_polling.CONNECTOR_MANAGER_MODULE, manager),
        (sim_polling.COMMUNICATOR_MODULE, types.SimpleNamespace(Communicator=Communicator)),
        (sim_polling.TCP_DRIVER_MODULE, types.SimpleNamespace(TcpDriver=TcpDriver)),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    assert sim_polling.wait_for_listeners() and sim_polling.wait_for_listeners()  # idempotent
    assert Communicator.start_listener.devsim_remembers and manager.time.monotonic is time.monotonic

    def waited(driver, seconds: float, ready_after: float | None = None) -> float:
        Communicator(driver).start_listener("tcp", {})
        if ready_after is not None:
            threading.Timer(ready_after, setattr, (driver, "server", object())).start()
        started = time.monotonic()
        manager.time.sleep(seconds)
        return time.monotonic() - started

    assert waited(TcpDriver(), 5.0, ready_after=0.02) < 2.0
    assert waited(OtherDriver(), 0.05) >= 0.05
    started = time.monotonic()
    manager.time.sleep(0.05)  # no listener started since the last wait: the whole sleep
    assert time.monotonic() - started >= 0.05


def test_nvflare_still_sleeps_after_starting_a_listener_and_sets_the_tcp_server_once_it_listens():
    """What the listener wait relies on in NVFlare: the 0.5 s sleep after ``start_listener`` in the connector
    manager, and the TCP driver's ``server`` assigned once its server socket is bound and listening."""
    import inspect

    from nvflare.fuel.f3.cellnet import connector_manager
    from nvflare.fuel.f3.drivers import tcp_driver

    source = inspect.getsource(connector_manager.ConnectorManager._get_connector)
    assert source.index("start_listener(") < source.index("time.sleep(0.5)")
    listen = inspect.getsource(tcp_driver.TcpDriver.listen)
    assert "self.server = TcpStreamServer(" in listen
    assert "self.server_activate()" in inspect.getsource(tcp_driver.TcpStreamServer.__init__)


def test_the_previous_run_is_set_aside_except_what_nvflare_keeps_and_removed_in_the_background(tmp_path):
    """Before a simulation, the job workspace's previous run (not startup/ or local/) moves under the workspace's
    trash folder, which a background thread empties, leftovers of earlier commands included."""
    import types

    from devsim_flare.launch import previous_run

    job_workspace = tmp_path / "nvflare" / "devsim_fedavg"
    for folder in ("startup", "local", "server/simulate_job/app_server/custom", "site-1/simulate_job"):
        (job_workspace / folder).mkdir(parents=True)
        (job_workspace / folder / "f.txt").write_text("x")
    leftover = tmp_path / previous_run.TRASH_FOLDER / "devsim_fedavg-1-2"
    leftover.mkdir(parents=True)
    recipe = types.SimpleNamespace(job_name="devsim_fedavg")
    env = types.SimpleNamespace(workspace_root=str(job_workspace.parent))
    moved = previous_run.clear_previous_run(recipe, env, str(tmp_path))
    assert sorted(os.listdir(job_workspace)) == ["local", "startup"]
    assert (job_workspace / "local" / "f.txt").read_text() == "x"
    assert moved is not None and os.path.dirname(moved) == str(tmp_path / previous_run.TRASH_FOLDER)
    deadline = time.monotonic() + 30
    while os.listdir(tmp_path / previous_run.TRASH_FOLDER) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.listdir(tmp_path / previous_run.TRASH_FOLDER) == []
    assert previous_run.clear_previous_run(recipe, env, str(tmp_path)) is None  # nothing more to move
    assert previous_run.clear_previous_run(types.SimpleNamespace(), env, str(tmp_path)) is None  # not a Collab recipe


def test_a_process_start_is_stamped_between_its_launch_and_its_first_line():
    """A child's own start stamp lies after the moment its parent launched it and before the child's first
    statement runs (a stamp from whole-second boot time would be up to a second early)."""
    import subprocess
    import sys

    code = "import time; now = time.time(); from devsim.observe.startup import process_started; "
    code += "print(process_started(), now)"
    launched = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    started, first_line = map(float, out.stdout.split())
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    assert launched - 2 * tick <= started <= first_line + 2 * tick
