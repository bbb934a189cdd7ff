"""FedBuff and FedRevive on a trace-driven population of 100,000 devices against always-on devices.

A trace of ``2 x --devices-per-leaf`` devices (diurnal sessions, lognormal speeds with log-sd 0.5, two network
classes; seeded) is written once as an NPZ file. Each method then runs through the real jobs with the same data,
devices, model, local training (Adam 1e-3, 10 steps of batch 32) and version budget, three ways: ``always /
profile`` (always online, delays from the schedule), ``always / lognormal`` (the trace's speeds) and ``trace``
(online only in the trace's sessions). Printed per run: final and best accuracy, versions, simulated hours, jobs
lost to ``session_end`` and their share, devices that took part, Jain's index, mean / p90 staleness, wall seconds.
``--json`` writes the runs and, per method, the figure (final accuracy always-on / trace) to
``benchmarks/results/availability_quality-<date>.json``:

    .venv/bin/python benchmarks/availability_quality.py --methods fedbuff --json
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import Session, arguments, best_accuracy, items, load, print_table, run_jobs  # noqa: E402

SETTINGS = {
    "always / profile": ["--availability", "always", "--speed-distribution", "profile"],
    "always / lognormal": ["--availability", "always", "--speed-distribution", "lognormal", "--speed-sigma", "0.5"],
    "trace": ["--availability", "trace", "--speed-distribution", "trace"],
}


def write_trace(path: str, devices: int, seed: int) -> str:
    """The diurnal sessions, lognormal speeds (the run's ``--speed-distribution lognormal`` draw) and
    uniform network classes of ``devices`` devices, as an NPZ trace."""
    from devsim.population.availability import diurnal_availability
    from devsim.population.traces import DeviceTrace, save_trace_npz
    from devsim.seeding import derive_rng

    speed = derive_rng(seed, "speed").lognormal(0.0, 0.5, size=devices).astype(np.float32)
    network = derive_rng(seed, "network-class").integers(2, size=devices, dtype=np.uint8)
    save_trace_npz(path, DeviceTrace(diurnal_availability(devices, seed), speed, network))
    return path


def common_args(args) -> list[str]:
    return [
        *("--dataset", args.dataset, "--num-leaf-nodes", "2", "--devices-per-leaf", str(args.devices_per_leaf)),
        *("--samples-per-device", str(args.samples_per_device), "--partition", "dirichlet", "--alpha", "0.5"),
        *("--concurrency", str(args.concurrency), "--buffer-size", str(args.buffer_size), "--min-open-slots", "1"),
        *("--max-versions", str(args.max_versions), "--eval-frequency", str(args.eval_frequency)),
        *("--samples-per-second", str(args.samples_per_second), "--seed", str(args.seed)),
        *("--optimizer", "adam", "--lr", "0.001", "--local-iterations", "10", "--batch-size", "32"),
        *("--log-every", "100"),
    ]


def method_args(method: str, args) -> tuple[str, list[str]]:
    if method == "fedbuff":
        return "pt_job_fedbuff.py", ["--global-lr", str(args.global_lr)]
    return "pt_job_fedrevive.py", [
        *("--preset", "fedrevive_small_cpu", "--global-lr", str(args.global_lr)),
        *("--freeze-version", str(args.max_versions // 5), "--warmup-version", str(args.max_versions // 3)),
    ]


def job(method: str, setting: str, trace: str, args) -> tuple[str, list[str]]:
    """(job script, flags) of one method in one setting."""
    script, extra = method_args(method, args)
    trace_flags = ["--trace-file", trace] if setting == "trace" else []
    return script, [*extra, *common_args(args), *SETTINGS[setting], *trace_flags]


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--dataset", default="digits", help="the jobs' --dataset")
    parser.add_argument("--devices-per-leaf", type=int, default=50_000, help="2 leaves: population = 2x this")
    parser.add_argument("--samples-per-device", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--buffer-size", type=int, default=2)
    parser.add_argument("--max-versions", type=int, default=150)
    parser.add_argument("--eval-frequency", type=int, default=25)
    parser.add_argument("--global-lr", type=float, default=0.3)
    parser.add_argument("--samples-per-second", type=float, default=1.0, help="speed-1 device (a job: 320 s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default="fedbuff,fedrevive")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list of: {', '.join(SETTINGS)}")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    args = parser.parse_args()
    session = Session("availability_quality")
    settings = items(parser, "--settings", args.settings, allowed=tuple(SETTINGS))
    print(f"load average before: {session.load_start}")
    pairs = [(method, setting) for method in items(parser, "--methods", args.methods) for setting in settings]
    with tempfile.TemporaryDirectory(prefix="availability_quality_") as workdir:
        trace = write_trace(os.path.join(workdir, "trace.npz"), 2 * args.devices_per_leaf, args.seed)
        done = run_jobs({f"{m} {s}": job(m, s, trace, args) for m, s in pairs}, args.timeout, workdir=workdir)
    rows = [
        (method, setting, {**results["summary"], "best_accuracy": best_accuracy(results), "wall": results["wall"]})
        for (method, setting), results in zip(pairs, done.values(), strict=True)
    ]
    print(f"load average after:  {load()}")
    print(
        f"{2 * args.devices_per_leaf:,} devices, {args.dataset}, K={args.concurrency} B={args.buffer_size}, "
        f"{args.max_versions} versions, {args.samples_per_device} samples/device, "
        f"--samples-per-second {args.samples_per_second:g}, seed {args.seed}"
    )
    table = []
    for method, setting, s in rows:
        lost = s["dropouts_by_cause"].get("session_end", 0)
        finished = s["accepted_updates"] + sum(s["dropouts_by_cause"].values())
        part, stale = s["participation"], s["staleness"]
        accuracy = [f"{s['final_accuracy']:.4f}", f"{s['best_accuracy']:.4f}", f"{s['simulated_time'] / 3600:.2f}"]
        lost_cells = [lost, f"{100 * lost / max(finished, 1):.1f}", part["participated"], f"{part['jain_index']:.4f}"]
        table.append(
            [method, setting, *accuracy, *lost_cells, f"{stale['mean']:.2f}", stale["p90"], f"{s['wall']:.0f}"]
        )
    columns = ["method", "setting", "final acc", "best acc", "sim time h", "session_end", "lost %", "devices", "Jain"]
    print_table([*columns, "stale mean", "p90", "wall s"], table)
    if args.json:
        runs = [{"method": m, "setting": setting, "summary": s} for m, setting, s in rows]
        session.write({"settings": vars(args), "rows": runs}, figures(rows, session))
    return 0


def figures(rows: list[tuple[str, str, dict]], session: Session) -> list[dict[str, str]]:
    """Per method run both always-on (profile delays) and on the trace: the final accuracy of each."""
    final = {(method, setting): s["final_accuracy"] for method, setting, s in rows}
    published = []
    for method in dict.fromkeys(method for method, _, _ in rows):
        if (method, "always / profile") in final and (method, "trace") in final:
            label = {"fedbuff": "FedBuff", "fedrevive": "FedRevive"}.get(method, method)
            published.append(
                session.figure(
                    f"availability: {label} final accuracy always-on / trace",
                    f"{final[(method, 'always / profile')]:.3f} / {final[(method, 'trace')]:.3f}",
                    "learns on traces",
                )
            )
    return published


if __name__ == "__main__":
    sys.exit(main())
