"""The GPU suite's sections that run job scripts (``benchmarks/gpu_suite.py``), and GPU-memory polling.

``run_job`` runs one job of ``jobs/`` through ``benchmarks/harness.py`` in a temporary folder (nothing lands in
``/tmp/nvflare`` or ``~/.nvflare``) and adds the leaves' ``workers=`` plans and the peak GPU memory to its results.
``VramMonitor`` polls the GPU's used memory (device-wide, from ``torch.cuda.mem_get_info``) in a thread and keeps
the peak above what was in use when it started.
"""

from __future__ import annotations

import collections
import contextlib
import os
import statistics
import threading
import time

import torch

from benchmarks import harness
from benchmarks.async_throughput import run_setting, settings, tight_loop_per_update
from devsim_flare.launch.warm_parent import plain_interpreter, running_parents, warm_enabled

REPO = harness.REPO


class VramMonitor:
    """Peak device-wide GPU memory in use (MiB) above the level at entry, polled every ``interval`` s.

    On the CPU it does nothing and ``peak_mib`` stays None.
    """

    def __init__(self, device: str, interval: float = 0.05):
        self.active = device == "cuda" and torch.cuda.is_available()
        self.interval = interval
        self.peak_mib: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _used(self) -> int:
        free, total = torch.cuda.mem_get_info(0)
        return total - free

    def _poll(self, baseline: int) -> None:
        peak = 0
        while not self._stop.is_set():
            peak = max(peak, self._used() - baseline)
            self.peak_mib = peak / 2**20
            self._stop.wait(self.interval)

    def __enter__(self) -> VramMonitor:
        if self.active:
            self._thread = threading.Thread(target=self._poll, args=(self._used(),), daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def run_job(script: str, flags: list[str], env_extra: dict[str, str], timeout: float) -> dict:
    """Run ``jobs/<script>`` with ``flags`` in a temporary folder (``harness.run_job``): its results.json with
    ``wall``, ``first_round`` and ``worker_lines``, and ``peak_gpu_memory_mib`` (None on the CPU); RuntimeError on
    failure or timeout, ending with the output's last 40 lines, each with its seconds since the launch (where a run
    that stalls stopped printing)."""
    device = "cpu" if env_extra.get("CUDA_VISIBLE_DEVICES") == "" else "cuda"
    timed: collections.deque[str] = collections.deque(maxlen=40)

    def watch(line: str, seconds: float) -> None:
        timed.append(f"{seconds:7.1f} {line}")

    with VramMonitor(device) as monitor:
        try:
            results = harness.run_job(script, flags, timeout=timeout, env=env_extra, watch=watch)
        except RuntimeError as error:
            raise RuntimeError(f"{error}\nlast lines, seconds since launch:\n" + "\n".join(timed)) from None
    return {**results, "peak_gpu_memory_mib": monitor.peak_mib}


def job_env(args) -> dict:
    return {"CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else {}


def job_figures(run: dict, selected_samples: int) -> dict:
    """Steady-round figures of one job run (rounds after the first): median round and training seconds,
    device-samples/s over ``selected_samples`` a round, mean timing parts (and the server aggregate's split), and the
    run's start-up and plans."""
    rounds = run["rounds"]
    steady = rounds[1:] or rounds
    parts = {k: statistics.mean(r["timing"]["parts"][k] for r in steady) for k in steady[0]["timing"]["parts"]}
    train = statistics.median(r["train_seconds"] for r in steady)
    out = _run_facts(run) | dict(round_seconds_median=statistics.median(r["round_seconds"] for r in steady))
    out.update(train_seconds_median=train, device_samples_per_s=selected_samples / train, timing_mean_parts=parts)
    split = ("server_screen", "server_update")  # server_aggregate's two halves: the checks, then the model's update
    out["server_split_mean"] = {k: statistics.mean(r["timing"]["info"].get(k, 0.0) for r in steady) for k in split}
    return out | dict(final_accuracy=rounds[-1].get("accuracy"), worker_plans=run["worker_lines"])


def _run_facts(run: dict) -> dict:
    """A job run's wall and first-round seconds, peak GPU memory and start-up breakdown."""
    facts = dict(wall_seconds=run["wall"], first_round_seconds=run["first_round"], startup=run.get("startup"))
    return facts | {"peak_gpu_memory_mib": run["peak_gpu_memory_mib"]}


def section_fedrevive(args, size: dict) -> dict:
    """FedRevive with the paper's server work per arrival (ResNet-18 without norm, generator width 128, 8 teachers,
    10 KD steps, synthesis batch 64) on synthetic images, sized to finish: ``revive_versions`` model versions
    (every arrival one, buffer 1) of a 100-device population with 20 jobs in flight. The server's work runs on the
    server's device (the GPU when there is one): wall seconds, and server seconds per arrival."""
    flags = [
        *("--preset", "fedrevive_paper_cifar10_shifted", "--dataset", "synthetic", "--data-root", "none"),
        *("--max-sim-time", "none", "--max-versions", str(size["revive_versions"])),
        *("--freeze-version", "2", "--warmup-version", "4", "--devices-per-leaf", "50", "--concurrency", "20"),
        *("--samples-per-device", "100", "--eval-frequency", "1000000", "--checkpoint-frequency", "0"),
    ]
    if args.tiny:
        flags += ["--devices-per-leaf", "10", "--samples-per-device", "20", "--concurrency", "4"]
        flags += ["--local-iterations", "2", "--kd-iterations", "2", "--generator-width", "16"]
        flags += ["--model", "cnn", "--synthetic-test-size", "100"]
    run = run_job("pt_job_fedrevive.py", flags, job_env(args), args.timeout)
    summary = run["summary"]
    per_arrival = summary.get("revive_seconds_per_arrival")
    return _run_facts(run) | dict(summary=summary, revive_seconds_per_arrival=per_arrival, server_device=args.device)


def _async_rows(updates: int, names, timeout: float) -> dict:
    """``async_throughput.py``'s rows ``names`` for ``updates`` device updates on digits, 2 leaves x 50 devices."""
    common = ["--dataset", "digits", "--num-leaf-nodes", "2", "--devices-per-leaf", "50"]
    runs = settings(updates, 2, 50)
    return {name: run_setting(*runs[name], common, timeout, 2) for name in names}


def section_async_throughput(args, size: dict) -> dict:
    """FedBuff's device updates/s against FedAvg's on the same work, and against a tight loop on this device."""
    rows = _async_rows(size["async_updates"], size["async_settings"], args.timeout)
    loop_per_update = tight_loop_per_update("digits", 2, args.device)
    fedavg = rows["fedavg"]["updates_per_s"]
    for row in rows.values():
        row["ratio_to_fedavg"] = row["updates_per_s"] / fedavg
        row["ratio_to_tight_loop"] = 1 / row["updates_per_s"] / loop_per_update
    return {"tight_loop_ms_per_update": 1000 * loop_per_update, "settings": rows}


def section_async_revive(args, size: dict) -> dict:
    """FedRevive paper's command against FedBuff paper's (``async_throughput.py``'s rows; FedRevive's issue: <= 1.5x)
    with cores to spare, DFKD on the device: up to ``revive_repeats`` pairs in time, each pair's ratio, the median."""
    pairs = []
    while len(pairs) < size["revive_repeats"] and not (pairs and time.monotonic() > args.section_deadline):
        pairs.append(_async_rows(size["revive_updates"], ("fedbuff paper", "fedrevive paper"), args.timeout))
    ratios = [pair["fedrevive paper"]["command_wall"] / pair["fedbuff paper"]["command_wall"] for pair in pairs]
    return dict(pairs=pairs, command_ratios=ratios, command_ratio=statistics.median(ratios))


def warm_parent_facts(env: dict[str, str], wait_seconds: float = 30.0) -> dict:
    """Whether job commands with ``env`` added may run in a warm parent (``devsim_flare.launch.warm_parent``), the
    warm parents of that cache folder after a job command ended, and the seconds until the newest had finished its
    imports (its CPU time unchanged for 1 s; waited for up to ``wait_seconds`` in all): a repeat measured while the
    warm parent still imports would time its imports, not a warm start."""
    import psutil

    environ = dict(os.environ) | env
    started = time.monotonic()
    deadline = started + wait_seconds
    while not running_parents(environ) and time.monotonic() < deadline:
        time.sleep(0.2)
    ready_after = None
    parents = running_parents(environ)
    if parents:
        with contextlib.suppress(psutil.Error):
            process, last, still_since = psutil.Process(parents[-1][0]), -1.0, time.monotonic()
            while time.monotonic() < deadline:
                used = sum(process.cpu_times()[:2])
                if used != last:
                    last, still_since = used, time.monotonic()
                elif time.monotonic() - still_since >= 1.0:
                    ready_after = still_since - started
                    break
                time.sleep(0.1)
    facts = dict(enabled=warm_enabled(environ), plain_interpreter=plain_interpreter())
    return facts | dict(running=len(parents), ready_after_seconds=ready_after)
