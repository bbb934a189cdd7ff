"""Shared helpers for tests that run jobs in NVFlare's simulator or POC mode."""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Small, fast, still clearly learnable: 2 leaves x 20 devices, 16 selected, 6 rounds (~0.8 accuracy).
SMALL_RUN = [
    *("--num-leaf-nodes", "2", "--devices-per-leaf", "20", "--device-selection-size", "16"),
    *("--samples-per-device", "100", "--partition", "iid", "--local-epochs", "2"),
    *("--synthetic-train-size", "4000", "--synthetic-test-size", "1000"),
    *("--num-rounds", "6", "--batch-size", "10", "--lr", "0.05", "--seed", "11"),
]


# Modules whose tests start whole deployments (POC systems, provisioned sites in network namespaces, edge relay
# trees): run one after another on one worker so two of them never share the two cores of a small machine.
MULTIPROCESS_MODULES = frozenset({"test_poc", "test_deployment", "test_edge_hierarchy"})


def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (``scripts/test.sh`` runs the suite on workers) a test module is one unit of work, so its
    module-scoped job runs happen once, and the multi-process modules share one unit. xdist's own ``loadgroup``
    cannot be used: with pytest 9.2 its group suffix on the node id is lost."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            name = os.path.splitext(os.path.basename(module))[0]
            return "multiprocess" if name in MULTIPROCESS_MODULES else module

    return ModuleScheduling(config, log)


@pytest.fixture(scope="module")
def single_torch_thread():
    """One torch thread for a module: tiny models run as fast on one thread, and far faster than two when
    the CPU is shared."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def no_warm_parent():
    """No job a test starts leaves a warm parent behind (``DEVSIM_WARM=0``; the warm parent's own tests turn it on
    for themselves and stop what they started)."""
    previous = os.environ.get("DEVSIM_WARM")
    os.environ["DEVSIM_WARM"] = "0"
    yield
    if previous is None:
        os.environ.pop("DEVSIM_WARM", None)
    else:
        os.environ["DEVSIM_WARM"] = previous


@pytest.fixture(autouse=True, scope="session")
def probe_cache_in_tmp(tmp_path_factory):
    """The batching probe's verdict cache (``DEVSIM_CACHE_DIR``) in a temporary folder for the whole session, for
    this process and the jobs it starts, never in the user's cache."""
    previous = os.environ.get("DEVSIM_CACHE_DIR")
    os.environ["DEVSIM_CACHE_DIR"] = str(tmp_path_factory.mktemp("devsim-cache"))
    yield
    if previous is None:
        os.environ.pop("DEVSIM_CACHE_DIR", None)
    else:
        os.environ["DEVSIM_CACHE_DIR"] = previous


def isolated_env(tmp_path) -> dict[str, str]:
    """Environment whose HOME and NVFlare POC workspace live under ``tmp_path``."""
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    env["NVFLARE_POC_WORKSPACE"] = str(tmp_path / "poc")
    env["PYTHONUNBUFFERED"] = "1"
    os.makedirs(env["HOME"], exist_ok=True)
    return env


def launch_job(script: str, args: list[str], tmp_path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``jobs/<script>`` in a subprocess with an isolated HOME and POC workspace; capture its output."""
    return subprocess.run(
        [sys.executable, os.path.join(REPO, "jobs", script), *args],
        cwd=tmp_path,
        env=isolated_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_job(script: str, args: list[str], tmp_path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``jobs/<script>``; fail the test with its output when it does not exit 0."""
    proc = launch_job(script, args, tmp_path, timeout)
    if proc.returncode != 0:
        pytest.fail(
            f"{script} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc


def start_job(script: str, args: list[str], tmp_path) -> subprocess.Popen:
    """Start ``jobs/<script>`` in its own session, as a terminal runs a command (``os.killpg(proc.pid, SIGINT)`` is
    its Ctrl-C), stdout and stderr merged into one text pipe; the caller stops it."""
    return _in_own_session([sys.executable, os.path.join(REPO, "jobs", script), *args], tmp_path, subprocess.STDOUT)


def _in_own_session(cmd: list[str], tmp_path, stderr: int) -> subprocess.Popen:
    """``cmd`` in its own session (``os.killpg(proc.pid, ...)`` reaches all it starts) with an isolated HOME, run in
    ``tmp_path``; stdout a text pipe, ``stderr`` a pipe of its own or merged into stdout."""
    return subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=isolated_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )


def run_in_group(cmd: list[str], tmp_path, timeout: float, label: str) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group with an isolated HOME; the whole group is killed on timeout.

    Fails the test (naming ``label``, with the output tails) on a timeout or a non-zero exit.
    """
    proc = _in_own_session(cmd, tmp_path, subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{label} did not finish in {timeout}s\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(f"{label} exited {proc.returncode}\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def refused_job(script: str, args: list[str], tmp_path) -> str:
    """Run ``jobs/<script>`` expecting it to refuse its arguments (exit code 2); returns its stderr."""
    proc = launch_job(script, args, tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stderr


def find_results(root) -> dict:
    """The single results.json under ``root``."""
    paths = glob.glob(os.path.join(str(root), "**", "results.json"), recursive=True)
    assert len(paths) == 1, f"expected one results.json under {root}, found {paths}"
    with open(paths[0], encoding="utf-8") as stream:
        return json.load(stream)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes (other than this one) that contain ``text``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as stream:
                cmdline = stream.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def end_leftovers(text: str, wait: float = 30.0) -> list[str]:
    """Wait up to ``wait`` s for the processes mentioning ``text`` to end, SIGKILL what is left; returns what was
    left (a test asserts it is empty after stopping every process it started)."""
    deadline = time.monotonic() + wait
    while processes_mentioning(text) and time.monotonic() < deadline:
        time.sleep(1)
    leftovers = processes_mentioning(text)
    for line in leftovers:
        try:
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    return leftovers


def small_processors(count: int, **overrides) -> list:
    """``count`` CNN task processors on a small synthetic set (by default 20 iid samples a device, batch 10,
    seed 3; ``overrides`` replace settings): leaf runners in core tests that need real local training."""
    from processors.task_processor import TaskDeviceProcessor

    settings = dict(
        dataset="synthetic",
        synthetic_train_size=600,
        synthetic_test_size=50,
        samples_per_device=20,
        partition="iid",
        batch_size=10,
        seed=3,
    )
    return [TaskDeviceProcessor.from_settings(settings | overrides) for _ in range(count)]


def lossy_codecs() -> list:
    """One spec of each lossy codec form (fp16; int8 per entry and in blocks; top-k with float32, int8 and
    float16 values), for tests parametrized over them (``ids=codec_id``)."""
    from devsim.compression import CodecSpec

    return [
        CodecSpec("fp16"),
        CodecSpec("int8"),
        CodecSpec("int8", int8_block=7),
        CodecSpec("topk", topk_fraction=0.1),
        CodecSpec("topk", topk_fraction=0.02, topk_values="int8"),
        CodecSpec("topk", topk_fraction=0.05, topk_values="float16"),
    ]


def codec_id(spec) -> str:
    return f"{spec.name}-{spec.topk_values}-{spec.int8_block}"


def import_script(*parts: str):
    """A repository script that is not in a package (e.g. ``import_script("scripts", "x.py")``), imported as a
    module so a test can call its functions."""
    import importlib.util

    path = os.path.join(REPO, *parts)
    spec = importlib.util.spec_from_file_location(os.path.splitext(parts[-1])[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port_base(count: int) -> int:
    """A port N such that N..N+count-1 can all be bound on localhost right now."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - count)
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports found")


def stop_deployment(script: str, workspace, tmp_path) -> list[str]:
    """End a deployment a test started (``script stop``, when any process of ``workspace`` still runs), then
    :func:`end_leftovers`; returns what was left."""
    if (workspace / "system.json").exists() and processes_mentioning(str(workspace)):
        try:
            subprocess.run(
                [sys.executable, script, "stop", "--workspace", str(workspace)],
                env=isolated_env(tmp_path),
                capture_output=True,
                timeout=120,
            )
        except subprocess.TimeoutExpired:
            pass
    return end_leftovers(str(tmp_path), wait=20.0)
