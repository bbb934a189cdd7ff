"""The GPU suite's sections inside one leaf's training step (``benchmarks/gpu_suite.py``): ``profile``, where a
batched leaf round's time goes, and ``compiled_step``, eager against compiled batched steps.

``profile_leaf`` builds one leaf as ``section_throughput``'s batched run does (``LeafRoundRunner``, one worker, all
devices as one batched computation), runs ``WARMUP_ROUNDS`` rounds, then ``PROFILED_ROUNDS`` under
``torch.profiler`` (CPU, and CUDA on a GPU). Its figures: wall milliseconds per round, the top ``TOP`` ops by self
CUDA time and by self CPU time (calls and milliseconds over the profiled rounds), kernel launches per round (the
CPU side's ``cudaLaunchKernel``-like and ``cudaGraphLaunch`` calls) and the share of round wall time the GPU was busy
(summed kernel, copy and set durations over wall time: an estimate, overlapping kernels count twice). On the CPU the
CUDA figures are None. The profiler records every thread's ops (``profile_all_threads``; without it only the main
thread's, and the worker thread's training would be missing from the tops). Times in milliseconds unless a name
says otherwise.
"""

from __future__ import annotations

import copy
import os
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from devsim.codec import model_to_numpy
from devsim.data.device_shards import Normaliser, ShardPool
from devsim.data.digits import load_digits_split
from devsim.models import build_model
from devsim.training.batched import BatchedTrainer
from devsim.training.graphed_step import GRAPH_OPTIONS
from devsim.training.leaf_runner import LeafRoundRunner
from devsim.training.local import LocalTrainingSpec
from processors.task_processor import TaskDeviceProcessor

WARMUP_ROUNDS = 2
PROFILED_ROUNDS = 3
TOP = 15
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")
NAME_CHARS = 160


def _self_device_us(event) -> float:
    """Self CUDA microseconds of a ``key_averages`` row (the attribute's name differs across torch versions)."""
    for attribute in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, attribute, None)
        if value is not None:
            return float(value)
    return 0.0


def _row(event, cuda: bool) -> dict:
    """One op of ``key_averages``: name, calls, self CUDA ms (None on the CPU) and self CPU ms, all profiled rounds."""
    row = dict(name=str(event.key)[:NAME_CHARS], calls=int(event.count))
    row["self_cuda_ms"] = _self_device_us(event) / 1000 if cuda else None
    return row | {"self_cpu_ms": float(event.self_cpu_time_total) / 1000}


def _gpu_busy_us(prof) -> float:
    """Summed duration (us) of the profile's device-side events: kernels, copies and sets."""
    return sum(
        float(event.time_range.elapsed_us())
        for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    )


def _all_threads_config():
    """Kineto's config that records ops of every thread (the leaf trains in its worker thread), or None where this
    torch has no ``profile_all_threads``."""
    try:
        return torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except (AttributeError, TypeError):
        return None


def profile_leaf(settings: dict, device: str, devices: int) -> dict:
    """Profile of one leaf's batched round (``settings`` of ``TaskDeviceProcessor``, ``devices`` devices as one
    group): see the module docstring for the figures."""
    cuda = device.startswith("cuda")
    if not cuda:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    torch.manual_seed(0)
    weights = model_to_numpy(build_model(settings["model"]))
    processor = TaskDeviceProcessor.from_settings(settings, compute_device=device)
    runner = LeafRoundRunner([processor], device_batch=devices)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    config = _all_threads_config()
    try:
        for _ in range(WARMUP_ROUNDS):
            runner.run_round(0, weights, list(range(devices)))
        synchronize(device)
        with profile(activities=activities, experimental_config=config) as prof:
            started = time.perf_counter()
            for _ in range(PROFILED_ROUNDS):
                runner.run_round(0, weights, list(range(devices)))
            synchronize(device)
            wall = time.perf_counter() - started
        compile_reason = processor.compile_choice().reason
    finally:
        runner.close()
    averages = list(prof.key_averages())
    calls = {event.key: int(event.count) for event in averages}
    out = dict(compile=settings.get("compile", "auto"), compile_choice=compile_reason, devices=devices)
    out["all_threads"] = config is not None  # False: only the main thread's ops (not the training) are in the tops
    out.update(profiled_rounds=PROFILED_ROUNDS, round_ms=1000 * wall / PROFILED_ROUNDS)
    out["top_self_cpu"] = [_row(e, cuda) for e in sorted(averages, key=lambda e: -e.self_cpu_time_total)[:TOP]]
    if not cuda:
        return out | dict(top_self_cuda=None, launches_per_round=None, graph_launches_per_round=None, gpu_busy=None)
    out["top_self_cuda"] = [_row(e, cuda) for e in sorted(averages, key=lambda e: -_self_device_us(e))[:TOP]]
    launches = sum(calls.get(name, 0) for name in LAUNCHES)
    graphs = sum(calls.get(name, 0) for name in GRAPH_LAUNCHES)
    out.update(
        launches_per_round=(launches + graphs) / PROFILED_ROUNDS, graph_launches_per_round=graphs / PROFILED_ROUNDS
    )
    return out | {"gpu_busy": _gpu_busy_us(prof) / 1e6 / wall}


def graph_launch_costs(device: str, kernel_counts=(16, 128, 1024), replays: int = 20) -> dict | None:
    """One CUDA graph replay of ``kernel_counts`` tiny kernels: median microseconds until ``replay()`` returns, the GPU
    idle (``host_us``: the launch's CPU cost), and until the GPU has run it (``wall_us``); None without CUDA. Per launch
    or per kernel says if one graph for a call's steps would pay (a graphed CNN step: ~0.48 ms, any group size)."""
    if not device.startswith("cuda"):
        return None
    values, out = torch.zeros(256, device=device), {}
    values.add_(1.0)  # warm-up before any capture
    for kernels in kernel_counts:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(kernels):
                values.add_(1.0)
        host, wall = [], []
        for _ in range(replays + 1):
            torch.cuda.synchronize()
            started = time.perf_counter()
            graph.replay()
            host.append(time.perf_counter() - started)
            torch.cuda.synchronize()
            wall.append(time.perf_counter() - started)
        out[str(kernels)] = {"host_us": 1e6 * statistics.median(host[1:]), "wall_us": 1e6 * statistics.median(wall[1:])}
    return out


def synchronize(device: str) -> None:
    """Wait for the GPU's queued work (``device`` "cuda"; nothing on the CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def lockstep_seconds(trainer: BatchedTrainer, pool: ShardPool, start: list[torch.Tensor], device: str, calls: int):
    """(seconds of the first call, best seconds of ``calls`` more, the deltas) of training every device of ``pool``
    from ``start`` with fixed batch orders."""
    count = len(pool.indices)
    timed = []
    for _ in range(calls + 1):
        synchronize(device)
        started = time.perf_counter()
        deltas, _ = trainer.train_pool(
            list(range(count)), start, pool, [torch.Generator().manual_seed(i) for i in range(count)]
        )
        synchronize(device)
        timed.append(time.perf_counter() - started)
    return timed[0], min(timed[1:]), deltas


def section_compiled_step(args, size: dict) -> dict:
    """Seconds per device of one batched group's training, eager against compiled, groups of several sizes. The
    default inductor arm runs on the CPU only: on the H200 it compiled 4.4-9.8 s per group size and replayed slower
    than graphs (2026-11-27), and with it the section did not fit its budget. (Graphs with the channels-last fold were
    measured on the H200 at 3.27 / 3.31 / 1.42 ms a device against 2.38 / 1.20 / 1.11, and dropped, 2026-11-28.)"""
    device = torch.device(args.device)
    train = load_digits_split(True)
    inputs = torch.from_numpy(train.images).to(device)
    targets = torch.from_numpy(train.labels).to(device)
    spec = LocalTrainingSpec(epochs=1, batch_size=10, lr=0.05)
    modes = {"eager": None, "graphs": dict(GRAPH_OPTIONS)}
    if args.device == "cuda":
        modes["reduce_overhead"] = {"mode": "reduce-overhead"}
    else:
        modes["compiled"] = {}
    torch.manual_seed(0)
    model = build_model("cnn")
    trainers = {
        name: BatchedTrainer(copy.deepcopy(model), spec, device, compile_options=options)
        for name, options in modes.items()
    }
    state = model.state_dict()
    start = [state[key].detach().to(device) for key in trainers["eager"].keys]
    samples = size["step_samples"]
    figures: dict = {}
    for group in size["step_groups"]:
        rows = [torch.arange(i * samples, (i + 1) * samples, device=device) % len(targets) for i in range(group)]
        pool = ShardPool(inputs, targets, rows, Normaliser(train.mean, train.std))
        row: dict = {}
        eager = None
        for name, trainer in trainers.items():
            try:
                first, best, deltas = lockstep_seconds(trainer, pool, start, args.device, calls=3)
            except Exception as error:  # noqa: BLE001 - a mode that cannot compile here is a finding, not a failure
                row[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
                continue
            row[name] = {"first_call_seconds": first, "ms_per_device": 1000 * best / group}
            if eager is None:
                eager = (best, deltas)
            else:
                row[name]["speedup"] = eager[0] / best
                row[name]["max_delta_difference"] = max(
                    float((a - b).abs().max()) for a, b in zip(eager[1], deltas, strict=True)
                )
        figures[f"group_{group}"] = row
    return figures
