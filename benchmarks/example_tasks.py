"""The example tasks (examples/) through every method in NVFlare's simulator: final metrics and one figure each.

Runs each example with FedAvg, FedBuff and (for continuous inputs) FedRevive at the settings below, in temporary
workspaces, and prints per run the final metrics, the rounds or versions and the job's wall time. Writes one PNG
per example comparing its runs (accuracy against rounds/versions, simulated time and wall time,
``devsim.observe.plots``) to ``--figures`` and, with ``--json``, the table under ``benchmarks/results/``.

    .venv/bin/python benchmarks/example_tasks.py --figures docs --json
    .venv/bin/python benchmarks/example_tasks.py --examples penguins --methods fedavg,fedbuff
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import REPO, Session, arguments, items, load, run_jobs  # noqa: E402

PENGUINS_LOCAL = ["--local-epochs", "5", "--batch-size", "4"]
TEXT_LOCAL = ["--local-iterations", "20", "--batch-size", "32", "--optimizer", "adam", "--lr", "0.003"]
ASYNC = ["--buffer-size", "5", "--concurrency", "20", "--eval-frequency", "10"]

RUNS: dict[str, dict[str, list[str]]] = {
    "penguins": {
        "fedavg": [*PENGUINS_LOCAL, "--device-selection-size", "40", "--num-rounds", "20"],
        "fedbuff": [*PENGUINS_LOCAL, *ASYNC, "--global-lr", "1.0", "--max-versions", "80"],
        "fedrevive": ["--max-versions", "150"],
    },
    "text": {
        "fedavg": [*TEXT_LOCAL, "--device-selection-size", "20", "--num-rounds", "30"],
        "fedbuff": [*TEXT_LOCAL, *ASYNC, "--global-lr", "1.0", "--max-versions", "120"],
    },
    "mnist": {
        "fedavg": ["--num-rounds", "20"],
        "fedbuff": [*ASYNC, "--global-lr", "0.5", "--max-versions", "100"],
        "fedrevive": ["--max-versions", "150"],
    },
}
"""Example -> method -> job flags (besides --task and the workspace); the seed is the jobs' default (0)."""


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--examples", default=",".join(RUNS))
    parser.add_argument("--methods", default="fedavg,fedbuff,fedrevive")
    parser.add_argument("--figures", default=None, help="folder for example_<name>.png (default: none)")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per job")
    args = parser.parse_args()
    examples = items(parser, "--examples", args.examples, allowed=tuple(RUNS))
    methods = items(parser, "--methods", args.methods)
    session = Session("example_tasks")
    print(f"machine: {session.where()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="devsim-examples-") as workdir:
        for example in examples:
            task = ["--task", os.path.join(REPO, "examples", f"{example}_task.py")]
            chosen = {m: (f"pt_job_{m}.py", [*task, *RUNS[example][m]]) for m in methods if m in RUNS[example]}
            done = run_jobs({f"{example}-{m}": job for m, job in chosen.items()}, args.timeout, workdir=workdir)
            runs = [
                {"example": example, "method": m, "flags": RUNS[example][m], "summary": r["summary"], "wall": r["wall"]}
                for m, r in zip(chosen, done.values(), strict=True)
            ]
            for row in runs:
                summary = row["summary"]
                progress = f"{summary['rounds']} rounds" if "rounds" in summary else f"{summary['versions']} versions"
                metrics = ", ".join(f"{k} {v:.4f}" for k, v in (summary.get("final_metrics") or {}).items())
                print(f"{example:<9} {row['method']:<10} {metrics} after {progress}; job wall {row['wall']:.0f} s")
            if args.figures:
                from devsim.observe.plots import plot_runs

                path = os.path.join(args.figures, f"example_{example}.png")
                plot_runs(
                    [os.path.join(workdir, name, "out") for name in done], path, title=f"examples/{example}_task.py"
                )
                print(f"wrote {path}")
            rows += runs
    print(f"load average at end {load()}")
    if args.json:
        session.write({"rows": rows}, figures(rows, session))


def figures(rows: list[dict], session: Session) -> list[dict]:
    """One figure per example: its final accuracy under each method run (``refused`` where a method refuses it)."""
    by_example: dict[str, dict[str, str]] = {}
    for row in rows:
        summary = row.get("summary") or {}
        accuracy = summary.get("final_accuracy")
        by_example.setdefault(row["example"], {})[row["method"]] = "refused" if accuracy is None else f"{accuracy:.3f}"
    return [
        session.figure(
            f"example {example}: final accuracy ({' / '.join(methods)})",
            " / ".join(methods.values()),
            "well above chance (FedAvg, FedBuff)",
            f".venv/bin/python benchmarks/example_tasks.py --examples {example} --json",
        )
        for example, methods in by_example.items()
    ]


if __name__ == "__main__":
    main()
