"""Leaf worker-pool sizing: device-training throughput at fixed worker counts vs the automatic choice.

Runs ``jobs/pt_job_fedavg.py`` in NVFlare's simulator once per setting on the same workload (2 leaves x 40
devices, all selected, 100 samples a device, 4 rounds, evaluation after the last): ``--num-workers`` at each of
``--counts`` and once without it (each leaf sizes its pool and prints ``workers=N (...)``). Throughput is
device-samples/s over the median ``train_seconds`` of rounds 2..; ``--passes N`` repeats the settings in turn and
pools the rounds. When auto chose one of the fixed counts, their ratio is this run's noise between identical
settings. ``--json`` writes the rows and the figure (auto over the best fixed count) to
``benchmarks/results/worker_sizing-<date>.json``:

    .venv/bin/python benchmarks/worker_sizing.py --passes 2 --json
"""

from __future__ import annotations

import functools
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import Session, alternate, arguments, items, print_table, run_job  # noqa: E402


def run_setting(args, workers: int | None) -> tuple[list[float], list[str]]:
    """Per-round train seconds and the leaves' ``workers=`` lines of one sim run."""
    selected = args.leaves * args.devices_per_leaf
    flags = [
        *("--num-leaf-nodes", str(args.leaves), "--devices-per-leaf", str(args.devices_per_leaf)),
        *("--device-selection-size", str(selected), "--samples-per-device", str(args.samples)),
        *("--num-rounds", str(args.rounds), "--eval-frequency", str(args.rounds), "--checkpoint-frequency", "0"),
        *("--batch-size", str(args.batch_size), "--model", args.model, "--partition", "iid"),
        *("--synthetic-train-size", str(max(20000, selected * args.samples))),
        *(["--num-workers", str(workers)] if workers is not None else []),
    ]
    results = run_job("pt_job_fedavg.py", flags, timeout=args.timeout)
    return [r["train_seconds"] for r in results["rounds"]], results["worker_lines"]


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--counts", default="1,2,4", help="comma list of --num-workers values to try")
    parser.add_argument("--leaves", type=int, default=2)
    parser.add_argument("--devices-per-leaf", type=int, default=40, help="all are selected every round")
    parser.add_argument("--samples", type=int, default=100, help="samples per device")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--passes", type=int, default=1, help="run all settings this many times, interleaved")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per run before it is abandoned")
    args = parser.parse_args()
    session = Session("worker_sizing")
    settings: list[int | None] = [*items(parser, "--counts", args.counts, int), None]
    samples = args.leaves * args.devices_per_leaf * args.samples
    runs = alternate({workers: functools.partial(run_setting, args, workers) for workers in settings}, args.passes)
    # per setting: the steady rounds (round 1 warms up) of every pass, and the last pass's plan lines
    results = {w: ([t for rounds, _ in done for t in rounds[1:] or rounds], done[-1][1]) for w, done in runs.items()}
    print(
        f"workload: {args.leaves} leaves x {args.devices_per_leaf} devices (all selected) x {args.samples} samples "
        f"x 1 epoch, model {args.model}, batch {args.batch_size}: {samples} device-samples per round, "
        f"{args.rounds} rounds; {args.passes} pass(es) over the settings, interleaved; machine: {session.where()}"
    )
    throughput = {workers: samples / statistics.median(steady) for workers, (steady, _) in results.items()}
    best = max(throughput, key=throughput.get)
    label = {w: ("auto" if w is None else f"workers={w}") for w in settings}
    table = [
        [label[w], ", ".join(f"{t:.2f}" for t in steady), f"{statistics.median(steady):.3f}"]
        + [f"{throughput[w]:,.0f}", f"{throughput[w] / throughput[best]:.2f}"]
        for w, (steady, _) in results.items()
    ]
    print_table(["setting", "round 2.. times (s)", "median s", "samples/s", "vs best"], table)
    print("automatic choice, as printed by the leaves:\n  " + "\n  ".join(results[None][1]))
    print(f"auto / best ({label[best]}): {throughput[None] / throughput[best]:.2f} ({throughput[None]:,.0f} samples/s)")
    chosen = {int(m.group(1)) for line in results[None][1] if (m := re.search(r"workers=(\d+)", line))}
    if len(chosen) == 1 and (same := chosen.pop()) in throughput:
        print(
            f"auto chose workers={same} on every leaf: auto / workers={same} = "
            f"{throughput[None] / throughput[same]:.2f}"
            " is this run's noise between identical settings"
        )
    if args.json:
        rows = [
            {"workers": label[w], "steady_train_seconds": steady, "samples_per_s": throughput[w], "worker_lines": lines}
            for w, (steady, lines) in results.items()
        ]
        fixed = [w for w in settings if w is not None]
        best_fixed = max(fixed, key=throughput.get)
        published = session.figure(
            "worker sizing: auto vs best fixed worker count",
            f"{throughput[None] / throughput[best_fixed]:.2f} (best of {', '.join(str(w) for w in fixed)})",
            "within 10%",
        )
        session.write({"settings": vars(args), "rows": rows}, [published])


if __name__ == "__main__":
    main()
