"""The same edge workload through NVFlare's stock edge simulation and through this project: seconds per round.

Three sides train the same workload (model, devices, samples per device, epochs, batch size, learning
rate, shards), every device in every round (synchronous FedAvg), with the global model evaluated on
the same test set after every round, in NVFlare's simulator on this machine:

- stock: NVFlare's edge components as ``EdgeFedBuffRecipe`` assembles them, in its flat simulator
  topology (``DevsimEdgeRecipe(runner="stock", numpy_payloads=False)``: NVFlare's ``TPORunner`` device
  simulator, with its 0.5 s pause per dispatched device and a processor copy per device, and
  ``BuffModelManager`` with list payloads), driving
  :class:`~processors.reference_edge_processor.ReferenceEdgeTaskProcessor`, a processor written the
  way NVFlare's edge examples write theirs (model, Dataset and DataLoader built per task, weights as
  lists). ``EdgeFedBuffRecipe`` itself imports torchvision, which this environment lacks;
- edge: ``jobs/pt_job_edge.py`` with its defaults (fast device runner, NumPy payloads, this
  project's processor);
- collab: ``jobs/pt_job_fedavg.py`` (this project's Collab FedAvg job) with all devices selected.

Figures: steady-state seconds per round (edge jobs: ``since_previous_s`` between global model versions
in ``edge_results.json``; Collab: ``round_seconds`` in ``results.json``; both include the evaluation),
median over the rounds after ``--warmup-rounds``, and the speedups stock / edge and stock / collab.
Every side runs as its own process group in a temporary workspace with HOME pointed inside it, and
is killed (with every process it started) when it exceeds ``--timeout``.

    .venv/bin/python benchmarks/stock_edge_comparison.py                      # 2 leaves x 32 devices
    .venv/bin/python benchmarks/stock_edge_comparison.py --devices-per-leaf 4 --rounds 3   # smoke test
    .venv/bin/python benchmarks/stock_edge_comparison.py --sides stock,edge --loader-workers 2
    .venv/bin/python benchmarks/stock_edge_comparison.py --json             # also the results JSON

``--json`` writes every side's rounds and median, and (when all three sides ran) the published figure, to
``benchmarks/results/stock_edge_comparison-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.harness import Session, load, run_isolated  # noqa: E402
from devsim_flare.edge.job import find_results  # noqa: E402

SIDES = ("stock", "edge", "collab")
CHILD_FLAG = "--run-stock-child"


def workload_flags(args: argparse.Namespace) -> list[str]:
    """Processor settings shared by every side, as flags of the project's job scripts."""
    return [
        *("--num-leaf-nodes", str(args.leaves), "--devices-per-leaf", str(args.devices_per_leaf)),
        *("--samples-per-device", str(args.samples), "--local-epochs", str(args.epochs)),
        *("--batch-size", str(args.batch_size), "--lr", str(args.lr), "--model", args.model),
        *("--partition", args.partition, "--alpha", str(args.alpha), "--seed", str(args.seed)),
        *("--synthetic-train-size", str(args.synthetic_train_size)),
    ]


def side_command(side: str, args: argparse.Namespace, workdir: str) -> list[str]:
    """The command line of one side; results land in ``workdir/out``."""
    common = [*workload_flags(args), "--workspace", os.path.join(workdir, "ws")]
    common += ["--output-dir", os.path.join(workdir, "out")]
    if side == "collab":
        selected = str(args.leaves * args.devices_per_leaf)
        rounds = ["--num-rounds", str(args.rounds), "--eval-frequency", "1"]
        return [
            sys.executable,
            os.path.join(REPO, "jobs", "pt_job_fedavg.py"),
            *common,
            "--device-selection-size",
            selected,
            *rounds,
        ]
    edge = [*common, "--num-versions", str(args.rounds), "--eval-frequency", "1"]
    if side == "edge":
        return [sys.executable, os.path.join(REPO, "jobs", "pt_job_edge.py"), *edge]
    child = [sys.executable, os.path.abspath(__file__), CHILD_FLAG, "--loader-workers", str(args.loader_workers)]
    if args.reload_data_per_task:
        child.append("--reload-data-per-task")
    if args.stock_workers:
        edge += ["--num-workers", str(args.stock_workers)]
    return [*child, "--", *edge, "--runner", "stock", "--payloads", "lists"]


def round_seconds(side: str, out_dir: str) -> list[float]:
    """Seconds of every trained round / version of a finished side, in order."""
    if side == "collab":
        path = find_results(out_dir, "results.json")
        if not path:
            return []
        with open(path, encoding="utf-8") as stream:
            return [float(r["round_seconds"]) for r in json.load(stream)["rounds"]]
    path = find_results(out_dir, "edge_results.json")
    if not path:
        return []
    with open(path, encoding="utf-8") as stream:
        records = json.load(stream)["records"]
    # version 1 is the initial model (its gap is job start-up); versions 2.. are trained rounds
    return [float(r["since_previous_s"]) for r in records if int(r["version"]) >= 2]


def collab_breakdown(out_dir: str, warmup: int) -> str:
    """Median training part (send -> aggregated) and evaluation part of the Collab job's steady rounds."""
    path = find_results(out_dir, "results.json")
    if not path:
        return ""
    with open(path, encoding="utf-8") as stream:
        rounds = json.load(stream)["rounds"][warmup:]
    if not rounds:
        return ""
    train = statistics.median(float(r["train_seconds"]) for r in rounds)
    evaluation = statistics.median(float(r["timing"]["parts"].get("evaluation", 0.0)) for r in rounds)
    return f"steady rounds: training part (send -> aggregated) {train:.3f} s, evaluation {evaluation:.3f} s (medians)"


def run_stock_child(argv: list[str]) -> int:
    """Child process of the stock side: ``jobs/pt_job_edge.py`` with the reference processor on the leaves."""
    parser = argparse.ArgumentParser(prog=f"stock_edge_comparison.py {CHILD_FLAG}")
    parser.add_argument("--loader-workers", type=int, default=0)
    parser.add_argument("--reload-data-per-task", action="store_true")
    parser.add_argument("job_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    job_args = args.job_args[1:] if args.job_args[:1] == ["--"] else args.job_args
    sys.path.insert(0, REPO)
    from devsim_flare.edge import cli as job
    from processors.reference_edge_processor import ReferenceEdgeTaskProcessor

    recipe_cls = job.DevsimEdgeRecipe

    def recipe_with_reference_processor(**kwargs):
        processor = ReferenceEdgeTaskProcessor(
            settings=kwargs["settings"],
            devices_per_leaf=kwargs["devices_per_leaf"],
            loader_workers=args.loader_workers,
            reload_data_per_task=args.reload_data_per_task,
        )
        return recipe_cls(processor=processor, **kwargs)

    job.DevsimEdgeRecipe = recipe_with_reference_processor  # build_recipe looks it up in the CLI module
    return job.main(job_args)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        return run_stock_child(sys.argv[2:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--leaves", type=int, default=2, help="leaf sites (NVFlare clients), flat topology")
    parser.add_argument("--devices-per-leaf", type=int, default=32, help="all are selected every round")
    parser.add_argument("--samples", type=int, default=100, help="samples per device")
    parser.add_argument("--epochs", type=int, default=1, help="local epochs")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--partition", default="dirichlet")
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--synthetic-train-size", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5, help="trained rounds (global model versions) per side")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="first rounds left out of the median")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma list of {', '.join(SIDES)}")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per side before it is killed")
    parser.add_argument(
        "--loader-workers", type=int, default=0, help="stock side: DataLoader workers per task (NVFlare's example: 2)"
    )
    parser.add_argument(
        "--reload-data-per-task",
        action="store_true",
        help="stock side: load the training arrays in every task, as NVFlare's example's torchvision dataset does",
    )
    parser.add_argument(
        "--stock-workers", type=int, default=None, help="stock side: device threads per leaf (default NVFlare's 4)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary workspaces (their path is printed)")
    parser.add_argument("--json", action="store_true", help="write the sides and figure under benchmarks/results/")
    args = parser.parse_args()
    session = Session("stock_edge_comparison")
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = [s for s in sides if s not in SIDES]
    if unknown or not sides:
        parser.error(f"--sides takes a comma list of {', '.join(SIDES)}; got {args.sides!r}")
    if args.rounds <= args.warmup_rounds:
        parser.error("--rounds must exceed --warmup-rounds")

    devices = args.leaves * args.devices_per_leaf
    print(
        f"workload: {args.leaves} leaves x {args.devices_per_leaf} devices = {devices} devices, all selected every "
        f"round; {args.samples} samples x {args.epochs} epoch(s), batch {args.batch_size}, lr {args.lr}, "
        f"model {args.model}, {args.partition} partition; {args.rounds} rounds, median of rounds "
        f"{args.warmup_rounds + 1}..{args.rounds}"
    )
    print(
        f"stock side: reference processor, DataLoader workers {args.loader_workers}, training data "
        f"{'reloaded per task' if args.reload_data_per_task else 'cached per process'}, "
        f"device threads per leaf {args.stock_workers or 'NVFlare default (4)'}"
    )
    print(f"machine: {os.cpu_count()} cores, load average {load()} at start", flush=True)

    root = tempfile.mkdtemp(prefix="devsim-edgecmp-")
    results: dict[str, dict] = {}
    try:
        for side in sides:
            workdir = os.path.join(root, side)
            os.makedirs(workdir)
            cmd = side_command(side, args, workdir)
            print(f"[{side}] running (timeout {args.timeout:.0f} s) ...", flush=True)
            rc, wall, tail = run_isolated(cmd, workdir, args.timeout, log_name="side.log")
            rounds = round_seconds(side, os.path.join(workdir, "out"))
            status = "timed out" if rc is None else f"exit {rc}"
            if rc != 0 or len(rounds) < args.rounds:
                print(f"[{side}] {status}, {len(rounds)} of {args.rounds} rounds recorded; log tail:\n{tail}")
            steady = rounds[args.warmup_rounds :]
            median = statistics.median(steady) if steady else float("nan")
            results[side] = {"rounds": rounds, "median": median, "wall": wall, "status": status}
            if side == "collab":
                print(f"[collab] {collab_breakdown(os.path.join(workdir, 'out'), args.warmup_rounds)}")
            print(
                f"[{side}] {status} after {wall:.1f} s wall; round seconds: {', '.join(f'{t:.2f}' for t in rounds)}; "
                f"load average {load()}",
                flush=True,
            )
    finally:
        if args.keep:
            print(f"workspaces kept in {root}")
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)

    print()
    print(f"{'side':<8} {'steady s/round':>15} {'samples/s':>11} {'stock / side':>13}   rounds (s)")
    samples = devices * args.samples * args.epochs
    stock = results.get("stock", {}).get("median")
    for side in sides:
        r = results[side]
        median = r["median"]
        measured = median == median and median > 0
        time_text = f"{median:>15.3f}" if measured else f"{'-':>15}"
        rate_text = f"{samples / median:>11,.0f}" if measured else f"{'-':>11}"
        speed_text = f"{stock / median:>12.1f}x" if measured and stock == stock and stock else f"{'-':>13}"
        print(
            f"{side:<8} {time_text} {rate_text} {speed_text}   "
            f"{', '.join(f'{t:.2f}' for t in r['rounds'])}  [{r['status']}]"
        )
    print(f"load average at end {load()}")
    if args.json:
        payload = {"settings": vars(args), "sides": results}
        published = figures(results, session)
        session.write(payload, published)
    return 0 if all(r["status"] == "exit 0" for r in results.values()) else 1


def figures(results: dict[str, dict], session: Session) -> list[dict[str, str]]:
    """Steady seconds per round of the three sides and the speed-ups stock / edge and stock / collab (all three
    sides measured, every run complete)."""
    medians = {side: results.get(side, {}).get("median", float("nan")) for side in SIDES}
    complete = all(results.get(side, {}).get("status") == "exit 0" for side in SIDES)
    if not complete or not all(value == value and value > 0 for value in medians.values()):
        return []
    stock, edge, collab = (medians[side] for side in SIDES)
    return [
        session.figure(
            "stock NVFlare edge round / this project's edge job / Collab FedAvg",
            f"{stock:.2f} / {edge:.2f} / {collab:.2f} s ({stock / edge:.1f}x, {stock / collab:.1f}x)",
            "faster than stock",
        )
    ]


if __name__ == "__main__":
    sys.exit(main())
