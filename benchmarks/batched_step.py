"""Per-device cost of the batched trainer's groups of a few digits CNNs, this checkout against a baseline checkout.

One process per measurement trains groups of ``--groups`` devices with ``train_devices_batched`` as an asynchronous
leaf does (digits, CNN, 100 samples a device, 1 epoch at batch 10, SGD, one torch thread), ``--calls`` calls per
group size; the rounds alternate the two trees (``harness.alternate``; the baseline a temporary worktree of
``--baseline-commit``). Printed per group size: milliseconds per device of each tree (median over ``--rounds`` of
each measurement's median call, wall and thread CPU), the speed-up, and whether both trees' updates are
bit-identical. ``--json`` writes
``benchmarks/results/batched_step-<date>.json``:

    .venv/bin/python benchmarks/batched_step.py --baseline-commit REV --rounds 3 --calls 15 --json
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import REPO, Session, alternate, arguments, baseline, items, run_child  # noqa: E402

SETTINGS = {
    "dataset": "digits",
    "partition": "dirichlet",
    "samples_per_device": 100,
    "batch_size": 10,
    "local_epochs": 1,
    "optimizer": "sgd",
    "lr": 0.05,
    "seed": 0,
    "augment": False,
}


def measure_here(tree: str, groups: list[int], calls: int) -> dict:
    """Milliseconds per device for each group size, with ``tree``'s code (imported from it), and a digest of the
    updates of each group size (to compare trees bit for bit)."""
    sys.path.insert(0, tree)
    import torch

    from processors.task_processor import TaskDeviceProcessor

    torch.set_num_threads(1)
    torch.manual_seed(0)  # the starting model's initialisation, the same in both trees
    processor = TaskDeviceProcessor.from_settings(SETTINGS)
    start = [t.clone() for t in processor._ready().state_tensors]
    out: dict = {"ms_per_device": {}, "cpu_ms_per_device": {}, "digest": {}}
    for size in groups:
        ids = list(range(size))
        deltas, _ = processor.train_devices_batched(ids, ids, start)
        digest = hashlib.sha256()
        for delta in deltas:
            digest.update(delta.contiguous().numpy().tobytes())
        out["digest"][str(size)] = digest.hexdigest()[:16]
        times, cpu = [], []
        for _ in range(calls):
            started, cpu_started = time.perf_counter(), time.thread_time()
            processor.train_devices_batched(ids, ids, start)
            times.append(time.perf_counter() - started)
            cpu.append(time.thread_time() - cpu_started)
        out["ms_per_device"][str(size)] = 1000 * statistics.median(times) / size
        out["cpu_ms_per_device"][str(size)] = 1000 * statistics.median(cpu) / size
    return out


def measure_in(tree: str, groups: list[int], calls: int) -> dict:
    """:func:`measure_here` in a fresh process importing ``tree``'s code."""
    args = ["--inner", tree, "--groups", ",".join(map(str, groups)), "--calls", str(calls)]
    return run_child(os.path.abspath(__file__), args, cwd=tree)


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--baseline-commit", help="a commit to compare against (in a temporary worktree)")
    parser.add_argument("--groups", default="2,4,10", help="comma-separated group sizes")
    parser.add_argument("--calls", type=int, default=20, help="timed calls per group size and measurement")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per tree, alternating")
    parser.add_argument("--inner", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    groups = items(parser, "--groups", args.groups, int)
    if min(groups) < 2:
        parser.error(f"--groups must list sizes >= 2, got {args.groups!r}")
    if args.inner:
        print(json.dumps(measure_here(args.inner, groups, args.calls)))
        return 0
    session = Session("batched_step")
    with baseline(parser, args.baseline_commit) as (base_commit, base_tree):
        trees = {"this": REPO, **({"baseline": base_tree} if base_tree else {})}

        def done(index: int, name: str, run: dict) -> None:
            per = ", ".join(f"{g}: {run['ms_per_device'][str(g)]:.2f}" for g in groups)
            print(f"round {index + 1} {name}: ms per device {per}")

        arms = {name: functools.partial(measure_in, tree, groups, args.calls) for name, tree in trees.items()}
        runs = alternate(arms, args.rounds, done)
    rows = []
    for size in groups:
        row: dict = {"group": size}
        for name in trees:
            for unit in ("ms_per_device", "cpu_ms_per_device"):
                row[f"{name}_{unit}"] = statistics.median(r[unit][str(size)] for r in runs[name])
        rows.append(row)
        line = f"group of {size:3d}: this {row['this_ms_per_device']:.2f} ms per device"
        if "baseline" in trees:
            row["speedup"] = row["baseline_ms_per_device"] / row["this_ms_per_device"]
            row["speedup_cpu"] = row["baseline_cpu_ms_per_device"] / row["this_cpu_ms_per_device"]
            digests = {r["digest"][str(size)] for r in runs["this"] + runs["baseline"]}
            row["bit_identical"] = len(digests) == 1
            line += (
                f", baseline {row['baseline_ms_per_device']:.2f} -> {row['speedup']:.2f}x faster "
                f"(CPU {row['baseline_cpu_ms_per_device']:.2f} -> {row['this_cpu_ms_per_device']:.2f}: "
                f"{row['speedup_cpu']:.2f}x), "
                f"updates bit-identical: {row['bit_identical']}"
            )
        print(line)
    if args.json:
        figures = [
            session.figure(
                f"batched group of {row['group']} digits CNNs: per-device cost vs baseline",
                f"{row['speedup']:.2f}x faster ({row['baseline_ms_per_device']:.2f} -> {row['this_ms_per_device']:.2f} "
                f"ms a device; CPU {row['speedup_cpu']:.2f}x; bit-identical {row['bit_identical']})",
                ">= 1.3x at 2 and 4" if row["group"] < 10 else "(reference)",
            )
            for row in rows
            if "speedup" in row
        ]
        payload = dict(baseline_commit=base_commit, settings=SETTINGS, calls=args.calls, runs=runs, rows=rows)
        for entry in figures:
            entry["machine"] += ", shared with other work"
        session.write(payload, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
