"""Sync FedAvg round time in the simulator against a tight single-process PyTorch loop.

Both sides train the same work: model, batch size and SGD steps over the same samples (selected devices x samples
per device x 1 epoch). The simulator side (``jobs/pt_job_fedavg.py``, every device selected every round) is the
median round (server send -> aggregated model) after the warm-up rounds, once per ``--device-batch-paths`` value
(default ``auto,off``: the batched default path and the thread pool). The tight loop trains one model in one
process at 1 torch thread and at every core, best of ``--baseline-repeats``. Ratio = sim round / fastest loop.

Without ``--sweep``: one cell, 2 leaves x 50 devices x 100 samples, small CNN, batch 10. ``--sweep``: the grid of
``--models`` x ``--devices``; ResNet-18 devices hold ``--resnet-samples-per-device`` samples and run
``--resnet-rounds`` rounds, CNN cells 8 rounds (median of rounds 3-8); the ResNet-18 x 1000 cell (27.5 minutes on
2 cores) runs only with ``--skip-cells none``. ``--json`` writes every cell and one figure per cell (the first path's
ratio) to ``benchmarks/results/round_overhead[-<models>]-<date>.json``:

    .venv/bin/python benchmarks/round_overhead.py --sweep --models cnn --devices 100,1000 --json
    .venv/bin/python benchmarks/round_overhead.py --sweep --models resnet18 --devices 1000 --skip-cells none --json
    .venv/bin/python benchmarks/round_overhead.py --sweep --devices 10 --samples 20 --rounds 3   # smoke test

``--task FILE`` (repeatable) measures a user task instead: ``pt_job_fedavg.py --task FILE`` (with ``--job-args``)
over every device of the task's population a round, against a tight loop over the same shards with the run's
optimizer, batch size and steps; ``--json`` writes the rows and one figure per task to
``benchmarks/results/task_round-<date>.json``:

    .venv/bin/python benchmarks/round_overhead.py --task examples/mnist_task.py --json
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import REPO, Session, arguments, items, load, print_table, run_job  # noqa: E402
from devsim.config import SimulationConfig  # noqa: E402
from devsim.tasks import load_task  # noqa: E402
from devsim.tasks.fit import fit_config  # noqa: E402
from devsim.tasks.shards import task_partitioner  # noqa: E402
from devsim.training.local import LocalTrainingSpec, batch_orders  # noqa: E402
from devsim_flare.cli import build_parser, config_from_args  # noqa: E402

SWEEP_DEVICES = "10,100,1000"
SWEEP_MODELS = "cnn,resnet18"
SWEEP_SKIP = "resnet18x1000"
MODEL_LABELS = {"cnn": "CNN", "resnet18": "ResNet-18"}
# The published cells: samples per device, and the target of the ratio; the CNN x 100 cell's name says it is the
# default (batched) path, as its README row always has.
PUBLISHED = {"cnn": (100, "<= 0.35"), "resnet18": (10, "<= 1")}
NAME_SUFFIX = {("cnn", 100): " (default batched path)"}


@dataclass(frozen=True)
class Cell:
    """One measured setting: ``leaves x devices_per_leaf`` devices, all selected, ``samples`` each."""

    model: str
    leaves: int
    devices_per_leaf: int
    samples: int
    batch_size: int
    rounds: int
    warmup_rounds: int

    @property
    def devices(self) -> int:
        return self.leaves * self.devices_per_leaf

    @property
    def total_samples(self) -> int:
        return self.devices * self.samples

    @property
    def steps(self) -> int:
        return self.devices * -(-self.samples // self.batch_size)

    @property
    def train_size(self) -> int:
        return max(20000, self.total_samples)


def simulate(flags: list[str], args: argparse.Namespace, path: str, warmup: int, key: str = "sim_rounds") -> dict:
    """One ``pt_job_fedavg.py`` run with ``flags`` and ``--device-batch path``: each round's ``train_seconds``
    (server send -> aggregated) under ``key``, the median of those after ``warmup`` (``sim``), its parts, the
    leaves' plan lines (``path``: which path they took and why) and the final accuracy."""
    results = run_job("pt_job_fedavg.py", [*flags, "--device-batch", path], timeout=args.timeout)
    records = results["rounds"]
    steady = records[warmup:] or records
    return {
        key: [float(r["train_seconds"]) for r in records],
        "sim": statistics.median(float(r["train_seconds"]) for r in steady),
        "parts": steady_parts(steady),
        "path": plan_lines(results),
        "final_accuracy": records[-1].get("accuracy"),
    }


def best_of_threads(loop) -> dict[int, object]:
    """``loop(threads)`` at 1 torch thread and at every core (threads -> its result); the thread count restored."""
    default = torch.get_num_threads()
    try:
        return {threads: loop(threads) for threads in sorted({1, default})}
    finally:
        torch.set_num_threads(default)


def plan_lines(results: dict) -> str:
    """The leaves' distinct ``workers=... device_batch=...`` plan lines of a run (which path they took and why)."""
    return "; ".join(sorted({line.split("] ", 1)[-1] for line in results["worker_lines"] if " device_batch=" in line}))


def steady_parts(records: list[dict]) -> dict[str, float]:
    """Median seconds of each timed part of a round (leaf compute, dispatch, return, ...) over ``records``."""
    names = sorted({name for r in records for name in r.get("timing", {}).get("parts", {})})
    parts = {}
    for name in names:
        values = [float(r["timing"]["parts"].get(name, 0.0)) for r in records if "timing" in r]
        if values and name != "evaluation":
            parts[name] = statistics.median(values)
    return parts


def cell_flags(cell: Cell) -> list[str]:
    return [
        *("--num-leaf-nodes", str(cell.leaves), "--devices-per-leaf", str(cell.devices_per_leaf)),
        *("--device-selection-size", str(cell.devices), "--samples-per-device", str(cell.samples)),
        *("--local-epochs", "1", "--batch-size", str(cell.batch_size), "--model", cell.model),
        *("--num-rounds", str(cell.rounds), "--eval-frequency", str(cell.rounds), "--partition", "iid"),
        *("--synthetic-train-size", str(cell.train_size)),
    ]


def measure(cell: Cell, args: argparse.Namespace) -> dict:
    """Sim runs (one per ``--device-batch-paths`` value) and tight-loop times of one cell."""
    sims = {path: simulate(cell_flags(cell), args, path, cell.warmup_rounds) for path in args.device_batch_paths}
    config = job_config(cell_flags(cell)).validate()
    baselines = best_of_threads(lambda t: tight_loop(config, t, args.baseline_repeats, args.baseline_budget))
    best_threads = min(baselines, key=lambda t: baselines[t][0])
    loop = baselines[best_threads][0]
    for result in sims.values():
        result["ratio"] = result["sim"] / loop
    return {"sims": sims, "baselines": baselines, "best_threads": best_threads, "loop": loop}


def describe(cell: Cell, result: dict) -> list[str]:
    """Detail lines of one measured cell: each path's leaves, rounds, steady round and its parts; the loops."""
    lines = [
        f"[--device-batch {name}] {sim['path'] or 'no path line found'}; round s "
        f"{', '.join(f'{t:.3f}' for t in sim['sim_rounds'])}; steady (median of rounds {cell.warmup_rounds + 1}.."
        f"{cell.rounds}) {sim['sim']:.3f} s; its parts along the slowest leaf (medians, s) "
        + ", ".join(f"{part} {value:.3f}" for part, value in sim["parts"].items() if value >= 0.0005)
        for name, sim in result["sims"].items()
    ]
    return lines + [
        f"tight single-process loop, torch threads={threads} (best of {runs}): {seconds:.3f} s"
        for threads, (seconds, runs) in result["baselines"].items()
    ]


def sweep_cells(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[list[Cell], list[str]]:
    """The sweep grid (models x devices) minus the skipped cells; returns (cells, skipped names)."""
    devices = items(parser, "--devices", args.devices, int)
    models = items(parser, "--models", args.models)
    skip = set() if args.skip_cells.strip().lower() == "none" else set(items(parser, "--skip-cells", args.skip_cells))
    cells, skipped = [], []
    for model in models:
        for count in devices:
            if count < args.leaves or count % args.leaves:
                parser.error(f"--devices: {count} is not a multiple of --leaves {args.leaves}")
            if f"{model}x{count}" in skip:
                skipped.append(f"{model}x{count}")
                continue
            resnet = model.startswith("resnet")
            samples = args.resnet_samples_per_device if resnet else args.samples
            rounds = args.resnet_rounds if resnet else args.rounds or 8
            warmup = (1 if resnet else 2) if args.warmup_rounds is None else args.warmup_rounds
            cells.append(Cell(model, args.leaves, count // args.leaves, samples, args.batch_size, rounds, warmup))
    return cells, skipped


def seconds_text(seconds: float) -> str:
    return f"{seconds:.1f}" if seconds >= 100 else f"{seconds:.3f}"


def figures(rows: list[tuple[Cell, dict | None]], args: argparse.Namespace) -> list[dict]:
    """One figure per measured cell: the first ``--device-batch-paths`` value's sim round over the tight loop.
    A cell off the published settings (2 leaves, batch 10, the model's samples per device) says so in its name."""
    published = []
    path = args.device_batch_paths[0]
    for cell, result in rows:
        if result is None:
            continue
        name = f"sync round vs tight loop, {MODEL_LABELS.get(cell.model, cell.model)} x {cell.devices:,} devices"
        samples, target = PUBLISHED.get(cell.model, (None, "<= 1"))
        if (cell.samples, cell.batch_size, cell.leaves) != (samples, 10, 2):
            name += f" [{cell.leaves} leaves, {cell.samples} samples, batch {cell.batch_size}]"
        name += NAME_SUFFIX.get((cell.model, cell.devices), "")
        if path != "auto":
            name += f" (--device-batch {path})"
        sim = result["sims"][path]
        value = f"{sim['ratio']:.3f} ({seconds_text(sim['sim'])} s vs {seconds_text(result['loop'])} s)"
        published.append(args.session.figure(name, value, target))
    return published


def write_json(rows: list[tuple[Cell, dict | None]], args: argparse.Namespace) -> None:
    """The cells' results and figures under benchmarks/results/ (named after the models unless only the CNN ran)."""
    cells = []
    for cell, result in rows:
        entry = {"cell": vars(cell) | {"devices": cell.devices}, "result": None}
        if result is not None:
            baselines = {str(t): {"seconds": s, "runs": r} for t, (s, r) in result["baselines"].items()}
            entry["result"] = {**result, "baselines": baselines}
        cells.append(entry)
    payload = {"settings": {k: v for k, v in vars(args).items() if k != "session"}, "cells": cells}
    models = sorted({cell.model for cell, _ in rows})
    name = "round_overhead" if models == ["cnn"] else f"round_overhead-{'-'.join(models)}"
    args.session.benchmark = name
    args.session.write(payload, figures(rows, args))


def run_sweep(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Measure every cell of the grid, print each cell's detail and the table; ``--json``: write them."""
    cells, skipped = sweep_cells(args, parser)
    for cell in cells:
        if cell.rounds <= cell.warmup_rounds:
            parser.error(f"{cell.model}: rounds ({cell.rounds}) must exceed the warm-up rounds ({cell.warmup_rounds})")
    print(
        f"sweep: {len(cells)} cells, {args.leaves} leaves, every device selected, 1 epoch, batch {args.batch_size}; "
        f"skipped: {', '.join(skipped) or 'none'}; machine: {os.cpu_count()} cores, load average {load()}"
    )
    rows = []
    for cell in cells:
        print(
            f"\n== {cell.model}, {cell.devices} devices ({cell.leaves} x {cell.devices_per_leaf}) x {cell.samples} "
            f"samples: {cell.total_samples} samples, {cell.steps} SGD steps per round, {cell.rounds} rounds"
        )
        started = time.perf_counter()
        try:
            result = measure(cell, args)
        except RuntimeError as error:
            print(f"cell failed: {error}")
            rows.append((cell, None))
            continue
        for line in describe(cell, result):
            print(line)
        print(f"cell wall {time.perf_counter() - started:.0f} s; load average {load()}")
        rows.append((cell, result))

    paths = args.device_batch_paths
    table = []
    for cell, result in rows:
        sims = result["sims"] if result else {}
        sim = [f"{sims[p]['sim']:.3f}" if result else "failed" for p in paths]
        ratio = [f"{sims[p]['ratio']:.3f}" if result else "-" for p in paths]
        loop = f"{result['loop']:.3f}" if result else "-"
        table.append([cell.devices, cell.model, cell.samples, *sim, loop, *ratio])
    print(
        "\nsim round: median of the steady rounds (send -> aggregated) per --device-batch value; tight loop: fastest "
        f"of torch threads {sorted({1, torch.get_num_threads()})}; ratio = sim round / tight loop"
    )
    columns = ["devices", "model", "samples/device", *(f"sim s ({p})" for p in paths), "tight loop s"]
    print_table([*columns, *(f"ratio ({p})" for p in paths)], table)
    print(f"load average at end {load()}")
    if args.json:
        write_json(rows, args)


def job_config(flags: list[str]) -> SimulationConfig:
    """The FedAvg job's configuration for these command-line flags."""
    parser = build_parser("round overhead benchmark")
    return config_from_args(parser, parser.parse_args(flags))


def task_config(task_path: str, job_args: list[str], leaves: int) -> SimulationConfig:
    """The job's configuration for these flags, fitted to the task (population from its owners, if any), with
    every device selected."""
    config = job_config(["--task", task_path, "--num-leaf-nodes", str(leaves), *job_args])
    config, _ = fit_config(config, load_task(config.to_dict()))
    config.device_selection_size = config.num_devices
    return config.validate()


def tight_loop(
    config: SimulationConfig, threads: int, repeats: int, budget: float = float("inf"), device: str = "cpu"
) -> tuple[float, int]:
    """(Best seconds, runs) to train every device's shard once in one process (one model, the run's optimizer,
    batch size and steps), on ``device`` (the data moved there first, synchronised before the clock stops): up to
    ``repeats`` runs while the next one fits in ``budget`` seconds (at least one)."""
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
    best, spent, runs = float("inf"), 0.0, 0
    while runs < repeats and (runs == 0 or spent + best <= budget):
        started = time.perf_counter()
        for owner, rows in enumerate(shards):
            generator = torch.Generator().manual_seed(owner)
            for index in batch_orders(len(rows), spec.steps_for(len(rows)), spec.batch_size, generator):
                batch = rows[index]
                loss = task.loss(model(inputs[batch]), targets[batch])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        best, spent, runs = min(best, seconds), spent + seconds, runs + 1
    return best, runs


def measure_task(task_path: str, args: argparse.Namespace) -> dict:
    """A user task's sim runs (one per ``--device-batch-paths`` value) and its tight loop."""
    job_args = shlex.split(args.job_args)
    config = task_config(task_path, job_args, args.leaves)
    partitioner = task_partitioner(
        load_task(config.to_dict()), config.partition, config.samples_per_device, config.seed, config.alpha
    )
    spec = LocalTrainingSpec.from_settings(config)
    sizes = [len(partitioner.device_indices(d)) for d in range(config.num_devices)]
    flags = [
        *("--task", config.task, "--num-leaf-nodes", str(config.num_leaf_nodes), *job_args),
        *("--device-selection-size", str(config.num_devices), "--num-rounds", str(args.rounds)),
        *("--eval-frequency", str(args.rounds)),
    ]
    sims = {path: simulate(flags, args, path, args.warmup_rounds, "rounds") for path in args.device_batch_paths}
    loops = {t: s for t, (s, _) in best_of_threads(lambda t: tight_loop(config, t, args.baseline_repeats)).items()}
    loop = min(loops.values())
    row = dict(task=os.path.relpath(task_path, REPO), job_args=job_args, partition=config.partition)
    row.update(
        devices=config.num_devices, samples_per_round=sum(sizes), steps_per_round=sum(map(spec.steps_for, sizes))
    )
    row["sims"] = {p: {**s, "ratio": s["sim"] / loop} for p, s in sims.items()}
    return row | dict(tight_loop_seconds={str(t): s for t, s in loops.items()}, tight_loop=loop)


def run_tasks(args: argparse.Namespace) -> None:
    """Measure every ``--task``, print each one's rounds and ratios; ``--json``: write the rows and figures."""
    rows = []
    print(f"machine: {os.cpu_count()} cores, load average {load()}")
    for task_path in args.task:
        row = measure_task(os.path.abspath(task_path), args)
        rows.append(row)
        print(
            f"\n== {row['task']} {' '.join(row['job_args'])}: {row['devices']} devices ({row['partition']}), "
            f"{row['samples_per_round']} samples and {row['steps_per_round']} steps a round"
        )
        for path, sim in row["sims"].items():
            rounds = ", ".join(f"{t:.3f}" for t in sim["rounds"])
            print(
                f"[--device-batch {path}] {sim['path']}\n[--device-batch {path}] steady round {sim['sim']:.3f} s "
                f"(rounds {rounds}); ratio to the tight loop {sim['ratio']:.3f}"
            )
        print(f"tight loop: {', '.join(f'{t} thread(s) {s:.3f} s' for t, s in row['tight_loop_seconds'].items())}")
    print(f"\nload average at end {load()}")
    if args.json:
        args.session.benchmark = "task_round"
        figures = [
            args.session.figure(
                f"user task round vs tight loop: {row['task']}",
                ", ".join(f"{sim['ratio']:.3f} ({path})" for path, sim in row["sims"].items()),
                "<= 0.5 for a small MLP/CNN batched; never slower than the thread pool",
                f".venv/bin/python benchmarks/round_overhead.py --task {row['task']} --json",
            )
            for row in rows
        ]
        args.session.write({"load_end": load(), "rows": rows}, figures)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--leaves", type=int, default=2)
    parser.add_argument("--samples", type=int, default=100, help="samples per device of CNN cells")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=None, help="sim rounds of CNN cells and tasks (default 8)")
    parser.add_argument("--warmup-rounds", type=int, help="rounds left out of the median (default 2; ResNet 1)")
    parser.add_argument("--baseline-repeats", type=int, default=3, help="tight-loop runs per thread setting (best)")
    parser.add_argument("--baseline-budget", type=float, default=60.0, help="tight-loop seconds per thread setting")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per simulator run before it is killed")
    parser.add_argument("--device-batch-paths", default="auto,off", help="comma list of the jobs' --device-batch")
    tasks = parser.add_argument_group("user tasks")
    tasks.add_argument("--task", action="append", help="a user task file, measured instead of the grid (repeatable)")
    tasks.add_argument("--job-args", default="", help="extra job flags, one string (e.g. '--batch-size 32')")
    sweep = parser.add_argument_group("sweep")
    sweep.add_argument("--sweep", action="store_true", help="the grid of --models x --devices (default: CNN x 100)")
    sweep.add_argument("--devices", help=f"selected devices per round, over --leaves (sweep: {SWEEP_DEVICES})")
    sweep.add_argument("--models", help=f"comma list (sweep: {SWEEP_MODELS})")
    sweep.add_argument("--resnet-samples-per-device", type=int, default=10, help="samples per device for resnet*")
    sweep.add_argument("--resnet-rounds", type=int, default=3, help="sim rounds of resnet* cells")
    sweep.add_argument("--skip-cells", default=SWEEP_SKIP, help="comma list of MODELxDEVICES cells, or 'none'")
    args = parser.parse_args()
    args.device_batch_paths = items(parser, "--device-batch-paths", args.device_batch_paths)
    args.session = Session("round_overhead")
    if args.task:
        args.rounds, args.warmup_rounds = args.rounds or 8, 2 if args.warmup_rounds is None else args.warmup_rounds
        if args.rounds <= args.warmup_rounds:
            parser.error(f"--rounds {args.rounds} must exceed --warmup-rounds {args.warmup_rounds}")
        return run_tasks(args)
    args.devices = args.devices or (SWEEP_DEVICES if args.sweep else "100")
    args.models = args.models or (SWEEP_MODELS if args.sweep else "cnn")
    run_sweep(args, parser)


if __name__ == "__main__":
    main()
