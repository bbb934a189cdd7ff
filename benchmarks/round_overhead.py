"""Sync FedAvg round time in the simulator against a tight single-process PyTorch loop.

Both sides train exactly the same work: the same model, batch size and number of SGD steps over
the same number of samples (selected devices x samples per device x epochs). The simulator
side is the steady-state round time (median over rounds after warm-up, evaluation excluded:
the server evaluates only after the last round). The baseline trains one model on one process
with every core, with no federated machinery at all. The ratio is the overhead of simulating
devices, leaves and the server.

    .venv/bin/python benchmarks/round_overhead.py                 # 2 leaves x 50 devices x 100 samples
    .venv/bin/python benchmarks/round_overhead.py --devices-per-leaf 500 --model resnet18
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from devsim.data import load_dataset  # noqa: E402
from devsim.device_data import Normaliser  # noqa: E402
from processors.models import build_model  # noqa: E402


def simulated_round_seconds(args, workdir: str) -> list[float]:
    """Per-round training seconds (server send -> aggregated) of a sim run; evaluation only at the end."""
    selected = args.leaves * args.devices_per_leaf
    cmd = [
        sys.executable,
        os.path.join(REPO, "jobs", "pt_job_fedavg.py"),
        "--num-leaf-nodes",
        str(args.leaves),
        "--devices-per-leaf",
        str(args.devices_per_leaf),
        "--device-selection-size",
        str(selected),
        "--samples-per-device",
        str(args.samples),
        "--local-epochs",
        "1",
        "--batch-size",
        str(args.batch_size),
        "--model",
        args.model,
        "--num-rounds",
        str(args.rounds),
        "--eval-frequency",
        str(args.rounds),
        "--partition",
        "iid",
        "--synthetic-train-size",
        str(max(20000, selected * args.samples)),
        "--workspace",
        os.path.join(workdir, "ws"),
        "--output-dir",
        os.path.join(workdir, "run"),
    ]
    if args.num_workers:
        cmd += ["--num-workers", str(args.num_workers)]
    env = dict(os.environ, HOME=os.path.join(workdir, "home"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"simulation failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(os.path.join(workdir, "run", "results.json"), encoding="utf-8") as stream:
        rounds = json.load(stream)["rounds"]
    return [r["train_seconds"] for r in rounds]


def tight_loop_seconds(args) -> tuple[float, int]:
    """Seconds to train the same number of samples and steps in one process; returns (seconds, steps)."""
    selected = args.leaves * args.devices_per_leaf
    data = load_dataset("synthetic", None, train=True, synthetic_train_size=max(20000, selected * args.samples))
    normalise = Normaliser(data.mean, data.std, torch.device("cpu"))
    images = normalise(torch.from_numpy(data.images[: selected * args.samples]))
    labels = torch.from_numpy(data.labels[: selected * args.samples])
    model = build_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps_per_device = -(-args.samples // args.batch_size)
    model.train()
    best = float("inf")
    for _ in range(args.baseline_repeats):
        started = time.perf_counter()
        for device in range(selected):
            base = device * args.samples
            order = torch.randperm(args.samples) + base
            for start in range(0, args.samples, args.batch_size):
                index = order[start : start + args.batch_size]
                loss = F.cross_entropy(model(images[index]), labels[index])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        best = min(best, time.perf_counter() - started)
    return best, selected * steps_per_device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--leaves", type=int, default=2)
    parser.add_argument("--devices-per-leaf", type=int, default=50, help="all are selected every round")
    parser.add_argument("--samples", type=int, default=100, help="samples per device")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup-rounds", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=None)
    parser.add_argument("--baseline-repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="devsim-bench-") as workdir:
        sim_rounds = simulated_round_seconds(args, workdir)
    steady = sim_rounds[args.warmup_rounds :] or sim_rounds
    sim_median = statistics.median(steady)
    baselines = {}
    for threads in sorted({1, torch.get_num_threads()}):
        torch.set_num_threads(threads)
        baselines[threads], steps = tight_loop_seconds(args)
    best_threads = min(baselines, key=baselines.get)
    baseline = baselines[best_threads]
    samples = args.leaves * args.devices_per_leaf * args.samples
    print(
        f"workload: {args.leaves} leaves x {args.devices_per_leaf} devices x {args.samples} samples x 1 epoch, "
        f"model {args.model}, batch {args.batch_size}: {samples} samples, {steps} SGD steps per round"
    )
    print(f"machine: {os.cpu_count()} cores")
    print(f"sim round times (s): {', '.join(f'{t:.3f}' for t in sim_rounds)}")
    print(
        f"sim steady-state round (median of rounds {args.warmup_rounds + 1}..{len(sim_rounds)}): {sim_median:.3f} s "
        f"({samples / sim_median:,.0f} samples/s)"
    )
    for threads, seconds in baselines.items():
        print(
            f"tight single-process loop, torch threads={threads} (best of {args.baseline_repeats}): {seconds:.3f} s "
            f"({samples / seconds:,.0f} samples/s)"
        )
    print(f"ratio sim / fastest tight loop (threads={best_threads}): {sim_median / baseline:.3f}")


if __name__ == "__main__":
    main()
