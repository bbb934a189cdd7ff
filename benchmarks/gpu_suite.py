"""The GPU suite: every figure of the GPU issues measured in one run, written to one JSON file.

Sections in order of importance (``BUDGETS``; the default is the first seven; each section function's docstring says
what it measures): ``fedavg_e2e``, ``throughput``, ``profile``, ``async_throughput``, ``worker_sweep``, ``fedrevive``,
``tf32``, ``cudnn_benchmark``, ``compiled_step``, ``async_revive``. A section starts only while half its budget is left
of ``--budget`` (default 360 s, one device call of at most 6 minutes), runs in its own child process
(``benchmarks/gpu_suite_child.py``: a crash, a Python error or the time limit of one section is recorded under
``errors`` and the next section runs), its job runs are killed at twice its budget and the child at twice what is left
of it, and the figures are written after every section. ``gpu_suite.py check FILE`` (``benchmarks/gpu_suite_check.py``)
prints every target beside its figure.
``--device cpu --tiny`` is the dry run (tiny sizes, CPU only; a test runs it); ``scripts/gpu_suite.sh run`` runs the
suite on the GPU machine:

    .venv/bin/python benchmarks/gpu_suite.py --device cpu --tiny --out /tmp/gpu_suite.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import gpu_suite_profile as profiling  # noqa: E402
from benchmarks.gpu_suite_child import ChildArgs, child_main, run_section, section_limits  # noqa: E402
from benchmarks.gpu_suite_jobs import (  # noqa: E402
    job_env,
    job_figures,
    run_job,
    section_async_revive,
    section_async_throughput,
    section_fedrevive,
    warm_parent_facts,
)
from benchmarks.harness import short_commit  # noqa: E402
from devsim.codec import model_to_numpy  # noqa: E402
from devsim.models import build_model  # noqa: E402
from devsim.resources.leaf_plan import LeafPlan, plan_leaf  # noqa: E402
from devsim.resources.precision import apply_cudnn_benchmark, apply_tf32  # noqa: E402
from devsim.resources.workers import plan_workers  # noqa: E402
from devsim.training.leaf_runner import LeafRoundRunner  # noqa: E402
from devsim_flare.launch.warm_parent import stop_parents  # noqa: E402
from processors.task_processor import TaskDeviceProcessor  # noqa: E402

BUDGETS = dict(fedavg_e2e=95, throughput=50, profile=30, async_throughput=95, worker_sweep=20, fedrevive=75)
BUDGETS.update(tf32=15, cudnn_benchmark=35, compiled_step=25, async_revive=90)
"""Every section in order of importance (a run takes them in this order whatever ``--sections`` lists), with the
seconds it is expected to take on an H100 (its job runs are killed at twice that); a section starts only while the
suite's ``--budget`` still holds its share. The default sections' budgets add up to 360 s."""
SECTIONS = tuple(BUDGETS)
DEFAULT_SECTIONS = SECTIONS[:7]
SUITE_BUDGET = 360.0
"""Default ``--budget``: the default sections in one device call of at most 6 minutes, with the wheels' install
(~15 s) and Python's start-up beside them."""

ASYNC_SETTINGS = ("fedavg", "fedbuff B=10", "fedbuff B=2", "fedbuff paper")
LIMIT_BATCH = 256


SIZES = {  # workload size: (the dry run's, seconds on a CPU; the real suite's)
    "rounds": (2, 10),
    "resnet_devices": (20, 1000),
    "resnet_selected": (4, 100),
    "leaf_devices": (4, 64),
    "leaf_samples": (20, 100),
    "central_samples": (64, 8192),
    "sweep": ([1, 2], [1, 2, 4, 8, 16]),
    "sweep_groups": ([1], [1, 2, 4]),
    "resnet_rounds": (2, 5),
    "resnet_leaf_devices": (2, 64),
    "revive_versions": (8, 30),
    "models": (["cnn"], ["cnn", "resnet18"]),
    "async_updates": (80, 800),
    "async_settings": (["fedavg", "fedbuff B=2"], list(ASYNC_SETTINGS)),
    "step_groups": ([2], [2, 4, 10]),
    "step_samples": (20, 100),
    "revive_updates": (80, 1200),
    "revive_repeats": (1, 2),
}


def sizes(tiny: bool) -> dict:
    """Workload sizes: the real suite's, or the dry run's."""
    return {key: values[0 if tiny else 1] for key, values in SIZES.items()}


def machine_facts(device: str) -> dict:
    """Device name, versions and host facts recorded with every figure."""
    facts = dict(device=device, torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version())
    facts.update(cpu_cores=len(os.sched_getaffinity(0)), load_average_start=os.getloadavg()[0])
    facts["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
        facts.update(cudnn=torch.backends.cudnn.version(), tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
        facts["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    facts["git_commit"] = short_commit() or None
    facts["host_seconds"] = host_seconds()
    try:
        facts["graph_launch"] = profiling.graph_launch_costs(device)  # None on the CPU
    except Exception as error:  # noqa: BLE001 - a probe that fails here must not cost the suite its figures
        facts["graph_launch"] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    return facts


HOST_PROBES = {
    "interpreter": "pass",
    "import_torch": "import torch",
    "import_torch_again": "import torch",
    "import_dynamo": "import torch._dynamo",  # the leaves' fork server's first import; any torch.optim needs it
    "import_dynamo_no_gc": "import gc; gc.disable(); import torch._dynamo",  # as the launch's processes import now
    "import_nvflare": "import nvflare.collab, nvflare.private.fed.app.simulator.simulator",
    "python_loop": "sum(i * i for i in range(3_000_000))",
}
"""What the host's own speed is measured by, each in a new interpreter: wall seconds, to set the launch's imports
against the 2-core CPU's (there: interpreter 0.02 s, torch 1.0-1.1 s, torch._dynamo with torch 2.2-2.8 s, the same
without automatic garbage collection 2.0-2.2 s, NVFlare 0.2 s, the loop 0.11 s)."""


def host_seconds() -> dict[str, float | None]:
    """Wall seconds of each of :data:`HOST_PROBES` in a new interpreter (None when it failed)."""
    out: dict[str, float | None] = {}
    for name, code in HOST_PROBES.items():
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0
        out[name] = round(time.perf_counter() - started, 3) if done else None
    return out


def centralized_rate(model_name: str, device: str, batch: int, samples: int) -> float:
    """Samples/s of one model trained by a plain SGD loop on random 32x32x3 images (after one warm-up pass)."""
    torch.manual_seed(0)
    model = build_model(model_name).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(max(samples, batch), 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (images.shape[0],), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def one_pass() -> int:
        seen = 0
        for start in range(0, images.shape[0] - batch + 1, batch):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(images[start : start + batch]), labels[start : start + batch]).backward()
            opt.step()
            seen += batch
        return seen

    one_pass()
    profiling.synchronize(device)
    started = time.perf_counter()
    seen = one_pass()
    profiling.synchronize(device)
    return seen / (time.perf_counter() - started)


def leaf_settings(model_name: str, devices: int, samples: int) -> dict:
    """The leaf benchmark's run settings: synthetic data, iid shards, batch 10, one epoch."""
    settings = dict(dataset="synthetic", synthetic_train_size=max(2000, devices * samples), synthetic_test_size=100)
    return settings | dict(
        model=model_name, partition="iid", samples_per_device=samples, batch_size=10, local_epochs=1, seed=0
    )


def auto_plan(model_name: str, device: str, devices: int, samples: int) -> LeafPlan:
    """The plan a leaf of one (alone on this host and GPU) takes for ``devices`` at once (``plan_leaf``)."""
    first = TaskDeviceProcessor.from_settings(leaf_settings(model_name, devices, samples), compute_device=device)
    first.setup()
    timed = functools.partial(first.batching_obstacle, timed=True)
    sizes = dict(num_params=int(first.num_params), device_bytes=first.batched_device_bytes(), devices_at_once=devices)
    return plan_leaf(device=device, batch_size=10, device_batch_setting="auto", obstacle=timed, **sizes)


def leaf_rate(model: str, device: str, devices: int, samples: int, workers: int, batch: int, seconds=None, fill=False):
    """Median device-samples/s of one leaf (``workers`` processors of this suite's leaf settings on ``device``,
    ``batch`` devices a computation, groups filled first with ``fill``) training devices 0..``devices``-1 from the
    same global model over rounds 2 and 3, and the last round's leaf delta sum (name -> array); every round's
    seconds are appended to the list ``seconds`` when given. Every round is round 0, so every setting trains the
    same batches. On the CPU torch gets usable cores / workers threads."""
    settings = leaf_settings(model, devices, samples)
    if device == "cpu":
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))
    torch.manual_seed(0)
    weights = model_to_numpy(build_model(model))
    processors = [TaskDeviceProcessor.from_settings(settings, compute_device=device) for _ in range(workers)]
    runner = LeafRoundRunner(processors, device_batch=batch, fill_groups=fill)
    rates, result = [], None
    try:
        for round_num in range(3):
            started = time.perf_counter()
            result = runner.run_round(0, weights, list(range(devices)))
            profiling.synchronize(device)
            if seconds is not None:
                seconds.append(time.perf_counter() - started)
            if round_num:
                rates.append(devices * samples / (time.perf_counter() - started))
    finally:
        runner.close()
    return statistics.median(rates), result.delta_sum


def leaf_shape(size: dict, model_name: str) -> tuple[int, int]:
    """(devices, samples per device) of one leaf's round for ``model_name``."""
    return (size["leaf_devices"], size["leaf_samples"]) if model_name == "cnn" else (size["resnet_leaf_devices"], 10)


def section_throughput(args, size: dict) -> dict:
    """One leaf's device-samples/s through the thread pool, batched in one group, and with the leaf's own plan
    (``plan_leaf``), against centralized training at batch 10 and 256 (the limit), per model."""
    out = {}
    for model_name in size["models"]:
        if time.monotonic() > args.section_deadline:
            out[model_name] = {"skipped": "the section's budget ran out"}
            continue
        devices, samples = leaf_shape(size, model_name)
        central_10 = centralized_rate(model_name, args.device, 10, size["central_samples"])
        central_limit = centralized_rate(model_name, args.device, LIMIT_BATCH, size["central_samples"])
        params = sum(p.numel() for p in build_model(model_name).parameters())
        workers = plan_workers(device=args.device, num_params=params, batch_size=10).num_workers
        pool, _ = leaf_rate(model_name, args.device, devices, samples, workers, 1)
        batched, _ = leaf_rate(model_name, args.device, devices, samples, 1, devices)
        plan = auto_plan(model_name, args.device, devices, samples)
        auto, _ = leaf_rate(
            model_name, args.device, devices, samples, plan.num_workers, plan.device_batch, fill=plan.fill_groups
        )
        row = dict(devices=devices, samples_per_device=samples, centralized_batch10=central_10)
        row[f"centralized_batch{LIMIT_BATCH}"] = central_limit
        row.update(pool_workers=workers, pool=pool, batched_1_worker=batched, auto_plan=plan.reason, auto=auto)
        row.update(pool_vs_limit=pool / central_limit, batched_vs_limit=batched / central_limit)
        out[model_name] = row | dict(auto_vs_limit=auto / central_limit, batched_vs_pool=batched / pool)
    return out


def section_tf32(args, size: dict, switch=apply_tf32) -> dict:
    """One leaf's batched round and centralized batch-256 training with a process-wide ``switch`` (``--tf32``) on
    against off (the suite's default) for each model of ``models``; the first round's seconds; the largest
    difference of the leaf's delta sum between the two, relative to its largest entry. The CPU has no TF32 (nor
    cuDNN: ``cudnn_benchmark``, the same with ``--cudnn-benchmark``): both runs are the same float32 run."""
    out = {}
    for model_name in size["models"]:
        (devices, samples), row, sums = leaf_shape(size, model_name), {}, {}
        for on, name in ((False, "off"), (True, "on")):
            switch(on)
            seconds: list[float] = []
            row[f"leaf_{name}"], sums[name] = leaf_rate(model_name, args.device, devices, samples, 1, devices, seconds)
            row[f"leaf_first_round_seconds_{name}"] = seconds[0]
            row[f"centralized_{name}"] = centralized_rate(model_name, args.device, LIMIT_BATCH, size["central_samples"])
            switch(False)
        scale = max(float(abs(v).max()) for v in sums["off"].values())
        difference = max(float(abs(sums["on"][k] - sums["off"][k]).max()) for k in sums["off"]) / scale
        row.update(leaf_gain=row["leaf_on"] / row["leaf_off"], max_relative_difference=difference)
        out[model_name] = row | {"centralized_gain": row["centralized_on"] / row["centralized_off"]}
    return out


def section_cudnn_benchmark(args, size: dict) -> dict:
    """``tf32``'s measurement with ``--cudnn-benchmark`` as the switch; time left, the last model's round profiled with
    the search on (``profile_on``: with it off, a quarter of ResNet-18's H200 kernel time was layout transposes)."""
    out, model = section_tf32(args, size, switch=apply_cudnn_benchmark), size["models"][-1]
    if time.monotonic() < args.section_deadline:  # the section's own child process: the switch ends with it
        devices, samples = leaf_shape(size, model)
        apply_cudnn_benchmark(True)
        out[model]["profile_on"] = profiling.profile_leaf(leaf_settings(model, devices, samples), args.device, devices)
    return out


def section_worker_sweep(args, size: dict) -> dict:
    """The leaf's own plan (``plan_leaf``: workers and devices per batched computation) against a sweep: the thread
    pool at several worker counts, and groups first at several worker counts (``ceil(devices / workers)`` devices a
    group). CNN, one leaf, ``leaf_devices`` devices a round."""
    devices, samples = size["leaf_devices"], size["leaf_samples"]
    plan = auto_plan("cnn", args.device, devices, samples)
    rates: dict[str, float] = {}
    for workers in size["sweep"]:
        if time.monotonic() < args.section_deadline:
            rates[f"pool {workers}"] = leaf_rate("cnn", args.device, devices, samples, workers, 1)[0]
    for workers in size["sweep_groups"]:
        if time.monotonic() < args.section_deadline:
            batch = -(-devices // workers)
            rate, _ = leaf_rate("cnn", args.device, devices, samples, workers, batch, fill=True)
            rates[f"groups {workers}x{batch}"] = rate
    auto, _ = leaf_rate(
        "cnn", args.device, devices, samples, plan.num_workers, plan.device_batch, fill=plan.fill_groups
    )
    best = max(rates, key=rates.get)
    out = dict(auto_plan=plan.reason, auto_workers=plan.num_workers, auto_device_batch=plan.device_batch)
    out.update(auto_samples_per_s=auto, samples_per_s=rates, best=best)
    return out | {"auto_vs_best": auto / max(rates[best], auto)}


def section_fedavg_e2e(args, size: dict) -> dict:
    """The CNN job at its defaults (against centralized training of the CNN at batch 256 on this device) twice (the
    second run's start is a user's next run's: warm parent, caches) and ResNet-18 with many devices, end to end,
    with each run's start-up breakdown; time left, the CNN's first launch once more with its fork servers forked
    after the command's imports (``DEVSIM_EARLY_FORK=0``, fresh caches), against the first run's early ones."""
    rounds = ["--num-rounds", str(size["rounds"]), "--eval-frequency", str(size["rounds"])]
    if args.tiny:
        rounds += ["--synthetic-test-size", "100"]
    with tempfile.TemporaryDirectory(prefix="devsim-suite-cache-") as cache:
        env = job_env(args) | {"DEVSIM_CACHE_DIR": cache, "HOME": cache}  # one warm parent's key for both runs
        try:
            cnn = run_job("pt_job_fedavg.py", [*rounds, "--checkpoint-frequency", "0"], env, args.timeout)
            config = cnn["config"]
            cnn_samples = (config["device_selection_size"] or config["devices_per_leaf"]) * config["samples_per_device"]
            out = {"cnn_default": job_figures(cnn, cnn_samples * config["num_leaf_nodes"])}
            if not args.tiny and time.monotonic() < args.section_deadline:  # again: the start a user's next run sees
                out["warm_parent"] = warm_parent_facts(env)
                again = run_job("pt_job_fedavg.py", [*rounds, "--checkpoint-frequency", "0"], env, args.timeout)
                out["cnn_repeat"] = job_figures(again, cnn_samples * config["num_leaf_nodes"])
        finally:
            stop_parents(dict(os.environ) | env)
    limit = centralized_rate("cnn", args.device, LIMIT_BATCH, size["central_samples"])
    out["cnn_default"]["centralized_batch256"] = limit
    out["cnn_default"]["vs_limit"] = out["cnn_default"]["device_samples_per_s"] / limit
    if time.monotonic() > args.section_deadline:
        return out
    resnet_rounds = ["--num-rounds", str(size["resnet_rounds"]), "--eval-frequency", str(size["resnet_rounds"])]
    per_leaf, selected = size["resnet_devices"] // 2, size["resnet_selected"]
    resnet_flags = [
        *resnet_rounds,
        *(["--synthetic-test-size", "100"] if args.tiny else []),
        *("--model", "resnet18", "--devices-per-leaf", str(per_leaf), "--device-selection-size", str(selected)),
        *("--samples-per-device", "10", "--partition", "iid", "--checkpoint-frequency", "0"),
        *("--synthetic-train-size", str(max(2000, per_leaf * 2 * 10))),
    ]
    try:
        resnet = run_job("pt_job_fedavg.py", resnet_flags, job_env(args), args.timeout)
    except RuntimeError as error:  # the CNN's figures above still count
        out["resnet18_1000_devices"] = {"error": str(error)[-2000:]}
        return out
    out["resnet18_1000_devices"] = job_figures(resnet, selected * 10)
    if not args.tiny and time.monotonic() < args.section_deadline:  # the first launch again, fork servers as before
        with tempfile.TemporaryDirectory(prefix="devsim-suite-cache-") as fresh:
            usual = job_env(args) | {"DEVSIM_CACHE_DIR": fresh, "HOME": fresh, "DEVSIM_WARM": "0"}
            usual["DEVSIM_EARLY_FORK"] = "0"
            cold = run_job("pt_job_fedavg.py", [*rounds, "--checkpoint-frequency", "0"], usual, args.timeout)
        out["cnn_cold_usual_fork"] = job_figures(cold, cnn_samples * config["num_leaf_nodes"])
    return out


def section_profile(args, size: dict) -> dict:
    """Where one leaf's batched round's time goes (``benchmarks/gpu_suite_profile.py``), with the leaf's default
    settings: the CNN (``default``), ``leaf_devices`` devices as one group, then ResNet-18 (``resnet18``, the leaf
    farthest from its target), ``resnet_leaf_devices`` devices of 10 samples; batch 10, one epoch. (Compile off
    against on was profiled in three H200 sessions: 129-188 ms a round and 5,000-7,000 launches against 60-75 ms.)"""
    devices, samples = size["leaf_devices"], size["leaf_samples"]
    out = {"default": profiling.profile_leaf(leaf_settings("cnn", devices, samples), args.device, devices)}
    if time.monotonic() < args.section_deadline:
        resnet = size["resnet_leaf_devices"]
        out["resnet18"] = profiling.profile_leaf(leaf_settings("resnet18", resnet, 10), args.device, resnet)
    return out


RUNNERS = {
    "fedavg_e2e": section_fedavg_e2e,
    "throughput": section_throughput,
    "worker_sweep": section_worker_sweep,
    "fedrevive": section_fedrevive,
    "profile": section_profile,
    "async_throughput": section_async_throughput,
    "compiled_step": profiling.section_compiled_step,
    "tf32": section_tf32,
    "cudnn_benchmark": section_cudnn_benchmark,
    "async_revive": section_async_revive,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"]:
        from benchmarks.gpu_suite_check import main as check_main

        return check_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="dry-run sizes (seconds on a CPU)")
    parser.add_argument("--sections", default=",".join(DEFAULT_SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    parser.add_argument("--out", default=None, help="JSON file of figures (default: $OUT/gpu_suite.json or stdout)")
    parser.add_argument("--timeout", type=float, help="seconds a job run may take (default: twice its section budget)")
    parser.add_argument("--budget", type=float, default=SUITE_BUDGET, help="seconds for the whole suite (0: no limit)")
    # the suite runs each section in a child process of this script (benchmarks/gpu_suite_child.py):
    parser.add_argument("--section-child", choices=SECTIONS, help=argparse.SUPPRESS)
    parser.add_argument("--part", help=argparse.SUPPRESS)  # the child's figures or error, as JSON
    parser.add_argument("--section-seconds", type=float, help=argparse.SUPPRESS)  # the child's section deadline
    parser.add_argument("--child-limit", type=float, help=argparse.SUPPRESS)  # seconds before the parent stops it
    args = parser.parse_args(argv)
    apply_tf32(False)  # what the jobs' processes run by default (torch leaves cuDNN's TF32 on); `tf32` sets its arms
    apply_cudnn_benchmark(False)  # the jobs' default too; `cudnn_benchmark` sets its arms
    if args.section_child:
        return _section_child(args)
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    if unknown := sorted(set(chosen) - set(SECTIONS)):
        parser.error(f"--sections: unknown {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible; use --device cpu for the dry run")
    out_path = args.out or (os.path.join(os.environ["OUT"], "gpu_suite.json") if os.environ.get("OUT") else None)
    suite_started = time.monotonic()
    suite_deadline = suite_started + args.budget if args.budget > 0 else float("inf")
    fixed_timeout = args.timeout
    report = dict(machine=machine_facts(args.device), tiny=args.tiny, budget_seconds=args.budget, sections={})
    report.update(section_seconds={}, skipped={}, errors={})
    for name in [s for s in SECTIONS if s in chosen]:
        left = suite_deadline - time.monotonic()
        budget = BUDGETS[name]
        if not args.tiny and left < budget / 2:
            report["skipped"][name] = f"{left:.0f} s left of the suite's --budget; the section's budget is {budget} s"
            print(f"[gpu_suite] {name} skipped: {report['skipped'][name]}", flush=True)
            continue
        started = time.perf_counter()
        print(f"[gpu_suite] {name} (budget {budget} s, {left:.0f} s left) ...", flush=True)
        unlimited = args.tiny or args.budget <= 0
        args.timeout, limit = section_limits(budget, left, unlimited, fixed_timeout)
        command = [sys.executable, os.path.abspath(__file__), "--device", args.device, "--section-child", name]
        command += ["--timeout", str(args.timeout), "--child-limit", str(limit), *(["--tiny"] if args.tiny else [])]
        if not unlimited:
            command += ["--section-seconds", str(min(budget, left))]
        part, error = run_section(name, command, limit)
        if part is not None and part.get("figures") is not None:
            report["sections"][name] = part["figures"]
            report["sections"][name]["suite_peak_gpu_memory_mib"] = part.get("peak_gpu_memory_mib")
        if error is not None:
            report["errors"][name] = error
            print(f"[gpu_suite] {name} failed: {error.strip().splitlines()[-1][:200]}", file=sys.stderr, flush=True)
        report["section_seconds"][name] = time.perf_counter() - started
        report["suite_seconds"] = time.monotonic() - suite_started
        print(f"[gpu_suite] {name} done in {report['section_seconds'][name]:.1f}s", flush=True)
        if out_path:
            _write(out_path, report)
    report["machine"]["load_average_end"] = os.getloadavg()[0]
    report["suite_seconds"] = time.monotonic() - suite_started
    if out_path:
        _write(out_path, report)
        print(f"[gpu_suite] figures in {out_path} ({report['suite_seconds']:.0f} s)")
    else:
        print(json.dumps(report, indent=2, default=str))
    return 1 if report["errors"] else 0


def _section_child(args) -> int:
    """One section in this (child) process: its figures or error into ``args.part``."""
    seconds = args.section_seconds
    args.section_deadline = time.monotonic() + seconds if seconds is not None else float("inf")
    runner = functools.partial(RUNNERS[args.section_child], ChildArgs(args, args.child_limit), sizes(args.tiny))
    return child_main(args.section_child, runner, args.device, args.part)


def _write(path: str, report: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(report, stream, indent=2, default=str)


if __name__ == "__main__":
    sys.exit(main())
