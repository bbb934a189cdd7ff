"""FedAvg, FedBuff and FedRevive on one non-IID synthetic setting with heavy staleness, side by side.

All three run through the same asynchronous server and leaves, on the same devices, data and delay schedule, for
the same simulated time: FedAvg as synchronous waves (K = B = O), FedBuff and FedRevive with K concurrent jobs and a
new version every B arrivals. Printed: final and best accuracy, versions, accepted updates, FedRevive's KD counts
and server seconds per arrival (wall, and the server thread's CPU), wall seconds, and FedRevive / FedBuff's wall
ratio. ``--json`` writes the rows and the figure to ``benchmarks/results/async_quality-<date>.json``:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/async_quality.py --methods FedBuff,FedRevive --seed 0 --json
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import Session, arguments, best_accuracy, items, load, print_table, run_jobs  # noqa: E402


def common_args(args) -> list[str]:
    return [
        *("--num-leaf-nodes", "2", "--devices-per-leaf", str(args.devices_per_leaf)),
        *("--samples-per-device", "100", "--partition", "dirichlet", "--alpha", str(args.alpha)),
        *("--synthetic-train-size", "20000", "--synthetic-test-size", "2000"),
        *("--delay-schedule", args.schedule, "--max-sim-time", str(args.sim_time), "--max-versions", "100000"),
        *("--optimizer", "adam", "--lr", "0.001", "--local-iterations", "10", "--batch-size", "32"),
        *("--seed", str(args.seed)),
    ]


def methods(args) -> dict[str, tuple[str, list[str]]]:
    """Method -> (job script, flags): K = ``args.concurrency`` jobs, B = ``args.buffer_size`` (FedAvg: K = B = O)."""
    k, b = str(args.concurrency), str(args.buffer_size)
    asynchronous = [
        *("--concurrency", k, "--buffer-size", b, "--min-open-slots", "1"),
        *("--global-lr", str(args.async_lr), "--eval-frequency", str(args.eval_every)),
    ]
    waves = [
        *("--concurrency", k, "--buffer-size", k, "--min-open-slots", k),
        *("--global-lr", "1.0", "--eval-frequency", "1"),
    ]
    return {
        "FedAvg": ("pt_job_fedbuff.py", waves),
        "FedBuff": ("pt_job_fedbuff.py", asynchronous),
        "FedRevive": ("pt_job_fedrevive.py", ["--preset", "fedrevive_small_cpu", *asynchronous]),
    }


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--concurrency", type=int, default=50, help="K")
    parser.add_argument("--buffer-size", type=int, default=1, help="B for FedBuff and FedRevive")
    parser.add_argument("--schedule", default="paper_shifted")
    parser.add_argument("--sim-time", type=float, default=2.0, help="simulated seconds for every method")
    parser.add_argument("--devices-per-leaf", type=int, default=100)
    parser.add_argument("--alpha", type=float, default=0.3, help="Dirichlet concentration (non-IID)")
    parser.add_argument("--async-lr", type=float, default=0.1, help="server lr of FedBuff and FedRevive")
    parser.add_argument("--eval-every", type=int, default=25, help="versions between evaluations (async)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default="FedAvg,FedBuff,FedRevive", help="comma-separated subset")
    args = parser.parse_args()
    session = Session("async_quality")
    chosen = items(parser, "--methods", args.methods, allowed=tuple(methods(args)))
    jobs = {name: (script, [*extra, *common_args(args)]) for name, (script, extra) in methods(args).items()}
    done = run_jobs({name: job for name, job in jobs.items() if name in chosen}, timeout=7200)
    rows = [(name, results["summary"], best_accuracy(results), results["wall"]) for name, results in done.items()]
    print(
        f"\nsetting: 2 leaves x {args.devices_per_leaf} devices, Dirichlet alpha {args.alpha}, K={args.concurrency}, "
        f"B={args.buffer_size} (FedAvg: K=B=O), schedule {args.schedule}, simulated time {args.sim_time}s, "
        f"seed {args.seed}"
    )
    table = []
    for name, summary, best, wall in rows:
        kd = [summary.get("kd_updates", "-"), summary.get("kd_runs", "-")]
        server = [_seconds(summary.get(f"revive_{kind}seconds_per_arrival")) for kind in ("", "cpu_")]
        counts = [summary["versions"], summary["accepted_updates"], *kd]
        table.append([name, f"{summary['final_accuracy']:.4f}", f"{best:.4f}", *counts, *server, f"{wall:.0f}"])
    columns = ["method", "final acc", "best acc", "versions", "updates", "KD", "KD runs", "s/arrival", "CPU s/arr"]
    print_table([*columns, "wall s"], table)
    walls = {name: wall for name, _, _, wall in rows}
    if "FedRevive" in walls and "FedBuff" in walls:
        print(f"wall time FedRevive / FedBuff: {walls['FedRevive'] / walls['FedBuff']:.2f}x", end="; ")
    print(f"load average now {load()}")
    if args.json:
        runs = [{"method": n, "summary": s, "best_accuracy": b, "wall": w} for n, s, b, w in rows]
        session.write({"settings": vars(args), "rows": runs}, figures(rows, session))


def figures(rows: list[tuple], session: Session) -> list[dict[str, str]]:
    """FedRevive against FedBuff: final accuracies, FedRevive's server seconds per arrival (wall), wall ratio."""
    by_name = {name: (summary, wall) for name, summary, _, wall in rows}
    if "FedRevive" not in by_name or "FedBuff" not in by_name:
        return []
    (revive, revive_wall), (buff, buff_wall) = by_name["FedRevive"], by_name["FedBuff"]
    per_arrival = _seconds(revive.get("revive_seconds_per_arrival"))
    return [
        session.figure(
            "FedRevive vs FedBuff at equal simulated time: accuracy, s/arrival, wall ratio",
            f"{revive['final_accuracy']:.4f} vs {buff['final_accuracy']:.4f}, {per_arrival} s/arrival, "
            f"{revive_wall / buff_wall:.2f}x",
            "<= 0.35 s/arrival, <= 3x",
        )
    ]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
