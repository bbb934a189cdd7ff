"""User-level DP measured in one process without NVFlare: what it costs a round, and what it does to accuracy.

Both modes drive the jobs' own leaf round runner (batched devices) and the server's aggregation.

``cost``: one leaf's round and the server's aggregation of its sum, alternately without DP
(:class:`~devsim.aggregation.FedAvg`) and with central DP (each device's update clipped where it is computed;
:class:`~devsim.privacy.server.PrivateAggregator` adds seeded Gaussian noise to the sum, divides by the fixed
denominator and steps the accountant), the same devices from the same model; the first round of each is a warm-up.
Printed: each setting's median round (ms) and their ratio (target: DP <= 1.10x). ``--asynchronous``: the same for a
DP-FedBuff version (B = ``--devices`` jobs in one ``run_jobs`` call, each delta clipped, with ``--noise-at leaves``
also noised with its share, then one buffer applied with its noise and the accountant's step).

``utility``: test accuracy of DP-FedAvg at epsilon 1, 4 and 8 against the same run without DP. A population of
``--devices`` (default 5,000) devices on a real task (``--task``, default the MNIST digits of examples/mnist_task.py:
4,000 training images, so the devices' iid shards of ``--samples`` images overlap). With DP each round selects devices
by Poisson sampling at rate ``--cohort / --devices``, clips each update to ``--clip``, adds Gaussian noise to the sum
(server placement) and divides by ``--cohort``; the noise multiplier is solved with dp-accounting (RDP) for the target
epsilon after ``--rounds`` rounds at delta = 1 / devices^1.1. Without DP the cohort is ``--cohort`` devices drawn
without replacement, sample-weighted FedAvg. ``--server-optimizer`` steps both with that optimizer (DP-FedAvgM,
DP-FedAdam: the noised mean). Same seed everywhere.

    .venv/bin/python benchmarks/privacy.py cost --rounds 12 --json        # privacy_cost-rdp-<date>.json
    .venv/bin/python benchmarks/privacy.py cost --asynchronous --json     # privacy_cost-async-server-<date>.json
    .venv/bin/python benchmarks/privacy.py utility --json                 # privacy_utility-<date>.json + PNG
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.harness import REPO, RESULTS, Session  # noqa: E402
from devsim.aggregation import FedAvg, LeafUpdate  # noqa: E402
from devsim.aggregation.fedbuff import FedBuff  # noqa: E402
from devsim.aggregation.server_optimizers import SERVER_OPTIMIZERS, server_optimizer_for  # noqa: E402
from devsim.codec import load_numpy_into_model, model_to_numpy  # noqa: E402
from devsim.config import AsyncConfig, SimulationConfig  # noqa: E402
from devsim.models import build_model  # noqa: E402
from devsim.population.devices import DevicePopulation  # noqa: E402
from devsim.privacy.buffered import BufferedPrivacy  # noqa: E402
from devsim.privacy.device import DevicePrivacy  # noqa: E402
from devsim.privacy.plan import PrivacyPlan, resolve_noise_multiplier  # noqa: E402
from devsim.privacy.sampling import poisson_select  # noqa: E402
from devsim.privacy.server import LeafSum, PrivateAggregator  # noqa: E402
from devsim.tasks.resolve import load_task  # noqa: E402
from devsim.training.evaluation import Evaluator  # noqa: E402
from devsim.training.leaf_runner import LeafRoundRunner  # noqa: E402
from processors.task_processor import TaskDeviceProcessor  # noqa: E402


def cost(args: argparse.Namespace, session: Session) -> int:
    """A DP round (or, ``--asynchronous``, a DP-FedBuff version) against a plain one, alternately."""
    settings = dict(dataset="digits", samples_per_device=50, partition="iid", batch_size=10, seed=0)
    runner = LeafRoundRunner([TaskDeviceProcessor.from_settings(settings)], device_batch=args.device_batch)
    if args.asynchronous:
        return _asynchronous(args, runner, session)
    config = SimulationConfig(
        dp="central", dp_noise_multiplier=1.0, dp_clip=1.0, dp_accountant=args.accountant, devices_per_leaf=500
    )
    aggregator = PrivateAggregator(PrivacyPlan.from_settings(config), seed=0, num_leaves=1)
    fedavg = FedAvg()
    weights = model_to_numpy(build_model("cnn"))
    devices = list(range(args.devices))
    times: dict[str, list[float]] = {"plain": [], "dp": []}
    try:
        for round_num in range(args.rounds):
            for name in ("plain", "dp") if round_num % 2 == 0 else ("dp", "plain"):
                started = time.perf_counter()
                if name == "plain":
                    result = runner.run_round(round_num, weights, devices)
                    update = LeafUpdate("leaf", result.delta_sum, result.total_weight, len(devices))
                    fedavg.aggregate(weights, [update])
                else:
                    result = runner.run_round(round_num, weights, devices, privacy=aggregator.device_privacy())
                    leaf = LeafSum(result.delta_sum, len(devices), result.counts.get("dp_below_clip", 0))
                    aggregator.aggregate(round_num, weights, [leaf])
                if round_num:
                    times[name].append(time.perf_counter() - started)
    finally:
        runner.close()
    line = f"round without DP {{plain}}, with DP ({args.accountant}) {{private}}"
    name = f"DP round / plain round, batched path ({args.accountant})"
    _report(args, session, times, line, name, f"privacy_cost-{args.accountant}")
    return 0


def _asynchronous(args: argparse.Namespace, runner: LeafRoundRunner, session: Session) -> int:
    """A DP-FedBuff version (B jobs trained in one leaf call, one buffer applied) against a plain FedBuff one."""
    dp = dict(dp="central", dp_noise_multiplier=1.0, dp_clip=1.0, dp_noise_at=args.noise_at)
    config = AsyncConfig(**dp, buffer_size=args.devices, devices_per_leaf=500).validate()
    privacy = BufferedPrivacy(PrivacyPlan.from_settings(config), seed=0)
    job = privacy.job_privacy()
    device = DevicePrivacy(job["clip"], job["noise_std"], 0)
    weights = model_to_numpy(build_model("cnn"))
    shapes = {name: value.shape for name, value in weights.items()}
    devices = list(range(args.devices))
    times: dict[str, list[float]] = {"plain": [], "dp": []}
    try:
        for version in range(1, args.rounds + 1):
            for name in ("plain", "dp") if version % 2 else ("dp", "plain"):
                seeds = [1000 * version + d for d in devices]
                started = time.perf_counter()
                payload = runner.run_jobs(weights, devices, devices, seeds, privacy=device if name == "dp" else None)
                buffer = FedBuff(len(devices), 1.0)
                for row in range(len(devices)):
                    buffer.add({k: v[row] for k, v in payload["deltas"].items()}, 0)
                buffer.apply(weights, privacy.noise(version, shapes) if name == "dp" else None)
                if name == "dp":
                    privacy.applied()
                if version > 1:
                    times[name].append(time.perf_counter() - started)
    finally:
        runner.close()
    line = f"version of {args.devices} jobs without DP {{plain}}, DP-FedBuff (noise at the {args.noise_at}) {{private}}"
    name = f"DP-FedBuff version / plain FedBuff version, batched path (noise at the {args.noise_at})"
    _report(args, session, times, line, name, f"privacy_cost-async-{args.noise_at}")
    return 0


def _report(
    args: argparse.Namespace, session: Session, times: dict[str, list[float]], line: str, name: str, benchmark: str
) -> None:
    """Print the medians and their ratio (``line`` with ``{plain}`` and ``{private}`` for the two medians in ms) and,
    with ``--json``, write the figure ``name`` to ``benchmarks/results/<benchmark>-<date>.json``."""
    plain, private = statistics.median(times["plain"]), statistics.median(times["dp"])
    ratio = private / plain
    print(f"machine: {session.where()}")
    print(f"{line.format(plain=f'{plain * 1000:.1f} ms', private=f'{private * 1000:.1f} ms')}: {ratio:.3f}x")
    if args.json:
        shown = session.figure(name, f"{ratio:.3f}x", "<= 1.10x")
        session.benchmark = benchmark
        session.write({"settings": vars(args), "seconds": times, "ratio": ratio}, [shown])


def utility_run(args, config: SimulationConfig, epsilon: float | None) -> dict:
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
        aggregator = PrivateAggregator(
            plan, config.seed, 1, config.global_lr, server_optimizer=server_optimizer_for(config)
        )
    population = DevicePopulation(1, args.devices, seed=config.seed)
    fedavg = FedAvg(config.global_lr, server_optimizer=server_optimizer_for(config))
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


def utility(args: argparse.Namespace, session: Session) -> int:
    """The privacy-utility table: one run per ``--settings`` row, the same seed everywhere."""
    torch.set_num_threads(1)
    population = dict(num_leaf_nodes=1, devices_per_leaf=args.devices, device_selection_size=args.cohort)
    training = dict(local_epochs=args.local_epochs, batch_size=args.batch_size, lr=args.lr, global_lr=args.global_lr)
    training.update(server_optimizer=args.server_optimizer)
    dp = dict(dp="central", dp_noise_multiplier=1.0, dp_clip=args.clip, seed=0)
    config = SimulationConfig(
        task=os.path.abspath(args.task),
        samples_per_device=args.samples,
        partition="iid",
        **population,
        **training,
        **dp,
    )
    chosen = {"none": None, "clip": math.inf}
    rows = [utility_run(args, config, chosen[w] if w in chosen else float(w)) for w in args.settings.split(",")]
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
    ax.set(xlabel="round", ylabel="test accuracy", title="DP-FedAvg privacy-utility (5,000 devices)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    costs = modes.add_parser("cost", help="a DP round (or DP-FedBuff version) against a plain one")
    costs.add_argument("--devices", type=int, default=20, help="devices trained per round")
    costs.add_argument("--device-batch", type=int, default=10, help="devices per batched computation")
    costs.add_argument("--rounds", type=int, default=12, help="rounds per setting (the first is a warm-up)")
    costs.add_argument("--accountant", choices=("rdp", "pld"), default="rdp")
    costs.add_argument("--asynchronous", action="store_true", help="a DP-FedBuff version instead (RDP only)")
    costs.add_argument("--noise-at", choices=("server", "leaves"), default="server", help="with --asynchronous")
    table = modes.add_parser("utility", help="accuracy at several epsilons against no DP")
    table.add_argument("--task", default=os.path.join(REPO, "examples", "mnist_task.py"))
    table.add_argument("--devices", type=int, default=5000)
    table.add_argument("--cohort", type=int, default=250, help="expected devices per round")
    table.add_argument("--samples", type=int, default=16, help="samples per device")
    table.add_argument("--rounds", type=int, default=40)
    table.add_argument("--clip", type=float, default=1.0)
    table.add_argument("--lr", type=float, default=0.1)
    table.add_argument("--global-lr", type=float, default=1.0)
    table.add_argument("--server-optimizer", choices=SERVER_OPTIMIZERS, default="sgd", help="(momentum 0.9, tau 1e-3)")
    table.add_argument("--local-epochs", type=int, default=1)
    table.add_argument("--batch-size", type=int, default=8)
    table.add_argument("--device-batch", type=int, default=25)
    table.add_argument("--eval-every", type=int, default=10)
    table.add_argument("--settings", default="none,1,4,8", help="rows: none (no DP), an epsilon, or clip (no noise)")
    for mode in (costs, table):
        mode.add_argument("--json", action="store_true", help="write the figures under benchmarks/results/")
    args = parser.parse_args(argv)
    session = Session(f"privacy_{args.mode}")
    return cost(args, session) if args.mode == "cost" else utility(args, session)


if __name__ == "__main__":
    sys.exit(main())
