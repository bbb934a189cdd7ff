"""The GPU suite's ``profile`` section (``benchmarks/gpu_suite.py``): where a batched leaf round's time goes.

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

import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from devsim.codec import model_to_numpy
from devsim.models import build_model
from devsim.training.leaf_runner import LeafRoundRunner
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
        if cuda:
            torch.cuda.synchronize()
        with profile(activities=activities, experimental_config=config) as prof:
            started = time.perf_counter()
            for _ in range(PROFILED_ROUNDS):
                runner.run_round(0, weights, list(range(devices)))
            if cuda:
                torch.cuda.synchronize()
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
