"""The GPU suite: every figure of issue #19 measured in one run, written to one JSON file.

Sections (``--sections``, default all), each a ratio measured in this run where it compares:

1. ``fedavg_e2e``: ``jobs/pt_job_fedavg.py`` end to end in NVFlare's simulator, for the CNN at its
   defaults and for ResNet-18 with 1,000 devices (100 selected a round, 10 samples each): round
   seconds, the timing breakdown, seconds from launch to the first finished round, the leaves'
   worker plans, and the GPU memory the run used at its peak (device-wide, polled).
2. ``throughput``: device-samples/s of one leaf (``LeafRoundRunner``, no NVFlare) training many
   devices, through the thread pool and batched (``device_batch``), against centralized training of
   the same model on the same device at the devices' batch size and at batch 256 (the limit).
3. ``worker_sweep``: the leaf's automatic worker count (``plan_workers``) against a sweep of counts.
4. ``fedrevive``: FedRevive's server distillation seconds per arrival at the paper's setting size
   (ResNet-18 without norm, generator width 128, 8 teachers, 10 KD steps) on the synthetic images.
5. ``shared_gpu``: two leaves on one GPU against one leaf alone, same work per leaf.
6. ``compression``: ``benchmarks/compression.py`` on the real digits (issue #17): uplink bytes,
   accuracy against ``none``, and encode + decode seconds as a share of the leaf's round when the
   devices train and the codecs run on this device (``torch.topk`` and torch reductions on a GPU).
7. ``compression_job``: ``benchmarks/compression_job.py``, the codecs inside the FedAvg job on digits
   (seeds 0 and 1): codec seconds against the round's wall time, summed over the leaves and on the
   critical leaf, and accuracy against ``none``.
8. ``async_throughput`` (issue #31 on this device): ``benchmarks/async_throughput.py``'s settings (digits CNN,
   2 leaves x 50 devices, the same device updates each): FedBuff's steady updates/s at B = 10, B = 2 and the
   paper's shape against FedAvg's, and each setting's wall per update against one tight loop training the same
   updates on this device.
9. ``compiled_step``: the batched trainer's whole lockstep for groups of 2, 4 and 10 digits CNNs, eager against
   ``torch.compile`` (default mode, and ``reduce-overhead``'s CUDA graphs on a GPU): seconds per device, the
   first (compiling) call, and the largest difference of the deltas. On the CPU a compiled step is 1.5-2x faster
   but each group size compiles for seconds (docs/concepts.md); on a GPU a small group's step is expected to be
   bound by kernel launches, which CUDA graphs remove.

``--device cpu --tiny`` is the dry run (tiny sizes, CPU only; a test runs it). On the GPU machine
``scripts/gpu_suite.sh run`` installs the carried wheels and runs this with ``--device cuda``.

    .venv/bin/python benchmarks/gpu_suite.py --device cpu --tiny --out /tmp/gpu_suite.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402

from benchmarks.async_throughput import run_setting, settings, tight_loop_per_update  # noqa: E402
from benchmarks.gpu_suite_jobs import VramMonitor, run_job  # noqa: E402
from devsim.codec import model_to_numpy  # noqa: E402
from devsim.data.device_shards import Normaliser, ShardPool  # noqa: E402
from devsim.data.digits import load_digits_split  # noqa: E402
from devsim.models import build_model  # noqa: E402
from devsim.resources.workers import plan_workers  # noqa: E402
from devsim.training.batched import BatchedTrainer  # noqa: E402
from devsim.training.leaf_runner import LeafRoundRunner  # noqa: E402
from devsim.training.local import LocalTrainingSpec  # noqa: E402
from processors.task_processor import TaskDeviceProcessor  # noqa: E402

SECTIONS = (
    "fedavg_e2e",
    "throughput",
    "worker_sweep",
    "fedrevive",
    "shared_gpu",
    "compression",
    "compression_job",
    "async_throughput",
    "compiled_step",
)
ASYNC_SETTINGS = ("fedavg", "fedbuff B=10", "fedbuff B=2", "fedbuff paper")
CODECS = "none,fp16,int8,topk 10%,topk 1%,topk 4% int8"
LIMIT_BATCH = 256


def sizes(tiny: bool) -> dict:
    """Workload sizes: the real suite, or the dry run's (seconds on a CPU)."""
    if tiny:
        return {
            "rounds": 2,
            "resnet_devices": 20,
            "resnet_selected": 4,
            "leaf_devices": 4,
            "leaf_samples": 20,
            "central_samples": 64,
            "sweep": [1, 2],
            "resnet_leaf_devices": 2,
            "revive_sim_time": 1.0,
            "models": ["cnn"],
            "compression": ["--rounds", "2", "--devices", "10", "--per-round", "4"],
            "compression_job": ["--quick", "--codecs", "none,topk 10%"],
            "async_updates": 80,
            "async_settings": ["fedavg", "fedbuff B=2"],
            "step_groups": [2],
            "step_samples": 20,
        }
    return {
        "rounds": 10,
        "resnet_devices": 1000,
        "resnet_selected": 100,
        "leaf_devices": 64,
        "leaf_samples": 100,
        "central_samples": 8192,
        "sweep": [1, 2, 4, 8, 16],
        "resnet_leaf_devices": 64,
        "revive_sim_time": 20.0,
        "models": ["cnn", "resnet18", "resnet18_nonorm"],
        "compression": ["--rounds", "30"],
        "compression_job": ["--seeds", "0,1"],
        "async_updates": 1200,
        "async_settings": list(ASYNC_SETTINGS),
        "step_groups": [2, 4, 10],
        "step_samples": 100,
    }


def machine_facts(device: str) -> dict:
    """Device name, versions and host facts recorded with every figure."""
    facts = {
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu_cores": len(os.sched_getaffinity(0)),
        "load_average_start": os.getloadavg()[0],
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
        facts["cudnn"] = torch.backends.cudnn.version()
        facts["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        facts["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    try:
        facts["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        facts["git_commit"] = None
    return facts


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


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
    _sync(device)
    started = time.perf_counter()
    seen = one_pass()
    _sync(device)
    return seen / (time.perf_counter() - started)


def leaf_rate(
    model_name: str, device: str, devices: int, samples: int, workers: int, device_batch: int, rounds: int = 3
) -> tuple[float, dict]:
    """Median device-samples/s of one leaf's rounds 2.. (round 1 warms up; one round: that one), batch 10,
    one epoch, and the last round's leaf delta sum (name -> array)."""
    settings = {
        "dataset": "synthetic",
        "synthetic_train_size": max(2000, devices * samples),
        "synthetic_test_size": 100,
        "model": model_name,
        "partition": "iid",
        "samples_per_device": samples,
        "batch_size": 10,
        "local_epochs": 1,
        "seed": 0,
    }
    if device == "cpu":
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))
    processors = [TaskDeviceProcessor.from_settings(settings, compute_device=device) for _ in range(workers)]
    runner = LeafRoundRunner(processors, device_batch=device_batch)
    torch.manual_seed(0)
    weights = model_to_numpy(build_model(model_name))
    rates, result = [], None
    try:
        for round_num in range(rounds):
            started = time.perf_counter()
            result = runner.run_round(round_num, weights, list(range(devices)))
            _sync(device)
            if round_num or rounds == 1:
                rates.append(devices * samples / (time.perf_counter() - started))
    finally:
        runner.close()
    return statistics.median(rates), result.delta_sum


def batched_vs_pool_difference(model_name: str, device: str, devices: int, samples: int, tf32: bool) -> float:
    """Largest |batched - pool| entry of one round's leaf delta sum, relative to the pool sum's largest entry.

    ``tf32`` sets ``torch.backends.cudnn.allow_tf32`` and ``torch.backends.cuda.matmul.allow_tf32`` for
    the comparison (restored after): on a GPU, TF32 convolutions (cuDNN's default) round operands to a
    10-bit mantissa, and the batched path's grouped kernels round differently from the per-device ones.
    """
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        _, pool = leaf_rate(model_name, device, devices, samples, 1, 1, rounds=1)
        _, batched = leaf_rate(model_name, device, devices, samples, 1, devices, rounds=1)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
    scale = max(float(abs(v).max()) for v in pool.values())
    return max(float(abs(batched[k] - pool[k]).max()) for k in pool) / scale


def section_throughput(args, size: dict) -> dict:
    """Pool and batched device-samples/s against centralized training at batch 10 and 256, per model."""
    out = {}
    for model_name in size["models"]:
        devices = size["leaf_devices"] if model_name == "cnn" else size["resnet_leaf_devices"]
        samples = size["leaf_samples"] if model_name == "cnn" else 10
        central_10 = centralized_rate(model_name, args.device, 10, size["central_samples"])
        central_limit = centralized_rate(model_name, args.device, LIMIT_BATCH, size["central_samples"])
        workers = plan_workers(device=args.device, num_params=_params(model_name), batch_size=10).num_workers
        pool, _ = leaf_rate(model_name, args.device, devices, samples, workers, 1)
        batched, _ = leaf_rate(model_name, args.device, devices, samples, 1, devices)
        tf32_settings = (True, False) if args.device == "cuda" else (False,)
        diff = {
            f"tf32_{'on' if on else 'off'}": batched_vs_pool_difference(model_name, args.device, devices, samples, on)
            for on in tf32_settings
        }
        out[model_name] = {
            "devices": devices,
            "samples_per_device": samples,
            "centralized_batch10": central_10,
            f"centralized_batch{LIMIT_BATCH}": central_limit,
            "pool_workers": workers,
            "pool": pool,
            "batched_1_worker": batched,
            "pool_vs_limit": pool / central_limit,
            "batched_vs_limit": batched / central_limit,
            "batched_vs_pool": batched / pool,
            "batched_vs_pool_max_relative_difference": diff,
        }
    return out


def _params(model_name: str) -> int:
    return sum(p.numel() for p in build_model(model_name).parameters())


def section_worker_sweep(args, size: dict) -> dict:
    """The automatic worker count's throughput against each swept count (CNN, thread pool)."""
    plan = plan_workers(device=args.device, num_params=_params("cnn"), batch_size=10)
    counts = sorted(set(size["sweep"]) | {plan.num_workers})
    rates = {n: leaf_rate("cnn", args.device, size["leaf_devices"], size["leaf_samples"], n, 1)[0] for n in counts}
    best = max(rates, key=rates.get)
    return {
        "auto_plan": plan.reason,
        "auto_workers": plan.num_workers,
        "samples_per_s": {str(n): r for n, r in rates.items()},
        "best_workers": best,
        "auto_vs_best": rates[plan.num_workers] / rates[best],
    }


def _job_env(args) -> dict:
    return {"CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else {}


def _job_figures(run: dict, selected_samples: int) -> dict:
    rounds = run["results"]["rounds"]
    steady = rounds[1:] or rounds
    parts = {k: statistics.mean(r["timing"]["parts"][k] for r in steady) for k in steady[0]["timing"]["parts"]}
    train = statistics.median(r["train_seconds"] for r in steady)
    return {
        "wall_seconds": run["wall_seconds"],
        "first_round_seconds": run["first_round_seconds"],
        "round_seconds_median": statistics.median(r["round_seconds"] for r in steady),
        "train_seconds_median": train,
        "device_samples_per_s": selected_samples / train,
        "timing_mean_parts": parts,
        "final_accuracy": rounds[-1].get("accuracy"),
        "worker_plans": run["worker_lines"],
        "peak_gpu_memory_mib": run["peak_gpu_memory_mib"],
    }


def section_fedavg_e2e(args, size: dict) -> dict:
    """The CNN job at its defaults and ResNet-18 with many devices, end to end."""
    rounds = ["--num-rounds", str(size["rounds"]), "--eval-frequency", str(size["rounds"])]
    if args.tiny:
        rounds += ["--synthetic-test-size", "100"]
    cnn = run_job("pt_job_fedavg.py", [*rounds, "--checkpoint-frequency", "0"], _job_env(args), args.timeout)
    per_leaf, selected = size["resnet_devices"] // 2, size["resnet_selected"]
    resnet_flags = [
        *rounds,
        *("--model", "resnet18", "--devices-per-leaf", str(per_leaf), "--device-selection-size", str(selected)),
        *("--samples-per-device", "10", "--partition", "iid", "--checkpoint-frequency", "0"),
        *("--synthetic-train-size", str(max(2000, per_leaf * 2 * 10))),
    ]
    resnet = run_job("pt_job_fedavg.py", resnet_flags, _job_env(args), args.timeout)
    cnn_selected = cnn["results"]["config"]["device_selection_size"] or cnn["results"]["config"]["devices_per_leaf"]
    cnn_samples = cnn_selected * cnn["results"]["config"]["samples_per_device"]
    return {
        "cnn_default": _job_figures(cnn, cnn_samples * cnn["results"]["config"]["num_leaf_nodes"]),
        "resnet18_1000_devices": _job_figures(resnet, selected * 10),
    }


def section_fedrevive(args, size: dict) -> dict:
    """Server distillation seconds per arrival at the paper's setting size, synthetic images."""
    flags = [
        *("--preset", "fedrevive_paper_cifar10_shifted", "--dataset", "synthetic", "--data-root", "none"),
        *("--max-sim-time", str(size["revive_sim_time"]), "--freeze-version", "2", "--warmup-version", "4"),
        *("--eval-frequency", "1000000", "--checkpoint-frequency", "0"),
    ]
    if args.tiny:
        flags += ["--devices-per-leaf", "10", "--samples-per-device", "20", "--concurrency", "4"]
        flags += ["--local-iterations", "2", "--kd-iterations", "2", "--generator-width", "16"]
        flags += ["--model", "cnn", "--max-versions", "8", "--max-sim-time", "none", "--synthetic-test-size", "100"]
    run = run_job("pt_job_fedrevive.py", flags, _job_env(args), args.timeout)
    summary = run["results"]["summary"]
    return {
        "wall_seconds": run["wall_seconds"],
        "summary": summary,
        "revive_seconds_per_arrival": summary.get("revive_seconds_per_arrival"),
        "peak_gpu_memory_mib": run["peak_gpu_memory_mib"],
    }


def section_shared_gpu(args, size: dict) -> dict:
    """Per-leaf throughput with two leaves on one GPU against one leaf alone (same work per leaf)."""
    common = ["--num-rounds", str(size["rounds"]), "--eval-frequency", str(size["rounds"])]
    common += ["--devices-per-leaf", "20", "--checkpoint-frequency", "0", "--partition", "iid"]
    if args.tiny:
        common += ["--samples-per-device", "20", "--synthetic-test-size", "100"]
    gpu = ["--gpus", "0"] if args.device == "cuda" else []
    one = run_job("pt_job_fedavg.py", [*common, "--num-leaf-nodes", "1", *gpu], _job_env(args), args.timeout)
    two = run_job("pt_job_fedavg.py", [*common, "--num-leaf-nodes", "2", *gpu], _job_env(args), args.timeout)
    per_leaf = 20 * one["results"]["config"]["samples_per_device"]
    alone = _job_figures(one, per_leaf)
    shared = _job_figures(two, 2 * per_leaf)
    return {
        "one_leaf": alone,
        "two_leaves": shared,
        "two_leaves_vs_one_total_throughput": shared["device_samples_per_s"] / alone["device_samples_per_s"],
    }


def _script_json(args, script: str, flags: list[str]) -> dict:
    """Run ``benchmarks/<script>`` with ``flags`` and ``--json`` into a temporary file; the JSON it wrote."""
    with tempfile.TemporaryDirectory(prefix="gpu_suite_script_") as folder:
        out = os.path.join(folder, "report.json")
        command = [sys.executable, os.path.join(REPO, "benchmarks", script), *flags, "--json", out]
        env = dict(os.environ, **_job_env(args))
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{script} failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        with open(out, encoding="utf-8") as stream:
            return json.load(stream)


def section_compression(args, size: dict) -> dict:
    """The codecs side by side on digits, at the benchmark's default 50 and the jobs' default 100 samples a device."""
    flags = ["--dataset", "digits", *size["compression"], "--codecs", CODECS]
    return {f"samples_{n}": _script_json(args, "compression.py", [*flags, "--samples", n]) for n in ("50", "100")}


def section_compression_job(args, size: dict) -> dict:
    """``benchmarks/compression_job.py``: each codec inside the FedAvg job (digits), its codec seconds against the
    round's wall time with the leaves training and coding on this device."""
    return _script_json(args, "compression_job.py", size["compression_job"])


def section_async_throughput(args, size: dict) -> dict:
    """FedBuff's device updates/s against FedAvg's on the same work, and against a tight loop on this device."""
    leaves, per_leaf = 2, 50
    common = ["--dataset", "digits", "--num-leaf-nodes", str(leaves), "--devices-per-leaf", str(per_leaf)]
    runs = settings(size["async_updates"], leaves, per_leaf)
    rows = {name: run_setting(*runs[name], common, args.timeout, leaves) for name in size["async_settings"]}
    loop_per_update = tight_loop_per_update("digits", leaves, args.device)
    fedavg = rows["fedavg"]["updates_per_s"]
    for row in rows.values():
        row["ratio_to_fedavg"] = row["updates_per_s"] / fedavg
        row["ratio_to_tight_loop"] = 1 / row["updates_per_s"] / loop_per_update
    return {"tight_loop_ms_per_update": 1000 * loop_per_update, "settings": rows}


def lockstep_seconds(trainer: BatchedTrainer, pool: ShardPool, start: list[torch.Tensor], device: str, calls: int):
    """(seconds of the first call, best seconds of ``calls`` more, the deltas) of training every device of ``pool``
    from ``start`` with fixed batch orders."""
    count = len(pool.indices)
    timed = []
    for _ in range(calls + 1):
        _sync(device)
        started = time.perf_counter()
        deltas, _ = trainer.train_pool(
            list(range(count)), start, pool, [torch.Generator().manual_seed(i) for i in range(count)]
        )
        _sync(device)
        timed.append(time.perf_counter() - started)
    return timed[0], min(timed[1:]), deltas


def section_compiled_step(args, size: dict) -> dict:
    """Seconds per device of one batched group's training, eager against compiled, groups of several sizes."""
    device = torch.device(args.device)
    train = load_digits_split(True)
    inputs = torch.from_numpy(train.images).to(device)
    targets = torch.from_numpy(train.labels).to(device)
    spec = LocalTrainingSpec(epochs=1, batch_size=10, lr=0.05)
    modes = {"eager": None, "compiled": {}}
    if args.device == "cuda":
        modes["reduce_overhead"] = {"mode": "reduce-overhead"}
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


RUNNERS = {
    "fedavg_e2e": section_fedavg_e2e,
    "throughput": section_throughput,
    "worker_sweep": section_worker_sweep,
    "fedrevive": section_fedrevive,
    "shared_gpu": section_shared_gpu,
    "compression": section_compression,
    "compression_job": section_compression_job,
    "async_throughput": section_async_throughput,
    "compiled_step": section_compiled_step,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="dry-run sizes (seconds on a CPU)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list out of {', '.join(SECTIONS)}")
    parser.add_argument("--out", default=None, help="JSON file of figures (default: $OUT/gpu_suite.json or stdout)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds each job run may take")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible; use --device cpu for the dry run")
    out_path = args.out or (os.path.join(os.environ["OUT"], "gpu_suite.json") if os.environ.get("OUT") else None)
    size = sizes(args.tiny)
    report = {"machine": machine_facts(args.device), "tiny": args.tiny, "sections": {}, "errors": {}}
    for name in chosen:
        started = time.perf_counter()
        print(f"[gpu_suite] {name} ...", flush=True)
        try:
            with VramMonitor(args.device) as monitor:
                report["sections"][name] = RUNNERS[name](args, size)
            report["sections"][name]["suite_peak_gpu_memory_mib"] = monitor.peak_mib
        except Exception:  # noqa: BLE001 - one failed section must not lose the others' figures
            report["errors"][name] = traceback.format_exc()[-4000:]
            print(report["errors"][name], file=sys.stderr, flush=True)
        print(f"[gpu_suite] {name} done in {time.perf_counter() - started:.1f}s", flush=True)
        if out_path:
            _write(out_path, report)
    report["machine"]["load_average_end"] = os.getloadavg()[0]
    text = json.dumps(report, indent=2, default=str)
    if out_path:
        _write(out_path, report)
        print(f"[gpu_suite] figures in {out_path}")
    else:
        print(text)
    return 1 if report["errors"] else 0


def _write(path: str, report: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(report, stream, indent=2, default=str)


if __name__ == "__main__":
    sys.exit(main())
