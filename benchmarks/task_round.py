"""A user task's sync FedAvg round in the simulator against a tight single-process loop over the same training.

Both sides train every device of the task's population once a round with the run's optimizer, batch size and
steps, on the shards the run's partition cuts. The simulator side (``jobs/pt_job_fedavg.py --task TASK``, every
device selected, evaluation after the last round) is the median ``train_seconds`` of the rounds after
``--warmup-rounds``, once per ``--device-batch-paths`` value (``auto``: batched where the probe allows; ``off``:
the thread pool); the tight loop is the best of ``--baseline-repeats`` at 1 thread and every core. Ratio = sim
round / tight loop. ``--json`` writes the rows and one figure per task to
``benchmarks/results/task_round-<date>.json``:

    .venv/bin/python benchmarks/task_round.py --task examples/mnist_task.py --json
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import REPO, Session, arguments, load, run_job  # noqa: E402
from benchmarks.round_overhead import plan_lines, steady_parts  # noqa: E402
from devsim.config import SimulationConfig  # noqa: E402
from devsim.tasks import load_task  # noqa: E402
from devsim.tasks.fit import fit_config  # noqa: E402
from devsim.tasks.shards import task_partitioner  # noqa: E402
from devsim.training.local import LocalTrainingSpec, batch_orders  # noqa: E402
from devsim_flare.cli import build_parser, config_from_args  # noqa: E402


def run_config(task_path: str, job_args: list[str], leaves: int) -> SimulationConfig:
    """The job's configuration for these flags, fitted to the task (population from its owners, if any), with
    every device selected."""
    parser = build_parser("task round benchmark")
    args = parser.parse_args(["--task", task_path, "--num-leaf-nodes", str(leaves), *job_args])
    config = config_from_args(parser, args)
    config, _ = fit_config(config, load_task(config.to_dict()))
    config.device_selection_size = config.num_devices
    return config.validate()


def simulate(config: SimulationConfig, job_args: list[str], args: argparse.Namespace, path: str) -> dict:
    """One simulator run with ``--device-batch path``: steady round (median), parts, the leaves' path lines."""
    flags = [
        *("--task", config.task, "--num-leaf-nodes", str(config.num_leaf_nodes), *job_args),
        *("--device-selection-size", str(config.num_devices), "--num-rounds", str(args.rounds)),
        *("--eval-frequency", str(args.rounds), "--device-batch", path),
    ]
    with tempfile.TemporaryDirectory(prefix="devsim-task-bench-") as workdir:
        results = run_job("pt_job_fedavg.py", flags, workdir, timeout=args.timeout)
    records = results["rounds"]
    rounds = [float(r["train_seconds"]) for r in records]
    steady = records[args.warmup_rounds :] or records
    return {
        "rounds": rounds,
        "sim": statistics.median([float(r["train_seconds"]) for r in steady]),
        "parts": steady_parts(steady),
        "path": plan_lines(results),
        "final_accuracy": records[-1].get("accuracy"),
    }


def tight_loop(config: SimulationConfig, threads: int, repeats: int, device: str = "cpu") -> float:
    """Best seconds to train every device's shard once in one process (one model, the run's optimizer), on
    ``device`` (the data moved there first, synchronised before the clock stops)."""
    task = load_task(config.to_dict())
    partitioner = task_partitioner(task, config.partition, config.samples_per_device, config.seed, config.alpha)
    spec = LocalTrainingSpec.from_settings(config)
    torch.set_num_threads(threads)
    inputs = torch.from_numpy(task.x_train).to(device)
    inputs = task.prepare(inputs) if task.prepare is not None else inputs
    targets = torch.from_numpy(task.y_train).to(device)
    shards = [torch.from_numpy(partitioner.device_indices(d)).to(device) for d in range(config.num_devices)]
    model = task.build_model().to(device)
    model.train()
    if spec.optimizer == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=spec.lr)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for device, rows in enumerate(shards):
            generator = torch.Generator().manual_seed(device)
            for index in batch_orders(len(rows), spec.steps_for(len(rows)), spec.batch_size, generator):
                batch = rows[index]
                loss = task.loss(model(inputs[batch]), targets[batch])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return best


def measure(task_path: str, args: argparse.Namespace) -> dict:
    job_args = shlex.split(args.job_args)
    config = run_config(task_path, job_args, args.leaves)
    task = load_task(config.to_dict())
    partitioner = task_partitioner(task, config.partition, config.samples_per_device, config.seed, config.alpha)
    spec = LocalTrainingSpec.from_settings(config)
    sizes = [len(partitioner.device_indices(d)) for d in range(config.num_devices)]
    samples = sum(sizes)
    steps = sum(spec.steps_for(n) for n in sizes)
    sims = {path: simulate(config, job_args, args, path) for path in args.device_batch_paths}
    default_threads = torch.get_num_threads()
    loops = {}
    try:
        for threads in sorted({1, default_threads}):
            loops[threads] = tight_loop(config, threads, args.baseline_repeats)
    finally:
        torch.set_num_threads(default_threads)
    loop = min(loops.values())
    return {
        "task": os.path.relpath(task_path, REPO),
        "job_args": job_args,
        "partition": config.partition,
        "devices": config.num_devices,
        "samples_per_round": samples,
        "steps_per_round": steps,
        "sims": {p: {**s, "ratio": s["sim"] / loop} for p, s in sims.items()},
        "tight_loop_seconds": {str(t): s for t, s in loops.items()},
        "tight_loop": loop,
    }


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--task", action="append", required=True, help="task file (repeat for several)")
    parser.add_argument("--job-args", default="", help="extra job flags, one string (e.g. '--batch-size 32')")
    parser.add_argument("--leaves", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup-rounds", type=int, default=2)
    parser.add_argument("--baseline-repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--device-batch-paths", type=lambda t: [v.strip() for v in t.split(",") if v.strip()], default=["auto", "off"]
    )
    args = parser.parse_args()
    if args.rounds <= args.warmup_rounds:
        parser.error(f"--rounds {args.rounds} must exceed --warmup-rounds {args.warmup_rounds}")
    session = Session("task_round")
    rows = []
    print(f"machine: {os.cpu_count()} cores, load average {load()}", flush=True)
    for task_path in args.task:
        row = measure(os.path.abspath(task_path), args)
        rows.append(row)
        print(
            f"\n== {row['task']} {' '.join(row['job_args'])}: {row['devices']} devices ({row['partition']}), "
            f"{row['samples_per_round']} samples and {row['steps_per_round']} steps a round"
        )
        for path, sim in row["sims"].items():
            print(f"[--device-batch {path}] {sim['path']}")
            rounds = ", ".join(f"{t:.3f}" for t in sim["rounds"])
            print(
                f"[--device-batch {path}] steady round {sim['sim']:.3f} s (rounds {rounds}); "
                f"ratio to the tight loop {sim['ratio']:.3f}"
            )
        print(f"tight loop: {', '.join(f'{t} thread(s) {s:.3f} s' for t, s in row['tight_loop_seconds'].items())}")
    print(f"\nload average at end {load()}")
    if args.json:
        session.write({"load_end": load(), "rows": rows}, figures(rows, session))


def figures(rows: list[dict], session: Session) -> list[dict]:
    """One figure per task: its steady round against the tight loop on each path measured."""
    published = []
    for row in rows:
        paths = ", ".join(f"{sim['ratio']:.3f} ({path})" for path, sim in row["sims"].items())
        published.append(
            session.figure(
                f"user task round vs tight loop: {row['task']}",
                paths,
                "<= 0.5 for a small MLP/CNN batched; never slower than the thread pool",
                f".venv/bin/python benchmarks/task_round.py --task {row['task']} --json",
            )
        )
    return published


if __name__ == "__main__":
    main()
