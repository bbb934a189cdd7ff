"""The same edge workload through NVFlare's stock edge simulation and through this project: seconds per round.

Three sides train the same workload (CNN, 2 leaves x ``--devices-per-leaf`` devices, ``--samples`` samples a
device, 1 epoch, batch 10, lr 0.05, Dirichlet 0.5 shards, seed 0), every device in every round (synchronous FedAvg),
the global model evaluated on the same test set after every round, in NVFlare's simulator on this machine:

- stock: NVFlare's edge components as ``EdgeFedBuffRecipe`` assembles them (``jobs/pt_job_edge.py --runner stock
  --payloads lists``: NVFlare's ``TPORunner`` and ``BuffModelManager`` with list payloads, see docs/environments.md),
  driving :class:`~processors.reference_edge_processor.ReferenceEdgeTaskProcessor`, a processor written the way
  NVFlare's edge examples write theirs (``EdgeFedBuffRecipe`` itself imports torchvision, which this environment
  lacks);
- edge: ``jobs/pt_job_edge.py`` with its defaults (fast device runner, NumPy payloads, this project's processor);
- collab: ``jobs/pt_job_fedavg.py`` (this project's Collab FedAvg job) with all devices selected.

Figures: steady-state seconds per round (edge jobs: ``since_previous_s`` between global model versions; Collab:
``round_seconds``; both include the evaluation), median over the rounds after ``--warmup-rounds``, and the
speed-ups stock / edge and stock / collab. Each side runs through ``harness.run_isolated``.

    .venv/bin/python benchmarks/stock_edge_comparison.py --json
    .venv/bin/python benchmarks/stock_edge_comparison.py --devices-per-leaf 4 --rounds 3   # smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import REPO, Session, arguments, load, read_results, run_isolated  # noqa: E402

SIDES = ("stock", "edge", "collab")
CHILD_FLAG = "--run-stock-child"
WORKLOAD = [
    *("--num-leaf-nodes", "2", "--local-epochs", "1", "--batch-size", "10", "--lr", "0.05", "--model", "cnn"),
    *("--partition", "dirichlet", "--alpha", "0.5", "--seed", "0", "--synthetic-train-size", "20000"),
]


def side_command(side: str, args: argparse.Namespace, workdir: str) -> list[str]:
    """The command line of one side; results land in ``workdir/out``."""
    common = [*WORKLOAD, "--devices-per-leaf", str(args.devices_per_leaf), "--samples-per-device", str(args.samples)]
    common += ["--workspace", os.path.join(workdir, "ws"), "--output-dir", os.path.join(workdir, "out")]
    if side == "collab":
        selected = ["--device-selection-size", str(2 * args.devices_per_leaf)]
        rounds = ["--num-rounds", str(args.rounds), "--eval-frequency", "1"]
        return [sys.executable, os.path.join(REPO, "jobs", "pt_job_fedavg.py"), *common, *selected, *rounds]
    edge = [*common, "--num-versions", str(args.rounds), "--eval-frequency", "1"]
    if side == "edge":
        return [sys.executable, os.path.join(REPO, "jobs", "pt_job_edge.py"), *edge]
    return [sys.executable, os.path.abspath(__file__), CHILD_FLAG, *edge, "--runner", "stock", "--payloads", "lists"]


def round_seconds(side: str, out_dir: str) -> list[float]:
    """Seconds of every trained round / version of a finished side, in order."""
    results = read_results(out_dir, "results.json" if side == "collab" else "edge_results.json")
    if results is None:
        return []
    if side == "collab":
        return [float(r["round_seconds"]) for r in results["rounds"]]
    # version 1 is the initial model (its gap is job start-up); versions 2.. are trained rounds
    return [float(r["since_previous_s"]) for r in results["records"] if int(r["version"]) >= 2]


def run_stock_child(job_args: list[str]) -> int:
    """Child process of the stock side: ``jobs/pt_job_edge.py`` with the reference processor on the leaves."""
    from devsim_flare.edge import cli as job
    from processors.reference_edge_processor import ReferenceEdgeTaskProcessor

    recipe_cls = job.DevsimEdgeRecipe

    def recipe_with_reference_processor(**kwargs):
        processor = ReferenceEdgeTaskProcessor(settings=kwargs["settings"], devices_per_leaf=kwargs["devices_per_leaf"])
        return recipe_cls(processor=processor, **kwargs)

    job.DevsimEdgeRecipe = recipe_with_reference_processor  # build_recipe looks it up in the CLI module
    return job.main(job_args)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        return run_stock_child(sys.argv[2:])
    parser = arguments(__doc__)
    parser.add_argument("--devices-per-leaf", type=int, default=32, help="all are selected every round")
    parser.add_argument("--samples", type=int, default=100, help="samples per device")
    parser.add_argument("--rounds", type=int, default=5, help="trained rounds (global model versions) per side")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="first rounds left out of the median")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per side before it is killed")
    args = parser.parse_args()
    if args.rounds <= args.warmup_rounds:
        parser.error("--rounds must exceed --warmup-rounds")
    session = Session("stock_edge_comparison")
    print(f"2 leaves x {args.devices_per_leaf} devices, all selected; machine: {session.where()}")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="devsim-edgecmp-") as root:
        for side in SIDES:
            workdir = os.path.join(root, side)
            os.makedirs(workdir)
            rc, wall, tail = run_isolated(side_command(side, args, workdir), workdir, args.timeout, "side.log")
            rounds = round_seconds(side, os.path.join(workdir, "out"))
            status = "timed out" if rc is None else f"exit {rc}"
            if rc != 0 or len(rounds) < args.rounds:
                print(f"[{side}] {status}, {len(rounds)} of {args.rounds} rounds recorded; log tail:\n{tail}")
            steady = rounds[args.warmup_rounds :]
            median = statistics.median(steady) if steady else float("nan")
            results[side] = {"rounds": rounds, "median": median, "wall": wall, "status": status}
            print(f"[{side}] {status}, {wall:.1f} s wall; round s: {', '.join(f'{t:.2f}' for t in rounds)}")
    samples = 2 * args.devices_per_leaf * args.samples
    stock = results["stock"]["median"]
    print(f"\n{'side':<8} {'steady s/round':>15} {'samples/s':>11} {'stock / side':>13}")
    for side, row in results.items():
        print(f"{side:<8} {row['median']:>15.3f} {samples / row['median']:>11,.0f} {stock / row['median']:>12.1f}x")
    print(f"load average at end {load()}")
    if args.json:
        session.write({"settings": vars(args), "sides": results}, figures(results, session))
    return 0 if all(r["status"] == "exit 0" for r in results.values()) else 1


def figures(results: dict[str, dict], session: Session) -> list[dict[str, str]]:
    """Steady seconds per round of the three sides and the speed-ups stock / edge and stock / collab (every side
    complete)."""
    medians = [results[side]["median"] for side in SIDES]
    if any(results[side]["status"] != "exit 0" for side in SIDES) or not all(m > 0 for m in medians):
        return []
    stock, edge, collab = medians
    return [
        session.figure(
            "stock NVFlare edge round / this project's edge job / Collab FedAvg",
            f"{stock:.2f} / {edge:.2f} / {collab:.2f} s ({stock / edge:.1f}x, {stock / collab:.1f}x)",
            "faster than stock",
        )
    ]


if __name__ == "__main__":
    sys.exit(main())
