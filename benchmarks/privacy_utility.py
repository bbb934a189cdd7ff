"""Privacy-utility table: test accuracy of DP-FedAvg at epsilon 1, 4 and 8 against the same run without DP.

A population of ``--devices`` (default 5,000) devices on a real task (``--task``, default the MNIST digits of
examples/mnist_task.py: 4,000 training images, so the devices' iid shards of ``--samples`` images overlap), in one
process without NVFlare: the leaf's round runner (batched devices) and the server's aggregation are the ones the
jobs run. With DP each round selects devices by Poisson sampling at rate ``--cohort / --devices``, clips each update
to ``--clip``, adds Gaussian noise to the sum (server placement) and divides by ``--cohort``; the noise multiplier is
solved with dp-accounting (RDP) for the target epsilon after ``--rounds`` rounds at delta = 1 / devices^1.1. Without
DP the cohort is ``--cohort`` devices drawn without replacement, sample-weighted FedAvg. Same seed everywhere.

    .venv/bin/python benchmarks/privacy_utility.py --json   # benchmarks/results/privacy_utility-<date>.json + PNG
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.harness import REPO, RESULTS, Session, arguments  # noqa: E402
from devsim.aggregation import FedAvg, LeafUpdate  # noqa: E402
from devsim.codec import load_numpy_into_model, model_to_numpy  # noqa: E402
from devsim.config import SimulationConfig  # noqa: E402
from devsim.population.devices import DevicePopulation  # noqa: E402
from devsim.privacy.plan import PrivacyPlan, resolve_noise_multiplier  # noqa: E402
from devsim.privacy.sampling import poisson_select  # noqa: E402
from devsim.privacy.server import LeafSum, PrivateAggregator  # noqa: E402
from devsim.tasks.resolve import load_task  # noqa: E402
from devsim.training.evaluation import Evaluator  # noqa: E402
from devsim.training.leaf_runner import LeafRoundRunner  # noqa: E402
from processors.task_processor import TaskDeviceProcessor  # noqa: E402


def run(args, config: SimulationConfig, epsilon: float | None) -> dict:
    """One run; returns its settings, per-evaluation accuracy and seconds."""
    settings = config.to_dict()
    runner = LeafRoundRunner([TaskDeviceProcessor.from_settings(settings)], device_batch=args.device_batch)
    task = load_task(settings)
    torch.manual_seed(config.seed)
    model = task.build_model()
    weights = model_to_numpy(model)
    evaluator = Evaluator.for_task(task, torch.device("cpu"))
    aggregator, z = None, None
    if epsilon is not None:
        z = resolve_noise_multiplier(
            dataclasses.replace(config, dp_epsilon=epsilon, dp_noise_multiplier=None), args.rounds
        )
        plan = PrivacyPlan.from_settings(dataclasses.replace(config, dp_noise_multiplier=z))
        aggregator = PrivateAggregator(plan, config.seed, num_leaves=1, global_lr=config.global_lr)
    population = DevicePopulation(1, args.devices, seed=config.seed)
    fedavg = FedAvg(config.global_lr)
    curve, started = [], time.perf_counter()
    try:
        for round_num in range(args.rounds):
            if aggregator is None:
                devices = population.select(round_num, args.cohort).tolist()
                result = runner.run_round(round_num, weights, devices)
                weights = fedavg.aggregate(weights, [LeafUpdate("leaf", result.delta_sum, result.total_weight, 1)])
                eps = None
            else:
                devices = poisson_select(config.seed, round_num, args.devices, aggregator.plan.rate).tolist()
                sums = []
                if devices:
                    result = runner.run_round(round_num, weights, devices, privacy=aggregator.device_privacy())
                    sums = [LeafSum(result.delta_sum, len(result.device_metrics))]
                weights, record = aggregator.aggregate(round_num, weights, sums)
                eps = record["dp_epsilon"]
            if (round_num + 1) % args.eval_every == 0 or round_num + 1 == args.rounds:
                load_numpy_into_model(model, weights)
                accuracy = evaluator.evaluate(model).metrics["accuracy"]
                curve.append({"round": round_num + 1, "accuracy": accuracy, "epsilon": eps})
                print(f"  epsilon target {epsilon}: round {round_num + 1} accuracy {accuracy:.4f} epsilon {eps}")
    finally:
        runner.close()
    return {
        "target_epsilon": epsilon,
        "noise_multiplier": z,
        "final_accuracy": curve[-1]["accuracy"],
        "final_epsilon": curve[-1]["epsilon"],
        "curve": curve,
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--task", default=os.path.join(REPO, "examples", "mnist_task.py"))
    parser.add_argument("--devices", type=int, default=5000)
    parser.add_argument("--cohort", type=int, default=250, help="expected devices per round")
    parser.add_argument("--samples", type=int, default=16, help="samples per device")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--global-lr", type=float, default=1.0)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device-batch", type=int, default=25)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument(
        "--settings",
        default="none,1,4,8",
        help="rows: none (no DP), an epsilon, or clip (DP's clipping, sampling and denominator with zero noise)",
    )
    args = parser.parse_args(argv)
    session = Session("privacy_utility")
    torch.set_num_threads(1)
    config = SimulationConfig(
        task=os.path.abspath(args.task),
        num_leaf_nodes=1,
        devices_per_leaf=args.devices,
        device_selection_size=args.cohort,
        samples_per_device=args.samples,
        partition="iid",
        local_epochs=args.local_epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        global_lr=args.global_lr,
        dp="central",
        dp_noise_multiplier=1.0,
        dp_clip=args.clip,
        seed=0,
    )
    chosen = {"none": None, "clip": math.inf}
    rows = [run(args, config, chosen[w] if w in chosen else float(w)) for w in args.settings.split(",")]
    baseline = next((r["final_accuracy"] for r in rows if r["target_epsilon"] is None), math.nan)
    print(f"machine: {session.where()}")
    print("| epsilon | noise multiplier | accuracy | vs. no DP | seconds |\n| --- | --- | --- | --- | --- |")
    for row in rows:
        name = "no DP" if row["target_epsilon"] is None else f"{row['final_epsilon']:.3f}"
        z = "—" if row["noise_multiplier"] is None else f"{row['noise_multiplier']:.3f}"
        gap = (row["final_accuracy"] - baseline) * 100
        print(f"| {name} | {z} | {row['final_accuracy']:.4f} | {gap:+.1f} points | {row['seconds']:.0f} |")
    if args.json:
        at8 = next((r for r in rows if r["target_epsilon"] == 8.0), None)
        shown = [
            session.figure(
                f"privacy-utility: accuracy at epsilon {r['target_epsilon']:g}, {args.devices} devices",
                f"{r['final_accuracy']:.4f} (no DP {baseline:.4f})",
                "epsilon 8 within 5 points of no DP" if r is at8 else "reported",
            )
            for r in rows
            if r["target_epsilon"] is not None
        ]
        session.write({"settings": vars(args), "rows": rows}, shown)
        plot(rows, os.path.join(RESULTS, f"privacy_utility-{session.date}.png"))
    return 0


def plot(rows: list[dict], path: str) -> None:
    """Accuracy against round for each setting (matplotlib; skipped when it is not installed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        label = "no DP" if row["target_epsilon"] is None else f"epsilon {row['target_epsilon']:g}"
        ax.plot([c["round"] for c in row["curve"]], [c["accuracy"] for c in row["curve"]], marker="o", label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title("DP-FedAvg privacy-utility (5,000 devices)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
